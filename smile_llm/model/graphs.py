"""CUDA-graph runners for the plain decode step and the speculative verify window (CUDA with FlashInfer only).

One class per forward kind owns capture and replay. Inputs go into static buffers (tokens, RoPE tables); the pool
keeps the KV write index and the CSR at fixed addresses (``prepare_decode_graph_step`` /
``prepare_verify_graph_step``); a graph-mode FlashInfer backend is planned outside capture before every replay.
Each bucket runs ``WARMUP_STEPS`` eager steps through the same static path, is captured on the next one and is
then replayed explicitly, because capturing only records the kernels (Smile quirk 14: without the replay the
output buffers hold stale data).

- ``DecodeGraphRunner``: buckets keyed by (batch, pages). The decode step CSR is bumped in place within a page and
  rebuilt across one, so each page count is its own bucket; the next bucket is captured ahead of time
  (``prefetch``) while the current one replays, writing into the pool's scratch pages, and its CSR is installed when
  the rows get there. Rows must share one position (Smile's rule) and the batch must be a power of two.
- ``VerifyGraphRunner``: buckets keyed by (batch, window), reading the pool's fixed-address verify CSR, which is
  rewritten in place for any row lengths; all buckets are dropped exactly when
  ``consume_verify_graph_meta_realloc()`` reports that the CSR moved.

A failed capture disables the runner (eager from then on). ``captures`` counts captures, for tests.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ..attention.flashinfer import FlashInferBackend, flashinfer_available
from ..cache import KvCachePool
from .context import ForwardContext
from .transformer import ForwardOutput, Transformer

WARMUP_STEPS = 2
PREFETCH_LEAD_STEPS = WARMUP_STEPS + 1  # start capturing the next page bucket this many steps before it


def cuda_graphs_supported(pool: KvCachePool) -> bool:
    """CUDA device, FlashInfer importable, and not switched off with ``SMILE_CUDA_GRAPHS=0``."""
    return pool.device.type == "cuda" and os.environ.get("SMILE_CUDA_GRAPHS", "1") != "0" and flashinfer_available()


@dataclass
class _Bucket:
    """One captured shape: its static inputs and outputs, its graph-mode backend and graph."""

    backend: FlashInferBackend
    tokens: torch.Tensor  # int64 [B, S]
    cos: torch.Tensor  # [B, S, 1, head_dim]
    sin: torch.Tensor
    start: np.ndarray  # positions the capture was made at (the pool checks puts against the prepared ones)
    warmups: int = 0
    graph: Any = None  # torch.cuda.CUDAGraph once captured
    out: ForwardOutput | None = None  # static outputs (the graph's), valid after a replay
    prefetched_meta: Any = field(default=None)


class _GraphRunner:
    def __init__(self, transformer: Transformer, pool: KvCachePool, max_batch: int = 16) -> None:
        self.transformer, self.pool, self.max_batch = transformer, pool, max_batch
        self.enabled = cuda_graphs_supported(pool)
        self.captures = 0
        self.buckets: dict[tuple[int, int], _Bucket] = {}
        c = transformer.config
        self._heads = (c.num_attention_heads, c.num_key_value_heads, c.head_dim)

    def _bucket(self, backend: FlashInferBackend, batch: int, seqlen: int, start: np.ndarray) -> _Bucket:
        c, dev, dtype = self.transformer.config, self.pool.device, self.transformer.dtype
        return _Bucket(backend, torch.zeros(batch, seqlen, dtype=torch.int64, device=dev),
                       torch.zeros(batch, seqlen, 1, c.head_dim, dtype=dtype, device=dev),
                       torch.zeros(batch, seqlen, 1, c.head_dim, dtype=dtype, device=dev), start.copy())

    def _plan(self, b: _Bucket, meta: Any, qo_indptr: torch.Tensor | None) -> None:
        hq, hkv, d = self._heads
        b.backend.plan(meta, num_qo_heads=hq, num_kv_heads=hkv, head_dim=d, qo_indptr=qo_indptr, causal=True,
                       q_dtype=self.transformer.dtype, kv_dtype=self.pool.dtype)

    def _load(self, b: _Bucket, tokens: torch.Tensor, start: np.ndarray) -> None:
        cos, sin = self.transformer.rope(start, tokens.shape[1])
        b.tokens.copy_(tokens)
        b.cos.copy_(cos)
        b.sin.copy_(sin)

    def _static_forward(self, b: _Bucket, start: np.ndarray) -> ForwardOutput:
        hq, hkv, d = self._heads
        ctx = ForwardContext.prepared(self.pool, b.backend, start, b.tokens.shape[1], b.cos, b.sin, hkv, d)
        return self.transformer.run(b.tokens, ctx)

    def _run(self, b: _Bucket, start: np.ndarray) -> ForwardOutput:
        """Warm up, capture (then replay explicitly) or replay the bucket; returns owned copies of the outputs."""
        if b.graph is None and b.warmups < WARMUP_STEPS:
            b.warmups += 1
            out = self._static_forward(b, start)
            return ForwardOutput(out.logits.clone(), out.hidden.clone())
        if b.graph is None:
            try:
                torch.cuda.synchronize(self.pool.device)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    b.out = self._static_forward(b, start)
                b.graph = graph
                self.captures += 1
            except Exception:
                self.enabled = False  # fall back to eager for good; the caller reruns this step eagerly
                raise
        b.graph.replay()
        assert b.out is not None
        return ForwardOutput(b.out.logits.clone(), b.out.hidden.clone())

    def reset(self) -> None:
        self.buckets.clear()


class DecodeGraphRunner(_GraphRunner):
    """Graphs of the plain decode step, keyed by (batch, pages)."""

    def __init__(self, transformer: Transformer, pool: KvCachePool, max_batch: int = 16,
                 prefetch: bool = True) -> None:
        super().__init__(transformer, pool, max_batch)
        self.prefetch = prefetch

    def eligible(self, positions: np.ndarray) -> bool:
        """Whether a decode step at ``positions`` can replay a graph: the runner is enabled, the batch is a power of two
        of at most ``max_batch`` rows, and every row is at the same position."""
        b = len(positions)
        return (self.enabled and 1 <= b <= self.max_batch and b & (b - 1) == 0
                and bool((positions == positions[0]).all()))

    def forward(self, tokens: torch.Tensor, positions: np.ndarray) -> ForwardOutput:
        """One decode step of the active rows (``tokens`` ``[B, 1]`` at ``positions``, all equal)."""
        pool = self.pool
        batch, cache_len = len(positions), int(positions[0]) + 1
        key = (batch, pool.num_pages_for_length(cache_len))
        b = self.buckets.get(key)
        if b is not None and b.prefetched_meta is not None:  # captured ahead: its CSR becomes the step CSR
            try:
                pool.install_prefetched_step_metadata(b.prefetched_meta, cache_len)
                b.prefetched_meta = None
            except ValueError:  # captured for rows that are no longer the active ones
                del self.buckets[key]
                b = None
        pool.decode_graph_buffers = True
        try:
            meta = pool.prepare_decode_graph_step(cache_len, positions)
            if b is not None and not b.backend.is_bound_to(meta):  # the step CSR was rebuilt: a stale graph
                b = None
            if b is None:
                b = self.buckets[key] = self._bucket(FlashInferBackend.for_decode_graph(pool, batch), batch, 1,
                                                     positions)
            self._load(b, tokens, positions)
            self._plan(b, meta, None)
            out = self._run(b, positions)
        finally:
            pool.decode_graph_buffers = False
        if self.prefetch and b.graph is not None:
            self._maybe_prefetch(batch, cache_len, tokens)
        return out

    def _maybe_prefetch(self, batch: int, cache_len: int, tokens: torch.Tensor) -> None:
        """Capture the next page bucket while its first length is PREFETCH_LEAD_STEPS steps away or fewer."""
        pool = self.pool
        ahead = pool.steps_until_page_boundary(cache_len)
        num_pages = pool.num_pages_for_length(cache_len)
        next_len = pool.first_cache_len_in_next_page_bucket(num_pages)
        key = (batch, num_pages + 1)
        if not 1 <= ahead <= PREFETCH_LEAD_STEPS or key in self.buckets or next_len > pool.request_capacity:
            return
        pos = np.full(batch, next_len - 1, dtype=np.int64)
        try:
            meta = pool.begin_prefetch_decode_graph_step(next_len, next_len - 1, batch)
        except Exception:
            self.prefetch = False
            return
        pool.decode_graph_buffers = True
        try:
            b = self._bucket(FlashInferBackend.for_decode_graph(pool, batch), batch, 1, pos)
            self._load(b, tokens, pos)
            for _ in range(WARMUP_STEPS + 1):  # warm-ups, then the capture and its replay: all into scratch
                self._plan(b, meta, None)
                self._run(b, pos)
        except Exception:
            self.prefetch = False
            b = None
        finally:
            pool.decode_graph_buffers = False
            b_meta = pool.end_prefetch_decode_graph_step()
        if b is not None and b.graph is not None:
            b.prefetched_meta = b_meta
            self.buckets[key] = b


class VerifyGraphRunner(_GraphRunner):
    """Graphs of the speculative verify window, keyed by (batch, window); ragged rows allowed."""

    def eligible(self, batch: int) -> bool:
        """Whether a verify window of ``batch`` rows can replay a graph: the runner is enabled and ``1 <= batch <=
        max_batch``."""
        return self.enabled and 1 <= batch <= self.max_batch

    def forward(self, tokens: torch.Tensor, start: np.ndarray) -> ForwardOutput:
        """The verify forward of the active rows: ``tokens`` ``[B, W]`` at positions ``start[b] + [0, W)``."""
        pool = self.pool
        batch, window = tokens.shape
        pool.verify_graph_buffers = True
        try:
            meta = pool.prepare_verify_graph_step(start + window, start, window)
            if pool.consume_verify_graph_meta_realloc():  # the CSR moved: every captured window reads stale memory
                self.buckets.clear()
            key = (batch, window)
            b = self.buckets.get(key)
            if b is None:
                b = self.buckets[key] = self._bucket(FlashInferBackend.for_verify_graph(pool, batch, window),
                                                     batch, window, start)
            self._load(b, tokens, start)
            self._plan(b, meta, pool.verify_qo_indptr(batch, window))
            return self._run(b, start)
        finally:
            pool.verify_graph_buffers = False
