"""A strict stand-in for the ``flashinfer`` module, for CPU tests of the FlashInfer backend and the CUDA-graph runners.

Its wrappers have the signatures of flashinfer-python 0.6.18 / 0.7.x (optional plan arguments keyword-only) and behave
as the real ones do where our code could go wrong:

- graph mode needs the fixed buffers; their sizes fix the batch (``len(last_page_len_buffer)``, ``indptr`` one
  longer); ``plan`` raises for another batch, for ``indices`` longer than the buffer, or (prefill) for more query rows
  than the first plan had, and *copies* the CSR it is given into the fixed buffers (eager mode binds to it);
- ``run`` checks q's shape and dtype and the KV dtype against the plan, and that the CSR still says what ``plan``
  read (a real kernel would run the old schedule over new buffers: plan before every replay);
- ``run`` computes real attention with the pure-PyTorch reference over the CSR the kernel reads (the fixed buffers
  in graph mode), with ``k_scale``/``v_scale`` applied; rows that see no key come out NaN (undefined in FlashInfer);
- scalars passed to ``run`` (softmax scale, ``k_scale``, ``v_scale``, soft cap) are frozen by a capture:
  :class:`FakeGraphCapture` records them while capturing and replays with the recorded ones, as a CUDA graph does.

Every wrapper made is listed in ``FakeFlashInfer.wrappers`` with its constructor arguments, plans and runs.
"""

from __future__ import annotations

import collections
import sys
import types
from collections.abc import Callable
from typing import Any

import pytest
import torch

import smile_llm.attention.flashinfer as fi_backend
from smile_llm.attention.reference import paged_attention
from smile_llm.cache.metadata import FlashInferKvMetadata
from smile_llm.model.transformer import ForwardOutput

HALF = (torch.float16, torch.bfloat16)
FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)


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
        self.init: dict[str, Any] = {
            "workspace": float_workspace_buffer, "kv_layout": kv_layout, "use_cuda_graph": use_cuda_graph,
            "use_tensor_cores": use_tensor_cores, "indptr": paged_kv_indptr_buffer, "indices": paged_kv_indices_buffer,
            "last": paged_kv_last_page_len_buffer, "backend": backend}
        self.fixed_batch = 0
        if use_cuda_graph:
            for name in ("indptr", "indices", "last"):
                if self.init[name] is None:
                    raise ValueError(f"CUDA-graph mode needs the paged_kv_{name} buffer")
                _int32_vector(self.init[name], name)
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
        else:
            self._indptr, self._indices, self._last = indptr, indices, last

    def _read_plan(self) -> tuple[list[int], list[int], list[int]]:
        indptr = self._indptr.cpu().tolist()  # type: ignore[union-attr]
        return indptr, self._last.cpu().tolist(), self._indices[: indptr[-1]].cpu().tolist()  # type: ignore[index]

    def plan(self, indptr: torch.Tensor, indices: torch.Tensor, last_page_len: torch.Tensor, num_qo_heads: int,
             num_kv_heads: int, head_dim: int, page_size: int, *, pos_encoding_mode: str = "NONE",
             window_left: int = -1, logits_soft_cap: float | None = None, q_data_type: Any = "float16",
             kv_data_type: Any = None, sm_scale: float | None = None, non_blocking: bool = True,
             q_len_per_req: int = 1) -> None:
        for name, t in (("indptr", indptr), ("indices", indices), ("last_page_len", last_page_len)):
            _int32_vector(t, name)
        self._bind(indptr, indices, last_page_len)
        self._snapshot = self._read_plan()
        self.plans.append({"indptr": indptr, "indices": indices, "last": last_page_len,
                           "heads": (num_qo_heads, num_kv_heads), "head_dim": head_dim, "page_size": page_size,
                           "logits_soft_cap": logits_soft_cap, "q_data_type": _dtype(q_data_type),
                           "kv_data_type": _dtype(kv_data_type or q_data_type), "sm_scale": sm_scale,
                           "qo_indptr": None, "causal": False})

    # ------------------------------------------------------------------ run
    def run(self, q: torch.Tensor, paged_kv_cache: Any, *args: Any, q_scale: float | None = None,
            k_scale: float | None = None, v_scale: float | None = None, out: torch.Tensor | None = None,
            lse: torch.Tensor | None = None, return_lse: bool = False) -> Any:
        if not self.plans or self._snapshot is None:
            raise RuntimeError("run before plan")
        plan = self.plans[-1]
        k, v = paged_kv_cache
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
        self._qo = qo_indptr_buf
        self.max_total_rows: int | None = None

    def plan(  # type: ignore[override]
            self, qo_indptr: torch.Tensor, paged_kv_indptr: torch.Tensor, paged_kv_indices: torch.Tensor,
            paged_kv_last_page_len: torch.Tensor, num_qo_heads: int, num_kv_heads: int, head_dim_qk: int,
            page_size: int, head_dim_vo: int | None = None, custom_mask: Any = None, packed_custom_mask: Any = None,
            causal: bool = False, pos_encoding_mode: str = "NONE", use_fp16_qk_reduction: bool = False,
            sm_scale: float | None = None, window_left: int = -1, logits_soft_cap: float | None = None,
            rope_scale: float | None = None, rope_theta: float | None = None, q_data_type: Any = "float16",
            kv_data_type: Any = None, o_data_type: Any = None, non_blocking: bool = True) -> None:
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
            self._qo = qo_indptr.to(torch.int32)
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
        FakeFlashInfer.recording = tape = []
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
