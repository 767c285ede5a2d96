"""OffloadedKv: a bound request's private KV held in host memory while its pages serve others."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(eq=False)
class OffloadedKv:
    """Host copy of one request's private pages, made by ``KvCachePool.offload_request`` and consumed once by
    ``restore_request``. ``k_raw``/``v_raw`` hold raw storage ``[num_layers, num_saved_pages * page_size, Hkv, D]``
    (uint8 views for FP8), so a restore is byte-identical wherever the pages land. Only the pages covering the
    request's written KV (``kv_len``) are saved; the rest of its capacity comes back freshly filled."""

    request_id: int
    num_private_pages: int
    num_saved_pages: int
    k_raw: torch.Tensor
    v_raw: torch.Tensor

    @property
    def nbytes(self) -> int:
        return self.k_raw.numel() * self.k_raw.element_size() + self.v_raw.numel() * self.v_raw.element_size()
