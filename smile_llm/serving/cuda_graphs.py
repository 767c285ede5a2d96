"""CUDA-graph runners for the plain decode step and the speculative verify window (CUDA with
FlashInfer).

One class per forward kind owns capture and replay. Each keeps one bucket per shape:
``DecodeGraphRunner`` one per batch size, ``VerifyGraphRunner`` one per (batch, window). A bucket
holds its static inputs (tokens, RoPE tables) and a graph-mode FlashInfer backend; the pool keeps
the write index and the graph CSR at fixed addresses and rewrites them in place before every replay
(``prepare_decode_graph_step`` / ``prepare_verify_graph_step``). The CSR's indices are sized for
every row at the pool's full page count (``reserve_graph_rows(max_batch)`` at construction), so one
graph serves every row length and ragged rows. The backend is planned outside capture before every
replay.

A bucket's first ``WARMUP_STEPS`` forwards run through the static path (on a side stream on CUDA),
the next one is captured and then replayed explicitly (capturing records the kernels without running
them: Smile quirk 14); later forwards replay. Warm-ups and captures run under
``torch.inference_mode()``. Every graph shares one memory pool; the outputs are copied out right
after each replay, so a later replay of another graph never clobbers them.

A graph freezes what the host handed its kernels: tensor addresses, the FP8 ``k_scale``/``v_scale``,
the softmax scale. Buckets are dropped and recaptured when
- a bucket's backend is no longer bound to the pool's graph CSR (the CSR moved: more rows were
  reserved);
- the pool's KV scales differ from those the buckets were captured with (``pool.set_kv_scales``).
At most ``max_buckets`` buckets are kept (least recently used dropped first): each holds a
FlashInfer wrapper with its own device and pinned host workspaces. A failed capture disables the
runner (``enabled`` False; the decoder reruns the step eagerly). ``captures`` counts captures.

Capture goes through a :class:`GraphCapture`: :class:`CudaGraphCapture` on CUDA; the CPU tests pass
one that records the eager forward and replays it.
"""

from __future__ import annotations

import functools
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from ..attention.flashinfer import FlashInferBackend, flashinfer_available
from ..cache import KvCachePool
from ..cache.metadata import FlashInferKvMetadata
from ..env import cuda_graphs_enabled
from ..models.forward_context import ForwardContext
from ..models.transformer import ForwardOutput, Transformer

WARMUP_STEPS = 2


def cuda_graphs_supported(pool: KvCachePool) -> bool:
    """CUDA device, FlashInfer importable, and not switched off with ``SMILE_CUDA_GRAPHS=0``."""
    return pool.device.type == "cuda" and cuda_graphs_enabled() and flashinfer_available()


class Replayable(Protocol):
    """A captured graph."""

    def replay(self) -> None:
        """Rerun the captured work: rewrites the static outputs ``capture`` returned."""
        ...


class GraphCapture(Protocol):
    """How a runner warms up and captures a forward (the seam between the runners' logic and
    CUDA)."""

    def warmup(self, fn: Callable[[], ForwardOutput]) -> ForwardOutput:
        """Run ``fn`` eagerly, as capture will see it; returns its outputs."""
        ...

    def capture(self, fn: Callable[[], ForwardOutput]) -> tuple[Replayable, ForwardOutput]:
        """Record ``fn`` into a graph; returns the graph and its static outputs, valid only after a
        replay."""
        ...


class CudaGraphCapture:
    """Warm-ups on a side stream (after it waited for the current one, which then waits for it);
    captures on that stream into one memory pool shared by every graph made through this object,
    with ``capture_error_mode= "thread_local"`` so other threads may use CUDA meanwhile. Sharing the
    pool is safe because graphs replay one at a time on the current stream and their outputs are
    copied out before another replays."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.stream = torch.cuda.Stream(device)
        self.pool = torch.cuda.graph_pool_handle()

    def warmup(self, fn: Callable[[], ForwardOutput]) -> ForwardOutput:
        current = torch.cuda.current_stream(self.device)
        self.stream.wait_stream(current)
        with torch.cuda.stream(self.stream):
            out = fn()
        current.wait_stream(self.stream)
        return out

    def capture(self, fn: Callable[[], ForwardOutput]) -> tuple[Replayable, ForwardOutput]:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool, stream=self.stream,
                              capture_error_mode="thread_local"):
            out = fn()
        return graph, out


@functools.cache
def shared_cuda_capture(device: torch.device) -> CudaGraphCapture:
    """The :class:`CudaGraphCapture` of ``device``: one graph memory pool for every runner on it."""
    return CudaGraphCapture(device)


@dataclass
class _Bucket:
    """One captured shape: static inputs and outputs, the graph-mode backend, the graph."""

    backend: FlashInferBackend
    tokens: torch.Tensor  # int64 [B, S]
    cos: torch.Tensor  # [B, S, 1, head_dim]
    sin: torch.Tensor
    # int64[B], positions of the step being run (read by every forward of the static path)
    start: np.ndarray
    warmups: int = 0
    graph: Replayable | None = None
    out: ForwardOutput | None = None  # static outputs (the graph's), valid after a replay


class _GraphRunner(ABC):
    """Buckets, warm-up, capture and replay shared by both runners. ``graph_capture`` None means
    :func:`shared_cuda_capture` of the pool's device, and the runner is enabled only where
    :func:`cuda_graphs_supported`; given one, the runner is enabled on any device FlashInfer's
    backend accepts."""

    def __init__(self, transformer: Transformer, pool: KvCachePool, max_batch: int = 16, *,
                 graph_capture: GraphCapture | None = None, max_buckets: int = 16) -> None:
        self.transformer, self.pool, self.max_batch, self.max_buckets = (transformer, pool,
                                                                         max_batch, max_buckets)
        self.enabled = graph_capture is not None or cuda_graphs_supported(pool)
        self._capture = graph_capture
        self.captures = 0
        # (batch, seqlen) -> bucket, least recently used first
        self.buckets: dict[tuple[int, int], _Bucket] = {}
        self._scales = (pool.k_scale, pool.v_scale)  # what the buckets' graphs froze
        c = transformer.config
        self._heads = (c.num_attention_heads, c.num_key_value_heads, c.head_dim)
        if self.enabled:
            pool.reserve_graph_rows(max_batch)

    @property
    def graph_capture(self) -> GraphCapture:
        if self._capture is None:
            self._capture = shared_cuda_capture(self.pool.device)
        return self._capture

    def reset(self) -> None:
        """Drop every bucket (graphs and wrappers); the next forward of each shape warms up and
        captures again."""
        self.buckets.clear()

    def _bucket(self, batch: int, seqlen: int, meta: FlashInferKvMetadata,
                make: Callable[[], FlashInferBackend]) -> _Bucket:
        """The bucket of (``batch``, ``seqlen``), made on first use; a stale one (not bound to
        ``meta``, the pool's graph CSR, or captured under other KV scales) is dropped first."""
        scales = (self.pool.k_scale, self.pool.v_scale)
        if scales != self._scales:  # frozen into every captured graph
            self.buckets.clear()
            self._scales = scales
        key = (batch, seqlen)
        b = self.buckets.pop(key, None)
        if b is not None and not b.backend.is_bound_to(meta):
            b = None  # the graph CSR moved: the graph reads freed tensors
        if b is None:
            c, dev, dtype = self.transformer.config, self.pool.device, self.transformer.dtype
            b = _Bucket(make(), torch.zeros(batch, seqlen, dtype=torch.int64, device=dev),
                        torch.zeros(batch, seqlen, 1, c.head_dim, dtype=dtype, device=dev),
                        torch.zeros(batch, seqlen, 1, c.head_dim, dtype=dtype, device=dev),
                        np.zeros(batch, dtype=np.int64))
            while len(self.buckets) >= self.max_buckets:
                del self.buckets[next(iter(self.buckets))]
        self.buckets[key] = b  # most recently used last
        return b

    def _load(self, b: _Bucket, tokens: torch.Tensor, start: np.ndarray) -> None:
        """Copy the step's tokens and RoPE rows into the static inputs: one gather from the model's
        table with a ``non_blocking`` index copy (no device synchronisation)."""
        seqlen, d = tokens.shape[1], self._heads[2]
        b.tokens.copy_(tokens)
        b.start = start.copy()
        end = int(start.max()) + seqlen
        # [1, end, 1, D] views of the table
        cos, sin = self.transformer.rope(np.zeros(1, dtype=np.int64), end)
        pos = (start[:, None] + np.arange(seqlen)).reshape(-1)
        idx = torch.from_numpy(pos).to(self.pool.device, non_blocking=True)
        torch.index_select(cos[0], 0, idx, out=b.cos.view(-1, 1, d))
        torch.index_select(sin[0], 0, idx, out=b.sin.view(-1, 1, d))

    def _plan(self, b: _Bucket, meta: FlashInferKvMetadata, qo_indptr: torch.Tensor | None) -> None:
        hq, hkv, d = self._heads
        b.backend.plan(meta, num_qo_heads=hq, num_kv_heads=hkv, head_dim=d,
                       qo_indptr=qo_indptr, causal=True, q_dtype=self.transformer.dtype,
                       kv_dtype=self.pool.dtype)

    def _static_forward(self, b: _Bucket) -> ForwardOutput:
        batch, seqlen = b.tokens.shape
        ctx = ForwardContext.prepared(self.pool, b.backend, b.start, seqlen, b.cos, b.sin,
                                      self._heads[2], self._write_index(batch, seqlen))
        return self.transformer.run(b.tokens, ctx)

    @abstractmethod
    def _write_index(self, batch: int, seqlen: int) -> torch.Tensor:
        """The pool's fixed write index prepared for this runner's forward (its KV writes go through
        it)."""

    def _run(self, b: _Bucket) -> ForwardOutput:
        """Warm up, capture (then replay explicitly) or replay the bucket; returns owned copies of
        the outputs."""
        if b.graph is None and b.warmups < WARMUP_STEPS:
            b.warmups += 1
            out = self.graph_capture.warmup(lambda: self._static_forward(b))
            return ForwardOutput(out.logits.clone(), out.hidden.clone())
        if b.graph is None:
            try:
                b.graph, b.out = self.graph_capture.capture(lambda: self._static_forward(b))
            except Exception:
                self.enabled = False  # eager from now on; the caller reruns this step eagerly
                self.buckets.clear()
                raise
            self.captures += 1
        b.graph.replay()
        assert b.out is not None
        return ForwardOutput(b.out.logits.clone(), b.out.hidden.clone())


class DecodeGraphRunner(_GraphRunner):
    """Graphs of the plain decode step, one per batch size; rows may sit at different positions."""

    def eligible(self, positions: np.ndarray) -> bool:
        """Whether a decode step at ``positions`` (one per row) can replay a graph: the runner is
        enabled and the batch has ``1 <= B <= max_batch`` rows."""
        return self.enabled and 1 <= len(positions) <= self.max_batch

    @torch.inference_mode()
    def forward(self, tokens: torch.Tensor, positions: np.ndarray) -> ForwardOutput:
        """One decode step of the active rows: ``tokens`` ``[B, 1]`` at ``positions``
        ``int64[B]``."""
        pool, batch = self.pool, len(positions)
        meta = pool.prepare_decode_graph_step(positions + 1, positions)
        b = self._bucket(batch, 1, meta, lambda: FlashInferBackend.for_decode_graph(pool, batch))
        self._load(b, tokens, positions)
        self._plan(b, meta, None)
        return self._run(b)

    def _write_index(self, batch: int, seqlen: int) -> torch.Tensor:
        return self.pool.decode_graph_index(batch)


class VerifyGraphRunner(_GraphRunner):
    """Graphs of the speculative verify window, one per (batch, window); ragged rows allowed."""

    def eligible(self, batch: int) -> bool:
        """Whether a verify window of ``batch`` rows can replay a graph: the runner is enabled and
        ``1 <= batch <= max_batch``."""
        return self.enabled and 1 <= batch <= self.max_batch

    @torch.inference_mode()
    def forward(self, tokens: torch.Tensor, start: np.ndarray) -> ForwardOutput:
        """The verify forward of the active rows: ``tokens`` ``[B, W]`` at positions
        ``start[b] + [0, W)``."""
        pool = self.pool
        batch, window = tokens.shape
        meta = pool.prepare_verify_graph_step(start + window, start, window)
        b = self._bucket(batch, window, meta,
                         lambda: FlashInferBackend.for_verify_graph(pool, batch, window))
        self._load(b, tokens, start)
        self._plan(b, meta, pool.verify_qo_indptr(batch, window))
        return self._run(b)

    def _write_index(self, batch: int, seqlen: int) -> torch.Tensor:
        return self.pool.verify_graph_index(batch, seqlen)
