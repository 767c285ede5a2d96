"""A request's logits processors, applied to the target's logits before greedy choice, sampling or speculative
acceptance (so a draft is kept only if the processed distribution would choose it: speculation stays lossless).

In Hugging Face's order, on float32 logits ``[N, V]`` of N positions, position i having seen ``prompt`` and
``generated[i]``:

1. ``repetition_penalty`` (HF ``RepetitionPenaltyLogitsProcessor``): every token of the prompt or the output so far
   has its logit divided by the penalty when positive, multiplied when negative;
2. ``presence_penalty`` and ``frequency_penalty`` (OpenAI): minus ``presence`` once for every token the output holds,
   minus ``frequency`` per occurrence (output tokens only);
3. ``logit_bias``: added to the listed tokens' logits;
4. ``min_new_tokens`` (HF ``MinNewTokensLengthLogitsProcessor``): the EOS ids get ``-inf`` while fewer tokens were
   generated.

The sampling warpers (temperature, ``top_k``, ``top_p``, ``min_p``) are in ``sampling.probabilities``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class LogitsProcessing:
    """The processors of one request (the defaults change nothing; ``active`` says whether any is on)."""

    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: tuple[tuple[int, float], ...] = ()
    min_new_tokens: int = 0
    eos_ids: tuple[int, ...] = ()

    @property
    def active(self) -> bool:
        """Whether any processor changes logits."""
        return (self.repetition_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0
                or bool(self.logit_bias) or (self.min_new_tokens > 0 and bool(self.eos_ids)))

    def apply(self, logits: torch.Tensor, prompt: Sequence[int], generated: Sequence[Sequence[int]]) -> torch.Tensor:
        """Processed float32 logits ``[N, V]`` (a new tensor); row i has seen ``prompt`` then ``generated[i]``."""
        out = logits.float().clone()
        vocab = out.shape[-1]
        for i, gen in enumerate(generated):
            row = out[i]
            if self.repetition_penalty != 1.0:
                seen = torch.tensor(sorted({*prompt, *gen}), dtype=torch.int64, device=row.device)
                seen = seen[seen < vocab]
                score = row[seen]
                row[seen] = torch.where(score < 0, score * self.repetition_penalty, score / self.repetition_penalty)
            if (self.presence_penalty or self.frequency_penalty) and len(gen):
                ids = torch.tensor(list(gen), dtype=torch.int64, device=row.device)
                counts = torch.bincount(ids[ids < vocab], minlength=vocab).to(row.dtype)
                row -= self.frequency_penalty * counts + self.presence_penalty * (counts > 0).to(row.dtype)
            for token, bias in self.logit_bias:
                if token < vocab:
                    row[token] += bias
            if len(gen) < self.min_new_tokens:
                for eos in self.eos_ids:
                    if eos < vocab:
                        row[eos] = float("-inf")
        return out
