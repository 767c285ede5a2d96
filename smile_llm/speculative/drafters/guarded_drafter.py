"""The drafter as the serving layer calls it: ``GuardedDrafter`` wraps a user's ``Drafter`` (or
``NullDrafter``, the drafter of a model that does not speculate) so that a drafter's failure never
fails a request.

- A hook other than ``propose`` that raises ends drafting for its rows: each row's
  ``drafter_failed`` is set and its ``draft_errors`` counts it, a RuntimeWarning names the error,
  and the rows hear nothing more from the drafter but their ``release``. The target's work and the
  rows' tokens are unaffected.
- ``propose`` / ``propose_tree`` that raise, or propose the wrong shape or ids outside the
  vocabulary, drop that round only (None; the rows take a plain step) and count a ``draft_errors``
  each.

The runner and the scheduler call these methods directly, with or without a real drafter behind
them."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Protocol, TypeVar

import torch

from ..draft_row import DraftRow
from ..draft_tree import DraftTree, tree_nodes
from .base import Drafter

_T = TypeVar("_T")


class GuardedRow(DraftRow, Protocol):
    """A row with the counters the guard keeps (the serving layer's ``RequestRow``)."""

    draft_errors: int  # rounds or hooks the drafter failed for this row
    drafter_failed: bool  # a hook raised: the row decodes plainly from then on


class NullDrafter:
    """The drafter of a model that does not speculate: binds nothing, is never ready, proposes
    nothing."""

    num_speculative_tokens = 0

    def bind(self, seq: DraftRow, final_len: int) -> bool:
        return False

    def ready(self, seq: DraftRow) -> bool:
        return False

    def max_batch(self, n: int) -> int:
        return 1

    def propose(self, seqs: Sequence[DraftRow], n: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        raise RuntimeError("the null drafter proposes nothing (ready() is always False)")

    def extend(self, seq: DraftRow, hidden: torch.Tensor, start: int) -> None:
        pass

    def absorb(self, seqs: Sequence[DraftRow]) -> None:
        pass

    def commit(self, seq: DraftRow, hidden: torch.Tensor) -> None:
        pass

    def release(self, seq: DraftRow) -> None:
        pass

    def close(self) -> None:
        pass


class GuardedDrafter:
    """``drafter``'s hooks with per-row failure isolation (see the module docstring).
    ``vocab_size``: the target's whole vocabulary, which every proposed id must lie in. ``user``:
    the drafter the model was given (None for plain decoding)."""

    def __init__(self, drafter: Drafter | None, vocab_size: int) -> None:
        self.user = drafter
        self.drafter: Drafter = NullDrafter() if drafter is None else drafter
        self.vocab_size = vocab_size
        # a plain model's forwards report nothing: no call per row per step on the hot path
        self.reports = drafter is not None

    @property
    def name(self) -> str:
        return type(self.drafter).__name__

    # ------------------------------------------------------ hooks that end drafting when they raise
    def _call(self, seqs: Sequence[GuardedRow], hook: str, call: Callable[[], _T]) -> _T | None:
        try:
            return call()
        except Exception as exc:  # the drafter's code: the rows go on without it
            for seq in seqs:
                seq.draft_errors += 1
                seq.drafter_failed = True
            warnings.warn(f"drafter {self.name}.{hook} failed for {len(seqs)} row(s), which decode "
                          f"plainly from now on: {type(exc).__name__}: {exc}", RuntimeWarning,
                          stacklevel=3)
            return None

    def bind(self, seq: GuardedRow, final_len: int) -> bool:
        """Whether the drafter serves ``seq`` (False also when ``bind`` raised)."""
        return bool(self._call([seq], "bind", lambda: self.drafter.bind(seq, final_len)))

    def ready(self, seq: GuardedRow) -> bool:
        """Whether ``seq`` can draft this step (never after a failed hook)."""
        return not seq.drafter_failed and bool(self._call([seq], "ready",
                                                          lambda: self.drafter.ready(seq)))

    def max_batch(self, n: int) -> int:
        return max(1, self.drafter.max_batch(n))

    def extend(self, seq: GuardedRow, hidden: torch.Tensor, start: int) -> None:
        if self.reports and not seq.drafter_failed:
            self._call([seq], "extend", lambda: self.drafter.extend(seq, hidden, start))

    def absorb(self, seqs: Sequence[GuardedRow]) -> None:
        if not self.reports:
            return
        live = [seq for seq in seqs if not seq.drafter_failed]
        if live:
            self._call(live, "absorb", lambda: self.drafter.absorb(live))

    def commit(self, seq: GuardedRow, hidden: torch.Tensor) -> None:
        if self.reports and not seq.drafter_failed:
            self._call([seq], "commit", lambda: self.drafter.commit(seq, hidden))

    def release(self, seq: GuardedRow) -> None:
        """Always called, even for a row whose drafter failed (it may hold the drafter's pages)."""
        self._call([seq], "release", lambda: self.drafter.release(seq))

    def close(self) -> None:
        self.drafter.close()

    # --------------------------------------------------------- proposals: a failure drops the round
    def propose(self, seqs: Sequence[GuardedRow],
                n: int) -> tuple[torch.Tensor, torch.Tensor | None] | None:
        """The drafter's ``n`` drafts per row, checked: int64 ``[B, n]`` ids in the vocabulary; None
        when it raised or proposed something else (the round is dropped)."""
        return self._round(seqs, lambda: self._linear(seqs, n))

    def propose_tree(self, seqs: Sequence[GuardedRow],
                     branching: tuple[int, ...]) -> DraftTree | None:
        """The drafter's token trees, checked: 1 .. ``tree_nodes(branching)`` nodes per row (a
        dynamic shape may be smaller) of at most ``len(branching)`` depths, ids in the vocabulary;
        None as ``propose``."""
        return self._round(seqs, lambda: self._tree(seqs, branching))

    def _round(self, seqs: Sequence[GuardedRow], propose: Callable[[], _T]) -> _T | None:
        try:
            return propose()
        except Exception as exc:  # the drafter's code: fail its round alone
            for seq in seqs:
                seq.draft_errors += 1
            warnings.warn(f"drafter {self.name} failed a round of {len(seqs)} row(s) and they "
                          f"decode plainly this step: {type(exc).__name__}: {exc}", RuntimeWarning,
                          stacklevel=3)
            return None

    def _linear(self, seqs: Sequence[GuardedRow],
                n: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        drafts, draft_probs = self.drafter.propose(seqs, n)
        if not isinstance(drafts, torch.Tensor) or tuple(drafts.shape) != (len(seqs), n) or \
                drafts.dtype != torch.int64:
            got = (f"{drafts.dtype} {list(drafts.shape)}" if isinstance(drafts, torch.Tensor)
                   else repr(drafts))
            raise ValueError(f"the drafter proposed {got}, need int64 [{len(seqs)}, {n}]")
        self._check_vocab(drafts)
        return drafts, draft_probs

    def _tree(self, seqs: Sequence[GuardedRow], branching: tuple[int, ...]) -> DraftTree:
        tree = getattr(self.drafter, "propose_tree")(seqs, branching)
        if not isinstance(tree, DraftTree) or tree.tokens.shape[0] != len(seqs) or \
                not 1 <= tree.size <= tree_nodes(branching) or \
                int(tree.depths().max()) > len(branching):
            raise ValueError(f"the drafter proposed {tree!r} for {len(seqs)} rows, need a "
                             f"DraftTree of 1..{tree_nodes(branching)} nodes per row and at most "
                             f"{len(branching)} depths")
        self._check_vocab(tree.tokens)
        return tree

    def _check_vocab(self, tokens: torch.Tensor) -> None:
        """ValueError unless every id lies in the target's whole vocabulary ``[0, V)`` (under tensor
        parallelism the logits' width spans every rank's partition)."""
        vocab = self.vocab_size
        if tokens.numel() and (int(tokens.min()) < 0 or int(tokens.max()) >= vocab):
            raise ValueError(f"the drafter proposed token ids outside the vocabulary [0, {vocab}): "
                             f"{tokens.tolist()}")
