"""The lab's lossless checks: speculative decoding must not change what the target generates.

At temperature 0 every speculative output must equal plain decoding's token for token
(``first_mismatch``). At temperature > 0 the outputs are random, so the check is statistical
(``distribution_check``): the joint outcome of the first few generated tokens, drawn many times
plainly and speculatively with different seeds, must not differ by a two-sample chi-square test
(p-values Bonferroni-corrected over the prompts, failing below ``P_FAIL``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .chi2 import ChiSquare, two_sample_chi2

P_FAIL = 1e-3


@dataclass(frozen=True)
class Mismatch:
    """A speculative output that differs from plain decoding's: at ``position`` (the first differing
    generated token) plain made ``plain_token`` and speculation ``speculative_token`` (None past an
    output's end)."""

    prompt_id: str
    position: int
    plain_token: int | None
    speculative_token: int | None

    def describe(self) -> str:
        return (f"prompt {self.prompt_id!r}: token {self.position} is {self.speculative_token} "
                f"speculatively, {self.plain_token} plainly")


@dataclass(frozen=True)
class LosslessCheck:
    """A configuration's verdict: ``kind`` "greedy" (``mismatches`` lists every differing output) or
    "distribution" (``tests`` per prompt, ``p_value`` the corrected minimum; with ``seeded``, also
    every timed seeded output compared with plain decoding's of the same seed, ``mismatches`` where
    they differ)."""

    kind: str
    passed: bool
    mismatches: tuple[Mismatch, ...] = ()
    tests: tuple[ChiSquare, ...] = ()
    p_value: float | None = None
    seeded: bool = False

    def describe(self) -> str:
        """One line for tables and logs."""
        if self.kind == "greedy":
            if self.passed:
                return "identical"
            return f"MISMATCH ({len(self.mismatches)} outputs differ)"
        if self.mismatches:
            return (f"MISMATCH ({len(self.mismatches)} seeded outputs differ; "
                    f"p = {self.p_value:.3g})")
        verdict = "same distribution" if self.passed else "DIFFERENT DISTRIBUTION"
        return f"{verdict} (p = {self.p_value:.3g})" + (", seeded outputs identical"
                                                        if self.seeded else "")

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "passed": self.passed, "p_value": self.p_value,
                "seeded": self.seeded, "mismatches": [m.__dict__ for m in self.mismatches],
                "tests": [t._asdict() for t in self.tests]}


def first_mismatch(prompt_id: str, plain: Sequence[int],
                   speculative: Sequence[int]) -> Mismatch | None:
    """Where two greedy outputs first differ (a shorter output differs where it ends), or None if
    equal."""
    if list(plain) == list(speculative):
        return None
    n = next((i for i, (a, b) in enumerate(zip(plain, speculative)) if a != b),
             min(len(plain), len(speculative)))
    return Mismatch(prompt_id, n, plain[n] if n < len(plain) else None,
                    speculative[n] if n < len(speculative) else None)


def greedy_check(mismatches: Sequence[Mismatch]) -> LosslessCheck:
    """The greedy verdict over a configuration's outputs: passed when nothing differed."""
    return LosslessCheck("greedy", not mismatches, tuple(mismatches))


def distribution_check(plain: Sequence[Sequence[tuple[int, ...]]],
                       speculative: Sequence[Sequence[tuple[int, ...]]],
                       seeded: Sequence[Mismatch] | None = None) -> LosslessCheck:
    """The sampled verdict: per prompt i, a two-sample chi-square of the outcomes ``plain[i]``
    against ``speculative[i]``; the p-value is the smallest, times the number of prompts
    (Bonferroni, at most 1); passed when it is at least ``P_FAIL`` and ``seeded`` is empty.
    ``seeded``: where whole seeded outputs differed from plain decoding's with the same seed, for a
    configuration whose drafts are greedy (its tokens are plain decoding's own draws, so every one
    must match); None when that does not hold (sampled drafts)."""
    if len(plain) != len(speculative) or not plain:
        raise ValueError("need one plain and one speculative sample per prompt, and at least one "
                         "prompt")
    tests = tuple(two_sample_chi2(a, b) for a, b in zip(plain, speculative))
    p = min(1.0, min(t.p_value for t in tests) * len(tests))
    return LosslessCheck("distribution", p >= P_FAIL and not seeded, tuple(seeded or ()), tests, p,
                         seeded is not None)
