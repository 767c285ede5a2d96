"""Chi-square two-sample test of sampled outcomes (numpy and ``math`` only: scipy is not a
dependency).

``chi2_sf(x, df)`` is the survival function ``P(X >= x)`` of the chi-square distribution, the
regularized upper incomplete gamma ``Q(df / 2, x / 2)``: a power series below ``a + 1``, Lentz's
continued fraction above (Numerical Recipes' ``gammq``), both to ~1e-14 relative.
``two_sample_chi2`` compares two samples of hashable outcomes with the 2 x C contingency statistic
``sum (O - E)^2 / E``, ``C - 1`` degrees of freedom.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Hashable, Iterable
from typing import NamedTuple

import numpy as np

_EPS = 1e-15
_TINY = 1e-300
_MAX_TERMS = 10_000
# the cell that pools outcomes seen fewer than ``min_count`` times in both samples together
RARE = "<rare>"


class ChiSquare(NamedTuple):
    """A test's statistic, degrees of freedom and p-value (1.0 when there are fewer than two
    cells)."""

    statistic: float
    df: int
    p_value: float


def _lower_series(a: float, x: float) -> float:
    """Regularized lower incomplete gamma P(a, x) by its power series (converges fast for
    x < a + 1)."""
    term = total = 1.0 / a
    ap = a
    for _ in range(_MAX_TERMS):
        ap += 1.0
        term *= x / ap
        total += term
        if abs(term) < abs(total) * _EPS:
            break
    return total * math.exp(-x + a * math.log(x) - math.lgamma(a))


def _upper_fraction(a: float, x: float) -> float:
    """Regularized upper incomplete gamma Q(a, x) by its continued fraction (modified Lentz; for
    x >= a + 1)."""
    b = x + 1.0 - a
    c = 1.0 / _TINY
    d = 1.0 / b
    h = d
    for i in range(1, _MAX_TERMS):
        an = -i * (i - a)
        b += 2.0
        d = an * d + b
        d = _TINY if abs(d) < _TINY else d
        c = b + an / c
        c = _TINY if abs(c) < _TINY else c
        d = 1.0 / d
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < _EPS:
            break
    return math.exp(-x + a * math.log(x) - math.lgamma(a)) * h


def chi2_sf(x: float, df: int) -> float:
    """``P(X >= x)`` for X chi-square with ``df`` degrees of freedom. ValueError for ``df < 1``.

    >>> round(chi2_sf(3.841458820694124, 1), 6)
    0.05
    >>> round(chi2_sf(18.307038053275146, 10), 6)
    0.05
    >>> chi2_sf(0.0, 3)
    1.0
    """
    if df < 1:
        raise ValueError(f"df must be >= 1, got {df}")
    if x <= 0:
        return 1.0
    a, half = df / 2.0, x / 2.0
    if half < a + 1.0:
        return max(0.0, 1.0 - _lower_series(a, half))
    return _upper_fraction(a, half)


def two_sample_chi2(first: Iterable[Hashable], second: Iterable[Hashable],
                    min_count: int = 10) -> ChiSquare:
    """Whether two samples of outcomes come from one distribution: the 2 x C contingency chi-square
    over the outcomes, where outcomes seen fewer than ``min_count`` times in both samples together
    share one cell (so that expected counts stay large enough for the chi-square approximation).
    ValueError for an empty sample."""
    a, b = Counter(first), Counter(second)
    n_a, n_b = sum(a.values()), sum(b.values())
    if n_a == 0 or n_b == 0:
        raise ValueError("both samples must be non-empty")
    rows: dict[Hashable, list[int]] = {}
    for outcome in set(a) | set(b):
        key = outcome if a[outcome] + b[outcome] >= min_count else RARE
        pair = rows.setdefault(key, [0, 0])
        pair[0] += a[outcome]
        pair[1] += b[outcome]
    if len(rows) < 2:
        return ChiSquare(0.0, 0, 1.0)
    observed = np.array(list(rows.values()), dtype=np.float64).T  # [2, C]
    pooled = observed.sum(axis=0)  # [C]
    expected = np.outer([n_a, n_b], pooled) / (n_a + n_b)  # [2, C]
    statistic = float(((observed - expected) ** 2 / expected).sum())
    df = len(rows) - 1
    return ChiSquare(statistic, df, chi2_sf(statistic, df))
