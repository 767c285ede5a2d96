"""What the two MTP drafters share: a request's ``MtpHistory``, absorbing the target's true hidden
states, and the chained draft steps of the head.

MTP position i takes (token i+1, main hidden h_i) and is computed only once token i+1 is known and
h_i is the target's true hidden state (after prefill, a plain step or a verify window), never a
draft's guess (vLLM #14649). Hidden rows whose next token is not yet known wait in
``MtpHistory.pending``. How the head's K/V is kept (a persistent history binding, or a fresh row per
round) is the subclass's business: ``MtpHistoryDrafter``, ``MtpPerRoundDrafter``.
"""

from __future__ import annotations

from collections.abc import Sequence

from dataclasses import dataclass, field

import numpy as np
import torch

from ...attention.backend import AttentionBackend, companion_backend
from ...cache import KvCachePool
from ...models.checkpoint.config import MAX_SPECULATIVE_TOKENS
from ..draft_chain import DraftChain
from ..draft_tree import DraftTree
from ..draft_row import DraftRow
from ...models.transformer import Transformer
from .draft_choice import choose_drafts, draft_buffers


@dataclass
class MtpHistory:
    """A request's MTP draft state: MTP position i (main position i, draft-pool position
    ``i - offset``) holds the head's K/V for (token i+1, hidden h_i). Positions ``[offset, filled)``
    are absorbed; ``pending`` holds the hidden rows of ``[filled, filled + len)`` whose next tokens
    are known only once ``last_pos`` is reached. ``offset`` is the matched prefix length: the draft
    never reads positions it has not computed. ``request_id``: the binding in the history pool (None
    for per-round drafting, which keeps no K/V)."""

    request_id: int | None
    offset: int
    filled: int
    # [rows_i, D] chunks, in position order
    pending: list[torch.Tensor] = field(default_factory=list)

    @property
    def pending_rows(self) -> int:
        """Hidden-state rows waiting to be absorbed."""
        return sum(int(h.shape[0]) for h in self.pending)

    def known_rows(self, seq: DraftRow, keep: int) -> int:
        """Pending rows whose next token is known, keeping at least the last ``keep`` rows
        pending."""
        return min(self.pending_rows - keep, len(seq.prompt) + len(seq.tokens) - 1 - self.filled)

    def drop(self, rows: torch.Tensor, n: int) -> None:
        """Mark the first ``n`` of the pending ``rows`` (``cat(pending)``) absorbed."""
        self.filled += n
        self.pending = [rows[n:]] if n < rows.shape[0] else []


class MtpDrafterBase:
    """Drafting from a model's MTP head through a draft pool (``pool``); per-request state in
    ``seq.history``."""

    def __init__(self, transformer: Transformer, pool: KvCachePool,
                 backend: AttentionBackend) -> None:
        self._depth_logits: list[torch.Tensor] | None = None  # set while propose_tree runs
        if not transformer.has_mtp:  # held here, or by the last pipeline stage
            raise ValueError(f"{type(self).__name__} needs a model with an MTP head")
        self.transformer, self.pool, self.backend = transformer, pool, backend
        # The draft chain's own backend: planned once per round for the history, so no other forward
        # may replan it
        self.chain_backend = companion_backend(backend, pool.device)
        self.num_speculative_tokens = min(transformer.config.num_speculative_tokens or 3,
                                          MAX_SPECULATIVE_TOKENS)

    @staticmethod
    def state(seq: DraftRow) -> MtpHistory | None:
        """``seq``'s MTP history (None when this drafter does not serve it)."""
        h = seq.history
        assert h is None or isinstance(h, MtpHistory)
        return h

    def _unbind(self, h: MtpHistory) -> None:
        """Free what ``bind`` took for ``h``."""

    def release(self, seq: DraftRow) -> None:
        """Drop ``seq``'s draft state (and its history binding). Does nothing when it has none."""
        h = self.state(seq)
        if h is not None:
            self._unbind(h)
            seq.history = None

    def close(self) -> None:
        self.pool.close()

    def propose_tree(self, seqs: Sequence[DraftRow], branching: tuple[int, ...]) -> DraftTree:
        """A token tree per row (``draft_tree``): the head's chain of ``len(branching)`` drafts (as
        ``propose`` drafts it), and at each depth j the head's next ``branching[j] - 1`` most likely
        tokens as leaves beside the chain's node (``DraftTree.chain_with_alternatives``). No extra
        forward of the head."""
        self._depth_logits = []
        try:
            drafts, _ = getattr(self, "propose")(seqs, len(branching))
            logits = torch.stack(self._depth_logits, dim=1)  # [B, k, V]
        finally:
            self._depth_logits = None
        return DraftTree.chain_with_alternatives(drafts, logits, branching)

    def extend(self, seq: DraftRow, hidden: torch.Tensor, start: int) -> None:
        """Queue the target's hidden rows ``[start, start + len)``. A gap (rows that do not follow
        the history) ends drafting for this sequence, releasing its state."""
        h = self.state(seq)
        if h is None:
            return
        if h.filled + h.pending_rows != start:
            self.release(seq)
            return
        h.pending.append(hidden.detach())

    def commit(self, seq: DraftRow, hidden: torch.Tensor) -> None:
        """The window's true hidden rows of the kept positions become pending (their next tokens are
        the kept drafts and the bonus)."""
        h = self.state(seq)
        if h is not None:
            h.pending = [hidden.detach()]

    def ready(self, seq: DraftRow) -> bool:
        """True when ``seq`` can draft now: its history reaches its last token."""
        h = self.state(seq)
        return h is not None and h.filled + h.pending_rows == seq.last_pos and h.pending_rows > 0

    # ------------------------------------------------------------------ drafting
    def _window(self, seqs: Sequence[DraftRow]
                ) -> tuple[list[MtpHistory], torch.Tensor, torch.Tensor, np.ndarray]:
        """Each row's pending rows right-padded into one step-0 input: (histories, tokens int64
        ``[B, W]``, hidden ``[B, W, D]``, real widths int64 ``[B]``). Column j of row b is MTP
        position ``filled_b + j``."""
        hist = [self.state(s) for s in seqs]
        assert all(h is not None and h.pending_rows > 0 for h in hist)
        real = [h for h in hist if h is not None]
        rows = np.array([h.pending_rows for h in real], dtype=np.int64)
        dev = self.pool.device
        tokens = torch.zeros(len(seqs), int(rows.max()), dtype=torch.int64, device=dev)
        hidden = torch.zeros(len(seqs), int(rows.max()), self.transformer.config.hidden_size,
                             dtype=self.transformer.dtype, device=dev)
        for b, (seq, h) in enumerate(zip(seqs, real)):
            tokens[b, : rows[b]] = torch.tensor(seq.tokens_between(h.filled + 1, seq.last_pos + 1))
            hidden[b, : rows[b]] = torch.cat(h.pending)
        return real, tokens, hidden, rows

    def _chain(self, seqs: Sequence[DraftRow], hist: list[MtpHistory], tokens: torch.Tensor,
               hidden: torch.Tensor, rows: np.ndarray, start0: np.ndarray, base: np.ndarray, n: int
               ) -> tuple[torch.Tensor, torch.Tensor | None, np.ndarray]:
        """Run the head: step 0 over the padded window at draft-pool positions ``start0`` (reading
        the draft at each row's last real column), steps 1..n-1 at ``base + d - 1`` fed the drafted
        token and the head's own output, as one ``DraftChain`` over the history ``[0, base)`` (their
        K/V stay out of the pool). Marks every pending row absorbed. Returns (drafts ``[B, n]``,
        draft distributions or None, the end of what each row wrote in the draft pool: step 0's
        window, padding included)."""
        out = self.transformer.draft(tokens, hidden, start0, self.pool, self.backend, cols=rows - 1)
        last = np.array([h.filled for h in hist], dtype=np.int64) + rows  # each row's last_pos
        for h, end in zip(hist, last):
            h.filled, h.pending = int(end), []
        written_end = start0 + tokens.shape[1]
        drafts, probs = draft_buffers(seqs, n, out.logits.shape[-1], self.pool.device)
        chain = (DraftChain(self.transformer, self.pool, self.chain_backend, base, n - 1) if n > 1
                 else None)
        for d in range(n):
            if chain is not None and d > 0:
                out = chain.step(drafts[:, d - 1 : d], out.hidden[:, None])
            choose_drafts(seqs, out.logits, last + 1 + d, d, drafts, probs)
            if self._depth_logits is not None:  # propose_tree ranks each depth's alternatives
                self._depth_logits.append(out.logits)
        return drafts, probs, written_end
