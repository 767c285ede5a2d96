"""DraftChain: the chained single-token steps of one draft round, planned once for the round: an MTP
head's (``step``) or a whole draft model's (``forward``).

A round's first step writes the true history of every row into the drafter's pool (the MTP head's
first step, ``Transformer.draft``; a draft model's backlog feed): positions ``[0, start_b)``. Steps
1..n-1 then each feed one drafted token at position ``start_b + j`` (column ``j``). Their K/V are
speculation, so they never enter the pool: each layer keeps them in a dense float32 scratch
``[B, Hkv, n - 1, D]``. Attention at column j is two parts merged by log-sum-exp
(``attention.torch.merge``):

- the history: the backend over the pool's ``[0, start_b)``, planned once for the whole chain (the
  history does not change while the chain runs), run with its LSE;
- the chain: columns ``[0, j]`` of the scratch, dense.

So a chained step builds no CSR, plans nothing, opens no KV step and leaves nothing to truncate:
about half of what a one-token forward through the pool costs on the CPU (``benchmarks/README.md``,
spec-lab), and on CUDA one FlashInfer plan per round instead of one per step. The chain's K/V are
not quantised: with FP8 KV storage the chain part attends in float32 (a draft, whose numerics never
change what the verify window accepts).

The chain plans its backend once, so the backend must be its own: a forward that planned it between
two steps would leave the chain attending with that forward's plan (the MTP and draft-model drafters
keep a second backend for their chains, ``companion_backend``). One chain serves one round on the
driver thread. With tensor parallelism each MTP step is sent to the followers, which build the same
chain at column 0 (``Leader.chain_step``); with pipeline parallelism the last stage runs the head
and returns each column's logits and output to rank 0 (``models.stages``); a draft model runs on
one rank.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np
import torch

from ..attention.backend import AttentionBackend
from ..attention.torch.merge import LN2, dense_attention, merge_by_lse
from ..cache import KvCachePool
from ..distributed.group import TensorParallel
from ..models.state_step import StateStep

if TYPE_CHECKING:
    from ..models.transformer import DraftOutput, ForwardOutput, Transformer


class DraftChain:
    """Steps 1..``steps`` of a draft round over the active rows of ``pool`` (an MTP head's pool, or
    a draft model's own) whose history ends at ``start[b]`` (see the module docstring). ``step`` (an
    MTP head) or ``forward`` (a whole draft model) runs the next column; the chain is a
    ``LayerContext`` for the layers while it runs."""

    states: StateStep | None = None  # full-attention layers only: an MTP head, a dense draft model

    def __init__(self, transformer: Transformer, pool: KvCachePool, backend: AttentionBackend,
                 start: np.ndarray, steps: int) -> None:
        if steps < 1:
            raise ValueError(f"a draft chain needs steps >= 1, got {steps}")
        c = transformer.config
        self.transformer, self.pool, self.backend = transformer, pool, backend
        self.start = np.asarray(start, dtype=np.int64)
        self.batch, self.steps, self.column = len(self.start), steps, 0
        self.num_heads, self.num_kv_heads, self.head_dim = (c.num_attention_heads,
                                                            c.num_key_value_heads, c.head_dim)
        self.tp: TensorParallel | None = transformer.tp
        backend.plan(pool.shared_flashinfer_metadata(self.start), num_qo_heads=self.num_heads,
                     num_kv_heads=self.num_kv_heads, head_dim=self.head_dim, causal=True,
                     q_dtype=transformer.dtype, kv_dtype=pool.dtype)
        self._cos, self._sin = transformer.rope(self.start, steps)  # [B, steps, 1, rotary_dim]
        self.cos, self.sin = self._cos[:, :1], self._sin[:, :1]
        self.k_scale, self.v_scale = pool.k_scale, pool.v_scale
        self._scale = 1.0 / math.sqrt(self.head_dim)
        # layer -> the pool's K and V
        self._history: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        # layer -> chain K and V [B, Hkv, n, D]
        self._scratch: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def step(self, tokens: torch.Tensor, hidden: torch.Tensor) -> DraftOutput:
        """The next column of an MTP head's chain: ``tokens`` int64 ``[B, 1]`` (the drafts of the
        previous step) and ``hidden`` ``[B, 1, D]`` (the head's previous output). Returns the head's
        logits and output at this column. RuntimeError past the last column, or for a model without
        an MTP head."""
        if not self.transformer.has_mtp:
            raise RuntimeError("this model has no MTP head (mtp_num_hidden_layers is 0): its "
                               "chain runs forward()")
        j = self._next_column()
        leader = self.transformer.leader
        if leader is None:
            out = self.transformer.draft_step(tokens, hidden, self)
        else:
            # the followers too
            with leader.chain_step(self.pool, tokens, hidden, self.start, self.steps, j):
                out = self.transformer.draft_step(tokens, hidden, self)
        self.column += 1
        return out

    @torch.inference_mode()
    def forward(self, tokens: torch.Tensor) -> ForwardOutput:
        """The next column of a whole draft model's chain (the pool is that model's): ``tokens``
        int64 ``[B, 1]``. Returns its logits ``[B, 1, V]`` and hidden state at this column.
        RuntimeError past the last column, or for a model split over tensor-parallel ranks."""
        if self.transformer.leader is not None:
            raise RuntimeError("a draft model's chain runs on one rank")
        self._next_column()
        out = self.transformer.run(tokens, self)
        self.column += 1
        return out

    def _next_column(self) -> int:
        """The column about to run, with its RoPE tables in place. RuntimeError past the last."""
        if self.column >= self.steps:
            raise RuntimeError(f"this draft chain has {self.steps} steps, all run")
        j = self.column
        self.cos, self.sin = self._cos[:, j : j + 1], self._sin[:, j : j + 1]
        return j

    # ------------------------------------------------------------------ LayerContext
    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Column j's K/V ``[B, 1, Hkv, D]`` into the layer's scratch, then attention of ``q``
        ``[B, 1, H, D]`` over the history and chain columns ``[0, j]``: ``[B, H, D]`` in q's
        dtype."""
        b, h, hkv, d, j = self.batch, self.num_heads, self.num_kv_heads, self.head_dim, self.column
        if layer not in self._history:
            self._history[layer] = (self.pool.key_layer(layer), self.pool.value_layer(layer))
            shape = (b, hkv, self.steps, d)
            self._scratch[layer] = (torch.empty(shape, dtype=torch.float32, device=q.device),
                                    torch.empty(shape, dtype=torch.float32, device=q.device))
        k_layer, v_layer = self._history[layer]
        ks, vs = self._scratch[layer]
        ks[:, :, j] = k[:, 0]
        vs[:, :, j] = v[:, 0]
        # [B, H, D], base-2 [B, H]
        out_h, lse_h = self.backend.run(q.reshape(b, h, d), k_layer, v_layer, k_scale=self.k_scale,
                                        v_scale=self.v_scale, return_lse=True)
        g = h // hkv  # query head kv_head * g + i reads KV head kv_head
        out_c, lse_c = dense_attention(q.reshape(b, hkv, g, d).float(), ks[:, :, : j + 1],
                                       vs[:, :, : j + 1], self._scale)
        out = merge_by_lse(out_h.float().reshape(b, hkv, g, d),
                           (lse_h.float() * LN2).reshape(b, hkv, g, 1), out_c, lse_c)
        return out.view(b, h, d).to(q.dtype)

    def reduce(self, x: torch.Tensor) -> torch.Tensor:
        """The tensor-parallel sum of a row-parallel block's partial output (the identity on one
        rank)."""
        return x if self.tp is None else self.tp.all_reduce(x)

    def commit(self) -> None:
        """Nothing: the chain writes no pool state."""
