"""Asymmetric integer pages (KIVI): ``bits``-bit codes (4, 3 or 2) with a float16 step and zero
point per group, the group's range clipped to the least squared error; keys per channel, values per
token.

Groups: a key group is one channel of one head over all the page's tokens; a value group is
``value_group`` consecutive channels (default 32, or head_dim when smaller) of one token of one
head. Parts of one page (``P`` = page_size, ``H`` = num_kv_heads, ``D`` = head_dim, ``G`` =
value_group, ``b`` = bits):

=========  =======  =================  ==================================================
part       dtype    keys ("k")         values ("v")
=========  =======  =================  ==================================================
``codes``  uint8    ``[P*b/8, H, D]``  ``[P, H, D*b/8]``: packed densely along the group's
                                       axis (tokens for keys, channels for values) as one
                                       little-endian bit stream (``packing``): int4 two a
                                       byte, int2 four a byte, int3 eight in three bytes
``scale``  float16  ``[H, D]``         ``[P, H, D/G]``: the group's step
``zero``   float16  ``[H, D]``         ``[P, H, D/G]``: the group's zero point
=========  =======  =================  ==================================================

An element decodes as ``code * scale + zero`` in float32 (the product is exact, the sum rounds
once), then cast to the asked dtype.

Encoding a group with minimum ``lo`` and maximum ``hi`` (``L = 2**bits - 1``) searches clipped
ranges, as AWQ's clip search does for weight groups: an outlier that stretches the whole range over
few elements costs every other element resolution, at 2 and 3 bits far more than clipping it
saves. On the shipped model (bits per byte of 12 held-out texts, against float32 KV): int2 +0.264
without clipping, +0.046 with; int3 +0.035 and +0.003; int4 +0.008 and -0.000.

- the candidates: for each ratio ``r`` of ``CLIP_RATIOS`` (1, 0.95, ..., 0.5) the range shrunk
  around its midpoint, ``lo + c`` to ``hi - c`` with ``c = (1 - r) * (hi - lo) / 2`` in float64
  (``r = 1`` is the whole range), and its ``(scale, zero)``: ``zero`` the largest float16 <= the
  lower end and ``scale`` the smallest float16 with ``zero + L * scale >=`` the upper end
  (``group_step_and_zero``; KIVI takes ``lo`` and ``(hi - lo) / L`` rounded to nearest, rounding
  outwards keeps the candidate's range inside its grid).
- each code is the integer nearest ``(x - zero) / scale``, ties to even, clamped to ``[0, L]``; the
  decisions compare ``x`` with the exact midpoints ``zero + (q +- 1/2) * scale`` in float64, so they
  are exact for every input dtype and the same on every device.
- the group keeps the candidate whose squared error ``sum((zero + code * scale - x)**2)`` over its
  elements is the least, ties to the widest range (the first in ``CLIP_RATIOS``). The errors are
  float64: an element's level comes from its rounded quotient, which takes the farther of two
  levels only where their errors agree to a relative 1e-13, and the sums are added in a fixed
  order (``pairwise_sum``). So the choice is the same on every device, but two candidates whose
  exact errors differ by less than about 1e-13 relative may be taken either way.
- elements outside the chosen grid ``[zero, zero + L * scale]`` saturate to code 0 or ``L``; an
  element inside it is off by at most half a step.
- a constant group whose value is a float16 (every float16 and every bfloat16 in float16's normal
  range) stores scale 0 and round-trips exactly (every candidate is the same: the first is kept);
  so does an all-zero group, and so does a group whose elements all lie on the whole range's grid
  (error 0). Negative zero decodes as zero.

Range and non-finite input: a group holding a NaN or an infinity, or one whose whole range's zero
point or step does not fit float16 (``lo < -65504`` or ``hi - zero > 65504 * L``), stores scale
and zero NaN and zero codes, so it decodes as NaN; other groups are unaffected (every group has its
own scales). A clipped candidate's zero point is no lower than the whole range's and its step no
larger, so they fit whenever those do.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .packing import pack_codes, run_length, unpack_codes
from .protocol import PartSpecs, allocate_parts, check_parts, check_raw, spec_bytes
from .rounding import FLOAT16, FLOAT16_MAX, grid_step, pairwise_sum, round_down, round_up

INT_BITS = {"int4": 4, "int3": 3, "int2": 2}
DEFAULT_VALUE_GROUP = 32
# the clipped ranges searched, as a fraction of the group's whole range, widest (ties) first
CLIP_RATIOS = (1.0, 0.95, 0.9, 0.85, 0.8, 0.75, 0.7, 0.65, 0.6, 0.55, 0.5)
_SEARCH_ELEMENTS = 1 << 22  # elements times candidates searched at once (float64 temporaries)


def group_step_and_zero(lo: torch.Tensor, hi: torch.Tensor,
                        levels: int) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 group minima and maxima (finite, ``lo <= hi``) -> (step, zero), float16 values in
    float64: ``zero`` the largest finite float16 <= ``lo``, ``step`` the smallest float16 >= 0
    with ``zero + levels * step >= hi``. Either may fall outside float16's range (``zero`` below
    -65504, ``step`` above 65504): the caller checks."""
    zero = round_down(lo, *FLOAT16).clamp(max=FLOAT16_MAX) + 0.0  # + 0.0 turns -0.0 into 0.0
    step = round_up((hi - zero) / levels, *FLOAT16)
    # hi - zero and the division may each round down once: one float16 step up restores the bound
    # (zero + levels * step is exact in float64: both are multiples of 2**-24 below 2**19)
    step = torch.where(zero + levels * step < hi, step + grid_step(step, *FLOAT16), step)
    return step, zero


def nearest_level(x: torch.Tensor, zero: torch.Tensor, step: torch.Tensor,
                  levels: int) -> torch.Tensor:
    """float64 elements, with their group's ``zero`` and ``step`` broadcast to them (finite,
    ``step >= 0``) -> float64 codes in ``[0, levels]``: the integer nearest ``(x - zero) / step``,
    ties to even, decided exactly; 0 where ``step`` is 0."""
    guess = torch.round((x - zero) / torch.where(step > 0, step, 1.0)).clamp(0, levels)
    below = zero + (guess - 0.5) * step  # exact: multiples of 2**-25 below 2**20
    above = zero + (guess + 0.5) * step
    odd = torch.remainder(guess, 2) == 1
    down = (x < below) | ((x == below) & odd)
    up = (x > above) | ((x == above) & odd)
    code = (guess - down.to(guess.dtype) + up.to(guess.dtype)).clamp(0, levels)
    return torch.where(step > 0, code, 0.0)


def clipped_step_and_zero(x: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor, levels: int,
                          axis: int) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 elements grouped along ``axis`` and their groups' minima and maxima (finite,
    ``lo <= hi``) -> the (step, zero) of the clipped range with the least squared error, float16
    values in float64, one per group (the module docstring's candidates and choice). A group
    with a non-finite element has a NaN error for every candidate and an arbitrary choice (the
    codec searches [0, 0] for it, whose candidates are all step 0 and zero 0).

    Candidates are evaluated side by side along a new leading dimension, as many at once as keep
    that to ``_SEARCH_ELEMENTS`` elements: one pass of whole-tensor operations for a few pages,
    one per candidate for a long prefill."""
    ratios = torch.tensor(CLIP_RATIOS, dtype=torch.float64, device=x.device)
    ratios = ratios.view(-1, *([1] * lo.dim()))  # [R, 1, ...]: one per candidate
    half = (hi - lo) / 2
    block = max(1, _SEARCH_ELEMENTS // max(x.numel(), 1))
    best: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None  # step, zero, error
    for start in range(0, len(CLIP_RATIOS), block):
        cut = (1.0 - ratios[start: start + block]) * half  # [b, *groups]
        step, zero = group_step_and_zero(lo + cut, hi - cut, levels)
        step_b, zero_b = step.unsqueeze(axis + 1), zero.unsqueeze(axis + 1)
        # each element's code, then its level's error, in place: the quotient rounds at most a
        # few ulps, so where that crosses a midpoint the element's error is the nearest level's
        # to a relative 1e-13, within the choice's float64 slack
        error = (x - zero_b).div_(torch.where(step_b > 0, step_b, 1.0)).round_().clamp_(0, levels)
        error = error.mul_(step_b).add_(zero_b).sub_(x)  # the level (exact) minus x
        error = pairwise_sum(error.mul_(error), axis + 1)  # [b, *groups]
        pick = error.argmin(0, keepdim=True)  # the first least: a tie keeps the wider range
        found = (step.gather(0, pick)[0], zero.gather(0, pick)[0], error.gather(0, pick)[0])
        if best is None:
            best = found
            continue
        better = found[2] < best[2]  # strict: a tie keeps the wider range
        best = (torch.where(better, found[0], best[0]), torch.where(better, found[1], best[1]),
                torch.where(better, found[2], best[2]))
    assert best is not None
    return best[0], best[1]


@dataclass(frozen=True)
class IntCodec:
    """``bits``-bit asymmetric integer storage of one side of a layer's pages (see the module
    docstring for the layout). ValueError if the geometry does not fit: keys need ``page_size`` a
    multiple of 2, 8, 4 (int4, int3, int2: whole bytes per channel); values need ``head_dim`` a
    multiple of ``value_group``, itself a multiple of 2, 8, 4 (whole bytes per group).

    >>> codec = IntCodec(4, "v", page_size=16, num_kv_heads=2, head_dim=128)
    >>> codec.page_bytes / (16 * 2 * 128), IntCodec(2, "k", 64, 2, 128).page_bytes / (64 * 2 * 128)
    (0.625, 0.3125)
    """

    bits: int
    side: str
    page_size: int
    num_kv_heads: int
    head_dim: int
    value_group: int | None = None  # None: 32, or head_dim when smaller

    def __post_init__(self) -> None:
        if self.bits not in INT_BITS.values():
            raise ValueError(f"bits must be one of {sorted(INT_BITS.values())}, got {self.bits!r}")
        for field in ("page_size", "num_kv_heads", "head_dim"):
            value = getattr(self, field)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{field} must be an int >= 1, got {value!r}")
        if self.side not in ("k", "v"):
            raise ValueError(f"side must be 'k' or 'v', got {self.side!r}")
        run = run_length(self.bits)
        if self.side == "k" and self.page_size % run:
            raise ValueError(f"{self.name} keys pack {run} tokens of a channel into whole bytes: "
                             f"page_size must be a multiple of {run}, got {self.page_size}")
        if self.value_group is not None and (not isinstance(self.value_group, int)
                                             or isinstance(self.value_group, bool)
                                             or self.value_group < 1):
            raise ValueError(f"value_group must be an int >= 1, got {self.value_group!r}")
        group = self.group
        if self.side == "v" and self.head_dim % group:
            raise ValueError(f"{self.name} values are quantized in groups of {group} channels: "
                             f"head_dim must be a multiple of {group}, got {self.head_dim}")
        if self.side == "v" and group % run:
            raise ValueError(f"{self.name} packs {run} codes into whole bytes: value_group must "
                             f"be a multiple of {run}, got {group}")

    @property
    def name(self) -> str:
        return f"int{self.bits}"

    @property
    def group(self) -> int:
        """Channels per value group (the explicit value_group, else 32 or head_dim if smaller)."""
        if self.value_group is not None:
            return self.value_group
        return min(DEFAULT_VALUE_GROUP, self.head_dim)

    @property
    def levels(self) -> int:
        """The largest code, ``2**bits - 1``."""
        return (1 << self.bits) - 1

    @property
    def specs(self) -> PartSpecs:
        """Each part's dtype and one page's shape."""
        p, h, d, b = self.page_size, self.num_kv_heads, self.head_dim, self.bits
        codes: tuple[int, ...]
        scales: tuple[int, ...]
        if self.side == "k":
            codes, scales = (p * b // 8, h, d), (h, d)
        else:
            codes, scales = (p, h, d * b // 8), (p, h, d // self.group)
        return {"codes": (torch.uint8, codes), "scale": (torch.float16, scales),
                "zero": (torch.float16, scales)}

    @property
    def page_bytes(self) -> int:
        return spec_bytes(self.specs)

    @property
    def _packed_dim(self) -> int:
        return 1 if self.side == "k" else 3  # of [n, P, H, D]

    @property
    def _member_axis(self) -> int:
        return 1 if self.side == "k" else 4  # of the grouped view

    def _grouped(self, x: torch.Tensor) -> torch.Tensor:
        """[n, P, H, D] -> keys as they are (a group along dim 1), values [n, P, H, D/G, G]."""
        if self.side == "k":
            return x
        n, p, h, d = x.shape
        return x.reshape(n, p, h, d // self.group, self.group)

    def allocate(self, num_pages: int, device: torch.device) -> dict[str, torch.Tensor]:
        return allocate_parts(self.specs, num_pages, device)

    def encode(self, raw: torch.Tensor) -> dict[str, torch.Tensor]:
        check_raw(raw, (self.page_size, self.num_kv_heads, self.head_dim))
        axis = self._member_axis
        x = self._grouped(raw.to(torch.float64))
        finite = torch.isfinite(x)
        lo = torch.where(finite, x, torch.inf).amin(axis)  # float64, one per group
        hi = torch.where(finite, x, -torch.inf).amax(axis)
        step, zero = group_step_and_zero(lo, hi, self.levels)  # the whole range
        bad = ~finite.all(axis) | ~(zero.abs() <= FLOAT16_MAX) | ~(step <= FLOAT16_MAX)
        # a bad group searches the constant range [0, 0]: step and zero 0, codes 0
        lo, hi = torch.where(bad, 0.0, lo), torch.where(bad, 0.0, hi)
        step, zero = clipped_step_and_zero(x, lo, hi, self.levels, axis)
        code = nearest_level(x, zero.unsqueeze(axis), step.unsqueeze(axis), self.levels)
        codes = pack_codes(code.to(torch.uint8).reshape(raw.shape), self.bits, self._packed_dim)
        return {"codes": codes, "scale": torch.where(bad, torch.nan, step).to(torch.float16),
                "zero": torch.where(bad, torch.nan, zero).to(torch.float16)}

    def decode(self, parts: dict[str, torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
        n = check_parts(parts, self.specs)
        code = unpack_codes(parts["codes"], self.bits, self._packed_dim).to(torch.float32)
        axis = self._member_axis
        step = parts["scale"].to(torch.float32).unsqueeze(axis)
        zero = parts["zero"].to(torch.float32).unsqueeze(axis)
        out = self._grouped(code) * step + zero  # code * step is exact in float32
        return out.reshape(n, self.page_size, self.num_kv_heads, self.head_dim).to(dtype)
