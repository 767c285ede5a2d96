"""Sized constructors of KvCachePool (docs/contract.md, "Construction and sizing"): ``allocate``,
``for_testing``, ``for_mtp``, ``for_mtp_history``. They are bound onto ``KvCachePool`` as
classmethods; each takes the pool class as ``cls`` (anything shaped like :class:`SizedPool`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, TypedDict, TypeVar

import torch

from .checks import as_device, as_int
from .layout import KvCacheLayout, ceil_page, compute_static_kv_budget, floor_page

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from .kv_dtype import LayerFormats


class PoolOptions(TypedDict, total=False):
    """The keyword-only options of ``KvCachePool``, passed through by every factory."""

    k_scale: float
    v_scale: float
    zero_rejected_kv: bool | None
    fresh_page_fill: str
    first_layer: int
    kv_formats: tuple[LayerFormats, ...] | None
    num_tails: int | None
    compute_dtype: torch.dtype | None


class SizedPool(Protocol):
    """What the factories need of the pool class: its constructor, and the prefix-reuse switch."""

    def __init__(self, num_layers: int, num_slots: int, num_kv_heads: int, head_dim: int,
                 page_size: int = ..., device: str | torch.device = ...,
                 dtype: torch.dtype = ..., **pool_kwargs: Unpack[PoolOptions]) -> None: ...

    def set_prefix_reuse(self, on: bool) -> None: ...


Pool = TypeVar("Pool", bound=SizedPool)


def _cuda_mem_info(device: torch.device) -> tuple[int, int]:
    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info(device)
    return int(free), int(total)


def allocate(cls: type[Pool], layout: KvCacheLayout, device: str | torch.device = "cpu",
             dtype: torch.dtype = torch.float32, mem_fraction: float = 0.85, page_size: int = 16,
             **pool_kwargs: Unpack[PoolOptions]) -> Pool:
    """A pool for ``layout``. On CUDA, sized from ``torch.cuda.mem_get_info`` by
    ``compute_static_kv_budget`` (call it after the weights are loaded, so "used" is right);
    elsewhere ``floor_page(max(page_size, max_batch * max_seq))`` slots. Raises ValueError for
    ``mem_fraction`` outside (0, 1] or ``page_size < 1``."""
    if isinstance(mem_fraction, bool) or not isinstance(mem_fraction, (int, float)) \
            or not 0.0 < mem_fraction <= 1.0:
        raise ValueError(f"mem_fraction must be in (0, 1], got {mem_fraction!r}")
    page_size = as_int(page_size, "page_size", minimum=1)
    device = as_device(device)
    if device.type == "cuda" and layout.num_layers:  # no layers: no bytes to size by
        free, total = _cuda_mem_info(device)
        per_token, reserved = kv_cost(layout, dtype, page_size, pool_kwargs)
        budget = compute_static_kv_budget(total, max(free - reserved, 0), mem_fraction, per_token,
                                          page_size, layout.max_batch_size, layout.max_seq_len)
        num_slots = budget.num_slots
    else:
        num_slots = floor_page(max(page_size, layout.max_batch_size * layout.max_seq_len),
                               page_size)
    return cls(layout.num_layers, num_slots, layout.num_kv_heads, layout.head_dim, page_size,
               device, dtype, **pool_kwargs)


def kv_cost(layout: KvCacheLayout, dtype: torch.dtype, page_size: int,
            pool_kwargs: PoolOptions) -> tuple[int, int]:
    """``(bytes per token, bytes set aside)`` of a pool for ``layout``: with ``kv_formats``, the
    real bytes of every layer's pages per token (rounded up) and the tails' bytes
    (``num_tails`` raw pages of every packed layer and side, in ``compute_dtype``); else every
    layer in ``dtype`` and nothing set aside."""
    formats = pool_kwargs.get("kv_formats")
    if not formats:
        return layout.bytes_per_token(dtype), 0
    per_token = -(-layout.page_bytes(formats, page_size) // page_size)
    compute = pool_kwargs.get("compute_dtype") or torch.bfloat16
    tails = (pool_kwargs.get("num_tails") or 0) * layout.tail_bytes(formats, page_size, compute)
    return per_token, tails


def for_testing(cls: type[Pool], layout: KvCacheLayout, device: str | torch.device = "cpu",
                **pool_kwargs: Unpack[PoolOptions]) -> Pool:
    """Page size 1, float32, ``max_batch * max_seq`` slots."""
    return cls(layout.num_layers, layout.max_batch_size * layout.max_seq_len, layout.num_kv_heads,
               layout.head_dim, 1, device, torch.float32, **pool_kwargs)


def for_mtp(cls: type[Pool], layout: KvCacheLayout, device: str | torch.device, dtype: torch.dtype,
            page_size: int, **pool_kwargs: Unpack[PoolOptions]) -> Pool:
    """The per-round MTP draft pool: ``max_batch * ceil_page(max_seq)`` slots with the model's real
    dtype and page size."""
    page_size = as_int(page_size, "page_size", minimum=1)
    per_request = ceil_page(layout.max_seq_len, page_size)
    return cls(layout.num_layers, layout.max_batch_size * per_request, layout.num_kv_heads,
               layout.head_dim, page_size, device, dtype, **pool_kwargs)


def for_mtp_history(cls: type[Pool], layout: KvCacheLayout, device: str | torch.device,
                    dtype: torch.dtype, page_size: int, want_slots: int,
                    **pool_kwargs: Unpack[PoolOptions]) -> Pool:
    """The persistent MTP history pool: ``want_slots`` (on CUDA capped at half the free memory),
    page-floored, prefix reuse off. Raises RuntimeError if not one page fits."""
    page_size = as_int(page_size, "page_size", minimum=1)
    slots = as_int(want_slots, "want_slots", minimum=0)
    device = as_device(device)
    if device.type == "cuda" and layout.num_layers:
        free, _ = _cuda_mem_info(device)
        slots = min(slots, int(free * 0.5) // layout.bytes_per_token(dtype))
    slots = floor_page(slots, page_size)
    if slots < page_size:
        raise RuntimeError(f"not enough free memory for the MTP history KV pool: {slots} slots, "
                           f"need at least one page of {page_size}")
    pool = cls(layout.num_layers, slots, layout.num_kv_heads, layout.head_dim, page_size, device,
               dtype, **pool_kwargs)
    pool.set_prefix_reuse(False)
    return pool
