"""MtpPerRoundDrafter: context-free MTP drafting (Smile's legacy mode) on a ``KvCachePool.for_mtp``
pool.

Each round binds one row per sequence for the round's n positions, drafts from the last true hidden
state alone and unbinds; nothing is kept between rounds. Cheaper per round, weaker drafts than
``MtpHistoryDrafter``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from ...attention.backend import AttentionBackend
from ...cache import KvCacheLayout, KvCachePool
from ...models.checkpoint.config import MAX_SPECULATIVE_TOKENS
from ..draft_row import DraftRow
from ...models.transformer import Transformer
from .mtp_base import MtpDrafterBase, MtpHistory

PER_ROUND_ROWS = 256  # rows of the per-round draft pool: larger batches draft in several rounds


class MtpPerRoundDrafter(MtpDrafterBase):
    """MTP drafts from the last true hidden state, on a fresh draft-pool row per round."""

    @classmethod
    def create(cls, transformer: Transformer, main: KvCachePool, backend: AttentionBackend,
               max_seq_len: int) -> MtpPerRoundDrafter:
        """A drafter whose pool holds ``MAX_SPECULATIVE_TOKENS + 2`` positions for each of at least
        PER_ROUND_ROWS rows."""
        c = transformer.config
        # a pipeline stage without the head books the pool's calls and holds none of its K/V
        layers = c.mtp_num_hidden_layers if transformer.mtp is not None else 0
        rows = max(1, main.num_slots // max(1, max_seq_len))
        layout = KvCacheLayout(layers, c.num_key_value_heads, c.head_dim,
                               max(rows, PER_ROUND_ROWS), MAX_SPECULATIVE_TOKENS + 2)
        return cls(transformer,
                   KvCachePool.for_mtp(layout, main.device, main.dtype, main.page_size), backend)

    def bind(self, seq: DraftRow, final_len: int) -> bool:
        """Start tracking ``seq``'s true hidden states; binds nothing in the pool. Always True."""
        seq.history = MtpHistory(None, offset=seq.matched, filled=seq.matched)
        return True

    def absorb(self, seqs: Sequence[DraftRow]) -> None:
        """Drop every known pending row but the last: only the last true hidden state is ever
        drafted from."""
        for seq in seqs:
            self._drop_known(seq)

    def _drop_known(self, seq: DraftRow) -> None:
        h = self.state(seq)
        if h is not None and h.known_rows(seq, 1) > 0:
            h.drop(torch.cat(h.pending), h.known_rows(seq, 1))

    def max_batch(self, n: int) -> int:
        """The rows of ``n`` positions the pool holds at once."""
        ps = self.pool.page_size
        return (self.pool.num_slots // ps) // (-(-n // ps))

    def propose(self, seqs: Sequence[DraftRow], n: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Draft ``n`` tokens for every (``ready``) sequence on fresh rows (position 0 the anchor,
        draft d at position d), unbound again before it returns."""
        self.absorb(seqs)
        hist, tokens, hidden, rows = self._window(seqs)
        batch = len(seqs)
        self.pool.bind_requests(batch, n)
        try:
            drafts, probs, _ = self._chain(seqs, hist, tokens, hidden, rows,
                                           np.zeros(batch, dtype=np.int64),
                                           np.ones(batch, dtype=np.int64), n)
        finally:
            self.pool.unbind_requests()
        return drafts, probs
