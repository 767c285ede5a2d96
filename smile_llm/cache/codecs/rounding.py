"""Exact rounding of float64 values onto the grid of a narrow binary float format (float16, FP8
e4m3), done with power-of-two scaling so the result is the same on every device; and a float64 sum
added in a fixed order (``pairwise_sum``), so its roundings are the same on every device too.

A narrow format is named by its significand bits (implicit bit included) and the exponent of its
smallest normal binade in ``frexp``'s convention (``v = m * 2**e`` with ``0.5 <= m < 1``): float16
is ``(11, -13)``, FP8 e4m3 is ``(4, -5)``. Below that binade the spacing stays that of the smallest
binade (subnormals). The largest finite value is the caller's business: these functions do not
saturate and do not produce infinities.

>>> import torch
>>> v = torch.tensor([1.0 + 2.0**-12, -(1.0 + 2.0**-12), 0.0], dtype=torch.float64)
>>> round_down(v, *FLOAT16).tolist(), round_up(v, *FLOAT16).tolist()
([1.0, -1.0009765625, 0.0], [1.0009765625, -1.0, 0.0])
>>> round_nearest_even(torch.tensor([432.0, 2.0**-10], dtype=torch.float64), *FP8_E4M3).tolist()
[448.0, 0.0]
>>> pairwise_sum(torch.tensor([1.0, 2.0**-53, 0.0, 2.0**-53], dtype=torch.float64), 0).item() - 1
2.220446049250313e-16
"""

from __future__ import annotations

import torch

FLOAT16 = (11, -13)  # significand bits, exponent of the smallest normal binade
FP8_E4M3 = (4, -5)
FLOAT16_MAX = 65504.0
FP8_E4M3_MAX = 448.0


def power_of_two(exponent: torch.Tensor) -> torch.Tensor:
    """``2.0 ** exponent`` as float64, exactly (built from the bits): int tensor, values in
    [-1022, 1023]."""
    biased = (exponent.to(torch.int64) + 1023) << 52
    return biased.view(torch.float64)


def grid_step(v: torch.Tensor, significand_bits: int, min_exponent: int) -> torch.Tensor:
    """The spacing of the narrow format's grid at ``|v|`` (float64, same shape): a power of two.
    Zero gets the subnormal spacing. ``v`` must be a finite float64 tensor (a non-finite ``v``
    gives an arbitrary step, and the rounding functions keep it non-finite)."""
    _, exponent = torch.frexp(v)
    exponent = torch.where(v == 0, min_exponent, exponent).clamp(min=min_exponent)
    return power_of_two(exponent - significand_bits)


def round_down(v: torch.Tensor, significand_bits: int, min_exponent: int) -> torch.Tensor:
    """The largest grid value <= ``v`` (float64). Exact: ``v / step`` only rescales by a power of
    two. Non-finite ``v`` gives a non-finite result."""
    step = grid_step(v, significand_bits, min_exponent)
    return torch.floor(v / step) * step


def round_up(v: torch.Tensor, significand_bits: int, min_exponent: int) -> torch.Tensor:
    """The smallest grid value >= ``v`` (float64); see ``round_down``."""
    step = grid_step(v, significand_bits, min_exponent)
    return torch.ceil(v / step) * step


def round_nearest_even(v: torch.Tensor, significand_bits: int, min_exponent: int) -> torch.Tensor:
    """The grid value nearest ``v`` (float64), a tie going to the even significand (IEEE's
    round-to-nearest-even)."""
    step = grid_step(v, significand_bits, min_exponent)
    return torch.round(v / step) * step


def pairwise_sum(x: torch.Tensor, dim: int) -> torch.Tensor:
    """The sum of ``x`` along ``dim`` (dropped), added as a fixed tree: zeros pad the dimension to
    a power of two, then its second half is added to its first, elementwise, until one remains.
    Every addition is one IEEE rounding in an order fixed by the shape alone, so the result has
    the same bits on every device and for every memory layout (``torch.sum``'s order is the
    kernel's choice). ``x`` must have at least one element along ``dim``."""
    dim = dim % x.dim()
    size = x.shape[dim]
    assert size >= 1, "an empty sum"
    width = 1 << (size - 1).bit_length()
    if width != size:
        pad = list(x.shape)
        pad[dim] = width - size
        x = torch.cat([x, x.new_zeros(pad)], dim)
    while width > 1:
        width //= 2
        x = x.narrow(dim, 0, width) + x.narrow(dim, width, width)
    return x.squeeze(dim)
