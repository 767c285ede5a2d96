"""NVFP4 pages: 4-bit E2M1 codes, one FP8 e4m3 scale per group of 16 elements, and one float32
scale per (page, head) so the group scales use FP8's range.

Both sides are grouped along the head dimension, NVFP4's own layout: a group is 16 consecutive
channels of one token of one head, for keys and values alike (the ``side`` field only names which
one a codec stores). Keys are not grouped per channel as KIVI does because that measured worse:
on the shipped model (bits per byte of 12 held-out texts, against float32 KV; nearest group scales)
nvfp4 with keys grouped per channel cost +0.041, with keys grouped per token +0.016. The integer
formats (``integer``) keep KIVI's per-channel keys, where the per-channel groups pay off.

Parts of one page (``P`` = page_size, ``H`` = num_kv_heads, ``D`` = head_dim), either side:

==============  =======  ==================================================================
part            dtype    shape and meaning
==============  =======  ==================================================================
``codes``       uint8    ``[P, H, D/2]``: two codes a byte along the channels, element ``2i``
                         in the low nibble
``scale``       uint8    ``[P, H, D/16]``: the group's FP8 e4m3fn scale, as its bits
                         (``.view(torch.float8_e4m3fn)``)
``page_scale``  float32  ``[H]``: a power of two
==============  =======  ==================================================================

A code is a sign bit (bit 3) and a magnitude index (bits 0-2) into E2M1's values 0, 0.5, 1, 1.5,
2, 3, 4, 6. An element decodes as ``(e2m1 * scale) * page_scale`` in float32 (the first product is
exact, the second is exact unless the result is a float32 subnormal), then cast to the asked dtype;
within range that is exact in bfloat16 and float16 too.

Encoding, per (page, head), with ``amax`` the largest finite magnitude there:

- ``page_scale`` is the smallest power of two with ``6 * 448 * page_scale >= amax`` (1 for an
  all-zero head, clamped to [2**-149, 2**127]), so the largest group's nearest scale (below)
  lands in [224, 448].
  NVIDIA's recipe takes ``amax / 2688`` itself; a power of two keeps every decode product exact.
- a group's ``scale`` is one of ``SCALE_CANDIDATES`` (3) FP8 e4m3 values: the nearest to
  ``amax_group / (6 * page_scale)`` clamped to 448 (ties to even; FP8 subnormals included, so a
  group far smaller than its head's largest may get scale 0 and decode to zeros, an absolute
  error under ``6 * 2**-10 * page_scale``) and the two FP8 values below it. Each candidate rounds
  the group's elements as below; the group keeps the one whose squared error
  ``sum((e2m1 * S - |x|)**2)`` is the least, ties to the largest scale. A smaller scale saturates
  the group's largest elements and resolves the rest more finely: on the shipped model the search
  takes nvfp4 from +0.016 to -0.026 bits per byte (as above), and the relative RMS error of the
  K and V it stores from 0.095 to 0.088. The errors are float64 sums added in a fixed order
  (``rounding.pairwise_sum``), so the choice is the same on every device, but two candidates
  whose exact errors differ by a few roundings may be taken either way.
- each element is rounded to the nearest multiple ``e2m1 * S`` (``S = scale * page_scale``):
  ties go to the even code (as IEEE round-to-nearest-even on E2M1: 0.25 -> 0, 0.75 -> 1,
  1.25 -> 1, 1.75 -> 2, 2.5 -> 2, 3.5 -> 4, 5 -> 4 in units of S); magnitudes above ``6 * S``
  saturate to 6. The decisions compare ``|x|`` with the exact midpoints ``m * S`` in float64, so
  they are exact for every input dtype and the same on every device. Negative zero keeps its sign.

Non-finite input: a group holding a NaN or an infinity stores scale NaN (bits 0x7F) and zero
codes, so all 16 of its elements decode as NaN; the (page, head)'s ``amax`` ignores non-finite
elements, so every other group encodes as if those elements were zero.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from .packing import pack_codes, unpack_codes
from .protocol import SIDES, PartSpecs, allocate_parts, check_parts, check_raw, spec_bytes
from .rounding import (FP8_E4M3, FP8_E4M3_MAX, pairwise_sum, power_of_two, round_down,
                       round_nearest_even)

GROUP = 16  # elements per FP8 scale: consecutive channels of one token of one head
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
E2M1_MAX = 6.0
SCALE_CANDIDATES = 3  # the nearest FP8 group scale and the two FP8 values below it
# midpoints between neighbouring E2M1 values, and whether one exactly on it rounds up (to the even
# code): the codes 1, 3, 5, 7 are odd, so 0.25, 1.25, 2.5 and 5 round down
_MIDPOINTS = ((0.25, False), (0.75, True), (1.25, False), (1.75, True), (2.5, False), (3.5, True),
              (5.0, False))
_NAN_SCALE = 0x7F  # FP8 e4m3fn's NaN
_PAGE_SCALE_EXPONENTS = (-149, 127)  # float32's smallest subnormal and largest power of two
_PACKED_DIM = 3  # the channels, of [n, P, H, D]
_MEMBER_AXIS = 4  # a group's members, of the grouped view [n, P, H, D/16, 16]


@functools.lru_cache(maxsize=8)
def _signed_values(device: torch.device) -> torch.Tensor:
    """float32[16]: the value of each 4-bit code (bit 3 the sign)."""
    magnitudes = torch.tensor(E2M1_VALUES, dtype=torch.float32)
    return torch.cat([magnitudes, -magnitudes]).to(device)


@functools.lru_cache(maxsize=8)
def _magnitudes(device: torch.device) -> torch.Tensor:
    """float64[8]: the magnitude of each 3-bit magnitude code."""
    return torch.tensor(E2M1_VALUES, dtype=torch.float64, device=device)


def fp8_below(scale: torch.Tensor) -> torch.Tensor:
    """float64 FP8 e4m3 values >= 0 -> the next FP8 value below each (0 for 0). Exact:
    ``scale * 31/32`` is a float64 product of 4 and 5 significant bits, and it lies between
    ``scale`` and its predecessor, which is at least ``scale / 16`` below."""
    return round_down(scale * (31 / 32), *FP8_E4M3)


def magnitude_codes(magnitude: torch.Tensor, unit: torch.Tensor) -> torch.Tensor:
    """float64 ``|x|`` and each element's ``S`` (broadcast; may be 0 or NaN) -> uint8 magnitude
    codes 0 .. 7: the E2M1 value nearest ``|x| / S``, ties to even, saturating at 6; 0 where ``S``
    is not > 0."""
    code = torch.zeros(magnitude.shape, dtype=torch.uint8, device=magnitude.device)
    for midpoint, tie_up in _MIDPOINTS:
        threshold = midpoint * unit  # exact: 3 bits times 4 bits times a power of two
        code += (magnitude >= threshold if tie_up else magnitude > threshold).to(torch.uint8)
    return torch.where(unit > 0, code, 0)


def _rounded(magnitude: torch.Tensor, group_scale: torch.Tensor,
             page_scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Grouped ``|x|`` ``[n, P, H, D/16, 16]``, a candidate FP8 scale per group and the page
    scales (broadcast to the groups) -> (uint8 magnitude codes, float64 squared error per group)."""
    unit = (group_scale * page_scale).unsqueeze(_MEMBER_AXIS)  # exact
    code = magnitude_codes(magnitude, unit)
    error = _magnitudes(magnitude.device)[code.long()].mul_(unit).sub_(magnitude)  # level exact
    return code, pairwise_sum(error.mul_(error), _MEMBER_AXIS)


def page_scale_of(amax: torch.Tensor) -> torch.Tensor:
    """float64 amax (>= 0, finite) -> float64 power of two: the smallest ``2**e`` with
    ``6 * 448 * 2**e >= amax``, clamped to float32's powers of two; 1 where ``amax`` is 0."""
    mantissa, exponent = torch.frexp(amax)  # amax = mantissa * 2**exponent, 0.5 <= mantissa < 1
    # 2688 = 0.65625 * 2**12: 2**(exponent - 12) suffices iff mantissa <= 0.65625
    exponent = exponent - 12 + (mantissa > 0.65625).to(exponent.dtype)
    scale = power_of_two(exponent.clamp(*_PAGE_SCALE_EXPONENTS))
    return torch.where(amax > 0, scale, 1.0)


@dataclass(frozen=True)
class Nvfp4Codec:
    """NVFP4 storage of one side of a layer's pages (see the module docstring for the layout,
    the same for keys and values). ValueError if the geometry does not fit: ``head_dim`` must be
    a multiple of 16 (any ``page_size``).

    >>> codec = Nvfp4Codec("k", page_size=16, num_kv_heads=2, head_dim=128)
    >>> codec.page_bytes, codec.page_bytes / (16 * 2 * 128)   # codes + FP8 scales + page scales
    (2312, 0.564453125)
    """

    side: str
    page_size: int
    num_kv_heads: int
    head_dim: int

    def __post_init__(self) -> None:
        for field in ("page_size", "num_kv_heads", "head_dim"):
            value = getattr(self, field)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{field} must be an int >= 1, got {value!r}")
        if self.side not in SIDES:
            raise ValueError(f"side must be 'k' or 'v', got {self.side!r}")
        if self.head_dim % GROUP:
            raise ValueError(f"nvfp4 quantizes in groups of {GROUP} channels of a token: "
                             f"head_dim must be a multiple of {GROUP}, got {self.head_dim}")

    @property
    def name(self) -> str:
        return "nvfp4"

    @property
    def bits(self) -> int:
        return 4

    @property
    def specs(self) -> PartSpecs:
        """Each part's dtype and one page's shape."""
        p, h, d = self.page_size, self.num_kv_heads, self.head_dim
        return {"codes": (torch.uint8, (p, h, d // 2)), "scale": (torch.uint8, (p, h, d // GROUP)),
                "page_scale": (torch.float32, (h,))}

    @property
    def page_bytes(self) -> int:
        return spec_bytes(self.specs)

    def _grouped(self, x: torch.Tensor) -> torch.Tensor:
        """[n, P, H, D] -> [n, P, H, D/16, 16]."""
        n, p, h, d = x.shape
        return x.reshape(n, p, h, d // GROUP, GROUP)

    def allocate(self, num_pages: int, device: torch.device) -> dict[str, torch.Tensor]:
        return allocate_parts(self.specs, num_pages, device)

    def encode(self, raw: torch.Tensor) -> dict[str, torch.Tensor]:
        check_raw(raw, (self.page_size, self.num_kv_heads, self.head_dim))
        n, axis = raw.shape[0], _MEMBER_AXIS
        x = self._grouped(raw.to(torch.float64))
        finite = torch.isfinite(x)
        magnitude = torch.where(finite, x.abs(), 0.0)
        bad = ~finite.all(axis)  # bool[n, P, H, D/16]
        group_amax = magnitude.amax(axis)  # float64[n, P, H, D/16]
        page_scale = page_scale_of(group_amax.amax(dim=(1, 3)))  # float64[n, H]
        page_scale_b = page_scale.view(n, 1, self.num_kv_heads, 1)
        ratio = (group_amax / (E2M1_MAX * page_scale_b)).clamp(max=FP8_E4M3_MAX)
        group_scale = round_nearest_even(ratio, *FP8_E4M3)  # FP8 values, in float64
        code, best_error = _rounded(magnitude, group_scale, page_scale_b)
        candidate = group_scale
        for _ in range(SCALE_CANDIDATES - 1):
            candidate = fp8_below(candidate)
            got, error = _rounded(magnitude, candidate, page_scale_b)
            better = error < best_error  # strict: a tie keeps the larger scale
            group_scale = torch.where(better, candidate, group_scale)
            best_error = torch.where(better, error, best_error)
            code = torch.where(better.unsqueeze(axis), got, code)
        code = torch.where(bad.unsqueeze(axis), 0, code)  # non-finite: magnitude code 0
        sign = torch.signbit(x) & ~bad.unsqueeze(axis)
        nibbles = (code | (sign.to(torch.uint8) << 3)).reshape(raw.shape)
        scale_bits = group_scale.to(torch.float32).to(torch.float8_e4m3fn).view(torch.uint8)
        return {"codes": pack_codes(nibbles, 4, _PACKED_DIM),
                "scale": torch.where(bad, _NAN_SCALE, scale_bits),
                "page_scale": page_scale.to(torch.float32)}

    def decode(self, parts: dict[str, torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
        n = check_parts(parts, self.specs)
        codes = parts["codes"]
        nibbles = unpack_codes(codes, 4, _PACKED_DIM)  # uint8[n, P, H, D]
        values = self._grouped(_signed_values(codes.device)[nibbles.long()])
        group_scale = parts["scale"].view(torch.float8_e4m3fn).to(torch.float32)
        page_scale = parts["page_scale"].reshape(n, 1, self.num_kv_heads, 1, 1)
        out = (values * group_scale.unsqueeze(_MEMBER_AXIS)) * page_scale
        return out.reshape(n, self.page_size, self.num_kv_heads, self.head_dim).to(dtype)
