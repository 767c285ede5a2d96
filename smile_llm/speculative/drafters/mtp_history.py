"""MtpHistoryDrafter: the MTP head drafting over the request's whole computed context (Smile's
default, vLLM's MTP proposer).

Every request has one binding in the MTP history pool (``KvCachePool.for_mtp_history``, prefix reuse
off) that absorbs every verified position, so the head attends over all of it. Draft steps write
past the known positions; ``propose`` seals them off again (``truncate_to``) before it returns, so
the history holds verified positions only.

On a prefix hit the main pool skips the matched tokens, whose hidden states are never computed; the
history then starts at the matched length (``MtpHistory.offset``): the draft sees a shorter context,
never uncomputed KV (SGLang #19796). RoPE is relative, so pool position ``i - offset`` serves
position i.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from ...attention.backend import AttentionBackend
from ...cache import KvCacheExhaustedError, KvCacheLayout, KvCachePool
from ..draft_row import DraftRow
from ...models.transformer import Transformer
from .mtp_base import MtpDrafterBase, MtpHistory


class MtpHistoryDrafter(MtpDrafterBase):
    """MTP drafts over a per-request history binding in ``pool`` (see the module docstring)."""

    @classmethod
    def create(cls, transformer: Transformer, main: KvCachePool, backend: AttentionBackend,
               max_seq_len: int) -> MtpHistoryDrafter:
        """A drafter with a history pool of as many slots as ``main`` (rows of ``max_seq_len``).
        RuntimeError when there is too little memory for it."""
        c = transformer.config
        # a pipeline stage without the head books the pool's calls and holds none of its K/V
        layers = c.mtp_num_hidden_layers if transformer.mtp is not None else 0
        layout = KvCacheLayout(layers, c.num_key_value_heads, c.head_dim,
                               max(1, main.num_slots // max(1, max_seq_len)), max_seq_len)
        pool = KvCachePool.for_mtp_history(layout, main.device, main.dtype, main.page_size,
                                           main.num_slots)
        return cls(transformer, pool, backend)

    def bind(self, seq: DraftRow, final_len: int) -> bool:
        """Give ``seq`` a history binding from its matched length to ``final_len``; False (it then
        decodes plainly) when the history pool cannot hold it."""
        try:
            rid = self.pool.bind_request([], max(1, final_len - seq.matched))
        except KvCacheExhaustedError:
            return False
        seq.history = MtpHistory(rid, offset=seq.matched, filled=seq.matched)
        return True

    def _unbind(self, h: MtpHistory) -> None:
        assert h.request_id is not None
        self.pool.unbind_request(h.request_id)

    def max_batch(self, n: int) -> int:
        return 1 << 30

    # ----------------------------------------------------------------- absorbing true hidden states
    def absorb_known(self, seq: DraftRow, keep: int = 1) -> None:
        """Write the MTP K/V of pending rows whose next token is known, keeping the last ``keep``
        rows pending."""
        h = self.state(seq)
        if h is None:
            return
        known = h.known_rows(seq, keep)
        if known <= 0:
            return
        assert h.request_id is not None
        rows = torch.cat(h.pending)
        tokens = torch.tensor([seq.tokens_between(h.filled + 1, h.filled + 1 + known)],
                              dtype=torch.int64, device=self.pool.device)
        self.pool.activate_step(h.request_id)
        self.transformer.draft(tokens, rows[None, :known],
                               np.array([h.filled - h.offset], dtype=np.int64),
                               self.pool, self.backend)
        h.drop(rows, known)

    def absorb(self, seqs: Sequence[DraftRow]) -> None:
        """``absorb_known`` (keeping one row pending) for every sequence, several in one
        right-padded MTP forward; the padding's K/V is sealed off again with ``truncate_to``. Falls
        back to one call per sequence where the padding would not fit a history row's capacity."""
        rows = []
        for s in seqs:
            h = self.state(s)
            if h is not None and h.known_rows(s, 1) > 0:
                rows.append((s, h, h.known_rows(s, 1)))
        width = max((n for _, _, n in rows), default=0)
        if len(rows) < 2 or any(h.filled + width > s.capacity for s, h, _ in rows):
            for seq, _, _ in rows:
                self.absorb_known(seq)
            return
        dev = self.pool.device
        tokens = torch.zeros(len(rows), width, dtype=torch.int64)
        hidden = torch.zeros(len(rows), width, self.transformer.config.hidden_size,
                             dtype=self.transformer.dtype, device=dev)
        pending = []
        for b, (seq, h, n) in enumerate(rows):
            tokens[b, :n] = torch.tensor(seq.tokens_between(h.filled + 1, h.filled + 1 + n))
            pending.append(torch.cat(h.pending))
            hidden[b, :n] = pending[-1][:n]
        start = np.array([h.filled - h.offset for _, h, _ in rows], dtype=np.int64)
        ids = [h.request_id for _, h, _ in rows]
        assert all(i is not None for i in ids)
        self.pool.activate_step(*[i for i in ids if i is not None])
        self.transformer.draft(tokens.to(dev), hidden, start, self.pool, self.backend)
        self.pool.truncate_to(start + np.array([n for _, _, n in rows], dtype=np.int64),
                              start + width)
        for (_, h, n), all_rows in zip(rows, pending):
            h.drop(all_rows, n)

    # ------------------------------------------------------------------ drafting
    def propose(self, seqs: Sequence[DraftRow], n: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Draft ``n`` tokens for every (``ready``) sequence. Step 0 absorbs each row's pending rows
        in one padded batch (padding after the real columns, never read); afterwards the draft
        positions are sealed off, so the history keeps true positions only."""
        for seq in seqs:
            h = self.state(seq)
            # a long backlog: absorb it alone, not as padding
            if h is not None and h.pending_rows > n + 1:
                self.absorb_known(seq)
        hist, tokens, hidden, rows = self._window(seqs)
        ids = [h.request_id for h in hist]
        self.pool.activate_step(*[i for i in ids if i is not None])
        offset = np.array([h.offset for h in hist], dtype=np.int64)
        filled = np.array([h.filled for h in hist], dtype=np.int64)
        base = filled + rows - offset
        drafts, probs, written_end = self._chain(seqs, hist, tokens, hidden, rows, filled - offset,
                                                 base, n)
        self.pool.truncate_to(base, written_end)
        return drafts, probs
