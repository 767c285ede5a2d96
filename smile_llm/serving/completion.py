"""Completion: the result of one generation, as every caller receives it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Completion:
    """The result of one generation: ``text`` (cut at a stop string), ``prompt_tokens``, generated
    ``tokens`` (without a stop token id), ``finish_reason`` ("stop" or "length"), ``logprobs``
    (one per token, or None), ``stats`` (counters and timings; see ``RequestRow.stats``),
    ``top_logprobs`` (with ``logprobs=k``: per token, its k most likely alternatives, id ->
    logprob) and ``prompt_logprobs`` (with ``prompt_logprobs=k``: per prompt token, None for the
    first, else its own logprob and the k most likely alternatives). Logprobs are under the
    model's raw distribution (before processors and temperature)."""

    text: str
    prompt_tokens: list[int]
    # generated ids, without a stop token id (a stop string's tokens stay; text is cut)
    tokens: list[int]
    finish_reason: str  # "stop" or "length"
    logprobs: list[float] | None
    stats: dict[str, Any] = field(default_factory=dict)
    top_logprobs: list[dict[int, float]] | None = None
    prompt_logprobs: list[dict[int, float] | None] | None = None
