"""Comparing two KV fingerprints of the same tokens (``kv_fingerprint.py``) within a tolerance, and
naming the first layer, region and page where they differ.

Why not exact equality: a warm request's prefix pages were written by another request's forward
(another batch shape, another prefill chunking), its suffix attended to them from a forward that
did not compute them, and a cold request computes every position in forwards of its own. Kernels
pick their blocking and reduction order by shape, so the same K/V come out with different roundings
(a few fp32 ulps in fp32, which can move a value across a rounding boundary of a narrower storage
or compute dtype), growing through the layers. Correct reuse therefore agrees to within roundings,
not bit for bit; a reuse bug (a stale, corrupted, misplaced or never written page) moves a page's
sums by far more.

The tolerance, relative to the magnitude of what is compared: ``ACCUMULATION_EPS`` fp32 epsilons
(accumulation in another order) plus ``ROUNDING_EPS`` epsilons of the coarser of the storage dtype
and the dtype the model computed in (a value rounded the other way), times ``slack``. A sum and a
sum of absolute values may differ by that times the larger sum of absolute values of the two
(``|sum(d)| <= sum(|d|) <= rel * sum(|x|)`` when every element moves by at most ``rel`` of itself),
a sum of squares by ``2 * rel + rel**2`` times the larger sum of squares. Measured on the shipped
models on the CPU, warm against cold: at most 2 fp32 epsilons per page in fp32, 0.1 bfloat16
epsilons in bfloat16, a margin of at least 15 below the tolerance.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from .kv_fingerprint import REGIONS, KvFingerprint, KvStats, LayerPages, PageFingerprint

ACCUMULATION_EPS = 32  # fp32 roundings: the same sums accumulated in another order
ROUNDING_EPS = 2  # roundings of the coarser of the storage and compute dtypes
STATISTICS = ("sum", "sum_sq", "sum_abs")
PAGE_STATISTIC = "page_sum_sq"


# the relative size of one rounding step of a packed low-bit format (a code flipped by a value
# that rounded the other way moves by one step of its group): half the 4-bit E2M1 grid's coarsest
# gap relative to its largest value for nvfp4, one level of the group's range for the integers. A
# group whose clipped range flips between two near-tied candidates moves further (up to a quarter
# of its range), but only that group: one of a page's num_kv_heads * head_dim or more, so a page's
# sums move by far less than this
PACKED_EPS = {"nvfp4": 2 ** -2, "int4": 1 / 15, "int3": 1 / 7, "int2": 1 / 3}


def dtype_eps(name: str | torch.dtype) -> float:
    """Machine epsilon of a floating dtype given as a ``torch.dtype`` or its name (``"bfloat16"``,
    ``"torch.float8_e4m3fn"``); for a layer's storage format name (``"nvfp4"``, ``"k=fp8_e4m3,
    v=int4"``) the coarsest of its sides (``PACKED_EPS`` for a packed one). ValueError for a name
    that is neither."""
    if isinstance(name, str) and ("=" in name or name in PACKED_EPS):
        sides = [part.split("=", 1)[-1].strip() for part in name.split(",")]
        return max(PACKED_EPS[side] if side in PACKED_EPS else dtype_eps(_fp8_name(side))
                   for side in sides)
    if isinstance(name, str):
        name = _fp8_name(name)
        dtype = getattr(torch, name.removeprefix("torch."), None)
        if not isinstance(dtype, torch.dtype):
            raise ValueError(f"{name!r} is not a torch dtype")
    else:
        dtype = name
    if not dtype.is_floating_point:
        raise ValueError(f"{dtype} is not a floating dtype; its epsilon is undefined")
    return float(torch.finfo(dtype).eps)


def _fp8_name(name: str) -> str:
    """A format name as torch names its dtype (``"fp8_e4m3"`` is ``float8_e4m3fn``)."""
    return {"fp8_e4m3": "float8_e4m3fn", "fp8_e5m2": "float8_e5m2"}.get(name, name)


def relative_tolerance(storage_dtype: str | torch.dtype,
                       compute_dtype: str | torch.dtype | None = None,
                       slack: float = 1.0) -> float:
    """``slack * (ACCUMULATION_EPS * eps(float32) + ROUNDING_EPS * eps)``, ``eps`` the larger of
    the storage dtype's and the compute dtype's (the storage dtype alone when None). ValueError for
    a dtype without an epsilon or a ``slack`` that is not a finite number > 0."""
    if isinstance(slack, bool) or not isinstance(slack, (int, float)) \
            or not math.isfinite(slack) or slack <= 0:
        raise ValueError(f"slack must be a finite number > 0, got {slack!r}")
    eps = dtype_eps(storage_dtype)
    if compute_dtype is not None:
        eps = max(eps, dtype_eps(compute_dtype))
    return float(slack) * (ACCUMULATION_EPS * dtype_eps(torch.float32) + ROUNDING_EPS * eps)


@dataclass(frozen=True)
class KvDivergence:
    """The first difference beyond tolerance, in layer order, then region order (prefix before
    suffix): ``layer`` and ``region``; the ``tensor`` (``"k"``/``"v"``) and ``statistic`` (a
    region's ``"sum"``, ``"sum_sq"``, ``"sum_abs"``, or ``"page_sum_sq"`` when only a page's sums
    of squares differ) with its ``value`` in the first fingerprint, its ``reference`` in the second
    and the ``tolerance``; and the first logical page of that region whose sums of squares differ
    (None when no single page does, or no page rows were given), with the physical page it maps
    to in each run."""

    layer: int
    region: str
    tensor: str
    statistic: str
    value: float
    reference: float
    tolerance: float
    logical_page: int | None
    physical_page: int | None
    reference_physical_page: int | None

    def describe(self) -> str:
        """One line naming the layer, region, page and the statistic that differs."""
        page = ("no single page beyond tolerance" if self.logical_page is None else
                f"logical page {self.logical_page} (physical {self.physical_page}; reference "
                f"physical {self.reference_physical_page})")
        return (f"layer {self.layer}, {self.region} region, {page}: {self.tensor.upper()} "
                f"{self.statistic} {self.value!r} vs {self.reference!r} (tolerance "
                f"{self.tolerance:.3g})")


@dataclass(frozen=True)
class KvComparison:
    """``compare_kv``: the first ``divergence`` (None when everything agrees), the largest
    ``|difference| / tolerance`` over every statistic compared (``worst_ratio``; at most 1 when
    they agree) and the relative tolerance used."""

    divergence: KvDivergence | None
    worst_ratio: float
    relative_tolerance: float

    @property
    def agree(self) -> bool:
        """True when no statistic differs beyond tolerance."""
        return self.divergence is None

    def describe(self) -> str:
        """One line: where they first differ, or that they agree and how closely."""
        if self.divergence is not None:
            return f"differ: {self.divergence.describe()}"
        return (f"agree: every layer, region and page within tolerance (relative "
                f"{self.relative_tolerance:.3g}; largest difference {self.worst_ratio:.3g} of it)")


def _ratio(a: float, b: float, tol: float) -> float:
    """``|a - b| / tol``: 0.0 for equal values (NaN and NaN, or the same infinity included), inf
    for a non-finite value on one side only or any difference at tolerance 0."""
    if a == b or (math.isnan(a) and math.isnan(b)):
        return 0.0
    if not (math.isfinite(a) and math.isfinite(b)):
        return math.inf
    return abs(a - b) / tol if tol > 0 else math.inf


def _abs_max(a: float, b: float) -> float:
    finite = [abs(x) for x in (a, b) if math.isfinite(x)]
    return max(finite, default=0.0)


@dataclass(frozen=True)
class _Hit:
    region: str
    tensor: str
    statistic: str
    value: float
    reference: float
    tolerance: float
    ratio: float


def _stats_hits(region: str, tensor: str, a: KvStats, b: KvStats, rel: float) -> list[_Hit]:
    mag_abs = _abs_max(a.sum_abs, b.sum_abs)
    tolerances = {"sum": rel * mag_abs, "sum_abs": rel * mag_abs,
                  "sum_sq": (2 * rel + rel * rel) * _abs_max(a.sum_sq, b.sum_sq)}
    hits = []
    for stat in STATISTICS:
        va, vb, tol = getattr(a, stat), getattr(b, stat), tolerances[stat]
        hits.append(_Hit(region, tensor, stat, va, vb, tol, _ratio(va, vb, tol)))
    return hits


def _page_hits(a: PageFingerprint, b: PageFingerprint, rel: float) -> list[_Hit]:
    hits = []
    for tensor, va, vb in (("k", a.k_sum_sq, b.k_sum_sq), ("v", a.v_sum_sq, b.v_sum_sq)):
        tol = (2 * rel + rel * rel) * _abs_max(va, vb)
        hits.append(_Hit(a.region, tensor, PAGE_STATISTIC, va, vb, tol, _ratio(va, vb, tol)))
    return hits


def _check_comparable(a: KvFingerprint, b: KvFingerprint) -> None:
    for name in ("kv_len", "boundary", "page_size"):
        if getattr(a, name) != getattr(b, name):
            raise ValueError(f"the fingerprints cover different KV: {name} {getattr(a, name)} vs "
                             f"{getattr(b, name)}; fingerprint the same tokens split at the same "
                             f"boundary")
    if len(a.layers) != len(b.layers):
        raise ValueError(f"the fingerprints have {len(a.layers)} and {len(b.layers)} layers; "
                         f"compare runs of the same model")


def _pages_by_layer(pages: Sequence[LayerPages]) -> dict[int, tuple[PageFingerprint, ...]]:
    return {lp.layer: lp.pages for lp in pages}


def compare_kv(a: KvFingerprint, b: KvFingerprint, a_pages: Sequence[LayerPages] = (),
               b_pages: Sequence[LayerPages] = (), *,
               compute_dtype: str | torch.dtype | None = None,
               slack: float = 1.0) -> KvComparison:
    """Compare fingerprint ``a`` (the run under test, e.g. warm) with ``b`` (the reference, e.g.
    cold) layer by layer: each region's K and V sums, then, for a layer whose page rows both
    ``a_pages`` and ``b_pages`` hold, each logical page's sums of squares. The first layer where
    anything differs beyond tolerance (``relative_tolerance`` of each layer's storage dtype and
    ``compute_dtype``, see the module docstring) is the divergence; its region is the earliest
    region that differs there (by its sums or by a page), its page the first page of that region
    that differs. ValueError when the two cover different KV (``kv_len``, ``boundary``,
    ``page_size``, layer count or page count), for a bad ``slack`` or dtype. Pure."""
    _check_comparable(a, b)
    pages_a, pages_b = _pages_by_layer(a_pages), _pages_by_layer(b_pages)
    worst, rel = 0.0, 0.0
    for la, lb in zip(a.layers, b.layers):
        rel = relative_tolerance(la.storage_dtype, compute_dtype, slack)
        hits = [h for ra, rb in zip(la.regions, lb.regions) for tensor in ("k", "v")
                for h in _stats_hits(ra.region, tensor, getattr(ra, tensor), getattr(rb, tensor),
                                     rel)]
        rows_a, rows_b = pages_a.get(la.layer), pages_b.get(la.layer)
        page_pairs: list[tuple[PageFingerprint, PageFingerprint, list[_Hit]]] = []
        if rows_a is not None and rows_b is not None:
            if len(rows_a) != len(rows_b):
                raise ValueError(f"layer {la.layer} has {len(rows_a)} and {len(rows_b)} page "
                                 f"rows; compare runs of the same tokens")
            page_pairs = [(pa, pb, _page_hits(pa, pb, rel)) for pa, pb in zip(rows_a, rows_b)]
        ratios = [h.ratio for h in hits] + [h.ratio for *_, ph in page_pairs for h in ph]
        worst = max([worst, *ratios])
        bad_regions = {h.region for h in hits if h.ratio > 1}
        bad_regions |= {pa.region for pa, _, ph in page_pairs if any(h.ratio > 1 for h in ph)}
        if not bad_regions:
            continue
        region = next(r for r in REGIONS if r in bad_regions)
        bad_page = next(((pa, pb, ph) for pa, pb, ph in page_pairs if pa.region == region
                         and any(h.ratio > 1 for h in ph)), None)
        first = next((h for h in hits if h.region == region and h.ratio > 1), None)
        if first is None:
            assert bad_page is not None
            first = next(h for h in bad_page[2] if h.ratio > 1)
        return KvComparison(
            KvDivergence(la.layer, region, first.tensor, first.statistic, first.value,
                         first.reference, first.tolerance,
                         None if bad_page is None else bad_page[0].logical_page,
                         None if bad_page is None else bad_page[0].physical_page,
                         None if bad_page is None else bad_page[1].physical_page),
            worst, rel)
    return KvComparison(None, worst, rel)
