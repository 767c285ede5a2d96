"""FlashInfer attention backend: one ``plan`` per forward, one ``run`` per layer, on the pool's
paged CSR.

FlashInfer is imported lazily (:func:`import_flashinfer`), never when this module is: ``import
smile_llm.attention`` works on machines without it, and no wrapper is constructed unless the device
is CUDA and ``torch.cuda.is_available()`` (without a driver FlashInfer's constructors fail on their
pinned host buffer).

Kernel per ``plan``::

    qo_indptr None  -> BatchDecodeWithPagedKVCacheWrapper
                       tensor cores when Hq/Hkv >= 4 or the KV is FP8 (SGLang)
    qo_indptr given -> BatchPrefillWithPagedKVCacheWrapper
                       ragged prefill and verify windows; bottom-right causal,
                       or a token tree's ``custom_mask`` (always on fa2)
    beyond the kernels' limits (``flashinfer_limits.kernel_limit``: float32, a head dim
    other than 64/128/256, ...)
                    -> the torch backend; never in CUDA-graph mode (ValueError naming the limit)

The kernels' limits and the choice of kernel family ("fa3" for prefill on Hopper where it can
serve, "fa2" elsewhere) are in ``flashinfer_limits``; ``kernel_backend=`` forces the family of the
prefill plans without a custom mask.

Devices: ``plan`` hands FlashInfer ``qo_indptr``, ``paged_kv_indptr`` and ``paged_kv_last_page_len``
on one device (the CSR's): with a custom mask FlashInfer does arithmetic on all three
(``_compute_page_mask_indptr``).

CUDA graphs: a graph-mode backend serves one captured shape. Its wrapper's fixed buffers *are* the
pool's graph CSR (``decode_graph_metadata(batch)``: ``indices`` over-provisioned for every row
length) and ``verify_qo_indptr(batch, window_len)``. FlashInfer's graph-mode ``plan`` copies the
CSR it is given into those buffers, so ``plan`` refuses any CSR but the bound one (another would
silently overwrite the pool's live CSR). ``plan`` reads the CSR's host mirrors
(:class:`GraphStepCsr`) and hands FlashInfer host ``indptr``/``last_page_len``, so neither this
module nor FlashInfer reads the device; it must run outside capture before every replay. ``run``
does no host work and is captured: what it passes as scalars (``k_scale``, ``v_scale``, the softmax
scale) is frozen into the graph.

FlashInfer API used (flashinfer-python 0.2 .. 0.7.4; optional arguments go by keyword, which every
version accepts and 0.6.18+ asks for; ``backend=`` only where the constructor has it)::

    BatchDecodeWithPagedKVCacheWrapper(float_workspace_buffer, kv_layout, use_cuda_graph=,
        use_tensor_cores=, paged_kv_indptr_buffer=, paged_kv_indices_buffer=,
        paged_kv_last_page_len_buffer=, backend=)
    .plan(indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size, *,
          logits_soft_cap=, q_data_type=, kv_data_type=, sm_scale=)
    BatchPrefillWithPagedKVCacheWrapper(float_workspace_buffer, kv_layout, use_cuda_graph=,
        qo_indptr_buf=, paged_kv_indptr_buf=, paged_kv_indices_buf=,
        paged_kv_last_page_len_buf=, backend=)
    .plan(qo_indptr, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len, num_qo_heads,
          num_kv_heads, head_dim, page_size, *, causal=, sm_scale=, logits_soft_cap=,
          q_data_type=, kv_data_type=,
          uniform_q_len=)   # uniform_q_len only where the installed version's plan has it
    .run(q, (k_cache, v_cache), k_scale=, v_scale=, return_lse=)
        # sm_scale *= k_scale; out *= v_scale; LSE base 2
"""

from __future__ import annotations

import functools
import inspect
import logging
import threading
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, overload

import numpy as np
import torch

from ..cache.graph_buffers import GraphStepCsr
from ..cache.metadata import FlashInferKvMetadata
from .flashinfer_limits import (
    KERNEL_FAMILIES,
    KERNELS,
    decode_kernel,
    default_kernel_backend,
    kernel_limit,
)

if TYPE_CHECKING:
    from ..cache.pool import KvCachePool

_log = logging.getLogger(__name__)

INSTALL_HINT = ("FlashInfer is not installed: on a machine with a CUDA GPU run `pip install -e "
                "'.[gpu]'` in the smile-llm checkout (or `pip install flashinfer-python`); "
                "select_backend(device, prefer='reference') needs nothing extra")

WORKSPACE_BYTES = 128 * 1024 * 1024  # FlashInfer's recommended float workspace
KV_LAYOUT = "NHD"  # the pool's per-layer view [num_pages, page_size, Hkv, D]


def import_flashinfer() -> types.ModuleType:
    """The ``flashinfer`` module. Raises ImportError with the install hint when it is missing, and
    ImportError with the cause when an installed build fails to import (CUDA or torch mismatch;
    FlashInfer issues 3262 and 4143)."""
    try:
        import flashinfer
    except ImportError as exc:
        raise ImportError(INSTALL_HINT) from exc
    except Exception as exc:  # a broken install raises anything at import
        raise ImportError(f"flashinfer is installed but failed to import ({type(exc).__name__}: "
                          f"{exc}); install the flashinfer-python build that matches torch "
                          f"{torch.__version__}") from exc
    return flashinfer


def flashinfer_available() -> bool:
    """Whether :func:`import_flashinfer` succeeds (imports FlashInfer if it is installed)."""
    try:
        import_flashinfer()
    except ImportError:
        return False
    return True


def rows_without_keys(kv_lens: np.ndarray, qo_indptr: np.ndarray | None,
                      causal: bool) -> np.ndarray:
    """Global query rows that see no key (``int64``): every query of a row with no KV and, under
    the bottom-right causal mask, the first ``qo_len - kv_len`` queries of a row whose window is
    longer than its KV. FlashInfer leaves them undefined (NaN: SGLang #1571, vLLM #38436); the
    backend writes output 0 and LSE -inf there, as the reference defines them. ``qo_indptr`` None
    means decode (one query per row)."""
    kv = np.asarray(kv_lens, dtype=np.int64)
    if qo_indptr is None:
        return np.flatnonzero(kv == 0).astype(np.int64)
    qo = np.asarray(qo_indptr, dtype=np.int64)
    qo_len = np.diff(qo)
    blind = np.where(kv == 0, qo_len, np.clip(qo_len - kv, 0, None) if causal else 0)
    total = int(blind.sum())
    if total == 0:
        return np.empty(0, dtype=np.int64)
    first = np.cumsum(blind) - blind  # offset of each row's first blind query among all of them
    return np.repeat(qo[:-1], blind) + np.arange(total) - np.repeat(first, blind)


# ---------------------------------------------------------------------------------------- workspace
_workspace_lock = threading.Lock()
_workspaces: dict[torch.device, torch.Tensor] = {}


def _canonical(device: str | torch.device) -> torch.device:
    device = torch.device(device)
    if device.type == "cuda" and device.index is None and torch.cuda.is_available():
        device = torch.device("cuda", torch.cuda.current_device())
    return device


def workspace_buffer(device: str | torch.device) -> torch.Tensor:
    """The float workspace every FlashInfer wrapper on ``device`` shares: ``WORKSPACE_BYTES`` of
    uint8, zeroed at creation (FlashInfer requires zero on first use), made once per device.
    Wrappers sharing it run on one stream, one kernel at a time (as SGLang's do); each wrapper keeps
    its own int workspace for its plan."""
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


def _check_cuda_device(device: torch.device) -> None:
    if device.type != "cuda" or not torch.cuda.is_available():
        raise RuntimeError(f"FlashInferBackend needs a CUDA device; got {device} "
                           f"(torch.cuda.is_available() = {torch.cuda.is_available()}). "
                           f"select_backend(device) picks the reference off CUDA")


@functools.cache
def _accepts_keyword(fn: Callable[..., object], name: str) -> bool:
    try:
        return name in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def _as_positive_int(value: object, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return int(value)


def _host_kv_lens(meta: FlashInferKvMetadata) -> np.ndarray:
    """Host ``int64[B]`` token count of each row, after checking the CSR: from a
    :class:`GraphStepCsr`'s host mirrors, else with one device-to-host copy. ValueError on a
    malformed CSR: FlashInfer checks none of it (``last_page_len > page_size`` is accepted,
    FlashInfer #320)."""
    meta.check_types()
    batch = int(meta.last_page_len.shape[0])
    if meta.indptr.shape[0] != batch + 1:
        raise ValueError(f"indptr has {meta.indptr.shape[0]} entries for {batch} rows; it needs "
                         f"B + 1")
    if meta.indices.device != meta.indptr.device or meta.last_page_len.device != meta.indptr.device:
        raise ValueError("indptr, indices and last_page_len must be on one device")
    if isinstance(meta, GraphStepCsr):
        indptr = meta.host_indptr.astype(np.int64)
        last = meta.host_last_page_len.astype(np.int64)
    else:
        host = torch.cat((meta.indptr, meta.last_page_len)).cpu().numpy().astype(np.int64)
        indptr, last = host[: batch + 1], host[batch + 1:]
    pages = meta.check_rows(indptr, last)
    return np.where(pages > 0, (pages - 1) * meta.page_size + last, 0)


def _host_qo_indptr(qo_indptr: object, batch: int) -> np.ndarray:
    if (not isinstance(qo_indptr, torch.Tensor) or qo_indptr.dim() != 1
            or qo_indptr.dtype == torch.bool or qo_indptr.dtype.is_floating_point
            or qo_indptr.dtype.is_complex):
        raise ValueError(f"qo_indptr must be a 1-D integer tensor, got "
                         f"{getattr(qo_indptr, 'dtype', type(qo_indptr))}")
    qo = qo_indptr.cpu().numpy().astype(np.int64)
    if len(qo) != batch + 1 or qo[0] != 0 or (np.diff(qo) < 0).any():
        raise ValueError(f"qo_indptr must hold B + 1 = {batch + 1} non-decreasing offsets from 0, "
                         f"got {qo.tolist()}")
    return qo


def _paged_view(layer: torch.Tensor, page_size: int, num_kv_heads: int, head_dim: int,
                name: str) -> torch.Tensor:
    """``[num_pages, page_size, Hkv, D]`` view of one layer, given as that or as the pool's
    ``[num_slots, Hkv, D]``."""
    if not isinstance(layer, torch.Tensor):
        raise ValueError(f"{name} must be a tensor, got {type(layer).__name__}")
    shape = tuple(layer.shape)
    if layer.dim() == 3 and shape[1:] == (num_kv_heads, head_dim) and shape[0] % page_size == 0:
        return layer.view(-1, page_size, num_kv_heads, head_dim)
    if layer.dim() == 4 and shape[1:] == (page_size, num_kv_heads, head_dim):
        return layer
    raise ValueError(f"{name} has shape {shape}; expected [num_pages, {page_size}, {num_kv_heads}, "
                     f"{head_dim}] or [num_slots, {num_kv_heads}, {head_dim}] with num_slots a "
                     f"multiple of {page_size}")


def _plan_csr(meta: FlashInferKvMetadata) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(indptr, indices, last_page_len)`` to hand FlashInfer's ``plan``: for a
    :class:`GraphStepCsr` its host ``indptr``/``last_page_len`` (FlashInfer reads them on the host,
    so no device read) and the used leading ``indices`` (a view: FlashInfer's copy onto the fixed
    buffer is then a no-op); else the CSR's own tensors."""
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
    zero_rows: torch.Tensor | None  # int64[n] on the device: rows set to 0 / -inf after the kernel
    wrapper: Any  # the FlashInfer wrapper planned for ``kernel`` (untyped), or a TorchBackend


class FlashInferBackend:
    """FlashInfer's paged decode and prefill kernels behind the :class:`AttentionBackend` protocol.

    ``FlashInferBackend(device)`` is the eager backend: one lazily made wrapper per kernel, shared
    by every forward. ``use_cuda_graph=True`` with ``fixed_meta`` (and ``fixed_qo_indptr`` for a
    verify window) makes a graph-mode backend for one captured shape; :meth:`for_decode_graph` and
    :meth:`for_verify_graph` build it from a pool. Graph mode: call ``plan`` outside capture before
    capturing and before every replay, always with the bound CSR (ValueError for any other:
    FlashInfer would copy it over the fixed buffers); capture ``run``; a later ``plan`` with another
    shape, dtype or option raises ValueError (build another backend). When the pool's graph CSR
    moves (``consume_verify_graph_meta_realloc()``; ``is_bound_to`` turns False), drop the graph
    and this backend.

    ``use_tensor_cores`` (decode) None means SGLang's rule: Hq/Hkv >= 4 or FP8 KV.
    ``kernel_backend`` is FlashInfer's ``backend`` argument for the prefill plans without a custom
    mask, "fa2" or "fa3" (ValueError otherwise); None chooses by compute capability
    (:func:`default_kernel_backend`); decode and custom-mask plans always take fa2. A plan beyond
    the kernels' limits (:func:`kernel_limit`) runs on the torch backend in eager mode and is a
    ValueError in graph mode."""

    name = "flashinfer"

    def __init__(self, device: str | torch.device, *, use_cuda_graph: bool = False,
                 fixed_meta: FlashInferKvMetadata | None = None,
                 fixed_qo_indptr: torch.Tensor | None = None,
                 use_tensor_cores: bool | None = None, kernel_backend: str | None = None) -> None:
        device = torch.device(device)
        _check_cuda_device(device)
        self.device = _canonical(device)
        self.use_cuda_graph = bool(use_cuda_graph)
        self.use_tensor_cores = use_tensor_cores
        if kernel_backend is not None and kernel_backend not in KERNEL_FAMILIES:
            raise ValueError(f"kernel_backend must be None or one of {KERNEL_FAMILIES}, got "
                             f"{kernel_backend!r}")
        self.kernel_backend = kernel_backend
        # host copy of fixed_qo_indptr (the pool never rewrites it)
        self._fixed_qo_host: np.ndarray | None = None
        if self.use_cuda_graph:
            if fixed_meta is None:
                raise ValueError("use_cuda_graph=True needs fixed_meta: the pool's fixed-address "
                                 "CSR (decode: pool.decode_graph_metadata(batch); verify: "
                                 "pool.verify_graph_metadata())")
            _host_kv_lens(fixed_meta)  # well formed
            for name in ("indptr", "indices", "last_page_len"):
                if getattr(fixed_meta, name).device != self.device:
                    raise ValueError(f"fixed_meta.{name} is on {getattr(fixed_meta, name).device}, "
                                     f"not {self.device}")
            if fixed_qo_indptr is not None:
                self._fixed_qo_host = _host_qo_indptr(fixed_qo_indptr, fixed_meta.batch_size)
                if fixed_qo_indptr.device != self.device:
                    raise ValueError(f"fixed_qo_indptr is on {fixed_qo_indptr.device}, not "
                                     f"{self.device}")
        elif fixed_meta is not None or fixed_qo_indptr is not None:
            raise ValueError("fixed_meta / fixed_qo_indptr are CUDA-graph buffers; pass "
                             "use_cuda_graph=True")
        self.fixed_meta = fixed_meta
        self.fixed_qo_indptr = fixed_qo_indptr
        self._capability = compute_capability(self.device)
        # FlashInfer's (untyped) wrappers by (kernel, family); TorchBackend by ("reference", None)
        self._wrappers: dict[tuple[str, str | None], Any] = {}
        self._plan: _Plan | None = None
        self._graph_key: tuple[object, ...] | None = None

    # ------------------------------------------------------------------ graph-mode factories
    @classmethod
    def for_decode_graph(cls, pool: KvCachePool, batch: int, *,
                         use_tensor_cores: bool | None = None,
                         kernel_backend: str | None = None) -> FlashInferBackend:
        """Graph-mode decode backend on the pool's graph CSR of ``batch`` rows
        (``decode_graph_metadata(batch)``): valid for every row length until the pool's graph CSR
        moves."""
        return cls(pool.device, use_cuda_graph=True, fixed_meta=pool.decode_graph_metadata(batch),
                   use_tensor_cores=use_tensor_cores, kernel_backend=kernel_backend)

    @classmethod
    def for_verify_graph(cls, pool: KvCachePool, batch: int, window_len: int, *,
                         use_tensor_cores: bool | None = None,
                         kernel_backend: str | None = None) -> FlashInferBackend:
        """Graph-mode verify backend on the pool's graph CSR of ``batch`` rows and
        ``verify_qo_indptr(batch, window_len)``: valid for every row length until the pool's graph
        CSR moves."""
        return cls(pool.device, use_cuda_graph=True, fixed_meta=pool.decode_graph_metadata(batch),
                   fixed_qo_indptr=pool.verify_qo_indptr(batch, window_len),
                   use_tensor_cores=use_tensor_cores, kernel_backend=kernel_backend)

    def is_bound_to(self, meta: FlashInferKvMetadata) -> bool:
        """Whether ``meta`` is the CSR this graph-mode backend's wrapper reads (same tensors)."""
        fixed = self.fixed_meta
        return fixed is not None and all(
            getattr(meta, n).data_ptr() == getattr(fixed, n).data_ptr()
            and getattr(meta, n).shape == getattr(fixed, n).shape
            for n in ("indptr", "indices", "last_page_len"))

    @property
    def kernel(self) -> str | None:
        """The kernel the last ``plan`` chose: "decode", "decode_tc", "prefill" or "reference"
        (None before)."""
        return None if self._plan is None else self._plan.kernel

    # ------------------------------------------------------------------ protocol
    def plan(self, meta: FlashInferKvMetadata, *, num_qo_heads: int, num_kv_heads: int,
             head_dim: int, qo_indptr: torch.Tensor | None = None, causal: bool = True,
             sm_scale: float | None = None, logits_soft_cap: float | None = None,
             q_dtype: torch.dtype = torch.float32, kv_dtype: torch.dtype = torch.float32,
             custom_mask: torch.Tensor | None = None) -> None:
        """Plan the kernel for one forward; every layer's ``run`` shares it. Decode when
        ``qo_indptr`` is None (one query per row); otherwise ragged prefill / verify with
        ``qo_indptr`` ``[B+1]`` (an integer tensor; int32 is used as is) and the bottom-right causal
        mask when ``causal``, or ``custom_mask`` (FlashInfer's prefill ``custom_mask``: each row's
        ``[qo_len, kv_len]`` block, row-major, concatenated; a token-tree window, planned on fa2).
        Reads the CSR on the host: never call it inside CUDA-graph capture. A plan beyond the
        kernels' limits (:func:`kernel_limit`) runs on the torch backend. ValueError on a malformed
        CSR, a head count that is not a multiple, or (graph mode) a shape other than the captured
        one or one beyond the kernels' limits."""
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
            raise ValueError("this CUDA-graph backend was built for decode (no fixed_qo_indptr): "
                             "qo_indptr must be None")
        if self.use_cuda_graph:
            if not self.is_bound_to(meta):
                raise ValueError("this CUDA-graph backend reads the pool's fixed graph CSR; plan "
                                 "it with that CSR (pool.decode_graph_metadata(batch)): FlashInfer "
                                 "would copy another one over it")
            if qo_indptr is not None and self.fixed_qo_indptr is not None and (
                    qo_indptr.data_ptr() != self.fixed_qo_indptr.data_ptr()
                    or qo_indptr.shape != self.fixed_qo_indptr.shape):
                raise ValueError("this CUDA-graph backend reads its fixed qo_indptr "
                                 "(pool.verify_qo_indptr(batch, window_len)); pass that one or "
                                 "None")

        if custom_mask is not None:
            if qo_indptr is None or self.use_cuda_graph:
                raise ValueError("custom_mask needs qo_indptr and an eager (not CUDA-graph) "
                                 "backend")
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

        if qo_indptr is not None:
            kernel = "prefill"
        else:
            kernel = decode_kernel(hq // hkv, kv_dtype, self.use_tensor_cores)
        masked = custom_mask is not None
        family = self._kernel_backend(kernel, q_dtype, kv_dtype, d, masked)
        limit = kernel_limit(kernel, family, head_dim=d, group=hq // hkv, q_dtype=q_dtype,
                             kv_dtype=kv_dtype, custom_mask=masked)
        if limit is not None:
            if self.use_cuda_graph:
                raise ValueError(f"FlashInfer cannot serve this plan: {limit}; graph mode cannot "
                                 f"fall back to the reference")
            kernel = "reference"
        if self.use_cuda_graph:
            if len(blind):
                raise ValueError(f"query rows {blind[:8].tolist()} see no key (empty rows, or "
                                 f"windows longer than their KV); a captured graph cannot fix "
                                 f"them up: point padding rows at a scratch slot with kv_len >= 1 "
                                 f"as the pool's graph steps do")
            key = (kernel, hq, hkv, d, meta.page_size, batch, total_q, bool(causal), scale, cap,
                   q_dtype, kv_dtype)
            if self._graph_key is not None and key != self._graph_key:
                raise ValueError(f"this CUDA-graph backend serves (kernel, Hq, Hkv, D, page_size, "
                                 f"batch, total_q, causal, sm_scale, soft_cap, q_dtype, kv_dtype) "
                                 f"= {self._graph_key}; got {key}; build another backend for "
                                 f"another shape")
            self._graph_key = key

        wrapper: Any  # the FlashInfer wrapper planned for ``kernel``, or a planned TorchBackend
        if kernel in KERNELS:
            wrapper = self._wrapper(kernel, family)
            indptr, indices, last = _plan_csr(meta)
            if kernel == "prefill":
                assert qo_host is not None
                extra: dict[str, int | torch.Tensor] = {}
                qo_lens = np.diff(qo_host)
                if len(qo_lens) and (qo_lens == qo_lens[0]).all() and _accepts_keyword(
                        type(wrapper).plan, "uniform_q_len"):
                    extra["uniform_q_len"] = int(qo_lens[0])
                # on the device of the CSR's indptr and last_page_len: a custom mask's plan does
                # arithmetic on all three (FlashInfer's _compute_page_mask_indptr)
                qo_arg = torch.from_numpy(qo_host.astype(np.int32)).to(indptr.device)
                if custom_mask is not None:
                    extra["custom_mask"] = custom_mask.to(self.device, torch.bool)
                    extra.pop("uniform_q_len", None)
                wrapper.plan(qo_arg, indptr, indices, last, hq, hkv, d, meta.page_size,
                             causal=bool(causal), sm_scale=scale, logits_soft_cap=cap,
                             q_data_type=q_dtype, kv_data_type=kv_dtype, **extra)
            else:
                wrapper.plan(indptr, indices, last, hq, hkv, d, meta.page_size,
                             logits_soft_cap=cap, q_data_type=q_dtype, kv_data_type=kv_dtype,
                             sm_scale=scale)
        else:  # the torch backend, planned once per forward like a kernel
            wrapper = self._wrappers.get((kernel, None))
            if wrapper is None:
                from .torch.backend import TorchBackend

                wrapper = self._wrappers[(kernel, None)] = TorchBackend()
            wrapper.plan(meta, num_qo_heads=hq, num_kv_heads=hkv, head_dim=d, qo_indptr=qo_indptr,
                         causal=causal, sm_scale=scale, logits_soft_cap=cap, q_dtype=q_dtype,
                         kv_dtype=kv_dtype, custom_mask=custom_mask)
        zero_rows = None
        if len(blind) and kernel != "reference":
            zero_rows = torch.from_numpy(blind).to(self.device)
        self._plan = _Plan(kernel, meta, qo_indptr, hq, hkv, d, total_q, bool(causal), scale, cap,
                           q_dtype, kv_dtype, zero_rows, wrapper)

    @overload
    def run(self, q: torch.Tensor, k_layer: torch.Tensor, v_layer: torch.Tensor, *,
            k_scale: float = ..., v_scale: float = ...,
            return_lse: Literal[False] = ...) -> torch.Tensor: ...
    @overload
    def run(self, q: torch.Tensor, k_layer: torch.Tensor, v_layer: torch.Tensor, *,
            k_scale: float = ..., v_scale: float = ...,
            return_lse: Literal[True]) -> tuple[torch.Tensor, torch.Tensor]: ...
    @overload
    def run(self, q: torch.Tensor, k_layer: torch.Tensor, v_layer: torch.Tensor, *,
            k_scale: float = ..., v_scale: float = ...,
            return_lse: bool = ...) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]: ...
    def run(self, q: torch.Tensor, k_layer: torch.Tensor, v_layer: torch.Tensor, *,
            k_scale: float = 1.0, v_scale: float = 1.0,
            return_lse: bool = False) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Attention of ``q`` ``[total_q, Hq, D]`` over one layer's cache
        (``[num_pages, page_size, Hkv, D]`` or the pool's ``[num_slots, Hkv, D]``) with the last
        plan. Returns ``[total_q, Hq, D]`` in q's dtype, or ``(out, lse)`` with a base-2 LSE
        ``[total_q, Hq]``. FP8 KV: pass ``pool.k_scale``/``pool.v_scale``. No host work:
        capturable in a CUDA graph. RuntimeError before ``plan``; ValueError on shapes or dtypes
        the plan does not cover."""
        plan = self._plan
        if plan is None:
            raise RuntimeError("FlashInferBackend.run before plan(): plan once per forward, then "
                               "run per layer")
        want = (plan.total_q, plan.num_qo_heads, plan.head_dim)
        if not isinstance(q, torch.Tensor) or tuple(q.shape) != want:
            raise ValueError(f"q must be [total_q, Hq, D] = {list(want)}, got "
                             f"{list(getattr(q, 'shape', []))}")
        if q.dtype != plan.q_dtype:
            raise ValueError(f"q is {q.dtype} but the plan is for {plan.q_dtype}")
        if plan.kernel == "reference":
            return plan.wrapper.run(q, k_layer, v_layer, k_scale=k_scale, v_scale=v_scale,
                                    return_lse=return_lse)
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
                                  v_scale=None if v_scale == 1.0 else float(v_scale),
                                  return_lse=bool(return_lse))
        if plan.zero_rows is not None:
            out = result[0] if return_lse else result
            out.index_fill_(0, plan.zero_rows, 0.0)
            if return_lse:
                result[1].index_fill_(0, plan.zero_rows, float("-inf"))
        return result

    # ------------------------------------------------------------------ wrappers
    def _kernel_backend(self, kernel: str, q_dtype: torch.dtype, kv_dtype: torch.dtype,
                        head_dim: int, custom_mask: bool) -> str:
        """The kernel family of a plan: fa2 for decode and for a custom mask (fa3 has none), else
        the forced one, else :func:`default_kernel_backend`."""
        if custom_mask or kernel != "prefill":
            return "fa2"
        if self.kernel_backend is not None:
            return self.kernel_backend
        return default_kernel_backend(kernel, self._capability, q_dtype, kv_dtype, head_dim)

    def _wrapper(self, kernel: str, backend: str) -> Any:
        """The FlashInfer wrapper for ``kernel`` on kernel family ``backend``, made on first use
        (graph mode: on the fixed buffers). FlashInfer is untyped: so is its wrapper."""
        wrapper = self._wrappers.get((kernel, backend))
        if wrapper is not None:
            return wrapper
        fi = import_flashinfer()
        meta = self.fixed_meta
        kwargs: dict[str, object]
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
                              paged_kv_indices_buffer=meta.indices,
                              paged_kv_last_page_len_buffer=meta.last_page_len)
        if _accepts_keyword(cls.__init__, "backend"):
            kwargs["backend"] = backend
        wrapper = cls(workspace_buffer(self.device), KV_LAYOUT, **kwargs)
        _log.debug("FlashInfer %s wrapper on %s (%s)", kernel, self.device,
                   kwargs.get("backend", "default"))
        self._wrappers[(kernel, backend)] = wrapper
        return wrapper

    def __repr__(self) -> str:
        mode = "graph" if self.use_cuda_graph else "eager"
        return f"FlashInferBackend({self.device}, {mode}, kernel={self.kernel})"
