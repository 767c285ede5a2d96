"""One row's acceptance of a verify forward: the target's choice at every window position or tree
node, with the row's processors and sampling, then the rule of ``acceptance`` or ``draft_tree``.

The target's choice at a position is the one plain decoding would make there: greedy at temperature
0, else the draw with the row's uniform of that position (``PositionalRng``), after the row's
processors applied as if the drafts before it were accepted. So greedy speculative output equals
plain greedy output token for token, and a seeded sampled row gives the same tokens whether it
speculates or not (drafted greedily)."""

from __future__ import annotations

from typing import Protocol

import numpy as np
import torch

from ..sampling.sampler import PositionalRng, probabilities, sample
from .acceptance import AcceptResult, accept_greedy, accept_rejection
from .draft_tree import DraftTree, TreeAccept, accept_tree


class VerifyRow(Protocol):
    """What acceptance reads of a row (the serving layer's ``RequestRow``)."""

    temperature: float
    top_p: float
    top_k: int
    min_p: float
    draft_sampling: str
    rng: PositionalRng

    @property
    def last_pos(self) -> int: ...

    def processed(self, logits: torch.Tensor, extra: list[list[int]]) -> torch.Tensor:
        """``logits`` ``[N, V]`` after the row's processors, row i having generated ``extra[i]``
        after its tokens."""
        ...


def accept_window(seq: VerifyRow, drafts: torch.Tensor, draft_probs: torch.Tensor | None,
                  logits: torch.Tensor) -> AcceptResult:
    """The kept drafts and the bonus token of ``seq``'s window ``[last, d_0..d_{n-1}]`` (``logits``
    ``[n + 1, V]``; ``n`` may be 0: the token plain decoding would choose). Greedy drafts: compared
    with the target's choice at every window position (``accept_greedy``); sampled drafts
    (``draft_probs`` ``[n, V]``): rejection sampling against the target's distributions."""
    d = drafts.tolist()
    first = seq.last_pos + 1  # window position j predicts the token at first + j
    # the request's processors at every window position, as if the drafts before it were accepted
    logits = seq.processed(logits, [d[:j] for j in range(len(d) + 1)])
    if seq.temperature > 0 and seq.draft_sampling == "sample" and draft_probs is not None:
        p = probabilities(logits, seq.temperature, seq.top_p, seq.top_k, seq.min_p)
        return accept_rejection(d, draft_probs, p, seq.rng.at(first, seq.rng.ACCEPT))
    if seq.temperature == 0:
        targets = logits.argmax(dim=-1).tolist()
    else:  # the draws plain decoding would make
        uniforms = [seq.rng.uniform(first + j) for j in range(len(d) + 1)]
        targets = sample(logits, seq.temperature, seq.top_p, uniforms, top_k=seq.top_k,
                         min_p=seq.min_p).tolist()
    if not d:  # a window of the last token alone: plain decoding's choice
        return AcceptResult(0, (targets[0],))
    return accept_greedy(d, targets)


def accept_tree_row(seq: VerifyRow, tree: DraftTree, row: int, depths: np.ndarray,
                    logits: torch.Tensor) -> TreeAccept:
    """The longest path of row ``row`` of ``tree`` the target follows: its choice after every node
    (the node's path taken as accepted; the node at depth d predicts the token at
    ``last_pos + 1 + d``), then the walk of ``accept_tree``."""
    logits = seq.processed(logits, tree.paths(row))
    if seq.temperature == 0:
        targets = logits.argmax(dim=-1).tolist()
    else:
        first = seq.last_pos + 1
        uniforms = [seq.rng.uniform(first + int(d)) for d in depths]
        targets = sample(logits, seq.temperature, seq.top_p, uniforms, top_k=seq.top_k,
                         min_p=seq.min_p).tolist()
    return accept_tree(tree.children(row), lambda slot: targets[slot])
