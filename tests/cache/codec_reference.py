"""An independent, plain reference for the KV page codecs (``smile_llm.cache.codecs``): exact
rational arithmetic (``Fraction``), one element at a time, grids enumerated from their bit
definitions, and bit streams built as Python integers. Slow by design; tests use small pages.

Each ``reference_*`` function takes raw pages ``[n, P, H, D]`` and the group scales the codec
chose, and returns ``(parts, decoded, picks)``: the parts the codec must store (same keys, dtypes
and shapes), the float32 values it must decode to, and which candidate each finite group took.
The choice among a group's candidate scales is a least squared error that the codec sums in
float64, so it is checked rather than recomputed: the reference recomputes every candidate
exactly, asserts that the codec's is one of them and that its exact error is the least within a
relative ``SLACK``; everything else (the candidates, the codes, the packing, the decoded values,
non-finite groups) the reference fixes bit for bit.
"""

from __future__ import annotations

import bisect
import math
from fractions import Fraction

import numpy as np
import torch

E2M1 = [Fraction(v) for v in (0, 0.5, 1, 1.5, 2, 3, 4, 6)]
E2 = (0, 1, 2, 3, 4, 6, 8, 12)  # twice the E2M1 values: integers
NVFP4_CANDIDATES = 3  # the nearest FP8 group scale and the two FP8 values below it
CLIP_RATIOS = (1.0, 0.95, 0.9, 0.85, 0.8, 0.75, 0.7, 0.65, 0.6, 0.55, 0.5)
SLACK = 1e-12  # float64 sums in another order than the exact one


def fp8_e4m3_grid() -> list[Fraction]:
    """The non-negative finite FP8 e4m3fn values, indexed by their bit pattern (0 .. 126)."""
    values = []
    for bits in range(127):
        exponent, mantissa = bits >> 3, bits & 7
        if exponent == 0:
            values.append(Fraction(mantissa, 8) * Fraction(2) ** -6)
        else:
            values.append((1 + Fraction(mantissa, 8)) * Fraction(2) ** (exponent - 7))
    return values


FP8 = fp8_e4m3_grid()


def nearest_index(value: Fraction, grid: list[Fraction]) -> int:
    """Index of the grid value nearest ``value`` (grid ascending), a tie going to the even index;
    beyond the ends, the end."""
    above = bisect.bisect_left(grid, value)  # grid[above - 1] < value <= grid[above]
    if above == 0 or above == len(grid):
        return min(above, len(grid) - 1)
    below_distance, above_distance = value - grid[above - 1], grid[above] - value
    if below_distance != above_distance:
        return above - 1 if below_distance < above_distance else above
    return above if above % 2 == 0 else above - 1


def to_float32(value: Fraction | float) -> float:
    """Round to the nearest float32 (via float64, exact for the values here)."""
    return float(np.float32(float(value)))


def float16_grid() -> list[float]:
    """Every finite float16 value, ascending, zero once."""
    every = np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(np.float64)
    return sorted({float(v) + 0.0 for v in every if np.isfinite(v)})


FLOAT16 = float16_grid()


def float16_down(value: Fraction | float) -> float:
    """The largest finite float16 <= value (-inf if none)."""
    i = bisect.bisect_right(FLOAT16, value)
    return FLOAT16[i - 1] if i else -math.inf


def float16_up(value: Fraction | float) -> float:
    """The smallest finite float16 >= value (inf if none)."""
    i = bisect.bisect_left(FLOAT16, value)
    return FLOAT16[i] if i < len(FLOAT16) else math.inf


def pack_stream(codes: list[int], bits: int) -> list[int]:
    """Codes as one little-endian bit stream, cut into bytes (least significant first)."""
    stream = 0
    for j, code in enumerate(codes):
        assert 0 <= code < (1 << bits)
        stream |= code << (bits * j)
    return [(stream >> (8 * k)) & 0xFF for k in range(len(codes) * bits // 8)]


def groups(n: int, p: int, h: int, d: int, along: str, size: int) -> list[list[tuple]]:
    """Each group's element indices ``(page, token, head, channel)``: along tokens (``"tokens"``)
    or along channels (``"channels"``), ``size`` elements a group."""
    found = []
    for page in range(n):
        for head in range(h):
            if along == "tokens":
                for channel in range(d):
                    for start in range(0, p, size):
                        found.append([(page, t, head, channel) for t in range(start, start + size)])
            else:
                for token in range(p):
                    for start in range(0, d, size):
                        found.append([(page, token, head, c) for c in range(start, start + size)])
    return found


def packed(codes: dict[tuple, int], shape: tuple[int, int, int, int], along: str,
           bits: int) -> torch.Tensor:
    """uint8 codes packed along tokens or channels, one stream per row."""
    n, p, h, d = shape
    if along == "tokens":
        out = torch.zeros(n, p * bits // 8, h, d, dtype=torch.uint8)
        for page in range(n):
            for head in range(h):
                for channel in range(d):
                    row = pack_stream([codes[(page, t, head, channel)] for t in range(p)], bits)
                    for k, byte in enumerate(row):
                        out[page, k, head, channel] = byte
    else:
        out = torch.zeros(n, p, h, d * bits // 8, dtype=torch.uint8)
        for page in range(n):
            for token in range(p):
                for head in range(h):
                    row = pack_stream([codes[(page, token, head, c)] for c in range(d)], bits)
                    for k, byte in enumerate(row):
                        out[page, token, head, k] = byte
    return out


def common_denominator(values: list[float | Fraction]) -> tuple[list[int], int]:
    """``values`` (floats, or Fractions whose denominators are powers of two) as integers over one
    common denominator, exactly: ``(numerators, denominator)``."""
    ratios = [v.as_integer_ratio() for v in values]
    den = max(d for _, d in ratios)  # every denominator is a power of two: the largest holds all
    return [n * (den // d) for n, d in ratios], den


def nearest_multiple(num: int, unit: int, top: int) -> int:
    """The integer nearest ``num / unit`` (``unit > 0``), ties to even, clamped to [0, top]."""
    q, r = divmod(num, unit)  # num = q * unit + r, 0 <= r < unit
    if 2 * r > unit or (2 * r == unit and q % 2 == 1):
        q += 1
    return min(max(q, 0), top)


def nearest_e2m1(magnitude: int, unit: int) -> int:
    """The E2M1 index nearest ``magnitude / unit`` (integers, ``unit >= 0``; 0 for unit 0), ties
    to the even index, saturating at 6."""
    if unit == 0:
        return 0
    best = 0
    for i, twice in enumerate(E2):
        distance = abs(2 * magnitude - twice * unit)
        best_distance = abs(2 * magnitude - E2[best] * unit)
        if distance < best_distance or (distance == best_distance and i % 2 == 0):
            best = i
    return best



def least_error(chosen: int, errors: list[Fraction], where: tuple) -> None:
    """Assert candidate ``chosen``'s exact squared error is the least of ``errors`` within SLACK."""
    least = min(errors)
    assert errors[chosen] <= least * (1 + Fraction(SLACK)), \
        (f"group {where}: candidate {chosen} has squared error {float(errors[chosen])!r}, "
         f"candidate {errors.index(least)} {float(least)!r}")


def reference_nvfp4(raw: torch.Tensor, chosen_scale: torch.Tensor
                    ) -> tuple[dict[str, torch.Tensor], torch.Tensor, list[int]]:
    """NVFP4, keys and values alike in groups of 16 channels of a token: power-of-two page scale;
    the candidate FP8 group scales (the nearest to ``amax / (6 * page_scale)``, ties to even,
    clamped to 448, and the two FP8 values below it); E2M1 codes (nearest, ties to even,
    saturating) for ``chosen_scale``, the codec's scale bits ``[n, P, H, D/16]``, which must be
    the least-error candidate; a group with a non-finite element is NaN."""
    x = raw.to(torch.float64).tolist()
    n, p, h, d = raw.shape
    page_scale = torch.zeros(n, h, dtype=torch.float32)
    scale = torch.zeros(n, p, h, d // 16, dtype=torch.uint8)
    codes: dict[tuple, int] = {}
    decoded = torch.zeros(n, p, h, d, dtype=torch.float32)
    picks = []
    for page in range(n):
        for head in range(h):
            finite = [abs(x[page][t][head][c]) for t in range(p) for c in range(d)
                      if math.isfinite(x[page][t][head][c])]
            amax = Fraction(max(finite, default=0.0))
            if amax == 0:
                s2 = Fraction(1)
            else:
                k = math.ceil(math.log2(amax / 2688))
                while 2688 * Fraction(2) ** (k - 1) >= amax:
                    k -= 1
                while 2688 * Fraction(2) ** k < amax:
                    k += 1
                s2 = Fraction(2) ** min(max(k, -149), 127)
            page_scale[page, head] = float(s2)
            for group in groups(1, p, 1, d, "channels", 16):
                members = [(page, t, head, c) for (_, t, _, c) in group]
                values = [x[a][t][b][c] for (a, t, b, c) in members]
                where = (page, members[0][1], head, members[0][3] // 16)
                if not all(math.isfinite(v) for v in values):
                    scale[where] = 0x7F
                    for m in members:
                        codes[m] = 0
                        decoded[m] = float("nan")
                    continue
                ratio = min(max(abs(Fraction(v)) for v in values) / (6 * s2), Fraction(448))
                nearest = nearest_index(ratio, FP8)  # FP8 is ascending in its bits
                candidates = [max(nearest - i, 0) for i in range(NVFP4_CANDIDATES)]
                ints, den = common_denominator([abs(v) for v in values]
                                               + [FP8[bits] * s2 for bits in candidates])
                magnitudes, units = ints[:16], ints[16:]
                indices = [[nearest_e2m1(m, u) for m in magnitudes] for u in units]
                errors = [Fraction(sum((E2[i] * u - 2 * m) ** 2 for i, m in zip(got, magnitudes)),
                                   4 * den * den) for got, u in zip(indices, units)]
                scale_bits = int(chosen_scale[where])
                assert scale_bits in candidates, \
                    f"group {where}: scale bits {scale_bits} not among the candidates {candidates}"
                picks.append(candidates.index(scale_bits))
                least_error(picks[-1], errors, where)
                scale[where] = scale_bits
                unit = FP8[scale_bits] * s2
                for m, v, magnitude in zip(members, values, indices[picks[-1]]):
                    negative = math.copysign(1.0, v) < 0
                    codes[m] = magnitude | (8 if negative else 0)
                    exact = E2M1[magnitude] * unit
                    decoded[m] = -to_float32(exact) if negative else to_float32(exact)
    parts = {"codes": packed(codes, (n, p, h, d), "channels", 4), "scale": scale,
             "page_scale": page_scale}
    return parts, decoded, picks


def int_candidates(lo: float, hi: float, levels: int) -> list[tuple[float, float]]:
    """The (step, zero) of each clipped range of [lo, hi] (finite floats): the range shrunk by
    ``(1 - r) * (hi - lo) / 2`` at each end in float64 (Python's floats), then zero = the largest
    float16 <= the lower end, step = the smallest float16 with zero + L * step >= the upper end
    (inf when none)."""
    half = (hi - lo) / 2
    found = []
    for ratio in CLIP_RATIOS:
        cut = (1.0 - ratio) * half
        zero = float16_down(lo + cut)
        step = math.inf if zero == -math.inf else \
            float16_up((Fraction(hi - cut) - Fraction(zero)) / levels)
        found.append((step, zero))
    return found


def reference_int(raw: torch.Tensor, side: str, bits: int, value_group: int,
                  chosen_step: torch.Tensor, chosen_zero: torch.Tensor
                  ) -> tuple[dict[str, torch.Tensor], torch.Tensor, list[int]]:
    """Asymmetric integers, keys per channel and values per token: the candidates of each group
    (``int_candidates``), of which ``chosen_step``/``chosen_zero`` (the codec's float16 scales)
    must be the least-error one, codes nearest (ties to even, clamped); a group with a
    non-finite element, or whose whole range's zero or step is not a finite float16, is NaN."""
    x = raw.to(torch.float64).tolist()
    n, p, h, d = raw.shape
    levels = (1 << bits) - 1
    along, size = ("tokens", p) if side == "k" else ("channels", value_group)
    scale_shape = (n, h, d) if side == "k" else (n, p, h, d // value_group)
    step_out = torch.zeros(scale_shape, dtype=torch.float64)
    zero_out = torch.zeros(scale_shape, dtype=torch.float64)
    codes: dict[tuple, int] = {}
    decoded = torch.zeros(n, p, h, d, dtype=torch.float32)
    picks = []
    for group in groups(n, p, h, d, along, size):
        values = [x[a][t][b][c] for (a, t, b, c) in group]
        a, t, b, c = group[0]
        where = (a, b, c) if side == "k" else (a, t, b, c // value_group)
        candidates: list[tuple[float, float]] = []
        if all(math.isfinite(v) for v in values):
            candidates = int_candidates(min(values), max(values), levels)
        if not candidates or candidates[0][1] == -math.inf or candidates[0][0] == math.inf:
            step_out[where] = zero_out[where] = float("nan")
            for m in group:
                codes[m] = 0
                decoded[m] = float("nan")
            continue
        ints, den = common_denominator(values + [v for pair in candidates for v in pair])
        numerators, scales = ints[:size], ints[size:]
        all_codes, errors = [], []
        for unit, base in zip(scales[0::2], scales[1::2]):  # each step and zero, over den
            got = [nearest_multiple(v - base, unit, levels) if unit else 0 for v in numerators]
            all_codes.append(got)
            errors.append(Fraction(sum((base + q * unit - v) ** 2
                                       for q, v in zip(got, numerators)), den * den))
        step, zero = float(chosen_step[where]), float(chosen_zero[where])
        assert (step, zero) in candidates, \
            f"group {where}: (step, zero) {(step, zero)} not among the candidates {candidates}"
        picks.append(candidates.index((step, zero)))
        least_error(picks[-1], errors, where)
        step_out[where], zero_out[where] = step, zero
        for m, q in zip(group, all_codes[picks[-1]]):
            codes[m] = q
            decoded[m] = to_float32(Fraction(zero) + q * Fraction(step))
    parts = {"codes": packed(codes, (n, p, h, d), along, bits),
             "scale": step_out.to(torch.float16), "zero": zero_out.to(torch.float16)}
    return parts, decoded, picks
