"""ForwardContext: everything one forward's attention needs, built once and shared by every layer.

It holds the forward's KV write handle (``KvCachePool.kv_step``: positions
``[start_b, start_b + S)`` of each row, validated once, with the write index and per-layer views),
the step CSR over ``[0, start_b + S)``, the planned attention backend and the rotary tables. Created
by ``Transformer.forward`` for one call and dropped after it; nothing is module-global.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
import torch

from ..attention.backend import AttentionBackend
from ..cache import KvCachePool, KvStep
from ..distributed.group import TensorParallel
from .state_step import StateStep


class LayerContext(Protocol):
    """What a decoder layer reads of its forward: RoPE tables ``cos``/``sin``
    ``[B, S, 1, rotary_dim]``, ``attend`` (write this window's K/V of a layer, then attend over the
    row's keys), ``reduce`` (the tensor-parallel sum of a row-parallel block's partial output) and
    ``states`` (a hybrid model's DeltaNet ``StateStep``, None without one). ``ForwardContext``
    serves a forward over the pool; ``DraftChain`` a draft round's chained steps."""

    cos: torch.Tensor
    sin: torch.Tensor
    states: StateStep | None

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """``q`` ``[B, S, H, D]``, ``k``/``v`` ``[B, S, Hkv, D]`` -> ``[B*S, H, D]``."""
        ...

    def reduce(self, x: torch.Tensor) -> torch.Tensor:
        """The sum over the tensor-parallel ranks of ``x`` (the identity on one rank)."""
        ...

    def commit(self) -> None:
        """Record the forward's writes once its last layer succeeded."""
        ...


class RopeTable:
    """cos and sin of every position below a limit that grows as needed (doubling), computed once
    per device and dtype with HF's float32 math; lookups are slices (one row) or one gather (ragged
    rows). The sin table has its first half negated, so RoPE is
    ``x * cos + x.roll(head_dim // 2, -1) * sin`` (HF's ``rotate_half`` as a roll)."""

    def __init__(self) -> None:
        self._key: tuple[torch.device, torch.dtype] | None = None
        self._cos = self._sin = torch.empty(0)

    def lookup(self, start: np.ndarray, seqlen: int, inv_freq: torch.Tensor, dtype: torch.dtype,
               offsets: np.ndarray | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin ``[B, S, 1, head_dim]`` of positions ``start[b] + [0, S)``, or
        ``start[b] + offsets[b, s]`` (int64 ``[B, S]``: a token tree's depths)."""
        end = int(start.max()) + (seqlen if offsets is None else int(offsets.max(initial=0)) + 1)
        if self._key != (inv_freq.device, dtype) or end > self._cos.shape[0]:
            self._build(max(2 * end, 1024, self._cos.shape[0]), inv_freq, dtype)
        if offsets is not None:
            idx = torch.from_numpy(start[:, None] + offsets).to(inv_freq.device)  # [B, S]
            return self._cos[idx][:, :, None], self._sin[idx][:, :, None]
        if len(start) == 1:
            s = int(start[0])
            return self._cos[None, s : s + seqlen, None], self._sin[None, s : s + seqlen, None]
        idx = torch.from_numpy(start[:, None] + np.arange(seqlen)).to(inv_freq.device)  # [B, S]
        return self._cos[idx][:, :, None], self._sin[idx][:, :, None]

    @torch.inference_mode(False)
    def _build(self, limit: int, inv_freq: torch.Tensor, dtype: torch.dtype) -> None:
        with torch.no_grad():
            positions = torch.arange(limit, device=inv_freq.device).float()
            freqs = positions[:, None] * inv_freq  # [limit, head_dim / 2]
            emb = torch.cat((freqs, freqs), dim=-1)  # [limit, head_dim]
            sin = emb.sin()
            # rotate_half(x) * sin == x.roll(half, -1) * this, bit for bit
            sin[:, : sin.shape[1] // 2].neg_()
            self._cos, self._sin = emb.cos().to(dtype), sin.to(dtype)
        self._key = (inv_freq.device, dtype)


class ForwardContext:
    """Per-forward state every layer shares: the attention backend, start positions ``[B]`` and
    window length, RoPE tables, the step CSR, the forward's KV write handle (``kv``, one
    ``KvCachePool.kv_step``) and, for a hybrid model, ``states``: the active rows' DeltaNet state (a
    ``StateStep`` over the pool's attached ``StatePool``; None without one). ``valid`` gives each
    row's real positions in a right-padded window; ``keep_states`` keeps the state after every
    window position (a verify window, see ``StateStep.rewind``); ``tp`` the tensor-parallel group
    whose ranks' partial outputs ``reduce`` sums (None: one rank); ``custom_mask`` replaces the
    causal mask (a token tree's window, see ``draft_tree.window_mask``). Created for one forward;
    ``commit`` once the forward has succeeded records its KV as written (a forward that raises never
    commits, so ``kv_len`` never covers KV it did not compute; DeltaNet state is written layer by
    layer, and a forward that raises fails its rows, whose state is then released with them)."""

    def __init__(self, pool: KvCachePool, backend: AttentionBackend, start: np.ndarray, seqlen: int,
                 rope: tuple[torch.Tensor, torch.Tensor], num_heads: int, num_kv_heads: int,
                 head_dim: int, dtype: torch.dtype, valid: np.ndarray | None = None,
                 keep_states: bool = False, tp: TensorParallel | None = None,
                 custom_mask: torch.Tensor | None = None) -> None:
        self.pool = pool
        self.tp = tp
        self.backend = backend
        self.start = start  # int64[B]
        self.batch, self.seqlen = len(start), seqlen
        self.head_dim = head_dim
        self.kv: KvStep = pool.kv_step(_window_start(start), seqlen)
        view = self.kv.attention_csr()  # a pool that is not direct: the window's sub-rows
        qo_indptr: torch.Tensor | None = None
        if view is not None:
            if custom_mask is not None:
                raise ValueError("a token tree's window needs a pool that stores every layer "
                                 "alike in a dense dtype; this pool's KV is read through views")
            meta, qo_indptr = view
        else:
            meta = pool.shared_flashinfer_metadata(start + seqlen)
            if seqlen > 1:
                qo_indptr = torch.arange(0, (self.batch + 1) * seqlen, seqlen, dtype=torch.int32,
                                         device=pool.device)
        if custom_mask is None:  # (backends written before custom masks take no such argument)
            backend.plan(meta, num_qo_heads=num_heads, num_kv_heads=num_kv_heads, head_dim=head_dim,
                         qo_indptr=qo_indptr, causal=True, q_dtype=dtype, kv_dtype=pool.dtype)
        else:
            backend.plan(meta, num_qo_heads=num_heads, num_kv_heads=num_kv_heads, head_dim=head_dim,
                         qo_indptr=qo_indptr, causal=False, q_dtype=dtype, kv_dtype=pool.dtype,
                         custom_mask=custom_mask)
        self.cos, self.sin = rope  # [B, S, 1, rotary_dim] each
        state_pools = pool.state_pools
        self.states = StateStep(state_pools[0], pool.active_request_ids, start, seqlen,
                                pool.page_size, valid, keep_states) if state_pools else None

    @classmethod
    def prepared(cls, pool: KvCachePool, backend: AttentionBackend, start: np.ndarray, seqlen: int,
                 cos: torch.Tensor, sin: torch.Tensor, head_dim: int,
                 write_index: torch.Tensor) -> ForwardContext:
        """A context over a backend the caller planned, RoPE tables it owns and the
        fixed write index the pool prepared for these positions (``decode_graph_index``
        / ``verify_graph_index``): the static buffers of a CUDA graph. Builds no CSR
        and plans nothing."""
        ctx = cls.__new__(cls)
        ctx.pool, ctx.backend, ctx.start = pool, backend, start
        ctx.tp = None  # graph replays serve one rank
        ctx.batch, ctx.seqlen = len(start), seqlen
        ctx.head_dim = head_dim
        ctx.kv = pool.kv_step(_window_start(start), seqlen, index=write_index)
        ctx.cos, ctx.sin = cos, sin
        ctx.states = None  # graph replays serve dense models only
        return ctx

    def reduce(self, x: torch.Tensor) -> torch.Tensor:
        """The sum over the tensor-parallel ranks of a row-parallel block's partial output ``x``
        (the identity on one rank)."""
        return x if self.tp is None else self.tp.all_reduce(x)

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Write this window's K/V ``[B, S, Hkv, D]`` into ``layer`` of the pool, then attend over
        each row's cache: ``[B*S, H, D]``."""
        kv = self.kv
        kv.write(layer, k, v)
        return self.backend.run(q.reshape(self.batch * self.seqlen, -1, self.head_dim),
                                kv.key_pages(layer),
                                kv.value_pages(layer), k_scale=kv.k_scale, v_scale=kv.v_scale)

    def commit(self) -> None:
        """Record the forward's KV as written (``KvStep.commit``) and its state snapshots as whole
        (``StateStep.commit``); call once, after the last layer succeeded."""
        self.kv.commit()
        if self.states is not None:
            self.states.commit()


def _window_start(start: np.ndarray) -> int | np.ndarray:
    """An int when every row starts at the same position (the pool validates it on
    scalars), else ``start``."""
    return int(start[0]) if (start == start[0]).all() else start
