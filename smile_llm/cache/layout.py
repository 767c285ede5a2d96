"""KV-cache geometry and static sizing (SGLang's ``--mem-fraction-static`` rule, as Smile applies
it)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from .kv_dtype import LayerFormats

GIB = 1 << 30
MIB = 1 << 20


def element_size(dtype: torch.dtype) -> int:
    """Bytes per element of a KV storage dtype (FP8 types are 1)."""
    return torch.empty((), dtype=dtype).element_size()


def floor_page(n: int, page_size: int) -> int:
    """Largest multiple of ``page_size`` not above ``n``."""
    return (n // page_size) * page_size


def ceil_page(n: int, page_size: int) -> int:
    """Smallest multiple of ``page_size`` not below ``n``."""
    return -(-n // page_size) * page_size


@dataclass(frozen=True)
class KvCacheLayout:
    """Per-pool geometry: layers, KV heads, head size and the largest batch and sequence it must
    serve. ValueError unless every field is an int >= 1 (``num_layers`` >= 0: a pool of no layers
    keeps the pages' bookkeeping alone, a pipeline stage without attention layers).

    >>> import torch
    >>> # an 8B Llama shape
    >>> layout = KvCacheLayout.of(32, 4096, 32, 8, max_batch_size=4, max_seq_len=8192)
    >>> layout
    KvCacheLayout(num_layers=32, num_kv_heads=8, head_dim=128, max_batch_size=4, max_seq_len=8192)
    >>> layout.bytes_per_token(torch.bfloat16)   # 2 (K and V) * 32 * 8 * 128 * 2 bytes
    131072
    >>> KvCacheLayout.of(2, 100, 3)
    Traceback (most recent call last):
        ...
    ValueError: ...
    """

    num_layers: int
    num_kv_heads: int
    head_dim: int
    max_batch_size: int
    max_seq_len: int

    def __post_init__(self) -> None:
        for name in ("num_layers", "num_kv_heads", "head_dim", "max_batch_size", "max_seq_len"):
            value = getattr(self, name)
            least = 0 if name == "num_layers" else 1
            if not isinstance(value, int) or isinstance(value, bool) or value < least:
                raise ValueError(f"KvCacheLayout.{name} must be an int >= {least}, got {value!r}")

    @classmethod
    def of(
        cls,
        num_layers: int,
        dim: int,
        num_heads: int,
        num_kv_heads: int | None = None,
        max_batch_size: int = 1,
        max_seq_len: int = 4096,
    ) -> KvCacheLayout:
        """Derive ``head_dim = dim // num_heads``; ``num_kv_heads`` defaults to ``num_heads`` (no
        GQA).

        Raises ValueError if any count is below 1 or ``dim`` is not divisible by ``num_heads``."""
        if num_heads < 1 or dim < 1:
            raise ValueError(f"dim and num_heads must be >= 1, got dim={dim}, "
                             f"num_heads={num_heads}")
        if dim % num_heads != 0:
            raise ValueError(f"dim {dim} is not divisible by num_heads {num_heads}; pick a head "
                             f"count that divides it")
        kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        return cls(num_layers, kv_heads, dim // num_heads, max_batch_size, max_seq_len)

    def bytes_per_token(self, dtype: torch.dtype) -> int:
        """K plus V bytes of one token over all layers: ``2 * L * Hkv * D * element_size``."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * element_size(dtype)

    def layer_page_bytes(self, formats: Sequence[LayerFormats],
                         page_size: int) -> list[tuple[int, int]]:
        """Bytes of one page of each layer's K and of its V as ``formats`` store them (a packed
        side's codes and scales, ``cache.codecs``). ValueError when ``formats`` does not list one
        per layer, or a packed format does not fit the geometry."""
        from .kv_sides import side_page_bytes

        if len(formats) != self.num_layers:
            raise ValueError(f"{len(formats)} layer formats for {self.num_layers} layers")
        return [(side_page_bytes(f.k, "k", page_size, self.num_kv_heads, self.head_dim),
                 side_page_bytes(f.v, "v", page_size, self.num_kv_heads, self.head_dim))
                for f in formats]

    def page_bytes(self, formats: Sequence[LayerFormats], page_size: int) -> int:
        """Bytes of one page over every layer, K and V (``layer_page_bytes`` summed): what the
        static budget divides by."""
        return sum(k + v for k, v in self.layer_page_bytes(formats, page_size))

    def tail_bytes(self, formats: Sequence[LayerFormats], page_size: int,
                   compute_dtype: torch.dtype) -> int:
        """Bytes of one tail (a raw page of every packed layer and side, ``cache.kv_tails``)."""
        sides = sum(f.k.packed + f.v.packed for f in formats)
        return sides * page_size * self.num_kv_heads * self.head_dim * element_size(compute_dtype)


@dataclass(frozen=True)
class SlotCount:
    """Slots a budget buys (``num_slots``) and the most that could ever be used
    (``max_useful_slots``)."""

    num_slots: int
    max_useful_slots: int


@dataclass(frozen=True)
class StaticKvBudget:
    """The outcome of :func:`compute_static_kv_budget`; all byte figures are ints."""

    total: int
    used: int
    static_budget: int
    kv_budget: int
    dynamic_reserve: int
    num_slots: int
    max_useful_slots: int


def slots_from_budget(
    kv_budget_bytes: int,
    bytes_per_token: int,
    page_size: int,
    max_batch_size: int,
    max_seq_len: int,
) -> SlotCount:
    """Page-floored slots the budget buys (at least one page), capped at
    ``ceil_page(max_batch * max_seq)``."""
    affordable = floor_page(max(page_size, kv_budget_bytes // bytes_per_token), page_size)
    from_budget = max(page_size, affordable)
    max_useful = ceil_page(max(page_size, max_batch_size * max_seq_len), page_size)
    return SlotCount(min(from_budget, max_useful), max_useful)


def compute_static_kv_budget(
    total: int,
    free: int,
    mem_fraction: float,
    bytes_per_token: int,
    page_size: int,
    max_batch_size: int,
    max_seq_len: int,
) -> StaticKvBudget:
    """SGLang's mem-fraction-static rule.

    ``static = floor(total * mem_fraction)`` holds weights (``used = total - free``) plus KV; the KV
    budget is ``static - used - soft_margin`` with
    ``soft_margin = min(1 GiB, max(512 MiB, total / 40))``, the margin dropped when it leaves less
    than one page. Raises ValueError on bad arguments and RuntimeError when not even one page
    fits."""
    if total <= 0:
        raise ValueError(f"total memory must be > 0 bytes, got {total}")
    if not 0 <= free <= total:
        raise ValueError(f"free memory must be in [0, total={total}], got {free}")
    if not 0.0 < mem_fraction <= 1.0:
        raise ValueError(f"mem_fraction must be in (0, 1], got {mem_fraction}")
    if bytes_per_token < 1 or page_size < 1 or max_batch_size < 1 or max_seq_len < 1:
        raise ValueError(
            f"bytes_per_token, page_size, max_batch_size and max_seq_len must be >= 1, got "
            f"{bytes_per_token}, {page_size}, {max_batch_size}, {max_seq_len}"
        )
    used = total - free
    static_budget = int(total * mem_fraction)
    dynamic_reserve = total - static_budget
    soft_margin = min(GIB, max(512 * MIB, total // 40))
    page_bytes = bytes_per_token * page_size
    kv_budget = static_budget - used - soft_margin
    if kv_budget < page_bytes:
        kv_budget = static_budget - used
    if kv_budget < page_bytes:
        raise RuntimeError(
            f"KV static budget too small: static budget {static_budget} B (mem_fraction "
            f"{mem_fraction} of {total} B) minus {used} B already in use leaves {kv_budget} B, "
            f"less than one page ({page_bytes} B); raise mem_fraction or free device memory"
        )
    slots = slots_from_budget(kv_budget, bytes_per_token, page_size, max_batch_size, max_seq_len)
    return StaticKvBudget(total, used, static_budget, kv_budget, dynamic_reserve, slots.num_slots,
                          slots.max_useful_slots)
