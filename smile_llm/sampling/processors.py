"""A request's logits processors, applied to the target's logits before greedy choice, sampling or
speculative acceptance (so a draft is kept only if the processed distribution would choose it:
speculation stays lossless).

In Hugging Face's order, on float32 logits ``[N, V]`` of N positions, position i having seen
``prompt`` and ``generated[i]``:

1. ``repetition_penalty`` (HF ``RepetitionPenaltyLogitsProcessor``): every token of the prompt or
   the output so far has its logit divided by the penalty when positive, multiplied when negative;
2. ``presence_penalty`` and ``frequency_penalty`` (OpenAI): minus ``presence`` once for every token
   the output holds, minus ``frequency`` per occurrence (output tokens only);
3. ``logit_bias``: added to the listed tokens' logits;
4. ``min_new_tokens`` (HF ``MinNewTokensLengthLogitsProcessor``): the EOS ids get ``-inf`` while
   fewer tokens were generated.

The sampling warpers (temperature, ``top_k``, ``top_p``, ``min_p``) are in
``sampler.probabilities``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class LogitsProcessing:
    """The processors of one request (the defaults change nothing; ``active`` says whether any is
    on)."""

    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: tuple[tuple[int, float], ...] = ()
    min_new_tokens: int = 0
    eos_ids: tuple[int, ...] = ()

    @property
    def needs_history(self) -> bool:
        """Whether a processor reads the token statistics (``TokenHistory``)."""
        return (self.repetition_penalty != 1.0 or self.presence_penalty != 0.0
                or self.frequency_penalty != 0.0)

    @property
    def active(self) -> bool:
        """Whether any processor changes logits."""
        return (self.repetition_penalty != 1.0 or self.presence_penalty != 0.0 or
                self.frequency_penalty != 0.0 or bool(self.logit_bias) or
                (self.min_new_tokens > 0 and bool(self.eos_ids)))

    def apply(self, logits: torch.Tensor, prompt: Sequence[int],
              generated: Sequence[Sequence[int]]) -> torch.Tensor:
        """Processed float32 logits ``[N, V]`` (a new tensor); row i has seen ``prompt`` then
        ``generated[i]``."""
        history = TokenHistory(prompt, logits.shape[-1], logits.device)
        seen, counts = history.rows([list(g) for g in generated])
        return apply_rows([self] * logits.shape[0], logits, seen, counts,
                          [len(g) for g in generated])


def apply_rows(processing: Sequence[LogitsProcessing],
               logits: torch.Tensor, seen: torch.Tensor | None,
               counts: torch.Tensor | None, generated_len: Sequence[int]) -> torch.Tensor:
    """Processed float32 logits ``[N, V]`` (a new tensor), row i with ``processing[i]`` and its
    statistics: ``seen`` bool ``[N, V]`` (in the prompt or the output) and ``counts`` float32
    ``[N, V]`` (occurrences in the output), None when no row's processors read them, and
    ``generated_len[i]`` output tokens. One tensor operation per processor for all rows. A processor
    that is off for a row leaves that row exactly unchanged (a penalty of 1 or 0 is exact in float
    arithmetic)."""
    out = logits.float().clone()
    dev, dt = out.device, out.dtype
    r = _per_row([p.repetition_penalty for p in processing], dt, dev)
    if not isinstance(r, float) or r != 1.0:
        assert seen is not None
        out = torch.where(seen, torch.where(out < 0, out * r, out / r), out)
    f = _per_row([p.frequency_penalty for p in processing], dt, dev)
    pr = _per_row([p.presence_penalty for p in processing], dt, dev)
    if not isinstance(f, float) or not isinstance(pr, float) or f or pr:
        assert counts is not None
        out -= f * counts + pr * (counts > 0).to(dt)
    vocab = out.shape[-1]
    # one indexed add for every listed token of every row (ids checked at creation)
    rows, ids, bias = [], [], []
    for i, p in enumerate(processing):
        for t, b in p.logit_bias:
            rows.append(i)
            ids.append(t)
            bias.append(b)
    if rows:
        out.index_put_((torch.tensor(rows, device=dev), torch.tensor(ids, device=dev)),
                       torch.tensor(bias, dtype=dt, device=dev), accumulate=True)
    short, eos = [], []
    for i, (p, n) in enumerate(zip(processing, generated_len)):
        if n < p.min_new_tokens:
            for e in p.eos_ids:
                if e < vocab:
                    short.append(i)
                    eos.append(e)
    if short:
        out[torch.tensor(short, device=dev), torch.tensor(eos, device=dev)] = float("-inf")
    return out


def _per_row(values: list[float], dtype: torch.dtype, device: torch.device) -> float | torch.Tensor:
    """One factor per row: the value itself when every row has it (a scalar operation, as in Hugging
    Face's processors), else a ``[N, 1]`` tensor."""
    if all(v == values[0] for v in values):
        return values[0]
    return torch.tensor(values, dtype=dtype, device=device)[:, None]


class TokenHistory:
    """A request's token statistics for the processors, kept up to date as tokens are appended
    (``push``), so a step costs O(vocab) tensor work, not a pass over the whole history:
    ``prompt_seen`` bool ``[V]`` (fixed) and ``counts`` float32 ``[V]`` (output occurrences); a
    token was seen if it is in the prompt or counted. On the CPU a push writes through a numpy view
    of ``counts`` (no tensor op per token)."""

    def __init__(self, prompt: Sequence[int], vocab: int, device: torch.device) -> None:
        self.vocab = vocab
        self.prompt_seen = torch.zeros(vocab, dtype=torch.bool, device=device)
        ids = torch.tensor([t for t in prompt if 0 <= t < vocab], dtype=torch.int64, device=device)
        self.prompt_seen[ids] = True
        self.counts = torch.zeros(vocab, dtype=torch.float32, device=device)
        self._host = self.counts.numpy() if self.counts.device.type == "cpu" else None
        self.length = 0

    def push(self, token: int) -> None:
        """Record one output token."""
        self.length += 1
        if 0 <= token < self.vocab:
            if self._host is not None:
                self._host[token] += 1
            else:
                self.counts[token] += 1

    def rows(self, extra: Sequence[Sequence[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """``(seen, counts)`` ``[N, V]``: row i as if ``extra[i]`` were appended to the output."""
        n = len(extra)
        counts = self.counts.expand(n, -1).clone()
        for i, tokens in enumerate(extra):
            for t in tokens:
                if 0 <= t < self.vocab:
                    counts[i, t] += 1
        return self.prompt_seen | (counts > 0), counts
