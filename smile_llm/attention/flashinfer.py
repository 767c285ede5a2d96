"""FlashInfer attention backend: one ``plan`` per forward, one ``run`` per layer, on the pool's paged CSR.

FlashInfer is imported lazily (:func:`import_flashinfer`), never when this module is: ``import smile_llm.attention``
works on machines without it, and no wrapper is constructed unless the device is CUDA and
``torch.cuda.is_available()`` (without a driver FlashInfer's constructors fail on their pinned host buffer).

Kernel per ``plan``::

    qo_indptr None   -> BatchDecodeWithPagedKVCacheWrapper   tensor cores when Hq/Hkv >= 4 or the KV is FP8 (SGLang)
    qo_indptr given  -> BatchPrefillWithPagedKVCacheWrapper  ragged prefill and verify windows; bottom-right causal,
                                                             or a token tree's ``custom_mask`` (always on fa2)
    beyond the kernels' limits (:func:`kernel_limit`: float32, a head dim other than 64/128/256, ...)
                     -> the reference; never in CUDA-graph mode (ValueError naming the limit)

The kernels' limits (flashinfer-python 0.6.18 / 0.7.4 sources; :func:`kernel_limit` checks them, and
:func:`model_limit` checks every kernel a model's forwards plan, which ``select_backend`` uses to choose per model):

- queries fp16 or bf16; KV of the query dtype or FP8 (fa2 has no FP8 queries, ``jit/attention/modules.py``);
- the prefill kernel (and the tensor-core decode, which runs it): head dims 64, 128 and 256. fa2 rejects head dims
  under 64 as an invalid tile configuration (``KernelTraits::IsInvalid``, ``NUM_MMA_D_VO < 4``, in
  ``include/flashinfer/attention/prefill.cuh``); fa3 instantiates 64, 128 and 256 only (``static_assert`` in
  ``attention/hopper/prefill_sm90.cuh``; ``is_fa3_prefill_head_dim_supported`` in ``utils.py``);
- fa3: query and KV of one dtype, and no custom mask (``is_fa3_backend_supported``; its kernels return
  ``cudaErrorNotSupported`` for ``MaskMode::kCustom``);
- the CUDA-core decode: 1, 2, 3, 4, 6 or 8 query heads per KV head (``DISPATCH_GQA_GROUP_SIZE``) and a
  power-of-two head dim of 16 to 256 (32 with FP8 KV) so that its ``bdx`` lanes per head are at least its two
  pipeline stages (``static_assert(num_stages_smem <= bdx)`` in ``attention/decode.cuh``).

Devices: ``plan`` hands FlashInfer ``qo_indptr``, ``paged_kv_indptr`` and ``paged_kv_last_page_len`` on one device
(the CSR's): with a custom mask FlashInfer does arithmetic on all three (``_compute_page_mask_indptr``).

CUDA graphs: a graph-mode backend serves one captured shape. Its wrapper's fixed buffers *are* the pool's graph CSR
(``decode_graph_metadata(batch)``: ``indices`` over-provisioned for every row length) and ``verify_qo_indptr(batch,
window_len)``. FlashInfer's graph-mode ``plan`` copies the CSR it is given into those buffers, so ``plan`` refuses any
CSR but the bound one (another would silently overwrite the pool's live CSR). ``plan`` reads the CSR's host mirrors
(:class:`GraphStepCsr`) and hands FlashInfer host ``indptr``/``last_page_len``, so neither this module nor FlashInfer
reads the device; it must run outside capture before every replay. ``run`` does no host work and is captured: what
it passes as scalars (``k_scale``, ``v_scale``, the softmax scale) is frozen into the graph.

Kernel family (FlashInfer's ``backend``): "fa3" for the prefill wrapper on compute capability 9.x (Hopper) when fa3
can serve the plan (matching query and KV dtypes, head dim 64/128/256, no custom mask), "fa2" everywhere else
(decode, FP8 KV, token-tree masks, other GPUs); ``kernel_backend=`` forces the family of the prefill plans without
a custom mask.

FlashInfer API used (flashinfer-python 0.2 .. 0.7.4; optional arguments go by keyword, which every version accepts
and 0.6.18+ asks for; ``backend=`` only where the constructor has it)::

    BatchDecodeWithPagedKVCacheWrapper(float_workspace_buffer, kv_layout, use_cuda_graph=, use_tensor_cores=,
        paged_kv_indptr_buffer=, paged_kv_indices_buffer=, paged_kv_last_page_len_buffer=, backend=)
    .plan(indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size, *,
          logits_soft_cap=, q_data_type=, kv_data_type=, sm_scale=)
    BatchPrefillWithPagedKVCacheWrapper(float_workspace_buffer, kv_layout, use_cuda_graph=, qo_indptr_buf=,
        paged_kv_indptr_buf=, paged_kv_indices_buf=, paged_kv_last_page_len_buf=, backend=)
    .plan(qo_indptr, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len, num_qo_heads, num_kv_heads,
          head_dim, page_size, *, causal=, sm_scale=, logits_soft_cap=, q_data_type=, kv_data_type=,
          uniform_q_len=)   # uniform_q_len only where the installed version's plan has it
    .run(q, (k_cache, v_cache), k_scale=, v_scale=, return_lse=)   # sm_scale *= k_scale; out *= v_scale; LSE base 2
"""

from __future__ import annotations

import functools
import inspect
import logging
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ..cache.graph_buffers import GraphStepCsr
from ..cache.metadata import FlashInferKvMetadata

if TYPE_CHECKING:
    from ..cache.pool import KvCachePool

_log = logging.getLogger(__name__)

INSTALL_HINT = ("FlashInfer is not installed: on a machine with a CUDA GPU run `pip install 'smile-llm[gpu]'` "
                "(or `pip install flashinfer-python`); select_backend(device, prefer='reference') needs nothing extra")

WORKSPACE_BYTES = 128 * 1024 * 1024  # FlashInfer's recommended float workspace
KV_LAYOUT = "NHD"  # the pool's per-layer view [num_pages, page_size, Hkv, D]
HALF_DTYPES = (torch.float16, torch.bfloat16)
FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)
TENSOR_CORE_MIN_GROUP = 4  # SGLang's should_use_tensor_core: GQA group >= 4, or FP8 KV
FA3_MAJOR = 9  # compute capability major of the GPUs FlashInfer's fa3 kernels run on (Hopper)
KERNEL_FAMILIES = ("fa2", "fa3")
KERNELS = ("decode", "decode_tc", "prefill")
PREFILL_HEAD_DIMS = (64, 128, 256)  # the prefill kernel on fa2 and fa3, and the tensor-core decode (it runs prefill's)
CUDA_CORE_DECODE_GROUPS = (1, 2, 3, 4, 6, 8)  # DISPATCH_GQA_GROUP_SIZE in include/flashinfer/utils.cuh
CUDA_CORE_DECODE_MAX_HEAD_DIM = 256
DECODE_PIPELINE_STAGES = 2  # the CUDA-core decode's shared-memory stages on sm_80 and later; <= its bdx lanes


def import_flashinfer() -> Any:
    """The ``flashinfer`` module. Raises ImportError with the install hint when it is missing, and ImportError with
    the cause when an installed build fails to import (CUDA or torch mismatch; FlashInfer issues 3262 and 4143)."""
    try:
        import flashinfer
    except ImportError as exc:
        raise ImportError(INSTALL_HINT) from exc
    except Exception as exc:  # a broken install raises anything at import
        raise ImportError(f"flashinfer is installed but failed to import ({type(exc).__name__}: {exc}); install the "
                          f"flashinfer-python build that matches torch {torch.__version__}") from exc
    return flashinfer


def flashinfer_available() -> bool:
    """Whether :func:`import_flashinfer` succeeds (imports FlashInfer if it is installed)."""
    try:
        import_flashinfer()
    except ImportError:
        return False
    return True


def decode_kernel(group: int, kv_dtype: torch.dtype, use_tensor_cores: bool | None = None) -> str:
    """The decode kernel for ``group`` query heads per KV head: "decode_tc" (the prefill kernel on tensor cores) when
    ``use_tensor_cores``, or, when that is None, by SGLang's rule (a group of 4 or more, or FP8 KV); else "decode"
    (the CUDA-core kernel)."""
    if use_tensor_cores is None:
        use_tensor_cores = group >= TENSOR_CORE_MIN_GROUP or kv_dtype in FP8_DTYPES
    return "decode_tc" if use_tensor_cores else "decode"


def _cuda_core_decode_serves(head_dim: int, kv_dtype: torch.dtype) -> bool:
    # decode.cuh: vec_size = max(16 / sizeof(KV), D / 32), bdx = D / vec_size lanes per head, reduced by a butterfly
    # over bdx (a power of two) and at least the pipeline stages.
    if head_dim > CUDA_CORE_DECODE_MAX_HEAD_DIM or head_dim & (head_dim - 1):
        return False
    vec = max(16 // kv_dtype.itemsize, head_dim // 32)
    return head_dim % vec == 0 and DECODE_PIPELINE_STAGES <= head_dim // vec <= 32


def _limits(kernel: str, family: str, head_dim: int, group: int, q_dtype: torch.dtype, kv_dtype: torch.dtype,
            custom_mask: bool) -> list[str]:
    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}")
    if family not in KERNEL_FAMILIES:
        raise ValueError(f"family must be one of {KERNEL_FAMILIES}, got {family!r}")
    out = []
    if q_dtype not in HALF_DTYPES:
        out.append(f"{q_dtype} queries (FlashInfer has float16 and bfloat16 kernels only)")
    elif kv_dtype != q_dtype and kv_dtype not in FP8_DTYPES:
        out.append(f"{q_dtype} queries over {kv_dtype} KV (the KV must be of the query dtype or FP8)")
    if kernel == "decode":
        if not _cuda_core_decode_serves(head_dim, kv_dtype):
            out.append(f"head dim {head_dim} (the CUDA-core decode runs powers of two from "
                       f"{DECODE_PIPELINE_STAGES * (16 // kv_dtype.itemsize)} to {CUDA_CORE_DECODE_MAX_HEAD_DIM} "
                       f"over {kv_dtype} KV)")
        if group not in CUDA_CORE_DECODE_GROUPS:
            out.append(f"{group} query heads per KV head (the CUDA-core decode serves "
                       f"{', '.join(map(str, CUDA_CORE_DECODE_GROUPS))})")
    elif head_dim not in PREFILL_HEAD_DIMS:
        out.append(f"head dim {head_dim} (the prefill kernels run {', '.join(map(str, PREFILL_HEAD_DIMS))} only)")
    if custom_mask and kernel != "prefill":
        out.append("a custom mask without a query window (the prefill kernel has masks)")
    if family == "fa3":
        if kernel != "prefill":
            out.append("fa3 for a decode kernel (fa3 serves the prefill wrapper here)")
        if q_dtype in HALF_DTYPES and kv_dtype != q_dtype:
            out.append(f"fa3 over {kv_dtype} KV under {q_dtype} queries (fa3 needs one dtype)")
        if custom_mask:
            out.append("a custom mask on fa3 (its kernels return cudaErrorNotSupported)")
    return out


def kernel_limit(kernel: str, family: str, *, head_dim: int, group: int, q_dtype: torch.dtype,
                 kv_dtype: torch.dtype, custom_mask: bool = False) -> str | None:
    """Why FlashInfer's ``kernel`` ("decode", "decode_tc" or "prefill") on kernel ``family`` ("fa2" or "fa3")
    cannot serve a plan of this head dim, GQA ``group`` (query heads per KV head), query and KV dtypes and mask, or
    None when it can. Every limit that applies is named, "; "-separated (this module's docstring lists them and
    where FlashInfer sets them). ValueError for an unknown kernel or family."""
    return "; ".join(_limits(kernel, family, head_dim, group, q_dtype, kv_dtype, custom_mask)) or None


def model_limit(*, head_dim: int, num_qo_heads: int, num_kv_heads: int, q_dtype: torch.dtype,
                kv_dtype: torch.dtype) -> str | None:
    """Why FlashInfer cannot serve every forward of a model with this attention geometry (fa2's prefill kernel for
    prompts, verify windows and token-tree masks; the decode kernel :func:`decode_kernel` picks; fa3 is only ever
    taken where it can serve), or None when it can. The reasons are named as :func:`kernel_limit` names them.
    ValueError when the heads do not form GQA groups."""
    if num_qo_heads < 1 or num_kv_heads < 1 or num_qo_heads % num_kv_heads:
        raise ValueError(f"num_qo_heads {num_qo_heads} must be a positive multiple of num_kv_heads {num_kv_heads}")
    group = num_qo_heads // num_kv_heads
    out: list[str] = []
    for kernel in ("prefill", decode_kernel(group, kv_dtype)):
        out += [r for r in _limits(kernel, "fa2", head_dim, group, q_dtype, kv_dtype, False) if r not in out]
    return "; ".join(out) or None


def rows_without_keys(kv_lens: np.ndarray, qo_indptr: np.ndarray | None, causal: bool) -> np.ndarray:
    """Global query rows that see no key (``int64``): every query of a row with no KV and, under the bottom-right
    causal mask, the first ``qo_len - kv_len`` queries of a row whose window is longer than its KV. FlashInfer leaves
    them undefined (NaN: SGLang #1571, vLLM #38436); the backend writes output 0 and LSE -inf there, as the
    reference defines them. ``qo_indptr`` None means decode (one query per row)."""
    kv = np.asarray(kv_lens, dtype=np.int64)
    if qo_indptr is None:
        return np.flatnonzero(kv == 0).astype(np.int64)
    qo = np.asarray(qo_indptr, dtype=np.int64)
    qo_len = np.diff(qo)
    blind = np.where(kv == 0, qo_len, np.clip(qo_len - kv, 0, None) if causal else 0)
    total = int(blind.sum())
    if total == 0:
        return np.empty(0, dtype=np.int64)
    first = np.cumsum(blind) - blind  # offset of each row's first blind query among all blind queries
    return np.repeat(qo[:-1], blind) + np.arange(total) - np.repeat(first, blind)


# ---------------------------------------------------------------------------------------------- workspace
_workspace_lock = threading.Lock()
_workspaces: dict[torch.device, torch.Tensor] = {}


def _canonical(device: str | torch.device) -> torch.device:
    device = torch.device(device)
    if device.type == "cuda" and device.index is None and torch.cuda.is_available():
        device = torch.device("cuda", torch.cuda.current_device())
    return device


def workspace_buffer(device: str | torch.device) -> torch.Tensor:
    """The float workspace every FlashInfer wrapper on ``device`` shares: ``WORKSPACE_BYTES`` of uint8, zeroed at
    creation (FlashInfer requires zero on first use), made once per device. Wrappers sharing it run on one stream,
    one kernel at a time (as SGLang's do); each wrapper keeps its own int workspace for its plan."""
    device = _canonical(device)
    with _workspace_lock:
        buf = _workspaces.get(device)
        if buf is None:
            buf = torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=device)
            _workspaces[device] = buf
    return buf


def compute_capability(device: torch.device) -> tuple[int, int] | None:
    """``(major, minor)`` of a CUDA ``device``; None off CUDA."""
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_capability(device)


def default_kernel_backend(kernel: str, capability: tuple[int, int] | None, q_dtype: torch.dtype,
                           kv_dtype: torch.dtype, head_dim: int, *, custom_mask: bool = False) -> str:
    """FlashInfer's ``backend`` for ``kernel`` on a GPU of ``capability``: "fa3" for the prefill wrapper on Hopper
    when fa3 can serve the plan (:func:`kernel_limit`: matching query and KV dtypes, head dim 64/128/256, no custom
    mask), "fa2" otherwise (decode is memory-bound; fa2 serves every GPU and has custom masks)."""
    if (kernel == "prefill" and capability is not None and capability[0] == FA3_MAJOR
            and not _limits("prefill", "fa3", head_dim, 1, q_dtype, kv_dtype, custom_mask)):
        return "fa3"
    return "fa2"


def _check_cuda_device(device: torch.device) -> None:
    if device.type != "cuda" or not torch.cuda.is_available():
        raise RuntimeError(f"FlashInferBackend needs a CUDA device; got {device} (torch.cuda.is_available() = "
                           f"{torch.cuda.is_available()}). select_backend(device) picks the reference off CUDA")


@functools.cache
def _accepts_keyword(fn: Any, name: str) -> bool:
    try:
        return name in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def _as_positive_int(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return int(value)


def _host_kv_lens(meta: FlashInferKvMetadata) -> np.ndarray:
    """Host ``int64[B]`` token count of each row, after checking the CSR: from a :class:`GraphStepCsr`'s host
    mirrors, else with one device-to-host copy. ValueError on a malformed CSR: FlashInfer checks none of it
    (``last_page_len > page_size`` is accepted, FlashInfer #320)."""
    meta.check_types()
    batch = int(meta.last_page_len.shape[0])
    if meta.indptr.shape[0] != batch + 1:
        raise ValueError(f"indptr has {meta.indptr.shape[0]} entries for {batch} rows; it needs B + 1")
    if meta.indices.device != meta.indptr.device or meta.last_page_len.device != meta.indptr.device:
        raise ValueError("indptr, indices and last_page_len must be on one device")
    if isinstance(meta, GraphStepCsr):
        indptr, last = meta.host_indptr.astype(np.int64), meta.host_last_page_len.astype(np.int64)
    else:
        host = torch.cat((meta.indptr, meta.last_page_len)).cpu().numpy().astype(np.int64)
        indptr, last = host[: batch + 1], host[batch + 1:]
    pages = meta.check_rows(indptr, last)
    return np.where(pages > 0, (pages - 1) * meta.page_size + last, 0)


def _host_qo_indptr(qo_indptr: Any, batch: int) -> np.ndarray:
    if (not isinstance(qo_indptr, torch.Tensor) or qo_indptr.dim() != 1 or qo_indptr.dtype == torch.bool
            or qo_indptr.dtype.is_floating_point or qo_indptr.dtype.is_complex):
        raise ValueError(f"qo_indptr must be a 1-D integer tensor, got {getattr(qo_indptr, 'dtype', type(qo_indptr))}")
    qo = qo_indptr.cpu().numpy().astype(np.int64)
    if len(qo) != batch + 1 or qo[0] != 0 or (np.diff(qo) < 0).any():
        raise ValueError(f"qo_indptr must hold B + 1 = {batch + 1} non-decreasing offsets from 0, got {qo.tolist()}")
    return qo


def _paged_view(layer: torch.Tensor, page_size: int, num_kv_heads: int, head_dim: int, name: str) -> torch.Tensor:
    """``[num_pages, page_size, Hkv, D]`` view of one layer, given as that or as the pool's ``[num_slots, Hkv, D]``."""
    if not isinstance(layer, torch.Tensor):
        raise ValueError(f"{name} must be a tensor, got {type(layer).__name__}")
    shape = tuple(layer.shape)
    if layer.dim() == 3 and shape[1:] == (num_kv_heads, head_dim) and shape[0] % page_size == 0:
        return layer.view(-1, page_size, num_kv_heads, head_dim)
    if layer.dim() == 4 and shape[1:] == (page_size, num_kv_heads, head_dim):
        return layer
    raise ValueError(f"{name} has shape {shape}; expected [num_pages, {page_size}, {num_kv_heads}, {head_dim}] or "
                     f"[num_slots, {num_kv_heads}, {head_dim}] with num_slots a multiple of {page_size}")


def _plan_csr(meta: FlashInferKvMetadata) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(indptr, indices, last_page_len)`` to hand FlashInfer's ``plan``: for a :class:`GraphStepCsr` its host
    ``indptr``/``last_page_len`` (FlashInfer reads them on the host, so no device read) and the used leading
    ``indices`` (a view: FlashInfer's copy onto the fixed buffer is then a no-op); else the CSR's own tensors."""
    if isinstance(meta, GraphStepCsr):
        return (torch.from_numpy(meta.host_indptr), meta.indices[: meta.num_used_pages],
                torch.from_numpy(meta.host_last_page_len))
    return meta.indptr, meta.indices, meta.last_page_len


@dataclass(frozen=True)
class _Plan:
    """What one ``plan`` fixed for the ``run`` calls (all layers) that follow it."""

    kernel: str  # "decode", "decode_tc", "prefill" or "reference"
    meta: FlashInferKvMetadata
    qo_indptr: torch.Tensor | None
    num_qo_heads: int
    num_kv_heads: int
    head_dim: int
    total_q: int
    causal: bool
    sm_scale: float | None
    logits_soft_cap: float | None
    q_dtype: torch.dtype
    kv_dtype: torch.dtype
    zero_rows: torch.Tensor | None  # int64[n] on the device: rows written as 0 / -inf after the kernel
    wrapper: Any  # the FlashInfer wrapper planned for ``kernel``, or a planned ReferenceBackend


class FlashInferBackend:
    """FlashInfer's paged decode and prefill kernels behind the :class:`AttentionBackend` protocol.

    ``FlashInferBackend(device)`` is the eager backend: one lazily made wrapper per kernel, shared by every forward.
    ``use_cuda_graph=True`` with ``fixed_meta`` (and ``fixed_qo_indptr`` for a verify window) makes a graph-mode
    backend for one captured shape; :meth:`for_decode_graph` and :meth:`for_verify_graph` build it from a pool.
    Graph mode: call ``plan`` outside capture before capturing and before every replay, always with the bound CSR
    (ValueError for any other: FlashInfer would copy it over the fixed buffers); capture ``run``; a later ``plan``
    with another shape, dtype or option raises ValueError (build another backend). When the pool's graph CSR moves
    (``consume_verify_graph_meta_realloc()``; ``is_bound_to`` turns False), drop the graph and this backend.

    ``use_tensor_cores`` (decode) None means SGLang's rule: Hq/Hkv >= 4 or FP8 KV. ``kernel_backend`` is FlashInfer's
    ``backend`` argument for the prefill plans without a custom mask, "fa2" or "fa3" (ValueError otherwise); None
    chooses by compute capability (:func:`default_kernel_backend`); decode and custom-mask plans always take fa2. A
    plan beyond the kernels' limits (:func:`kernel_limit`) runs on the reference in eager mode and is a ValueError in
    graph mode."""

    name = "flashinfer"

    def __init__(self, device: str | torch.device, *, use_cuda_graph: bool = False,
                 fixed_meta: FlashInferKvMetadata | None = None, fixed_qo_indptr: torch.Tensor | None = None,
                 use_tensor_cores: bool | None = None, kernel_backend: str | None = None) -> None:
        device = torch.device(device)
        _check_cuda_device(device)
        self.device = _canonical(device)
        self.use_cuda_graph = bool(use_cuda_graph)
        self.use_tensor_cores = use_tensor_cores
        if kernel_backend is not None and kernel_backend not in KERNEL_FAMILIES:
            raise ValueError(f"kernel_backend must be None or one of {KERNEL_FAMILIES}, got {kernel_backend!r}")
        self.kernel_backend = kernel_backend
        self._fixed_qo_host: np.ndarray | None = None  # host copy of fixed_qo_indptr (the pool never rewrites it)
        if self.use_cuda_graph:
            if fixed_meta is None:
                raise ValueError("use_cuda_graph=True needs fixed_meta: the pool's fixed-address CSR (decode: "
                                 "pool.decode_graph_metadata(batch); verify: pool.verify_graph_metadata())")
            _host_kv_lens(fixed_meta)  # well formed
            for name in ("indptr", "indices", "last_page_len"):
                if getattr(fixed_meta, name).device != self.device:
                    raise ValueError(f"fixed_meta.{name} is on {getattr(fixed_meta, name).device}, not {self.device}")
            if fixed_qo_indptr is not None:
                self._fixed_qo_host = _host_qo_indptr(fixed_qo_indptr, fixed_meta.batch_size)
                if fixed_qo_indptr.device != self.device:
                    raise ValueError(f"fixed_qo_indptr is on {fixed_qo_indptr.device}, not {self.device}")
        elif fixed_meta is not None or fixed_qo_indptr is not None:
            raise ValueError("fixed_meta / fixed_qo_indptr are CUDA-graph buffers; pass use_cuda_graph=True")
        self.fixed_meta = fixed_meta
        self.fixed_qo_indptr = fixed_qo_indptr
        self._capability = compute_capability(self.device)
        self._wrappers: dict[tuple[str, str | None], Any] = {}
        self._plan: _Plan | None = None
        self._graph_key: tuple[Any, ...] | None = None

    # ------------------------------------------------------------------ graph-mode factories
    @classmethod
    def for_decode_graph(cls, pool: KvCachePool, batch: int, **kwargs: Any) -> FlashInferBackend:
        """Graph-mode decode backend on the pool's graph CSR of ``batch`` rows (``decode_graph_metadata(batch)``):
        valid for every row length until the pool's graph CSR moves."""
        return cls(pool.device, use_cuda_graph=True, fixed_meta=pool.decode_graph_metadata(batch), **kwargs)

    @classmethod
    def for_verify_graph(cls, pool: KvCachePool, batch: int, window_len: int, **kwargs: Any) -> FlashInferBackend:
        """Graph-mode verify backend on the pool's graph CSR of ``batch`` rows and ``verify_qo_indptr(batch,
        window_len)``: valid for every row length until the pool's graph CSR moves."""
        return cls(pool.device, use_cuda_graph=True, fixed_meta=pool.decode_graph_metadata(batch),
                   fixed_qo_indptr=pool.verify_qo_indptr(batch, window_len), **kwargs)

    def is_bound_to(self, meta: FlashInferKvMetadata) -> bool:
        """Whether ``meta`` is the CSR this graph-mode backend's wrapper reads (same tensors)."""
        fixed = self.fixed_meta
        return fixed is not None and all(
            getattr(meta, n).data_ptr() == getattr(fixed, n).data_ptr()
            and getattr(meta, n).shape == getattr(fixed, n).shape for n in ("indptr", "indices", "last_page_len"))

    @property
    def kernel(self) -> str | None:
        """The kernel the last ``plan`` chose: "decode", "decode_tc", "prefill" or "reference" (None before)."""
        return None if self._plan is None else self._plan.kernel

    # ------------------------------------------------------------------ protocol
    def plan(self, meta: FlashInferKvMetadata, *, num_qo_heads: int, num_kv_heads: int, head_dim: int,
             qo_indptr: torch.Tensor | None = None, causal: bool = True, sm_scale: float | None = None,
             logits_soft_cap: float | None = None, q_dtype: torch.dtype = torch.float32,
             kv_dtype: torch.dtype = torch.float32, custom_mask: torch.Tensor | None = None) -> None:
        """Plan the kernel for one forward; every layer's ``run`` shares it. Decode when ``qo_indptr`` is None (one
        query per row); otherwise ragged prefill / verify with ``qo_indptr`` ``[B+1]`` (an integer tensor; int32 is
        used as is) and the bottom-right causal mask when ``causal``, or ``custom_mask`` (FlashInfer's prefill
        ``custom_mask``: each row's ``[qo_len, kv_len]`` block, row-major, concatenated; a token-tree window, planned
        on fa2). Reads the CSR on the host: never call it inside CUDA-graph capture. A plan beyond the kernels'
        limits (:func:`kernel_limit`) runs on the reference. ValueError on a malformed CSR, a head count that is not
        a multiple, or (graph mode) a shape other than the captured one or one beyond the kernels' limits."""
        hq = _as_positive_int(num_qo_heads, "num_qo_heads")
        hkv = _as_positive_int(num_kv_heads, "num_kv_heads")
        d = _as_positive_int(head_dim, "head_dim")
        if hq % hkv:
            raise ValueError(f"num_qo_heads {hq} must be a multiple of num_kv_heads {hkv} (GQA)")
        if logits_soft_cap is not None and not logits_soft_cap >= 0:
            raise ValueError(f"logits_soft_cap must be >= 0 or None, got {logits_soft_cap!r}")
        cap = float(logits_soft_cap) if logits_soft_cap else None
        scale = None if sm_scale is None else float(sm_scale)
        graph_decode = self.use_cuda_graph and self.fixed_qo_indptr is None
        if self.use_cuda_graph and qo_indptr is None and not graph_decode:
            qo_indptr = self.fixed_qo_indptr
        if graph_decode and qo_indptr is not None:
            raise ValueError("this CUDA-graph backend was built for decode (no fixed_qo_indptr): qo_indptr must be "
                             "None")
        if self.use_cuda_graph:
            if not self.is_bound_to(meta):
                raise ValueError("this CUDA-graph backend reads the pool's fixed graph CSR; plan it with that CSR "
                                 "(pool.decode_graph_metadata(batch)): FlashInfer would copy another one over it")
            if qo_indptr is not None and self.fixed_qo_indptr is not None and (
                    qo_indptr.data_ptr() != self.fixed_qo_indptr.data_ptr()
                    or qo_indptr.shape != self.fixed_qo_indptr.shape):
                raise ValueError("this CUDA-graph backend reads its fixed qo_indptr (pool.verify_qo_indptr(batch, "
                                 "window_len)); pass that one or None")

        if custom_mask is not None:
            if qo_indptr is None or self.use_cuda_graph:
                raise ValueError("custom_mask needs qo_indptr and an eager (not CUDA-graph) backend")
            causal = False  # the mask decides; a query seeing no key is found from it below
        kv_lens = _host_kv_lens(meta)
        batch = len(kv_lens)
        if qo_indptr is None:
            qo_host = None
        elif self.use_cuda_graph and self.fixed_qo_indptr is not None:
            qo_host = self._fixed_qo_host  # read once, at construction
        else:
            qo_host = _host_qo_indptr(qo_indptr, batch)
        if qo_indptr is not None and qo_indptr.dtype != torch.int32:
            qo_indptr = qo_indptr.to(torch.int32)  # FlashInfer's index type is the CSR's
        total_q = batch if qo_host is None else int(qo_host[-1])
        blind = rows_without_keys(kv_lens, qo_host, causal)

        kernel = "prefill" if qo_indptr is not None else decode_kernel(hq // hkv, kv_dtype, self.use_tensor_cores)
        masked = custom_mask is not None
        family = self._kernel_backend(kernel, q_dtype, kv_dtype, d, masked)
        limit = kernel_limit(kernel, family, head_dim=d, group=hq // hkv, q_dtype=q_dtype, kv_dtype=kv_dtype,
                             custom_mask=masked)
        if limit is not None:
            if self.use_cuda_graph:
                raise ValueError(f"FlashInfer cannot serve this plan: {limit}; graph mode cannot fall back to the "
                                 f"reference")
            kernel = "reference"
        if self.use_cuda_graph:
            if len(blind):
                raise ValueError(f"query rows {blind[:8].tolist()} see no key (empty rows, or windows longer than "
                                 f"their KV); a captured graph cannot fix them up: point padding rows at a scratch "
                                 f"slot with kv_len >= 1 as the pool's graph steps do")
            key = (kernel, hq, hkv, d, meta.page_size, batch, total_q, bool(causal), scale, cap, q_dtype, kv_dtype)
            if self._graph_key is not None and key != self._graph_key:
                raise ValueError(f"this CUDA-graph backend serves (kernel, Hq, Hkv, D, page_size, batch, total_q, "
                                 f"causal, sm_scale, soft_cap, q_dtype, kv_dtype) = {self._graph_key}; got {key}; "
                                 f"build another backend for another shape")
            self._graph_key = key

        wrapper: Any  # the FlashInfer wrapper planned for ``kernel``, or a planned ReferenceBackend
        if kernel in KERNELS:
            wrapper = self._wrapper(kernel, family)
            indptr, indices, last = _plan_csr(meta)
            if kernel == "prefill":
                assert qo_host is not None
                extra: dict[str, Any] = {}
                qo_lens = np.diff(qo_host)
                if len(qo_lens) and (qo_lens == qo_lens[0]).all() and _accepts_keyword(type(wrapper).plan,
                                                                                        "uniform_q_len"):
                    extra["uniform_q_len"] = int(qo_lens[0])
                # on the device of the CSR's indptr and last_page_len: a custom mask's plan does arithmetic on all
                # three (FlashInfer's _compute_page_mask_indptr)
                qo_arg = torch.from_numpy(qo_host.astype(np.int32)).to(indptr.device)
                if custom_mask is not None:
                    extra["custom_mask"] = custom_mask.to(self.device, torch.bool)
                    extra.pop("uniform_q_len", None)
                wrapper.plan(qo_arg, indptr, indices, last, hq, hkv, d, meta.page_size, causal=bool(causal),
                             sm_scale=scale, logits_soft_cap=cap, q_data_type=q_dtype, kv_data_type=kv_dtype,
                             **extra)
            else:
                wrapper.plan(indptr, indices, last, hq, hkv, d, meta.page_size, logits_soft_cap=cap,
                             q_data_type=q_dtype, kv_data_type=kv_dtype, sm_scale=scale)
        else:  # the reference, planned once per forward like a kernel
            wrapper = self._wrappers.get((kernel, None))
            if wrapper is None:
                from .reference import ReferenceBackend

                wrapper = self._wrappers[(kernel, None)] = ReferenceBackend()
            wrapper.plan(meta, num_qo_heads=hq, num_kv_heads=hkv, head_dim=d, qo_indptr=qo_indptr, causal=causal,
                         sm_scale=scale, logits_soft_cap=cap, q_dtype=q_dtype, kv_dtype=kv_dtype,
                         custom_mask=custom_mask)
        zero_rows = None
        if len(blind) and kernel != "reference":
            zero_rows = torch.from_numpy(blind).to(self.device)
        self._plan = _Plan(kernel, meta, qo_indptr, hq, hkv, d, total_q, bool(causal), scale, cap, q_dtype, kv_dtype,
                           zero_rows, wrapper)

    def run(self, q: torch.Tensor, k_layer: torch.Tensor, v_layer: torch.Tensor, *, k_scale: float = 1.0,
            v_scale: float = 1.0, return_lse: bool = False) -> Any:
        """Attention of ``q`` ``[total_q, Hq, D]`` over one layer's cache (``[num_pages, page_size, Hkv, D]`` or the
        pool's ``[num_slots, Hkv, D]``) with the last plan. Returns ``[total_q, Hq, D]`` in q's dtype, or ``(out,
        lse)`` with a base-2 LSE ``[total_q, Hq]``. FP8 KV: pass ``pool.k_scale``/``pool.v_scale``. No host work:
        capturable in a CUDA graph. RuntimeError before ``plan``; ValueError on shapes or dtypes the plan does not
        cover."""
        plan = self._plan
        if plan is None:
            raise RuntimeError("FlashInferBackend.run before plan(): plan once per forward, then run per layer")
        want = (plan.total_q, plan.num_qo_heads, plan.head_dim)
        if not isinstance(q, torch.Tensor) or tuple(q.shape) != want:
            raise ValueError(f"q must be [total_q, Hq, D] = {list(want)}, got {list(getattr(q, 'shape', []))}")
        if q.dtype != plan.q_dtype:
            raise ValueError(f"q is {q.dtype} but the plan is for {plan.q_dtype}")
        if plan.kernel == "reference":
            return plan.wrapper.run(q, k_layer, v_layer, k_scale=k_scale, v_scale=v_scale, return_lse=return_lse)
        ps = plan.meta.page_size
        k = _paged_view(k_layer, ps, plan.num_kv_heads, plan.head_dim, "k_layer")
        v = _paged_view(v_layer, ps, plan.num_kv_heads, plan.head_dim, "v_layer")
        for name, t in (("q", q), ("k_layer", k), ("v_layer", v)):
            if t.device != self.device:
                raise ValueError(f"{name} is on {t.device}, not {self.device}")
        if k.dtype != plan.kv_dtype or v.dtype != plan.kv_dtype:
            raise ValueError(f"KV is {k.dtype}/{v.dtype} but the plan is for {plan.kv_dtype}")
        if not q.is_contiguous():
            q = q.contiguous()
        result = plan.wrapper.run(q, (k, v), k_scale=None if k_scale == 1.0 else float(k_scale),
                                  v_scale=None if v_scale == 1.0 else float(v_scale), return_lse=bool(return_lse))
        if plan.zero_rows is not None:
            out = result[0] if return_lse else result
            out.index_fill_(0, plan.zero_rows, 0.0)
            if return_lse:
                result[1].index_fill_(0, plan.zero_rows, float("-inf"))
        return result

    # ------------------------------------------------------------------ wrappers
    def _kernel_backend(self, kernel: str, q_dtype: torch.dtype, kv_dtype: torch.dtype, head_dim: int,
                        custom_mask: bool) -> str:
        """The kernel family of a plan: fa2 for decode and for a custom mask (fa3 has none), else the forced one,
        else :func:`default_kernel_backend`."""
        if custom_mask or kernel != "prefill":
            return "fa2"
        if self.kernel_backend is not None:
            return self.kernel_backend
        return default_kernel_backend(kernel, self._capability, q_dtype, kv_dtype, head_dim)

    def _wrapper(self, kernel: str, backend: str) -> Any:
        """The FlashInfer wrapper for ``kernel`` on kernel family ``backend``, made on first use (graph mode: on the
        fixed buffers)."""
        wrapper = self._wrappers.get((kernel, backend))
        if wrapper is not None:
            return wrapper
        fi = import_flashinfer()
        meta = self.fixed_meta
        kwargs: dict[str, Any]
        if kernel == "prefill":
            cls = fi.BatchPrefillWithPagedKVCacheWrapper
            kwargs = {}
            if self.use_cuda_graph:
                assert meta is not None and self.fixed_qo_indptr is not None
                kwargs = {"use_cuda_graph": True, "qo_indptr_buf": self.fixed_qo_indptr,
                          "paged_kv_indptr_buf": meta.indptr, "paged_kv_indices_buf": meta.indices,
                          "paged_kv_last_page_len_buf": meta.last_page_len}
        else:
            cls = fi.BatchDecodeWithPagedKVCacheWrapper
            kwargs = {"use_tensor_cores": kernel == "decode_tc"}
            if self.use_cuda_graph:
                assert meta is not None
                kwargs.update(use_cuda_graph=True, paged_kv_indptr_buffer=meta.indptr,
                              paged_kv_indices_buffer=meta.indices, paged_kv_last_page_len_buffer=meta.last_page_len)
        if _accepts_keyword(cls.__init__, "backend"):
            kwargs["backend"] = backend
        wrapper = cls(workspace_buffer(self.device), KV_LAYOUT, **kwargs)
        _log.debug("FlashInfer %s wrapper on %s (%s)", kernel, self.device, kwargs.get("backend", "default"))
        self._wrappers[(kernel, backend)] = wrapper
        return wrapper

    def __repr__(self) -> str:
        mode = "graph" if self.use_cuda_graph else "eager"
        return f"FlashInferBackend({self.device}, {mode}, kernel={self.kernel})"
