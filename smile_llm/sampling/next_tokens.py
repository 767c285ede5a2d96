"""Choosing the next token of many rows at once (a decode step's batch, or one row after its
prefill).

Each row keeps its own settings; the work is batched across rows: one pass of every processor over
the rows that use it (``processors.apply_rows``), one argmax, one ``sampler.probabilities`` per
group of rows with the same warper settings, one inverse-transform draw for all sampled rows, and
one ``log_softmax`` for the rows that want logprobs. Each row's uniform comes from its positional
randomness (``PositionalRng.uniform``), so a seeded row draws the same token whichever rows it is
batched with, and the same as a speculative round's target sample at that position.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch

import numpy as np

from ..errors import GrammarError
from .grammar_state import GrammarState
from .processors import LogitsProcessing, TokenHistory, apply_rows
from .sampler import PositionalRng, draw, probabilities
from .token_mask import mask_logits


class SamplingRow(Protocol):
    """What choosing a row's next token reads of it (the serving layer's ``RequestRow`` is one)."""

    prompt: list[int]
    tokens: list[int]  # generated so far: the next token sits at position len(prompt) + len(tokens)
    processing: LogitsProcessing  # applied before any choice
    temperature: float  # 0: greedy
    top_p: float
    top_k: int
    min_p: float
    rng: PositionalRng
    logprobs: list[float] | None  # None: the row wants no logprobs
    grammar_state: GrammarState | None  # the output constraint's state (None: free text)

    def token_history(self, vocab: int, device: torch.device) -> TokenHistory:
        """The processors' statistics of the row's tokens."""
        ...

    def fail(self, error: BaseException) -> None:
        """End the row with ``error`` (its grammar failed); it appends no further token."""
        ...


def masked_rows(seqs: Sequence[SamplingRow], logits: torch.Tensor) -> torch.Tensor:
    """``logits`` ``[B, V]`` with each constrained row's disallowed tokens at ``-inf`` (one
    batched operation; free rows unchanged); the logits themselves when no row is constrained. A
    row whose grammar fails is failed with the GrammarError (``fail``) and left unmasked."""
    rows = [b for b, s in enumerate(seqs) if s.grammar_state is not None]
    if not rows:
        return logits
    words = (logits.shape[-1] + 31) // 32
    masks = np.zeros((len(rows), words), dtype=np.int32)
    for i, b in enumerate(rows):
        grammar = seqs[b].grammar_state
        assert grammar is not None
        try:
            mask = grammar.mask()
        except GrammarError as exc:  # the engine's failure: this row alone, left unmasked
            seqs[b].fail(exc)
            masks[i] = -1
            continue
        masks[i, : len(mask)] = mask[:words]
    if len(rows) == len(seqs):
        return mask_logits(logits, masks)
    out = logits.float().clone()
    index = torch.tensor(rows, device=logits.device)
    out[index] = mask_logits(logits[index], masks)
    return out


def processed_rows(seqs: Sequence[SamplingRow], logits: torch.Tensor) -> torch.Tensor:
    """``logits`` ``[B, V]`` (row b predicting ``seqs[b]``'s next token) after each row's grammar
    mask (``masked_rows``), then its processors; the logits themselves when no row has either."""
    logits = masked_rows(seqs, logits)
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


def choose_next(seqs: Sequence[SamplingRow],
                logits: torch.Tensor) -> list[tuple[int, torch.Tensor | None]]:
    """For each row b: the token ``seqs[b]`` chooses from ``logits[b]`` (greedy at temperature 0,
    else drawn with its warpers and generator at its next position) and, when the row asks for
    logprobs, the raw log-distribution ``[V]`` it was chosen from (for ``RequestRow.push``)."""
    processed = processed_rows(seqs, logits)
    tokens = processed.argmax(dim=-1).tolist()
    groups: dict[tuple[float, float, int, float], list[int]] = {}
    for b, s in enumerate(seqs):
        if s.temperature > 0:
            groups.setdefault((s.temperature, s.top_p, s.top_k, s.min_p), []).append(b)
    for (temperature, top_p, top_k, min_p), rows in groups.items():
        probs = probabilities(processed[rows] if len(rows) < len(seqs) else processed, temperature,
                              top_p, top_k, min_p)
        drawn = draw(probs, [seqs[b].rng.uniform(len(seqs[b].prompt) + len(seqs[b].tokens))
                             for b in rows]).tolist()
        for b, token in zip(rows, drawn):
            tokens[b] = token
    wanting = [b for b, s in enumerate(seqs) if s.logprobs is not None]
    logp: list[torch.Tensor | None] = [None] * len(seqs)
    if wanting:
        dist = torch.log_softmax(logits[wanting].float(), dim=-1)
        for i, b in enumerate(wanting):
            logp[b] = dist[i]
    return list(zip(tokens, logp))
