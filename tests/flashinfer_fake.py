"""A strict stand-in for the ``flashinfer`` module, for CPU tests of the FlashInfer backend and the CUDA-graph runners,
and a simulated CUDA device to run it on.

Its wrappers have the signatures of flashinfer-python 0.6.18 / 0.7.x (optional plan arguments keyword-only) and behave
as the real ones do where our code could go wrong:

- graph mode needs the fixed buffers, on the workspace's device; their sizes fix the batch
  (``len(last_page_len_buffer)``, ``indptr`` one longer); ``plan`` raises for another batch, for ``indices`` longer
  than the buffer, or (prefill) for more query rows than the first plan had, and *copies* the CSR it is given into
  the fixed buffers; eager mode moves it to the wrapper's device (``.to``: binds to it when it is there already);
- devices: a custom mask's ``plan`` does FlashInfer's arithmetic on ``qo_indptr``, ``paged_kv_indptr`` and
  ``paged_kv_last_page_len`` (``_compute_page_mask_indptr``: one device for all three) and packs the mask on the
  wrapper's device; ``run`` needs ``q`` and the paged KV on the wrapper's device;
- the kernels' limits (``smile_llm/attention/flashinfer.py`` lists where FlashInfer sets each), refused where and as
  the real library refuses them: a fa2 prefill or tensor-core decode at a head dim under 64 or not a multiple of 16
  raises "Invalid configuration" at ``run``; fa3 builds head dims 64, 128 and 256 only (``plan``), has no mixed
  query/KV dtypes (``plan``) and no custom mask (``run``: cudaErrorNotSupported); fa2 has no FP8 queries (``plan``);
  the CUDA-core decode builds only head dims whose lanes per head hold its two pipeline stages (``plan``) and serves
  1, 2, 3, 4, 6 or 8 query heads per KV head (``run``); queries of another dtype than fp16/bf16, or KV of another
  dtype than the query's or FP8, are refused at ``run`` (FlashInfer's kernels would reinterpret their bits);
- ``run`` checks q's shape and dtype and the KV dtype against the plan, and that the CSR still says what ``plan``
  read (a real kernel would run the old schedule over new buffers: plan before every replay);
- ``run`` computes real attention with the pure-PyTorch reference over the CSR the kernel reads (the fixed buffers
  in graph mode), with ``k_scale``/``v_scale`` applied; rows that see no key come out NaN (undefined in FlashInfer);
- scalars passed to ``run`` (softmax scale, ``k_scale``, ``v_scale``, soft cap) are frozen by a capture:
  :class:`FakeGraphCapture` records them while capturing and replays with the recorded ones, as a CUDA graph does.

Every wrapper made is listed in ``FakeFlashInfer.wrappers`` with its constructor arguments, plans and runs.

:func:`simulate_cuda` makes ``cuda:0`` exist on the CPU (:class:`SimulatedCuda`): tensors put there are
:class:`OnDevice` CPU tensors that report ``cuda:0``, an operation mixing them with host tensors (other than
0-dim ones, copies and indices) raises PyTorch's "Expected all tensors to be on the same device" error, and
``.numpy()`` of one raises as for a real CUDA tensor; so a host tensor handed where FlashInfer needs a device one
fails on the CPU as it would on a GPU.
"""

from __future__ import annotations

import collections
import sys
import types
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from torch.overrides import TorchFunctionMode

import smile_llm.attention.flashinfer as fi_backend
from smile_llm.attention.torch.backend import paged_attention
from smile_llm.cache.metadata import FlashInferKvMetadata
from smile_llm.models.transformer import ForwardOutput

HALF = (torch.float16, torch.bfloat16)
FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)
FA3_HEAD_DIMS = (64, 128, 256)  # attention/hopper/prefill_sm90.cuh: static_assert(HEAD_DIM_VO == 64 || 128 || 256)
DECODE_GROUPS = (1, 2, 3, 4, 6, 8)  # DISPATCH_GQA_GROUP_SIZE, include/flashinfer/utils.cuh
DECODE_STAGES = 2  # decode.cuh: static_assert(num_stages_smem <= bdx), 2 stages on sm_80+


class FakeFlashInfer:
    """Shared state of the stand-in: the wrappers made, and the tape of a capture being recorded or replayed."""

    wrappers: list[Any] = []
    recording: list[tuple[Any, tuple[Any, ...]]] | None = None
    replaying: collections.deque[tuple[Any, tuple[Any, ...]]] | None = None

    @classmethod
    def reset(cls) -> None:
        cls.wrappers, cls.recording, cls.replaying = [], None, None


def _dtype(value: Any) -> torch.dtype:
    return getattr(torch, value) if isinstance(value, str) else value


def _int32_vector(t: Any, name: str) -> torch.Tensor:
    if not isinstance(t, torch.Tensor) or t.dtype != torch.int32 or t.dim() != 1:
        raise ValueError(f"{name} must be a 1-D int32 tensor, got {getattr(t, 'dtype', type(t).__name__)}")
    return t


def _compute_page_mask_indptr(qo_indptr: torch.Tensor, paged_kv_indptr: torch.Tensor,
                              paged_kv_last_page_len: torch.Tensor, page_size: int) -> torch.Tensor:
    """FlashInfer's own (prefill.py, 0.6.18 and 0.7.4): arithmetic on all three, so they must share a device."""
    if len(qo_indptr) != len(paged_kv_indptr):
        raise ValueError("The length of qo_indptr and paged_kv_indptr should be the same.")
    mask_indptr = torch.empty_like(qo_indptr)
    mask_indptr[0] = 0
    mask_indptr[1:] = torch.cumsum((qo_indptr[1:] - qo_indptr[:-1])
                                   * ((paged_kv_indptr[1:] - paged_kv_indptr[:-1] - 1) * page_size
                                      + paged_kv_last_page_len), 0)
    return mask_indptr


def _invalid_configuration(head_dim: int) -> RuntimeError:
    # prefill.cuh, KernelTraits::IsInvalid: NUM_MMA_D_VO = head_dim / 16 < 4
    return RuntimeError(f"FlashInfer Internal Error: Invalid configuration : NUM_MMA_Q=1 NUM_MMA_D_QK={head_dim // 16} "
                        f"NUM_MMA_D_VO={head_dim // 16} NUM_MMA_KV=1 NUM_WARPS_Q=4 NUM_WARPS_KV=1 please create an "
                        f"issue (https://github.com/flashinfer-ai/flashinfer/issues) and report the issue to the "
                        f"developers.")


class FakeDecode:
    """BatchDecodeWithPagedKVCacheWrapper."""

    def __init__(self, float_workspace_buffer: torch.Tensor, kv_layout: str = "NHD", use_cuda_graph: bool = False,
                 use_tensor_cores: bool = False, paged_kv_indptr_buffer: torch.Tensor | None = None,
                 paged_kv_indices_buffer: torch.Tensor | None = None,
                 paged_kv_last_page_len_buffer: torch.Tensor | None = None, backend: str = "auto",
                 jit_args: Any = None) -> None:
        if float_workspace_buffer.dtype != torch.uint8:
            raise ValueError("the float workspace is a uint8 buffer")
        if kv_layout not in ("NHD", "HND"):
            raise KeyError(kv_layout)
        self.device = float_workspace_buffer.device
        self.init: dict[str, Any] = {
            "workspace": float_workspace_buffer, "kv_layout": kv_layout, "use_cuda_graph": use_cuda_graph,
            "use_tensor_cores": use_tensor_cores, "indptr": paged_kv_indptr_buffer, "indices": paged_kv_indices_buffer,
            "last": paged_kv_last_page_len_buffer, "backend": backend}
        self.fixed_batch = 0
        if use_cuda_graph:
            for name in ("indptr", "indices", "last"):
                if self.init[name] is None:
                    raise ValueError(f"CUDA-graph mode needs the paged_kv_{name} buffer")
                self._on_device(_int32_vector(self.init[name], name), f"the paged_kv_{name} buffer")
            self.fixed_batch = len(paged_kv_last_page_len_buffer)  # type: ignore[arg-type]
            if len(paged_kv_indptr_buffer) != self.fixed_batch + 1:  # type: ignore[arg-type]
                raise ValueError("The length of paged_kv_indptr_buffer should be batch_size + 1")
        self._indptr, self._indices, self._last = paged_kv_indptr_buffer, paged_kv_indices_buffer, \
            paged_kv_last_page_len_buffer
        self._qo: torch.Tensor | None = None
        self.plans: list[dict[str, Any]] = []
        self.runs: list[dict[str, Any]] = []
        self._snapshot: tuple[list[int], list[int], list[int]] | None = None
        FakeFlashInfer.wrappers.append(self)

    def _on_device(self, t: torch.Tensor, name: str) -> None:
        if t.device != self.device:
            raise RuntimeError(f"Expected all tensors to be on the same device, but found at least two devices, "
                               f"{self.device} and {t.device}! ({name})")

    @property
    def _kernel(self) -> str:
        return "decode_tc" if self.init["use_tensor_cores"] else "decode"

    # ------------------------------------------------------------------ plan
    def _bind(self, indptr: torch.Tensor, indices: torch.Tensor, last: torch.Tensor) -> None:
        if self.init["use_cuda_graph"]:
            batch = len(indptr) - 1
            if batch != self.fixed_batch:
                raise ValueError(f"The batch size should be fixed in cudagraph mode, the runtime batch size {batch} "
                                 f"mismatches the batch size {self.fixed_batch} set during initialization.")
            if len(indices) > len(self._indices):  # type: ignore[arg-type]
                raise ValueError("The size of indices should be less than or equal to the allocated buffer")
            self._indptr.copy_(indptr)  # type: ignore[union-attr]
            self._indices[: len(indices)].copy_(indices)  # type: ignore[index]
            self._last.copy_(last)  # type: ignore[union-attr]
        else:  # FlashInfer's eager plan: .to(self.device), the same tensors when they are there already
            self._indptr, self._indices, self._last = (t.to(self.device) for t in (indptr, indices, last))

    def _read_plan(self) -> tuple[list[int], list[int], list[int]]:
        assert self._indptr is not None and self._indices is not None and self._last is not None, "plan first"
        indptr = self._indptr.cpu().tolist()
        return indptr, self._last.cpu().tolist(), self._indices[: indptr[-1]].cpu().tolist()

    def _build(self, q_data_type: torch.dtype, kv_data_type: torch.dtype, head_dim: int) -> None:
        """What FlashInfer's JIT refuses to build (at ``plan``)."""
        backend = self.init["backend"]
        if q_data_type in FP8 and (self._kernel != "decode" and backend != "fa3"):
            raise AssertionError("fp8 tensor core is not supported in fa2 backend")
        if self._kernel == "decode":  # decode.cuh: vec_size = max(16 / sizeof(KV), D / 32), bdx = D / vec_size
            bdx = head_dim // max(16 // kv_data_type.itemsize, head_dim // 32)
            if not DECODE_STAGES <= bdx <= 32:
                raise RuntimeError(f"Ninja build failed: decode.cuh: static_assert(num_stages_smem <= bdx) failed "
                                   f"(head_dim={head_dim}, bdx={bdx})")
        if backend == "fa3" and head_dim not in FA3_HEAD_DIMS:
            raise RuntimeError(f"Ninja build failed: prefill_sm90.cuh: static_assert(HEAD_DIM_VO == 64 || "
                               f"HEAD_DIM_VO == 128 || HEAD_DIM_VO == 256) failed (head_dim={head_dim})")

    def plan(self, indptr: torch.Tensor, indices: torch.Tensor, last_page_len: torch.Tensor, num_qo_heads: int,
             num_kv_heads: int, head_dim: int, page_size: int, *, pos_encoding_mode: str = "NONE",
             window_left: int = -1, logits_soft_cap: float | None = None, q_data_type: Any = "float16",
             kv_data_type: Any = None, sm_scale: float | None = None, non_blocking: bool = True,
             q_len_per_req: int = 1) -> None:
        for name, t in (("indptr", indptr), ("indices", indices), ("last_page_len", last_page_len)):
            _int32_vector(t, name)
        q_type, kv_type = _dtype(q_data_type), _dtype(kv_data_type or q_data_type)
        self._build(q_type, kv_type, head_dim)
        self._bind(indptr, indices, last_page_len)
        self._snapshot = self._read_plan()
        self.plans.append({"indptr": indptr, "indices": indices, "last": last_page_len,
                           "heads": (num_qo_heads, num_kv_heads), "head_dim": head_dim, "page_size": page_size,
                           "logits_soft_cap": logits_soft_cap, "q_data_type": q_type, "kv_data_type": kv_type,
                           "sm_scale": sm_scale, "qo_indptr": None, "causal": False})

    # ------------------------------------------------------------------ run
    def _dispatch(self, plan: dict[str, Any]) -> None:
        """What FlashInfer's kernels refuse when launched (at ``run``)."""
        hq, hkv = plan["heads"]
        d, q_type, kv_type = plan["head_dim"], plan["q_data_type"], plan["kv_data_type"]
        if q_type not in HALF or (kv_type != q_type and kv_type not in FP8):
            raise RuntimeError(f"FlashInfer has no kernel for {q_type} queries over {kv_type} KV")
        if self._kernel == "decode":
            if hq // hkv not in DECODE_GROUPS:
                raise RuntimeError(f"Unsupported group_size: {hq // hkv}")
        elif self.init["backend"] == "fa3":
            if plan.get("custom_mask") is not None:
                raise RuntimeError("BatchPrefillWithPagedKVCacheSM90Run failed with error: operation not supported "
                                   "(cudaErrorNotSupported: MaskMode::kCustom)")
        elif d % 16 or d < 64 or d > 512:
            raise _invalid_configuration(d)

    def run(self, q: torch.Tensor, paged_kv_cache: Any, *args: Any, q_scale: float | None = None,
            k_scale: float | None = None, v_scale: float | None = None, out: torch.Tensor | None = None,
            lse: torch.Tensor | None = None, return_lse: bool = False) -> Any:
        if not self.plans or self._snapshot is None:
            raise RuntimeError("run before plan")
        plan = self.plans[-1]
        k, v = paged_kv_cache
        for name, t in (("q", q), ("k_cache", k), ("v_cache", v)):
            self._on_device(t, name)
        hq, hkv = plan["heads"]
        total_q = int(self._qo[-1]) if self._qo is not None else len(self._last)  # type: ignore[arg-type]
        if tuple(q.shape) != (total_q, hq, plan["head_dim"]):
            raise ValueError(f"q shape {tuple(q.shape)} does not match the plan {(total_q, hq, plan['head_dim'])}")
        if q.dtype != plan["q_data_type"] or q.dtype not in HALF:
            raise ValueError(f"q dtype {q.dtype} does not match the plan's {plan['q_data_type']}")
        if k.dtype != plan["kv_data_type"] or v.dtype != plan["kv_data_type"]:
            raise ValueError(f"KV dtype {k.dtype} does not match the plan's {plan['kv_data_type']}")
        if tuple(k.shape[1:]) != (plan["page_size"], hkv, plan["head_dim"]) or k.shape != v.shape:
            raise ValueError(f"paged KV cache shape {tuple(k.shape)} does not match the plan")
        self._dispatch(plan)
        if self._read_plan() != self._snapshot:
            raise RuntimeError("the CSR changed since plan(): the kernel would run the planned schedule over it")
        frozen = (plan["sm_scale"], k_scale, v_scale, plan["logits_soft_cap"])
        if FakeFlashInfer.recording is not None:
            FakeFlashInfer.recording.append((self, frozen))
        elif FakeFlashInfer.replaying is not None:
            owner, frozen = FakeFlashInfer.replaying.popleft()
            assert owner is self, "a replay ran another wrapper than the capture recorded"
        sm_scale, k_scale, v_scale, cap = frozen
        self.runs.append({"q": q, "k": k, "v": v, "k_scale": k_scale, "v_scale": v_scale, "return_lse": return_lse})
        meta = FlashInferKvMetadata(self._indptr, self._indices, self._last, plan["page_size"])  # type: ignore[arg-type]
        o, s = paged_attention(q, k, v, meta, qo_indptr=self._qo, causal=plan["causal"], sm_scale=sm_scale,
                               logits_soft_cap=cap, k_scale=1.0 if k_scale is None else k_scale,
                               v_scale=1.0 if v_scale is None else v_scale, return_lse=True,
                               custom_mask=plan.get("custom_mask"))
        blind = torch.isneginf(s).all(dim=1)
        o[blind], s[blind] = float("nan"), float("nan")  # rows FlashInfer leaves undefined
        return (o, s) if return_lse else o


class FakePrefill(FakeDecode):
    """BatchPrefillWithPagedKVCacheWrapper."""

    def __init__(self, float_workspace_buffer: torch.Tensor, kv_layout: str = "NHD", use_cuda_graph: bool = False,
                 qo_indptr_buf: torch.Tensor | None = None, paged_kv_indptr_buf: torch.Tensor | None = None,
                 paged_kv_indices_buf: torch.Tensor | None = None,
                 paged_kv_last_page_len_buf: torch.Tensor | None = None, custom_mask_buf: Any = None,
                 mask_indptr_buf: Any = None, backend: str = "auto", jit_args: Any = None) -> None:
        super().__init__(float_workspace_buffer, kv_layout, use_cuda_graph, False, paged_kv_indptr_buf,
                         paged_kv_indices_buf, paged_kv_last_page_len_buf, backend)
        self.init["qo_indptr"] = qo_indptr_buf
        if use_cuda_graph:
            if qo_indptr_buf is None or len(_int32_vector(qo_indptr_buf, "qo_indptr")) != self.fixed_batch + 1:
                raise ValueError("CUDA-graph mode needs qo_indptr_buf of batch_size + 1 entries")
            self._on_device(qo_indptr_buf, "the qo_indptr buffer")
        self._qo = qo_indptr_buf
        self.max_total_rows: int | None = None

    @property
    def _kernel(self) -> str:
        return "prefill"

    def plan(  # type: ignore[override]
            self, qo_indptr: torch.Tensor, paged_kv_indptr: torch.Tensor, paged_kv_indices: torch.Tensor,
            paged_kv_last_page_len: torch.Tensor, num_qo_heads: int, num_kv_heads: int, head_dim_qk: int,
            page_size: int, head_dim_vo: int | None = None, custom_mask: Any = None, packed_custom_mask: Any = None,
            causal: bool = False, pos_encoding_mode: str = "NONE", use_fp16_qk_reduction: bool = False,
            sm_scale: float | None = None, window_left: int = -1, logits_soft_cap: float | None = None,
            rope_scale: float | None = None, rope_theta: float | None = None, q_data_type: Any = "float16",
            kv_data_type: Any = None, o_data_type: Any = None, non_blocking: bool = True) -> None:
        if custom_mask is not None:
            mask_indptr = _compute_page_mask_indptr(qo_indptr, paged_kv_indptr, paged_kv_last_page_len, page_size)
            # segment_packbits runs on the mask's device (a CUDA kernel), mask_indptr moved there
            self._on_device(custom_mask, "custom_mask")
            if custom_mask.dtype != torch.bool or custom_mask.dim() != 1:
                raise ValueError(f"custom_mask must be a 1-D bool tensor, got {custom_mask.dtype} "
                                 f"{tuple(custom_mask.shape)}")
            if len(custom_mask) != int(mask_indptr[-1]):
                raise ValueError(f"custom_mask has {len(custom_mask)} entries; the rows' qo_len * kv_len sum to "
                                 f"{int(mask_indptr[-1])}")
        total_rows = int(qo_indptr.cpu()[-1])
        if self.init["use_cuda_graph"]:
            if self.max_total_rows is None:
                self.max_total_rows = total_rows
            elif total_rows > self.max_total_rows:
                raise ValueError("The total number of rows in qo_indptr cannot exceed the first plan's")
            if len(qo_indptr) != self.fixed_batch + 1:
                raise ValueError("The batch size should be fixed in cudagraph mode")
            self._qo.copy_(qo_indptr)  # type: ignore[union-attr]
        else:
            self._qo = qo_indptr.to(self.device)
        if self.init["backend"] == "fa3" and _dtype(q_data_type) != _dtype(kv_data_type or q_data_type):
            raise ValueError("fa3 needs the query and KV dtypes to match")
        super().plan(paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len, num_qo_heads, num_kv_heads,
                     head_dim_qk, page_size, logits_soft_cap=logits_soft_cap, q_data_type=q_data_type,
                     kv_data_type=kv_data_type, sm_scale=sm_scale)
        self.plans[-1].update(qo_indptr=qo_indptr, causal=causal, custom_mask=custom_mask)


class FakeGraph:
    """A recorded forward: ``replay`` reruns it with the scalars frozen at capture and rewrites the static outputs."""

    def __init__(self, fn: Callable[[], ForwardOutput], tape: list[tuple[Any, tuple[Any, ...]]],
                 out: ForwardOutput) -> None:
        self.fn, self.tape, self.out = fn, tape, out
        self.replays = 0

    def replay(self) -> None:
        FakeFlashInfer.replaying = collections.deque(self.tape)
        try:
            new = self.fn()
            assert not FakeFlashInfer.replaying, "the replay ran fewer kernels than the capture recorded"
        finally:
            FakeFlashInfer.replaying = None
        self.out.logits.copy_(new.logits)
        self.out.hidden.copy_(new.hidden)
        self.replays += 1


class FakeGraphCapture:
    """The runners' capture seam on the CPU: warm-ups run eagerly; a capture records the forward (and the scalars its
    kernels got) and returns static outputs that hold NaN until the first replay, as a real capture's do."""

    def __init__(self) -> None:
        self.warmups = 0
        self.graphs: list[FakeGraph] = []

    def warmup(self, fn: Callable[[], ForwardOutput]) -> ForwardOutput:
        self.warmups += 1
        return fn()

    def capture(self, fn: Callable[[], ForwardOutput]) -> tuple[FakeGraph, ForwardOutput]:
        tape: list[tuple[Any, tuple[Any, ...]]] = []
        FakeFlashInfer.recording = tape
        try:
            out = fn()
        finally:
            FakeFlashInfer.recording = None
        static = ForwardOutput(torch.full_like(out.logits, float("nan")), torch.full_like(out.hidden, float("nan")))
        graph = FakeGraph(fn, tape, static)
        self.graphs.append(graph)
        return graph, static


def install(monkeypatch: pytest.MonkeyPatch) -> type[FakeFlashInfer]:
    """Install the stand-in as ``flashinfer`` and let the backend run on the CPU (small workspace)."""
    module = types.ModuleType("flashinfer")
    module.BatchDecodeWithPagedKVCacheWrapper = FakeDecode  # type: ignore[attr-defined]
    module.BatchPrefillWithPagedKVCacheWrapper = FakePrefill  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "flashinfer", module)
    monkeypatch.setattr(fi_backend, "_check_cuda_device", lambda device: None)
    monkeypatch.setattr(fi_backend, "WORKSPACE_BYTES", 1024)
    monkeypatch.setattr(fi_backend, "_workspaces", {})
    FakeFlashInfer.reset()
    return FakeFlashInfer


# ---------------------------------------------------------------------------------------------- simulated CUDA
CUDA = torch.device("cuda", 0)
HOST = torch.device("cpu")


class OnDevice(torch.Tensor):
    """A CPU tensor that stands for one on the simulated ``cuda:0`` (:class:`SimulatedCuda` places results)."""

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **(kwargs or {}))


def _tensors(obj: Any) -> Iterator[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for item in obj:
            yield from _tensors(item)
    elif isinstance(obj, dict):
        for item in obj.values():
            yield from _tensors(item)


def _as_device(value: Any) -> torch.device | None:
    """The device ``value`` names (a device, a device string, a CUDA ordinal), or None."""
    if isinstance(value, torch.device):
        return value
    if isinstance(value, str):
        try:
            return torch.device(value)
        except RuntimeError:
            return None
    if isinstance(value, int) and not isinstance(value, bool):
        return torch.device("cuda", value)
    return None


def _place(out: Any, device: torch.device, sources: list[torch.Tensor]) -> Any:
    """``out`` on the simulated ``device``: tensors become :class:`OnDevice` (cuda) or plain (cpu), copied when they
    would share memory with a source on the other device (a real transfer copies)."""
    if isinstance(out, (list, tuple)):
        return type(out)(_place(o, device, sources) for o in out)
    if not isinstance(out, torch.Tensor):
        return out
    on_cuda = device.type == "cuda"
    if any(isinstance(s, OnDevice) != on_cuda and s.untyped_storage().data_ptr() == out.untyped_storage().data_ptr()
           for s in sources):
        out = out.clone()
    if on_cuda:
        return out if isinstance(out, OnDevice) else out.as_subclass(OnDevice)
    return out.as_subclass(torch.Tensor) if isinstance(out, OnDevice) else out


class SimulatedCuda(TorchFunctionMode):
    """While active, ``cuda:0`` exists on the CPU: factories and ``.to``/``.cuda`` with a CUDA device make
    :class:`OnDevice` tensors, ``.cpu``/``.to("cpu")`` copy them back to plain ones, results of operations on them are
    on the device, ``.device``/``.is_cuda`` report it, and ``.numpy()`` of one raises. An operation mixing device
    tensors with host ones of one or more dimensions raises PyTorch's "same device" RuntimeError, except ``copy_``
    (a transfer) and host index tensors (as on CUDA)."""

    _MIXED_OK = (torch.Tensor.copy_, torch.Tensor.__getitem__, torch.Tensor.__setitem__)

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = dict(kwargs or {})
        owner = getattr(func, "__self__", None)
        if owner is torch.Tensor.device:
            return CUDA if isinstance(args[0], OnDevice) else HOST
        if owner is torch.Tensor.is_cuda:
            return isinstance(args[0], OnDevice)
        if func in (torch.Tensor.numpy, torch.Tensor.__array__) and isinstance(args[0], OnDevice):
            raise TypeError("can't convert cuda:0 device type tensor to numpy. Use Tensor.cpu() to copy the tensor "
                            "to host memory first.")
        if func is torch.Tensor.get_device:
            return 0 if isinstance(args[0], OnDevice) else -1
        sources = list(_tensors((args, kwargs)))
        if func is torch.Tensor.cpu:
            return _place(func(*args, **kwargs), HOST, sources)
        if func is torch.Tensor.cuda:
            return _place(args[0], CUDA, sources)
        target = _as_device(kwargs.get("device"))
        if target is not None:
            kwargs["device"] = HOST
        elif func is torch.Tensor.to:
            rest = list(args[1:])
            for i, value in enumerate(rest):
                if isinstance(value, torch.Tensor):  # .to(other): other's device and dtype
                    target, rest[i] = (CUDA if isinstance(value, OnDevice) else HOST), value.dtype
                elif _as_device(value) is not None:
                    target, rest[i] = _as_device(value), HOST
            args = (args[0], *rest)
        if target is not None and target.type in ("cuda", "cpu"):
            return _place(func(*args, **kwargs), target, sources)
        on_device = [t for t in sources if isinstance(t, OnDevice)]
        if on_device and func not in self._MIXED_OK:
            if any(not isinstance(t, OnDevice) and t.dim() > 0 for t in sources):
                raise RuntimeError(f"Expected all tensors to be on the same device, but found at least two devices, "
                                   f"{CUDA} and cpu! ({getattr(func, '__name__', func)})")
        out = func(*args, **kwargs)
        return _place(out, CUDA, []) if on_device else out


def simulate_cuda(monkeypatch: pytest.MonkeyPatch, capability: tuple[int, int] = (9, 0)) -> SimulatedCuda:
    """Make ``torch.cuda`` report one device of ``capability`` and return the :class:`SimulatedCuda` mode to enter
    (``with simulate_cuda(monkeypatch): ...``) for tensors on it. Use with :func:`install`: FlashInfer's stand-in
    then runs on that device as the real one runs on a GPU."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    return SimulatedCuda()
