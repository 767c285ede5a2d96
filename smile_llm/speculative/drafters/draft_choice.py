"""How a drafter with a language-model head turns one draft step's logits into drafts: the argmax
for rows drafting greedily, a sample from the row's own distribution (kept, for rejection sampling)
for rows drafting by sampling.

A row drafts by sampling when ``seq.draft_sampling == "sample"`` and ``seq.temperature > 0``; its
draw for the token at position p uses ``seq.rng.at(p, DRAFT)``, so it depends on (seed, position)
alone."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from ...sampling.sampler import probabilities
from ..draft_row import DraftRow


def sampled_rows(seqs: Sequence[DraftRow]) -> list[bool]:
    """Which rows draft by sampling."""
    return [s.draft_sampling == "sample" and s.temperature > 0 for s in seqs]


def draft_buffers(seqs: Sequence[DraftRow], n: int, vocab: int, device: torch.device
                  ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Empty drafts int64 ``[B, n]`` and, when some row drafts by sampling, zeroed distributions
    float32 ``[B, n, vocab]`` (else None)."""
    drafts = torch.empty(len(seqs), n, dtype=torch.int64, device=device)
    probs = torch.zeros(len(seqs), n, vocab, device=device) if any(sampled_rows(seqs)) else None
    return drafts, probs


def choose_drafts(seqs: Sequence[DraftRow], logits: torch.Tensor, positions: np.ndarray, d: int,
                  drafts: torch.Tensor, probs: torch.Tensor | None) -> None:
    """Fill column ``d`` of ``drafts`` (and of ``probs`` for rows drafting by sampling) from
    ``logits`` ``[B, V]``; row b's draft is the token at position ``positions[b]``. Mutates
    ``drafts`` and ``probs`` only."""
    drafts[:, d] = logits.argmax(dim=-1)
    if probs is None:
        return
    for b, (seq, sampled) in enumerate(zip(seqs, sampled_rows(seqs))):
        if sampled:
            q = probabilities(logits[b], seq.temperature, seq.top_p)
            probs[b, d] = q / q.sum()
            gen = seq.rng.at(int(positions[b]), seq.rng.DRAFT)
            drafts[b, d] = torch.multinomial(probs[b, d], 1, generator=gen)[0]
