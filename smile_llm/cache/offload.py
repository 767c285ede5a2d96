"""OffloadedKv: a bound request's private KV held in host memory while its pages serve others."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


@dataclass(eq=False)
class OffloadedKv:
    """Host copy of one request's private pages, made by ``KvCachePool.offload_request`` and
    consumed once by ``restore_request``. ``k_raw``/``v_raw`` hold, per layer, the stored contents
    of every private page (``KvStore.copy_pages_out``: a dense layer's raw slots
    ``[num_private_pages * page_size, Hkv, D]``, uint8 views for FP8; a packed layer's parts and its
    raw tails), so a restore is byte-identical wherever the pages land, whatever was written where
    (gap writes past ``kv_len`` included)."""

    request_id: int
    num_private_pages: int
    k_raw: list[Any]
    v_raw: list[Any]

    @property
    def nbytes(self) -> int:
        """Host bytes held by the offloaded K and V."""
        return sum(_nbytes(x) for x in (*self.k_raw, *self.v_raw))


def _nbytes(x: Any) -> int:
    if isinstance(x, torch.Tensor):
        return x.numel() * x.element_size()
    if isinstance(x, dict):
        return sum(_nbytes(v) for v in x.values())
    if isinstance(x, (tuple, list)):
        return sum(_nbytes(v) for v in x)
    return 0
