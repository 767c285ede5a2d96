"""What a lab run measured: per-configuration numbers (``ConfigResult``) and the whole run
(``LabResult``)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from .config import Configuration, LabConfig
from .lossless import LosslessCheck
from .trace import RoundTally
from .workload import Prompt


def _total_of_medians(runs: dict[str, list[float]]) -> float:
    """Sum over prompts of the median over each prompt's runs."""
    return sum(statistics.median(v) for v in runs.values() if v)


@dataclass
class Timings:
    """Wall and decode seconds of every timed run, by prompt id (one entry per repeat), with the
    drafter's ``propose`` seconds summed over the same runs."""

    wall_s: dict[str, list[float]] = field(default_factory=dict)
    decode_s: dict[str, list[float]] = field(default_factory=dict)
    propose_s: float = 0.0

    def add(self, prompt_id: str, wall_s: float, decode_s: float, propose_s: float = 0.0) -> None:
        self.wall_s.setdefault(prompt_id, []).append(wall_s)
        self.decode_s.setdefault(prompt_id, []).append(decode_s)
        self.propose_s += propose_s

    @property
    def wall_total_s(self) -> float:
        """The workload's wall time: the sum over prompts of each prompt's median ``generate`` wall
        time."""
        return _total_of_medians(self.wall_s)

    @property
    def decode_total_s(self) -> float:
        """As ``wall_total_s`` for decode time (``Completion.stats["decode_s"]``: without the
        prefill)."""
        return _total_of_medians(self.decode_s)

    @property
    def draft_cost_share(self) -> float:
        """Time in the drafter's ``propose`` over decode time, over all runs (0.0 without decode
        time)."""
        total = sum(sum(v) for v in self.decode_s.values())
        return self.propose_s / total if total > 0 else 0.0


@dataclass
class ConfigResult:
    """One configuration: its rounds (``tally``, from the first repeat), target forwards and
    generated tokens after the first (first repeat), timings (every repeat) and lossless verdict."""

    configuration: Configuration
    tally: RoundTally = field(default_factory=RoundTally)
    decode_forwards: int = 0  # target forwards after the prefill, first repeat
    decode_tokens: int = 0  # generated tokens after the first, first repeat
    generated_tokens: int = 0
    timings: Timings = field(default_factory=Timings)
    check: LosslessCheck | None = None

    @property
    def target_forwards_per_token(self) -> float:
        """Decode forwards per token after the first (1.0 for plain decoding)."""
        return self.decode_forwards / self.decode_tokens if self.decode_tokens else 0.0

    def speedup(self, plain: Timings) -> float:
        """Plain decoding's workload wall time over this configuration's."""
        own = self.timings.wall_total_s
        return plain.wall_total_s / own if own > 0 else 0.0

    def decode_speedup(self, plain: Timings) -> float:
        """As ``speedup`` for decode time only."""
        own = self.timings.decode_total_s
        return plain.decode_total_s / own if own > 0 else 0.0

    def to_json(self, plain: Timings) -> dict[str, Any]:
        c = self.configuration
        return {"label": c.label, "drafter": c.drafter, "speculative_tokens": c.speculative_tokens,
                "generate_kwargs": {k: list(v) if isinstance(v, tuple) else v
                                    for k, v in c.generate_kwargs.items()},
                "rounds": self.tally.summary(), "tokens_per_round": self.tally.tokens_per_round,
                "target_forwards_per_token": self.target_forwards_per_token,
                "generated_tokens": self.generated_tokens,
                "wall_s": self.timings.wall_total_s, "decode_s": self.timings.decode_total_s,
                "wall_speedup": self.speedup(plain), "decode_speedup": self.decode_speedup(plain),
                "draft_cost_share": self.timings.draft_cost_share,
                "wall_s_by_prompt": self.timings.wall_s,
                "decode_s_by_prompt": self.timings.decode_s,
                "lossless": None if self.check is None else self.check.to_json()}


@dataclass
class LabResult:
    """A finished run: the config, the prompts, plain decoding's timings, one ``ConfigResult`` per
    configuration (in ``LabConfig.configurations()`` order), ``environment`` (model, code version,
    torch, threads, date) and ``notes`` (configurations skipped, and why)."""

    config: LabConfig
    prompts: list[Prompt]
    plain: Timings
    results: list[ConfigResult]
    environment: dict[str, Any]
    notes: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        """Whether every configuration passed its lossless check."""
        return all(r.check is not None and r.check.passed for r in self.results)

    @property
    def failures(self) -> list[ConfigResult]:
        """The configurations whose lossless check failed."""
        return [r for r in self.results if r.check is None or not r.check.passed]

    def best(self) -> ConfigResult:
        """The lossless configuration with the highest wall speedup (any configuration when none is
        lossless)."""
        pool = [r for r in self.results if r.check is not None and r.check.passed] or self.results
        return max(pool, key=lambda r: r.speedup(self.plain))

    def to_json(self) -> dict[str, Any]:
        best = self.best()
        return {"environment": self.environment,
                "config": {k: v for k, v in self.config.__dict__.items() if k != "extra"},
                "prompts": [p.__dict__ for p in self.prompts],
                "plain": {"wall_s": self.plain.wall_total_s, "decode_s": self.plain.decode_total_s,
                          "wall_s_by_prompt": self.plain.wall_s,
                          "decode_s_by_prompt": self.plain.decode_s},
                "passed": self.passed, "notes": self.notes,
                "best": {"label": best.configuration.label,
                         "wall_speedup": best.speedup(self.plain)},
                "configurations": [r.to_json(self.plain) for r in self.results]}
