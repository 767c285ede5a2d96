"""OffloadedKv: a bound request's private KV held in host memory while its pages serve others."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(eq=False)
class OffloadedKv:
    """Host copy of one request's private pages, made by ``KvCachePool.offload_request`` and
    consumed once by ``restore_request``. ``k_raw``/``v_raw`` hold the raw storage of every private
    page ``[num_layers, num_private_pages * page_size, Hkv, D]`` (uint8 views for FP8), so a restore
    is byte-identical wherever the pages land, whatever was written where (gap writes past
    ``kv_len`` included)."""

    request_id: int
    num_private_pages: int
    k_raw: torch.Tensor
    v_raw: torch.Tensor

    @property
    def nbytes(self) -> int:
        """Host bytes held by the offloaded K and V."""
        k, v = self.k_raw, self.v_raw
        return k.numel() * k.element_size() + v.numel() * v.element_size()
