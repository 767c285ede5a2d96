"""The draft policy as the runner calls it: ``GuardedPolicy`` wraps a ``DraftPolicy`` so that a
policy's failure costs only its choice. A method that raises, or a ``choose`` outside what the row
can take, gives a RuntimeWarning naming the error; the row then takes a plain step (``choose`` gives
0) and an observation is dropped."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import TypeVar

from .draft_policy import DraftPolicy
from .draft_row import DraftRow
from .draft_tree import MAX_BRANCHING, MAX_TREE_NODES, TreeWalk, tree_nodes

_T = TypeVar("_T")


class GuardedPolicy:
    """``policy``'s methods with their failures contained (see the module docstring)."""

    def __init__(self, policy: DraftPolicy) -> None:
        self.policy = policy

    def _call(self, method: str, call: Callable[[], _T]) -> _T | None:
        try:
            return call()
        except Exception as exc:  # the caller's policy: never the request's failure
            warnings.warn(f"draft policy {type(self.policy).__name__}.{method} failed: "
                          f"{type(exc).__name__}: {exc}", RuntimeWarning, stacklevel=3)
            return None

    def choose(self, seq: DraftRow, budget: int) -> int | tuple[int, ...]:
        """The policy's drafts (or tree shape) for ``seq``'s next round, checked; 0 (a plain step)
        when it failed."""
        def checked() -> int | tuple[int, ...]:
            out = self.policy.choose(seq, budget)
            self._check_choice(out, seq, budget)
            return out

        return self._call("choose", checked) or 0

    def _check_choice(self, out: object, seq: DraftRow, budget: int) -> None:
        """ValueError unless ``out`` is a draft count in ``0 .. budget`` or, for a row with
        ``tree_rounds`` and a policy with ``observe_tree``, a tree shape of at most ``budget``
        depths within the tree limits."""
        if isinstance(out, tuple):
            if not seq.tree_rounds:
                raise ValueError(f"chose the token tree {out!r} for a row that cannot take tree "
                                 "rounds (its drafter has no propose_tree, or the model has "
                                 "DeltaNet layers or tensor parallelism)")
            if not callable(getattr(self.policy, "observe_tree", None)):
                raise ValueError(f"chose the token tree {out!r} but has no observe_tree")
            if not 1 <= len(out) <= budget or any(not isinstance(b, int) or
                                                  not 1 <= b <= MAX_BRANCHING
                                                  for b in out) or tree_nodes(out) > MAX_TREE_NODES:
                raise ValueError(f"chose the token tree {out!r}, need 1..{budget} depths of "
                                 f"1..{MAX_BRANCHING} nodes, at most {MAX_TREE_NODES} in all")
        elif not isinstance(out, int) or isinstance(out, bool) or not 0 <= out <= budget:
            raise ValueError(f"chose {out!r} drafts, need an int in 0..{budget} or a "
                             "token-tree shape")

    def observe_round(self, seqs: Sequence[DraftRow], k: int, accepted: list[int], draft_s: float,
                      verify_s: float) -> None:
        self._call("observe_round",
                   lambda: self.policy.observe_round(seqs, k, accepted, draft_s, verify_s))

    def observe_tree(self, seqs: Sequence[DraftRow], branching: tuple[int, ...],
                     walks: list[TreeWalk], draft_s: float, verify_s: float) -> None:
        self._call("observe_tree",
                   lambda: getattr(self.policy, "observe_tree")(seqs, branching, walks, draft_s,
                                                                verify_s))

    def observe_plain(self, seqs: Sequence[DraftRow], seconds: float) -> None:
        self._call("observe_plain", lambda: self.policy.observe_plain(seqs, seconds))

    def forget(self, seq: DraftRow) -> None:
        """The request of ``seq`` ended (a policy with ``forget`` drops its per-request
        estimates)."""
        forget = getattr(self.policy, "forget", None)
        if callable(forget):
            self._call("forget", lambda: forget(seq))
