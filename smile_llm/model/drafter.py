"""MtpDrafter: the MTP head's draft KV history and greedy/sampled drafting for any batch of sequences.

History mode (Smile's default, vLLM's MTP proposer): every request has one binding in the MTP history pool
(``KvCachePool.for_mtp_history``, prefix reuse off) that absorbs every accepted position, so the head attends over
the whole context it has computed. MTP position i takes (token i+1, main hidden h_i) and is written only once token
i+1 is known and h_i is the target's true hidden state (after prefill, a plain step or a verify window), never a
draft's guess (vLLM #14649). Draft steps write at positions past the known ones; ``propose`` seals them off again
(``truncate_to``) before it returns, so the history holds verified positions only.

On a prefix hit the main pool skips the matched tokens, whose hidden states are never computed; the history then
starts at the matched length (``MtpHistory.offset``): the draft sees a shorter context, never uncomputed KV
(SGLang #19796). RoPE is relative, so pool position ``i - offset`` serves position i.

Per-round mode (``mode="per_round"``, Smile's legacy context-free drafting on a ``KvCachePool.for_mtp`` pool): each
round binds one row per sequence for the round's n positions, drafts from the last true hidden state alone, and
unbinds; nothing is kept between rounds. Cheaper per round, weaker drafts.
"""

from __future__ import annotations

import numpy as np
import torch

from ..attention.backend import AttentionBackend
from ..cache import KvCacheExhaustedError, KvCachePool
from .sampling import probabilities
from .sequence import MtpHistory, Sequence
from .transformer import Transformer


class MtpDrafter:
    """Drafts for sequences of one model through its MTP pool (a history pool, or a per-round pool)."""

    MODES = ("history", "per_round")

    def __init__(self, transformer: Transformer, pool: KvCachePool, backend: AttentionBackend,
                 mode: str = "history") -> None:
        if transformer.mtp is None:
            raise ValueError("MtpDrafter needs a model with an MTP head")
        if mode not in self.MODES:
            raise ValueError(f"draft KV mode must be one of {self.MODES}, got {mode!r}")
        self.transformer, self.pool, self.backend, self.mode = transformer, pool, backend, mode

    # ------------------------------------------------------------------ binding
    def bind(self, seq: Sequence, final_len: int) -> bool:
        """Give ``seq`` a history binding from its matched length to ``final_len`` (its prompt plus every token it may
        generate). False (the sequence then decodes without drafts) when the history pool cannot hold it. Per-round
        mode binds nothing here."""
        if self.mode == "per_round":
            seq.history = MtpHistory(0, offset=seq.matched, filled=seq.matched)
            return True
        try:
            rid = self.pool.bind_request([], max(1, final_len - seq.matched))
        except KvCacheExhaustedError:
            return False
        seq.history = MtpHistory(rid, offset=seq.matched, filled=seq.matched)
        return True

    def release(self, seq: Sequence) -> None:
        """Drop ``seq``'s draft KV: unbind its MTP history row (history mode) and clear ``seq.history``. Does nothing
        when it has none."""
        if seq.history is not None:
            if self.mode == "history":
                self.pool.unbind_request(seq.history.request_id)
            seq.history = None

    # ------------------------------------------------------------------ absorbing true hidden states
    def extend(self, seq: Sequence, hidden: torch.Tensor, start: int) -> None:
        """Record the target's hidden rows ``[start, start + len)`` (pre-norm). A gap (rows that do not follow
        the history) ends drafting for this sequence, releasing its history."""
        h = seq.history
        if h is None:
            return
        if h.filled + h.pending_rows != start:
            self.release(seq)
            return
        h.pending.append(hidden.detach())

    def absorb_known(self, seq: Sequence, keep: int = 1) -> None:
        """Write the MTP K/V of pending rows whose next token is known, keeping the last ``keep`` rows pending."""
        h = seq.history
        if h is None:
            return
        known = min(h.pending_rows - keep, len(seq.prompt) + len(seq.tokens) - 1 - h.filled)
        if known <= 0:
            return
        rows = torch.cat(h.pending)
        if self.mode == "per_round":  # nothing is kept between rounds: only the last row matters
            h.filled += known
            h.pending = [rows[known:]]
            return
        tokens = torch.tensor([seq.tokens_between(h.filled + 1, h.filled + 1 + known)], dtype=torch.int64,
                              device=self.pool.device)
        self.pool.activate_step(h.request_id)
        self.transformer.draft(tokens, rows[None, :known], np.array([h.filled - h.offset], dtype=np.int64),
                               self.pool, self.backend)
        h.filled += known
        h.pending = [rows[known:]] if known < rows.shape[0] else []

    def absorb_known_batch(self, seqs: list[Sequence]) -> None:
        """``absorb_known`` (keeping one row pending) for several sequences in one right-padded MTP forward; the
        padding's K/V is sealed off again with ``truncate_to``. Falls back to one call per sequence where the
        padding would not fit a history row's capacity."""
        hist = [s.history for s in seqs]
        known = [0 if h is None else min(h.pending_rows - 1, len(s.prompt) + len(s.tokens) - 1 - h.filled)
                 for s, h in zip(seqs, hist)]
        rows = [(s, h, n) for s, h, n in zip(seqs, hist, known) if h is not None and n > 0]
        width = max((n for _, _, n in rows), default=0)
        if self.mode == "per_round" or len(rows) < 2 or \
                any(h.filled + width > s.capacity for s, h, _ in rows):
            for seq, _, _ in rows:
                self.absorb_known(seq)
            return
        dev = self.pool.device
        tokens = torch.zeros(len(rows), width, dtype=torch.int64)
        hidden = torch.zeros(len(rows), width, self.transformer.config.hidden_size, dtype=self.transformer.dtype,
                             device=dev)
        pending = []
        for b, (seq, h, n) in enumerate(rows):
            tokens[b, :n] = torch.tensor(seq.tokens_between(h.filled + 1, h.filled + 1 + n))
            pending.append(torch.cat(h.pending))
            hidden[b, :n] = pending[-1][:n]
        start = np.array([h.filled - h.offset for _, h, _ in rows], dtype=np.int64)
        self.pool.activate_step(*[h.request_id for _, h, _ in rows])
        self.transformer.draft(tokens.to(dev), hidden, start, self.pool, self.backend)
        self.pool.truncate_to(start + np.array([n for _, _, n in rows], dtype=np.int64), start + width)
        for (_, h, n), all_rows in zip(rows, pending):
            h.filled += n
            h.pending = [all_rows[n:]] if n < all_rows.shape[0] else []

    # ------------------------------------------------------------------ drafting
    def max_batch(self, n: int) -> int:
        """The most sequences one ``propose`` of ``n`` drafts can take: per-round mode binds a row of ``n``
        positions per sequence in its pool; history mode has no limit of its own."""
        if self.mode == "history":
            return 1 << 30
        ps = self.pool.page_size
        return (self.pool.num_slots // ps) // (-(-n // ps))

    def ready(self, seq: Sequence) -> bool:
        """True when ``seq`` can draft now: its history reaches its last token."""
        h = seq.history
        return h is not None and h.filled + h.pending_rows == seq.last_pos and h.pending_rows > 0

    def propose(self, seqs: list[Sequence], n: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Draft ``n`` tokens for every sequence (all ``ready``): int64 ``[B, n]``, and for sequences drafting by
        sampling the draft distributions ``[B, n, V]`` (None when every row drafts greedily).

        Step 0 absorbs each row's pending rows in one padded batch (padding after the real columns, never read)
        and reads the draft at the last real column; steps 1..n-1 feed the drafted token and the head's own output
        back in. Afterwards the draft positions are sealed off (history mode) or the round's rows unbound
        (per-round mode), so only true positions are ever kept."""
        per_round = self.mode == "per_round"
        for seq in seqs:
            assert seq.history is not None
            if per_round or seq.history.pending_rows > n + 1:
                self.absorb_known(seq)
        hist = [s.history for s in seqs if s.history is not None]
        assert len(hist) == len(seqs)
        rows = np.array([h.pending_rows for h in hist], dtype=np.int64)
        batch, width = len(seqs), int(rows.max())
        dev = self.pool.device
        tokens = torch.zeros(batch, width, dtype=torch.int64, device=dev)
        hidden = torch.zeros(batch, width, self.transformer.config.hidden_size, dtype=self.transformer.dtype,
                             device=dev)
        for b, (seq, h) in enumerate(zip(seqs, hist)):
            tokens[b, : rows[b]] = torch.tensor(seq.tokens_between(h.filled + 1, seq.last_pos + 1))
            hidden[b, : rows[b]] = torch.cat(h.pending)
        filled = np.array([h.filled for h in hist], dtype=np.int64)
        last = filled + rows  # each row's last_pos
        if per_round:  # a fresh row per sequence: position 0 is the anchor, draft d sits at position d
            self.pool.bind_requests(batch, n)
            start0, base = np.zeros(batch, dtype=np.int64), np.ones(batch, dtype=np.int64)
        else:
            self.pool.activate_step(*[h.request_id for h in hist])
            offset = np.array([h.offset for h in hist], dtype=np.int64)
            start0, base = filled - offset, last - offset
        try:
            out = self.transformer.draft(tokens, hidden, start0, self.pool, self.backend, cols=rows - 1)
            for h, end in zip(hist, last):
                h.filled, h.pending = int(end), []
            written_end = start0 + width
            drafts = torch.empty(batch, n, dtype=torch.int64, device=dev)
            sampled = [s.draft_sampling == "sample" and s.temperature > 0 for s in seqs]
            probs = torch.zeros(batch, n, out.logits.shape[-1], device=dev) if any(sampled) else None
            for d in range(n):
                if d > 0:
                    start = base + d - 1
                    out = self.transformer.draft(drafts[:, d - 1 : d], out.hidden[:, None], start, self.pool,
                                                 self.backend)
                    written_end = np.maximum(written_end, start + 1)
                drafts[:, d] = out.logits.argmax(dim=-1)
                if probs is not None:
                    for b, seq in enumerate(seqs):
                        if sampled[b]:
                            q = probabilities(out.logits[b], seq.temperature, seq.top_p)
                            probs[b, d] = q / q.sum()
                            gen = seq.rng.at(int(last[b]) + 1 + d, seq.rng.DRAFT)
                            drafts[b, d] = torch.multinomial(probs[b, d], 1, generator=gen)[0]
            if not per_round:
                self.pool.truncate_to(base, written_end)
        finally:
            if per_round:
                self.pool.unbind_requests()
        return drafts, probs

    def commit(self, seq: Sequence, hidden: torch.Tensor) -> None:
        """After a verify window at ``last_pos`` kept ``len(hidden) - 1`` drafts: the window's true hidden rows
        of the kept positions become pending (their next tokens are the kept drafts and the bonus)."""
        h = seq.history
        if h is not None:
            h.pending = [hidden.detach()]
