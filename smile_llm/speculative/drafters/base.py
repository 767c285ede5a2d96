"""Drafter: the protocol every draft source of speculative decoding implements (MTP heads, n-gram
lookup, yours).

The scheduler binds and releases; the decoder asks for drafts and reports what the target computed.
Neither knows which drafter it holds. One request's life, in call order:

1. ``bind(seq, final_len)`` when the request is admitted with ``speculative_tokens > 0``. False: the
   drafter cannot serve it (e.g. its pool is full) and the request decodes plainly; it is still
   released.
2. After every target forward that covers the request (prefill chunks, padded prefill batches, plain
   steps): ``extend(seq, hidden, start)`` with the target's pre-norm hidden rows ``[len, D]`` of
   positions ``[start, start + len)``; after a prefill also ``absorb(seqs)`` (a good moment to write
   what is known, batched).
3. Before a step: ``ready(seq)``; rows that are ready and have a draft budget ``n >= 1`` are grouped
   by ``n`` and chunked by ``max_batch(n)``; each chunk gets one ``propose(seqs, n)`` and one verify
   forward.
4. After a verify window: ``commit(seq, hidden)`` with the window's true hidden rows of the kept
   positions (the last token and the accepted drafts; the bonus token follows them).
5. ``release(seq)`` when the request ends, however it ends (also after a failed forward).
   ``close()`` when the model closes.

Every hook is called for every sequence of the forward, bound or not: a drafter ignores sequences it
did not bind. Per-request state lives in the drafter or in ``seq.history`` (which only the bound
drafter reads or writes; None when unbound). Drafts are proposals only: whatever a drafter proposes,
the acceptance rule keeps the output identical to plain decoding at temperature 0 and distributed as
the target otherwise. A drafter that raises never fails a request: a raising ``propose`` (or one
proposing the wrong shape or tokens outside the vocabulary) drops that round, and the rows take a
plain step; any other hook that raises ends drafting for its rows (they get no further hook but
``release``). Either way a RuntimeWarning names the error and ``stats["draft_errors"]`` counts it.

Optional: ``propose_tree(seqs, branching) -> DraftTree`` (``draft_tree``) lets requests and draft
policies ask for token trees: per row 1 .. ``sum(branching)`` nodes of at most ``len(branching)``
depths (a static or a dynamic shape).
"""

from __future__ import annotations

from collections.abc import Sequence

from typing import TYPE_CHECKING, Protocol, runtime_checkable

import torch

if TYPE_CHECKING:
    from ..draft_row import DraftRow


@runtime_checkable
class Drafter(Protocol):
    """A source of draft tokens for speculative decoding (see the module docstring for the call
    order)."""

    # drafts per round for a request that asks for the default (None); >= 1
    num_speculative_tokens: int

    def bind(self, seq: DraftRow, final_len: int) -> bool:
        """Prepare to draft for ``seq``, whose prompt plus output never exceeds ``final_len``
        tokens. False when this drafter cannot serve it (it then decodes plainly). Must not raise
        for lack of room."""
        ...

    def ready(self, seq: DraftRow) -> bool:
        """Whether ``propose`` can draft for ``seq`` now. False for sequences it did not bind; may
        be False for a step (the row then takes a plain step) and True again later."""
        ...

    def max_batch(self, n: int) -> int:
        """The most rows one ``propose(seqs, n)`` may take (``1 << 30`` for no limit)."""
        ...

    def propose(self, seqs: Sequence[DraftRow], n: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Exactly ``n`` drafts for every row (each ``ready``): int64 ``[B, n]`` token ids in the
        vocabulary, and ``[B, n, V]`` draft distributions when some row drafted by sampling
        (``seq.draft_sampling == "sample"`` at ``seq.temperature > 0``; rows drafted greedily may
        hold anything there), else None. Any device: the decoder moves them. Must not change
        ``seq.tokens`` or the main pool."""
        ...

    def extend(self, seq: DraftRow, hidden: torch.Tensor, start: int) -> None:
        """The target computed hidden rows ``hidden`` ``[len, D]`` (pre-norm) of ``seq``'s positions
        ``[start, start + len)`` in a prefill chunk, a padded prefill batch or a plain step."""
        ...

    def absorb(self, seqs: Sequence[DraftRow]) -> None:
        """A prefill of ``seqs`` ended: absorb what ``extend`` reported and is now known (may run a
        batched forward of the drafter's own)."""
        ...

    def commit(self, seq: DraftRow, hidden: torch.Tensor) -> None:
        """A verify window at ``seq.last_pos`` kept ``len(hidden) - 1`` drafts: ``hidden``
        ``[kept + 1, D]`` are the target's true hidden rows of the window's kept positions. Called
        before the round's tokens are appended to ``seq.tokens``."""
        ...

    def release(self, seq: DraftRow) -> None:
        """Forget ``seq`` and free what ``bind`` took. Idempotent; does nothing for a sequence never
        bound."""
        ...

    def close(self) -> None:
        """Free the drafter's own resources (pools); called once, when the model closes."""
        ...
