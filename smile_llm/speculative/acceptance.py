"""Acceptance rules of speculative decoding: which drafted tokens a verify window keeps.

A round drafts ``k`` tokens ``d_0..d_{k-1}`` after the last token, runs one target forward over the
window ``[last, d_0..d_{k-1}]`` (k+1 positions) and keeps ``d_0..d_{r-1}`` plus one bonus token from
the target.

- ``accept_greedy`` (Smile's rule): sample the target at every window position; ``r`` is the longest
  prefix where the samples equal the drafts and the bonus is the target's sample at position ``r``.
  Every kept token is the target's own sample given the kept prefix, so with deterministic (greedy)
  drafts the output has exactly the target's distribution at any temperature, and equals plain
  greedy decoding at temperature 0.
- ``accept_rejection`` (Leviathan et al. / Chen et al.): for drafts sampled from ``q``, keep ``d_i``
  with probability ``min(1, p(d_i) / q(d_i))``; on the first rejection the bonus is drawn from
  ``norm(max(0, p - q))``, after a full accept from ``p`` at the last position. Also distributed
  exactly as the target.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ..cache.tokens import as_int_array


@dataclass(frozen=True)
class AcceptResult:
    """``tokens``: the accepted drafts followed by the bonus token (``num_accepted + 1`` tokens)."""

    num_accepted: int
    tokens: tuple[int, ...]

    @property
    def num_tokens(self) -> int:
        """Tokens this round adds: the accepted drafts plus the bonus (``num_accepted + 1``)."""
        return len(self.tokens)

    @property
    def bonus_token(self) -> int:
        """The target's own token after the accepted drafts (the last of ``tokens``)."""
        return self.tokens[-1]


@dataclass(frozen=True)
class RoundRecord:
    """One speculative round of one request, as given to its ``on_round`` hook: the position of the
    window's first token (``position``, the last token before the round), the drafts proposed (``k``
    of them), how many the target accepted and the tokens the round added (the accepted drafts and
    the bonus token, before any stop cut them)."""

    position: int
    k: int
    drafts: tuple[int, ...]
    num_accepted: int
    tokens: tuple[int, ...]
    # a token-tree round: each draft's parent (0: the root); k is its nodes
    parents: tuple[int, ...] | None = None


def accept_greedy(drafts: Sequence[int], target_samples: Sequence[int]) -> AcceptResult:
    """Longest prefix of ``drafts`` equal to ``target_samples``, plus the target's sample after it.
    ValueError if ``drafts`` is empty or ``target_samples`` does not have ``len(drafts) + 1``
    entries.

    Smile's ``SpeculativeDecodingTest`` table:

    >>> accept_greedy([10, 20, 30], [10, 20, 30, 99])
    AcceptResult(num_accepted=3, tokens=(10, 20, 30, 99))
    >>> r = accept_greedy([10, 20, 30], [11, 20, 30, 99])
    >>> r.num_accepted, r.tokens, r.bonus_token
    (0, (11,), 11)
    >>> accept_greedy([10, 20, 30], [10, 21, 30, 99]).tokens
    (10, 21)
    >>> accept_greedy([1], [1])
    Traceback (most recent call last):
        ...
    ValueError: target_samples must have len(drafts) + 1 = 2 entries, got 1
    >>> accept_greedy([], [1])
    Traceback (most recent call last):
        ...
    ValueError: drafts must be non-empty
    """
    d = as_int_array(drafts, "drafts").tolist() if drafts is not None else []
    if not d:
        raise ValueError("drafts must be non-empty")
    if target_samples is None:
        raise ValueError("target_samples must have len(drafts) + 1 entries, got None")
    t = as_int_array(target_samples, "target_samples").tolist()
    if len(t) != len(d) + 1:
        raise ValueError(f"target_samples must have len(drafts) + 1 = {len(d) + 1} "
                         f"entries, got {len(t)}")
    r = 0
    while r < len(d) and d[r] == t[r]:  # keep a draft while the target sampled the same token
        r += 1
    return AcceptResult(r, tuple(d[:r]) + (t[r],))


def accept_rejection(drafts: Sequence[int], draft_probs: torch.Tensor, target_probs: torch.Tensor,
                     generator: torch.Generator) -> AcceptResult:
    """Standard speculative rejection sampling. ``draft_probs`` ``[k, V]`` are the distributions the
    drafts were sampled from, ``target_probs`` ``[k+1, V]`` the target's at the window positions
    (both after temperature and top-p; normalised here). ValueError on mismatched shapes."""
    d = as_int_array(drafts, "drafts").tolist()
    k = len(d)
    if k == 0:
        raise ValueError("drafts must be non-empty")
    if (draft_probs.shape[0] != k or target_probs.shape[0] != k + 1
            or draft_probs.shape[1:] != target_probs.shape[1:]):
        raise ValueError(f"need draft_probs [{k}, V] and target_probs [{k + 1}, V], got "
                         f"{list(draft_probs.shape)} and {list(target_probs.shape)}")
    p, q = target_probs.double(), draft_probs.double()
    # top-p leaves them unnormalised
    p, q = p / p.sum(-1, keepdim=True), q / q.sum(-1, keepdim=True)
    u = torch.rand(k, generator=generator, device=generator.device, dtype=torch.float64)
    idx = torch.tensor(d, device=p.device)
    rows = torch.arange(k, device=p.device)
    ratio = (p[rows, idx] / q[rows, idx]).clamp(max=1.0)  # q(d_i) > 0: d_i was drawn from q
    rejected = (u.to(p.device) >= ratio).nonzero()
    if rejected.numel() == 0:
        bonus = torch.multinomial(p[k], 1, generator=generator)
        return AcceptResult(k, tuple(d) + (int(bonus),))
    r = int(rejected[0])
    residual = (p[r] - q[r]).clamp(min=0.0)
    if float(residual.sum()) <= 0.0:  # p == q at this position: a rejection there has probability 0
        residual = p[r]
    bonus = torch.multinomial(residual / residual.sum(), 1, generator=generator)
    return AcceptResult(r, tuple(d[:r]) + (int(bonus),))
