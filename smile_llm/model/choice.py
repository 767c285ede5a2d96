"""Choosing the next token of many rows at once (a decode step's batch, or one row after its prefill).

Each row keeps its own settings; the work is batched across rows: one pass of every processor over the rows that
use it (``logits_processing.apply_rows``), one argmax, one ``sampling.probabilities`` per group of rows with the
same warper settings, one inverse-transform draw for all sampled rows, and one ``log_softmax`` for the rows that
want logprobs. Each row's uniform comes from its positional randomness (``PositionalRng.uniform``), so a seeded row
draws the same token whichever rows it is batched with, and the same as a speculative round's target sample at
that position.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from .logits_processing import apply_rows
from .sampling import draw, probabilities

if TYPE_CHECKING:
    from .sequence import Sequence


def processed_rows(seqs: list[Sequence], logits: torch.Tensor) -> torch.Tensor:
    """``logits`` ``[B, V]`` (row b predicting ``seqs[b]``'s next token) after each row's processors; the logits
    themselves when no row has one."""
    rows = [b for b, s in enumerate(seqs) if s.processing.active]
    if not rows:
        return logits
    processing = [seqs[b].processing for b in rows]
    seen = counts = None
    if any(p.needs_history for p in processing):
        histories = [seqs[b].token_history(logits.shape[-1], logits.device) for b in rows]
        counts = torch.stack([h.counts for h in histories])
        seen = torch.stack([h.prompt_seen for h in histories]) | (counts > 0)
    lengths = [len(seqs[b].tokens) for b in rows]
    if len(rows) == len(seqs):
        return apply_rows(processing, logits, seen, counts, lengths)
    out = logits.float().clone()
    index = torch.tensor(rows, device=logits.device)
    out[index] = apply_rows(processing, logits[index], seen, counts, lengths)
    return out


def choose_next(seqs: list[Sequence], logits: torch.Tensor) -> list[tuple[int, torch.Tensor | None]]:
    """For each row b: the token ``seqs[b]`` chooses from ``logits[b]`` (greedy at temperature 0, else drawn with
    its warpers and generator at its next position) and, when the row asks for logprobs, the raw log-distribution
    ``[V]`` it was chosen from (for ``Sequence.push``)."""
    processed = processed_rows(seqs, logits)
    tokens = processed.argmax(dim=-1).tolist()
    groups: dict[tuple[float, float, int, float], list[int]] = {}
    for b, s in enumerate(seqs):
        if s.temperature > 0:
            groups.setdefault((s.temperature, s.top_p, s.top_k, s.min_p), []).append(b)
    for (temperature, top_p, top_k, min_p), rows in groups.items():
        probs = probabilities(processed[rows] if len(rows) < len(seqs) else processed, temperature, top_p, top_k,
                              min_p)
        drawn = draw(probs, [seqs[b].rng.uniform(len(seqs[b].prompt) + len(seqs[b].tokens)) for b in rows]).tolist()
        for b, token in zip(rows, drawn):
            tokens[b] = token
    wanting = [b for b, s in enumerate(seqs) if s.logprobs is not None]
    logp: list[torch.Tensor | None] = [None] * len(seqs)
    if wanting:
        dist = torch.log_softmax(logits[wanting].float(), dim=-1)
        for i, b in enumerate(wanting):
            logp[b] = dist[i]
    return list(zip(tokens, logp))
