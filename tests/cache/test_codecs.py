"""The KV page codecs (``smile_llm.cache.codecs``) against the plain reference in
``codec_reference``: bit-for-bit parts and decoded values, the least-error choice of each group's
scale, error bounds derived from each format, hand-checked packings, the byte cost, exact round
trips and the errors for shapes that do not fit.

Floats are compared exactly throughout: encode decides every rounding exactly and decode's float32
arithmetic rounds at most once, so the reference (exact rationals) fixes every bit once a group's
scale is chosen; the choice itself (a float64 sum of squared errors) is checked to be the least of
the exactly recomputed candidates' within a relative 1e-12.
"""

from __future__ import annotations

import doctest
import importlib

import pytest
import torch

from smile_llm.cache.codecs import CODEC_NAMES, PageCodec, codec_for, integer, nvfp4
from smile_llm.cache.codecs.packing import unpack_codes
from smile_llm.cache.codecs.rounding import pairwise_sum
from tests.cache import codec_reference
from tests.cache.codec_reference import E2M1, FP8, reference_int, reference_nvfp4

SIDES = ("k", "v")
BITS = {"int4": 4, "int3": 3, "int2": 2}
SHAPES = [(2, 16, 2, 32, None), (1, 32, 1, 64, 16)]  # n, page_size, heads, head_dim, value_group
KINDS = ["normal", "outliers", "tiny", "huge", "grid", "nonfinite"]


def make_pages(kind: str, shape: tuple[int, int, int, int], seed: int) -> torch.Tensor:
    """float32 pages of one kind: normal; outlier channels and tokens; magnitudes spread over
    2**-40 .. 1 (FP8 and float16 subnormal scales); huge (beyond float16: one head of one page
    near 1e29, one all above 7e4); on a coarse grid (exact midpoints); normal with NaN and
    infinities."""
    g = torch.Generator().manual_seed(seed)
    n, p, h, d = shape
    x = torch.randn(shape, generator=g)
    if kind == "outliers":
        x[..., 1] = x[..., 1] * 40 + 5
        x[..., d - 3] *= -25
        x[:, p // 2] *= 8
    elif kind == "tiny":
        token = torch.randint(0, 20, (1, p, 1, 1), generator=g)
        channel = torch.randint(0, 20, (1, 1, h, d), generator=g)
        x = x * torch.pow(2.0, -(token + channel).float())
    elif kind == "huge":
        x = x * 3e4
        x[0, :, 0] *= 1e25
        x[n - 1, :, h - 1] = x[n - 1, :, h - 1].abs() + 7e4  # above float16 yet representable
    elif kind == "grid":
        # multiples of 1/16 in [-105/16, 105/16], both ends in every integer group: the steps
        # are 105/8 / L (7/8, 15/8, 35/8), so many elements sit exactly on a midpoint
        x = torch.randint(-105, 106, shape, generator=g).float() / 16
        x[:, 0], x[:, 1], x[..., 0::16], x[..., 1::16] = -105 / 16, 105 / 16, -105 / 16, 105 / 16
    elif kind == "nonfinite":
        x[0, 1, 0, 2] = float("nan")
        x[0, 3, h - 1, d - 1] = float("inf")
        x[n - 1, p - 1, 0, 0] = -float("inf")
    return x


def codec_of(name: str, side: str, shape: tuple[int, int, int, int],
             value_group: int | None) -> PageCodec:
    _, p, h, d = shape
    if name == "nvfp4":
        return codec_for(name, side, p, h, d)
    return codec_for(name, side, p, h, d, value_group=value_group)


def reference(name: str, side: str, raw: torch.Tensor, value_group: int | None,
              parts: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], torch.Tensor,
                                                        list[int]]:
    """The reference's (parts, decoded, picks) of ``raw``, checking the group scales the codec
    chose (in ``parts``) against every candidate."""
    if name == "nvfp4":
        return reference_nvfp4(raw, parts["scale"])
    group = value_group if value_group is not None else min(32, raw.shape[3])
    return reference_int(raw, side, BITS[name], group, parts["scale"], parts["zero"])


def assert_same_bits(got: torch.Tensor, want: torch.Tensor) -> None:
    """Equal dtype, shape and bits (any NaN matching any NaN)."""
    assert got.dtype == want.dtype and got.shape == want.shape
    if got.is_floating_point():
        nan = torch.isnan(want)
        assert torch.equal(torch.isnan(got), nan)
        got, want = got[~nan], want[~nan]
        width = {2: torch.int16, 4: torch.int32, 8: torch.int64}[got.element_size()]
        got, want = got.view(width), want.view(width)
    assert torch.equal(got, want)


@pytest.mark.parametrize("shape_group", SHAPES, ids=lambda s: "x".join(map(str, s[:4])))
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("side", SIDES)
@pytest.mark.parametrize("name", CODEC_NAMES)
def test_encode_and_decode_match_the_reference_bit_for_bit(
        name: str, side: str, kind: str, shape_group: tuple) -> None:
    *shape, value_group = shape_group
    raw = make_pages(kind, tuple(shape), seed=len(kind) + 7 * shape[1])
    codec = codec_of(name, side, tuple(shape), value_group)
    parts = codec.encode(raw)
    want_parts, want, picks = reference(name, side, raw, value_group, parts)
    if kind in ("normal", "outliers"):  # the search is exercised: some groups take a smaller scale
        assert any(picks)
    assert sorted(parts) == sorted(want_parts)
    for key in want_parts:
        assert_same_bits(parts[key], want_parts[key])
    assert_same_bits(codec.decode(parts, torch.float32), want)
    assert_same_bits(codec.decode(parts, torch.bfloat16), want.to(torch.bfloat16))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float64])
@pytest.mark.parametrize("name", CODEC_NAMES)
def test_other_input_dtypes_match_the_reference(name: str, dtype: torch.dtype) -> None:
    raw = (make_pages("outliers", (1, 16, 1, 32), seed=3) * 0.37).to(dtype)
    for side in SIDES:
        codec = codec_of(name, side, (1, 16, 1, 32), None)
        parts = codec.encode(raw)
        want_parts, want, _ = reference(name, side, raw, None, parts)
        for key in want_parts:
            assert_same_bits(parts[key], want_parts[key])
        assert_same_bits(codec.decode(parts, torch.float32), want)


def nvfp4_unit(parts: dict[str, torch.Tensor]) -> torch.Tensor:
    """float64[n, P, H, D]: each element's ``S = scale * page_scale``."""
    scale = parts["scale"].view(torch.float8_e4m3fn).to(torch.float64).repeat_interleave(16, dim=3)
    return scale * parts["page_scale"].to(torch.float64)[:, None, :, None]


def int_per_element(codec: PageCodec, part: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """float64[n, P, H, D]: each element's group's ``part`` (``scale`` or ``zero``)."""
    per_group = part.to(torch.float64)
    if codec.side == "k":
        return per_group[:, None].expand(shape)
    return per_group.repeat_interleave(shape[3] // per_group.shape[3], dim=3)


@pytest.mark.parametrize("kind", ["normal", "outliers", "tiny", "huge", "grid"])
@pytest.mark.parametrize("side", SIDES)
@pytest.mark.parametrize("name", CODEC_NAMES)
def test_error_is_within_half_a_step_inside_the_grid_and_saturates_outside(
        name: str, side: str, kind: str) -> None:
    shape = (2, 32, 2, 64)
    raw = make_pages(kind, shape, seed=11)
    codec = codec_of(name, side, shape, None)
    parts = codec.encode(raw)
    decoded = codec.decode(parts, torch.float32).to(torch.float64)
    x = raw.to(torch.float64)
    error = (decoded - x).abs()
    rounding = decoded.abs() * 2.0**-24 + 2.0**-150  # decode's one float32 rounding
    if name == "nvfp4":
        unit = nvfp4_unit(parts)
        ratio = x.abs() / unit
        # half the gap between the E2M1 neighbours of |x| / S: 0.25 below 2, 0.5 below 4, else 1
        half_gap = torch.where(ratio < 2, 0.25, torch.where(ratio < 4, 0.5, 1.0)) * unit
        inside = x.abs() <= 6 * unit
        assert bool((error[inside] <= half_gap[inside] + rounding[inside]).all())
        # above 6 S (a scale below the nearest one, or the nearest rounded down): saturates
        assert torch.equal(decoded[~inside], (torch.sign(x) * 6 * unit)[~inside].float().double())
        assert not inside.all()  # the search saturates some
    else:
        step = int_per_element(codec, parts["scale"], raw.shape)
        zero = int_per_element(codec, parts["zero"], raw.shape)
        fits = ~torch.isnan(step)
        assert kind == "huge" or bool(fits.all())
        assert bool(torch.isnan(decoded[~fits]).all())
        top = zero + ((1 << BITS[name]) - 1) * step  # exact
        inside = fits & (x >= zero) & (x <= top)
        assert bool((error[inside] <= step[inside] / 2 + rounding[inside]).all())
        below, above = fits & (x < zero), fits & (x > top)  # clipped: saturate to the ends
        assert torch.equal(decoded[below], zero[below].float().double())
        assert torch.equal(decoded[above], top[above].float().double())
        assert kind in ("huge", "grid") or bool((below | above).any())


def run(row: list[float], along: str, p: int, d: int) -> torch.Tensor:
    """One page, one head: ``row`` down the tokens of channel 0 (``"tokens"``) or along the
    channels of token 0 (``"channels"``), zeros elsewhere."""
    raw = torch.zeros(1, p, 1, d)
    values = torch.tensor(row)
    if along == "tokens":
        raw[0, : len(values), 0, 0] = values
    else:
        raw[0, 0, 0, : len(values)] = values
    return raw


E2M1_ROW = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]
INT4_CODES = (15, 0, 7, 8, 1, 14, 2, 13, 3, 12, 4, 11, 5, 10, 6, 9)
# format: (row, page_size, head_dim, packed bytes of the row, step, zero)
HAND: dict[str, tuple[list[float], int, int, list[int], float | None, float | None]] = {
    "nvfp4": (E2M1_ROW, 16, 16, [0x10, 0x32, 0x54, 0x76, 0x98, 0xBA, 0xDC, 0xFE], None, None),
    "int4": ([-1 + 0.25 * q for q in INT4_CODES], 16, 16,
             [0x0F, 0x87, 0xE1, 0xD2, 0xC3, 0xB4, 0xA5, 0x96], 0.25, -1.0),
    "int3": ([0, 1, 2, 3, 4, 5, 6, 7], 8, 8, [0x88, 0xC6, 0xFA], 1.0, 0.0),
    "int2": ([0, 1, 2, 3, 3, 2, 1, 0], 8, 8, [0xE4, 0x1B], 1.0, 0.0),
}


def group_axis(name: str, side: str) -> str:
    """The axis a group runs along: tokens for integer keys, channels otherwise."""
    return "tokens" if side == "k" and name != "nvfp4" else "channels"


@pytest.mark.parametrize("side", SIDES)
@pytest.mark.parametrize("name", CODEC_NAMES)
def test_packing_of_a_hand_example(name: str, side: str) -> None:
    values, p, d, expected, step, zero = HAND[name]
    axis = group_axis(name, side)
    raw = run(values, axis, p, d)
    codec = codec_for(name, side, p, 1, d)
    parts = codec.encode(raw)
    codes = parts["codes"]
    row = codes[0, : len(expected), 0, 0] if axis == "tokens" else codes[0, 0, 0, : len(expected)]
    assert row.tolist() == expected
    if name == "nvfp4":
        # amax 6: page scale 2**-8 (2688 / 256 >= 6 > 2688 / 512), the group's FP8 scale
        # 6 / (6 * 2**-8) = 256 = 0x78 (exponent 15 - 7, mantissa 0); zero groups scale 0
        assert parts["page_scale"].tolist() == [[2.0**-8]]
        assert parts["scale"].flatten().tolist() == [0x78] + [0] * (parts["scale"].numel() - 1)
    else:
        group = (0, 0, 0) if side == "k" else (0, 0, 0, 0)
        assert (parts["scale"][group].item(), parts["zero"][group].item()) == (step, zero)
    assert codes.sum().item() == sum(expected)  # every other code is 0
    assert_same_bits(codec.decode(parts, torch.float32), raw)


@pytest.mark.parametrize("side", SIDES)
def test_nvfp4_ties_go_to_the_even_code(side: str) -> None:
    codec = codec_for("nvfp4", side, 16, 1, 48)
    # page amax 100: page scale 2**-4 (2688 / 16 >= 100 > 2688 / 32). First two groups: amax 6,
    # FP8 scale 16, S = 1; the seven midpoints, then just above and below two of them, and
    # enough elements on the grid (+-6, which the scales below 16 cannot reach) that S = 1 is the
    # least squared error. Third group: amax 100, FP8 scale 100 / (6 / 16) = 266.7 -> 256,
    # S = 16: 7 -> 0.4375 S -> 0.5 S, and -100 -> 6.25 S saturates to -6 S (the scales below
    # saturate it further)
    first = [6.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0] + [6.0, -6.0] * 4
    second = [6.0, 0.2500001, 4.9999995, -0.75, -5.0, 4.0, -4.0, 3.0] + [6.0, -6.0] * 4
    parts = codec.encode(run(first + second + [7.0, -100.0], "channels", 16, 48))
    decoded = codec.decode(parts, torch.float32)[0, 0, 0].tolist()
    assert decoded[:8] == [6.0, 0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0]
    assert decoded[16:24] == [6.0, 0.5, 4.0, -1.0, -4.0, 4.0, -4.0, 3.0]
    assert decoded[32:34] == [8.0, -96.0]
    assert parts["page_scale"].tolist() == [[2.0**-4]]
    assert parts["scale"][0, 0, 0].tolist() == [0x58, 0x58, 0x78]  # 16 = 2**(11 - 7), 256


@pytest.mark.parametrize("name", ["int4", "int3", "int2"])
def test_integer_ties_go_to_the_even_code(name: str) -> None:
    levels = (1 << BITS[name]) - 1
    codec = codec_for(name, "v", 16, 1, 64, value_group=64)
    # zero -2, step 0.5: every midpoint (q + 1/2) for q = 0 .. levels - 1, then the ends, often
    # enough that the whole range is the least squared error (a clipped range moves the ends)
    row = [-2.0 + 0.5 * (q + 0.5) for q in range(levels)]
    row = (row + [-2.0, -2.0 + 0.5 * levels] * 32)[:64]
    parts = codec.encode(run(row, "channels", 16, 64))
    assert (parts["scale"][0, 0, 0, 0].item(), parts["zero"][0, 0, 0, 0].item()) == (0.5, -2.0)
    decoded = codec.decode(parts, torch.float32)[0, 0, 0, :levels]
    codes = ((decoded + 2) / 0.5).tolist()
    assert codes == [q + (q % 2) for q in range(levels)]


@pytest.mark.parametrize("side", SIDES)
@pytest.mark.parametrize("name", CODEC_NAMES)
def test_page_bytes_is_the_storage_per_page(name: str, side: str) -> None:
    for p, h, d in [(16, 1, 16), (32, 4, 64), (64, 8, 128)]:
        codec = codec_for(name, side, p, h, d)
        storage = codec.allocate(3, torch.device("cpu"))
        total = sum(t.numel() * t.element_size() for t in storage.values())
        assert total == 3 * codec.page_bytes
        assert all(t.shape[0] == 3 and not t.any() for t in storage.values())
        assert torch.equal(codec.decode(storage, torch.float32), torch.zeros(3, p, h, d))
        parts = codec.encode(torch.randn(2, p, h, d))
        assert {k: (t.dtype, t.shape[1:]) for k, t in parts.items()} == \
            {k: (t.dtype, t.shape[1:]) for k, t in storage.items()}
    if name == "nvfp4":
        # codes 0.5 + FP8 scales 1/16 bytes an element + 4 bytes per (page, head)
        assert codec.page_bytes == 64 * 8 * 128 * 9 // 16 + 4 * 8
    else:
        bits = BITS[name]
        scales = 8 * 128 if side == "k" else 64 * 8 * 128 // 32
        assert codec.page_bytes == 64 * 8 * 128 * bits // 8 + 2 * 2 * scales


@pytest.mark.parametrize("side", SIDES)
@pytest.mark.parametrize("name", CODEC_NAMES)
def test_storage_round_trip_by_page(name: str, side: str) -> None:
    codec = codec_for(name, side, 16, 2, 32)
    raw = make_pages("outliers", (3, 16, 2, 32), seed=5)
    parts = codec.encode(raw)
    storage = codec.allocate(6, torch.device("cpu"))
    page_ids = torch.tensor([4, 0, 2])
    for key, tensor in storage.items():
        tensor.index_copy_(0, page_ids, parts[key])
    gathered = {key: t.index_select(0, torch.tensor([2, 4])) for key, t in storage.items()}
    assert_same_bits(codec.decode(gathered, torch.bfloat16),
                     codec.decode(parts, torch.bfloat16)[[2, 0]])
    one_by_one = [codec.encode(raw[i: i + 1]) for i in range(3)]  # pages are independent
    for key in parts:
        assert_same_bits(parts[key], torch.cat([part[key] for part in one_by_one]))
    assert all(p.numel() == 0 for p in codec.encode(raw[:0]).values())
    strided = raw.transpose(1, 2).contiguous().transpose(1, 2)  # same values, other strides
    strided_parts = codec.encode(strided)
    for key in parts:
        assert_same_bits(strided_parts[key], parts[key])
    transposed = {key: t.transpose(0, -1).contiguous().transpose(0, -1) for key, t in parts.items()}
    assert_same_bits(codec.decode(transposed, torch.float32), codec.decode(parts, torch.float32))


def representable_pages(name: str, side: str, shape: tuple[int, int, int, int],
                        seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(pages made only of values the format stores exactly, their codes [n, P, H, D])."""
    g = torch.Generator().manual_seed(seed)
    n, p, h, d = shape
    if name == "nvfp4":
        nibbles = torch.randint(0, 16, shape, generator=g)
        scale_bits = torch.randint(1, 127, (n, p, h, d // 16), generator=g)
        nibbles[..., 0::16] = torch.where(nibbles[..., 0::16] < 8, 7, 15)  # |6| in every group
        scale_bits[:, 0, :, 0] = 0x7E  # 448: one group a head fixes the page scale
        fp8 = torch.tensor([float(v) for v in FP8], dtype=torch.float64)[scale_bits]
        fp8 = fp8.repeat_interleave(16, dim=3)
        page_scale = torch.pow(2.0, torch.randint(-20, 10, (n, 1, h, 1), generator=g).double())
        e2m1 = torch.tensor([float(v) for v in E2M1] + [-float(v) for v in E2M1],
                            dtype=torch.float64)
        return (e2m1[nibbles] * fp8 * page_scale).float(), nibbles
    levels = (1 << BITS[name]) - 1
    group = min(32, d)
    codes = torch.randint(0, levels + 1, shape, generator=g)
    scales = (n, 1, h, d) if side == "k" else (n, p, h, d // group)
    zero = torch.randint(-64, 65, scales, generator=g).double() / 16
    step = torch.randint(1, 65, scales, generator=g).double() / 64
    if side == "k":
        codes[:, 0], codes[:, 1] = 0, levels
    else:
        codes[..., 0::group], codes[..., 1::group] = 0, levels
        zero = zero.repeat_interleave(group, dim=3)
        step = step.repeat_interleave(group, dim=3)
    return (zero + codes * step).float(), codes


@pytest.mark.parametrize("side", SIDES)
@pytest.mark.parametrize("name", CODEC_NAMES)
def test_exactly_representable_values_round_trip_exactly(name: str, side: str) -> None:
    shape = (2, 32, 2, 64)
    raw, codes = representable_pages(name, side, shape, seed=17)
    codec = codec_for(name, side, *shape[1:])
    parts = codec.encode(raw)
    assert_same_bits(codec.decode(parts, torch.float32), raw)
    assert_same_bits(codec.decode(parts, torch.bfloat16), raw.to(torch.bfloat16))
    if name == "nvfp4":  # at most 6 significant bits: bfloat16 holds them exactly
        assert_same_bits(codec.decode(parts, torch.bfloat16).float(), raw)
    bits = 4 if name == "nvfp4" else BITS[name]
    packed_dim = 1 if group_axis(name, side) == "tokens" else 3
    assert torch.equal(unpack_codes(parts["codes"], bits, packed_dim),
                       codes.to(torch.uint8))


@pytest.mark.parametrize("side", SIDES)
@pytest.mark.parametrize("name", CODEC_NAMES)
def test_zero_and_constant_groups_round_trip_exactly(name: str, side: str) -> None:
    shape = (3, 32, 2, 64)
    codec = codec_for(name, side, *shape[1:])
    zeros = torch.zeros(shape)
    zeros[1] = -0.0
    # nvfp4 keeps the sign of zero (a sign bit per code); the integer formats give +0
    want = zeros if name == "nvfp4" else zeros.abs()
    assert_same_bits(codec.decode(codec.encode(zeros), torch.float32), want)
    g = torch.Generator().manual_seed(2)
    if name == "nvfp4":
        # constants c with c / (6 * page_scale) an FP8 value: 6 fixes page scale 2**-8, then
        # 1.5 -> 64, -0.75 -> 32, 0.1875 -> 8, 3 * 2**-10 -> 2**-7 (an FP8 subnormal scale)
        palette = torch.tensor([6.0, 1.5, -0.75, 0.1875, 3 * 2.0**-10])
    else:
        # any float16 value, from 2**-24 to 65504
        palette = torch.tensor([65504.0, -3.5, 2.0**-24, 1e-3, -1234.5]).half().float()
    if group_axis(name, side) == "tokens":
        pick = torch.randint(0, len(palette), (shape[0], 1, shape[2], shape[3]), generator=g)
        pick[:, 0, :, 0] = 0
        raw = palette[pick].repeat_interleave(shape[1], dim=1)
    else:
        group = 16 if name == "nvfp4" else 32
        pick = torch.randint(0, len(palette), (*shape[:3], shape[3] // group), generator=g)
        pick[:, 0, :, 0] = 0
        raw = palette[pick].repeat_interleave(group, dim=3)
    parts = codec.encode(raw)
    assert_same_bits(codec.decode(parts, torch.float32), raw)
    if name != "nvfp4":
        assert not parts["scale"].any()  # constant groups store step 0


def group_ids(codec: PageCodec, shape: tuple[int, int, int, int]) -> torch.Tensor:
    """int64[n, P, H, D]: which group each element belongs to."""
    n, p, h, d = shape
    page, token, head, channel = torch.meshgrid(*(torch.arange(s) for s in shape), indexing="ij")
    if group_axis(codec.name, codec.side) == "tokens":
        token = torch.zeros_like(token)
    else:
        channel = channel // (16 if codec.name == "nvfp4" else min(32, d))
    return ((page * p + token) * h + head) * d + channel


@pytest.mark.parametrize("side", SIDES)
@pytest.mark.parametrize("name", CODEC_NAMES)
def test_non_finite_values_spoil_only_their_group(name: str, side: str) -> None:
    shape = (2, 32, 2, 64)
    codec = codec_for(name, side, *shape[1:])
    spoiled = make_pages("nonfinite", shape, seed=9)
    finite = torch.isfinite(spoiled)
    clean = torch.where(finite, spoiled, 0.0)
    ids = group_ids(codec, shape)
    hit = torch.isin(ids, ids[~finite])
    got = codec.decode(codec.encode(spoiled), torch.float32)
    group_size = 16 if name == "nvfp4" else 32  # integer keys: the page's 32 tokens
    assert bool(torch.isnan(got[hit]).all()) and int(hit.sum()) == 3 * group_size
    assert_same_bits(got[~hit], codec.decode(codec.encode(clean), torch.float32)[~hit])
    assert not torch.isnan(got[~hit]).any()


@pytest.mark.parametrize(("name", "side", "geometry", "value_group", "message"), [
    ("nvfp4", "k", (16, 2, 24), None, "head_dim must be a multiple of 16, got 24"),
    ("nvfp4", "v", (16, 2, 24), None, "head_dim must be a multiple of 16, got 24"),
    ("nvfp4", "v", (16, 2, 64), 16, "value_group applies to the integer formats"),
    ("int4", "k", (15, 2, 32), None, "page_size must be a multiple of 2, got 15"),
    ("int3", "k", (12, 2, 32), None, "page_size must be a multiple of 8, got 12"),
    ("int2", "k", (6, 2, 32), None, "page_size must be a multiple of 4, got 6"),
    ("int4", "v", (16, 2, 48), None, "head_dim must be a multiple of 32, got 48"),
    ("int4", "v", (16, 2, 64), 24, "head_dim must be a multiple of 24, got 64"),
    ("int3", "v", (16, 2, 12), None, "value_group must be a multiple of 8, got 12"),
    ("int4", "v", (16, 2, 64), 0, "value_group must be an int >= 1"),
    ("int4", "k", (0, 2, 32), None, "page_size must be an int >= 1"),
    ("int4", "q", (16, 2, 32), None, "side must be 'k' or 'v'"),
    ("fp4", "k", (16, 2, 32), None, "unknown KV codec 'fp4': expected one of nvfp4, int4"),
])
def test_geometry_that_does_not_fit_raises(name: str, side: str, geometry: tuple[int, int, int],
                                           value_group: int | None, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        codec_for(name, side, *geometry, value_group=value_group)


def test_what_fits_does_not_raise() -> None:
    for side in SIDES:  # any page_size
        assert codec_for("nvfp4", side, 3, 1, 16).page_bytes == 3 * 16 * 9 // 16 + 4
    assert codec_for("int4", "v", 16, 1, 8).page_bytes == 16 * 8 // 2 + 2 * 2 * 16  # group 8
    assert codec_for("int3", "v", 8, 1, 64, value_group=64).page_bytes == 8 * 64 * 3 // 8 + 32


@pytest.mark.parametrize("name", CODEC_NAMES)
def test_bad_pages_and_parts_raise(name: str) -> None:
    codec = codec_for(name, "v", 16, 2, 32)
    for bad in (torch.zeros(1, 16, 2, 31), torch.zeros(16, 2, 32), torch.zeros(1, 16, 3, 32)):
        with pytest.raises(ValueError, match=r"\[n, 16, 2, 32\]"):
            codec.encode(bad)
    with pytest.raises(ValueError, match="float tensor"):
        codec.encode(torch.zeros(1, 16, 2, 32, dtype=torch.int32))
    parts = codec.encode(torch.randn(2, 16, 2, 32))
    with pytest.raises(ValueError, match="parts must be"):
        codec.decode({k: t for k, t in parts.items() if k != "codes"}, torch.float32)
    with pytest.raises(ValueError, match="part 'scale' must be"):
        codec.decode({**parts, "scale": parts["scale"].float()}, torch.float32)
    with pytest.raises(ValueError, match="page count"):
        codec.decode({**parts, "codes": parts["codes"][:1]}, torch.float32)
    with pytest.raises(ValueError, match="num_pages"):
        codec.allocate(-1, torch.device("cpu"))


def test_the_searches_are_the_references() -> None:
    assert integer.CLIP_RATIOS == codec_reference.CLIP_RATIOS
    assert nvfp4.SCALE_CANDIDATES == codec_reference.NVFP4_CANDIDATES


def test_an_outlier_is_clipped_where_that_pays() -> None:
    # int2, one group of 32: 31 elements spread over [-1, 1] and one at 8. The whole range gives
    # a step of 3 (levels -1, 2, 5, 8): every element but the outlier decodes to -1 or 2. A
    # clipped range saturates the outlier and resolves the rest
    row = [-1 + 2 * i / 30 for i in range(31)] + [8.0]
    raw = run(row, "channels", 16, 32)
    codec = codec_for("int2", "v", 16, 1, 32)
    parts = codec.encode(raw)
    group = raw[0, 0, 0].double()
    whole_step, whole_zero = integer.group_step_and_zero(group.min(), group.max(), 3)
    step, zero = parts["scale"][0, 0, 0, 0].item(), parts["zero"][0, 0, 0, 0].item()
    assert (whole_step.item(), whole_zero.item()) == (3.0, -1.0) and step < 3.0
    decoded = codec.decode(parts, torch.float32)[0, 0, 0].double()
    whole = whole_zero + whole_step * integer.nearest_level(group, whole_zero, whole_step, 3)
    assert float(((decoded - group) ** 2).sum()) < 0.5 * float(((whole - group) ** 2).sum())
    assert decoded[31].item() == zero + 3 * step < 8.0  # saturated at the top level
    # nvfp4, one group of 16: 15 elements at 2.625 and one at 6. Page scale 2**-8, the nearest
    # FP8 scale 256 (S = 1), the candidates below it 240 and 224 (S = 0.9375, 0.875). Squared
    # errors: S = 1: 15 * (3 - 2.625)**2 = 2.109375; S = 0.9375: 15 * (2.8125 - 2.625)**2 +
    # (6 - 5.625)**2 = 0.66796875; S = 0.875: 2.625 = 3 S exactly, 6 saturates to 6 S = 5.25:
    # 0.5625, the least
    codec = codec_for("nvfp4", "v", 16, 1, 16)
    parts = codec.encode(run([2.625] * 15 + [6.0], "channels", 16, 16))
    assert parts["page_scale"].tolist() == [[2.0**-8]]
    assert parts["scale"][0, 0, 0].tolist() == [0x76]  # 224 = 1.75 * 2**(14 - 7)
    assert codec.decode(parts, torch.float32)[0, 0, 0].tolist() == [2.625] * 15 + [5.25]


@pytest.mark.parametrize("side", SIDES)
@pytest.mark.parametrize("name", ["int4", "int2"])
def test_candidates_searched_in_blocks_choose_as_all_at_once(
        name: str, side: str, monkeypatch: pytest.MonkeyPatch) -> None:
    raw = make_pages("outliers", (2, 16, 2, 64), seed=4)
    codec = codec_for(name, side, 16, 2, 64)
    at_once = codec.encode(raw)
    for budget in (1, 3 * raw.numel()):  # one candidate a block; blocks of 3
        monkeypatch.setattr(integer, "_SEARCH_ELEMENTS", budget)
        blocked = codec.encode(raw)
        for key in at_once:
            assert_same_bits(blocked[key], at_once[key])


def test_pairwise_sum_adds_in_a_fixed_order_whatever_the_layout() -> None:
    g = torch.Generator().manual_seed(6)
    x = torch.randn(3, 13, 5, dtype=torch.float64, generator=g) * torch.pow(
        10.0, torch.randint(-8, 8, (3, 13, 5), generator=g).double())
    want = pairwise_sum(x, 1)
    assert torch.allclose(want, x.sum(1), rtol=1e-12, atol=0)
    for other in (x.transpose(0, 2).contiguous().transpose(0, 2), x.permute(1, 0, 2).contiguous()
                  .permute(1, 0, 2)):
        assert not other.is_contiguous() and torch.equal(pairwise_sum(other, 1), want)
    assert torch.equal(pairwise_sum(x, -2), want)
    # the tree: element i meets element i + 8 first (13 is padded to 16), so 1 + 2**-53 + 2**-53
    # sums to 1 in order but to 1 + 2**-52 here
    row = torch.zeros(16, dtype=torch.float64)
    row[0], row[1], row[9] = 1.0, 2.0**-53, 2.0**-53
    assert pairwise_sum(row[:13], 0).item() == 1.0 + 2.0**-52


def realistic_pages(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys and values of 8 pages of a Llama-like layer (16 tokens, 8 KV heads, head_dim 128):
    keys with per-channel scales and offsets and a few channels 10-20x larger, as in real models;
    values plain."""
    g = torch.Generator().manual_seed(seed)
    shape = (8, 16, 8, 128)
    channel_scale = torch.exp(0.5 * torch.randn(1, 1, 8, 128, generator=g))
    channel_scale[..., [3, 37, 64, 101]] *= torch.tensor([12.0, 20.0, 10.0, 15.0])
    offset = 0.5 * torch.randn(1, 1, 8, 128, generator=g) * channel_scale
    keys = torch.randn(shape, generator=g) * channel_scale + offset
    return keys, torch.randn(shape, generator=g)


def test_relative_error_and_bytes_per_element_on_a_realistic_page() -> None:
    keys, values = realistic_pages(seed=0)
    rows = {}
    for name in CODEC_NAMES:
        for side, raw in (("k", keys), ("v", values)):
            codec = codec_for(name, side, *raw.shape[1:])
            decoded = codec.decode(codec.encode(raw), torch.float32)
            error = float((decoded - raw).norm() / raw.norm())
            per_element = codec.page_bytes / raw[0].numel()
            rows[name, side] = (error, per_element)
    print("\nformat side  rel.error  bytes/elem  vs float32")
    for (name, side), (error, per_element) in rows.items():
        print(f"{name:6} {side:4} {error:9.4f} {per_element:11.4f} {4 / per_element:10.2f}x")
    nvfp4_bytes = rows["nvfp4", "k"][1]
    assert 0.5625 < nvfp4_bytes <= 0.5625 + 4 / (16 * 128)
    assert 4 / nvfp4_bytes > 7.0
    assert rows["nvfp4", "k"][1] == rows["nvfp4", "v"][1]
    for side in SIDES:
        errors = [rows[name, side][0] for name in ("int4", "int3", "int2")]
        assert errors == sorted(errors)  # fewer bits, more error
    ceilings = {"nvfp4": 0.12, "int4": 0.10, "int3": 0.22, "int2": 0.50}
    for (name, side), (error, _) in rows.items():
        assert error < ceilings[name], (name, side, error)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("name", CODEC_NAMES)
def test_cuda_encodes_and_decodes_the_same_bits_as_the_cpu(name: str) -> None:
    for kind in KINDS:
        raw = make_pages(kind, (2, 32, 2, 64), seed=1)
        for side in SIDES:
            codec = codec_for(name, side, 32, 2, 64)
            on_cpu = codec.encode(raw)
            on_cuda = codec.encode(raw.cuda())
            for key in on_cpu:
                assert on_cuda[key].is_cuda
                assert_same_bits(on_cuda[key].cpu(), on_cpu[key])
            for dtype in (torch.float32, torch.bfloat16):
                assert_same_bits(codec.decode(on_cuda, dtype).cpu(), codec.decode(on_cpu, dtype))


@pytest.mark.parametrize("module", ["", ".nvfp4", ".integer", ".packing", ".rounding"])
def test_docstring_examples(module: str) -> None:
    imported = importlib.import_module("smile_llm.cache.codecs" + module)
    result = doctest.testmod(imported, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0 and result.failed == 0
