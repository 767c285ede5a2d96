"""ActiveStep: the batch of rows that step verbs (``put``, ``get``, metadata, seal) act on.

It is a read-only view built by ``activate_step`` from the rows' bindings: their page tables stacked into one
``[B, max_pages]`` array so slot ids for a whole batch come from one vectorised gather, plus per-row capacity and
matched-prefix arrays. Page tables never change while a row is active (offloading deactivates it), so the view
and its cached index tensors stay valid until the step is cleared.
"""

from __future__ import annotations

import numpy as np
import torch

from .bindings import Binding


class ActiveStep:
    def __init__(self, bindings: list[Binding], page_size: int, device: torch.device) -> None:
        self.bindings = tuple(bindings)
        self.ids = tuple(b.request_id for b in bindings)
        self.batch = len(bindings)
        self.page_size = page_size
        self.device = device
        self.rows = np.array([b.row for b in bindings], dtype=np.int64)  # int64[B] into BindingTable.kv_len
        self.capacity = np.array([b.capacity for b in bindings], dtype=np.int64)  # int64[B]
        self.matched = np.array([b.matched_len for b in bindings], dtype=np.int64)  # int64[B]
        self.min_capacity = int(self.capacity.min())
        self.max_capacity = int(self.capacity.max())
        self.max_matched = int(self.matched.max())
        max_pages = self.max_capacity // page_size
        table = np.zeros((self.batch, max_pages), dtype=np.int64)
        for i, b in enumerate(bindings):
            table[i, : len(b.page_ids)] = b.page_ids
        self.page_table = table  # int64[B, max_pages], host
        self._index_cache: tuple[tuple[bytes, int, bool], torch.Tensor] | None = None

    def slots(self, start: np.ndarray, length: int, clamp: bool = False) -> np.ndarray:
        """Physical slots of positions ``[start_b, start_b + length)`` of every row, row-major ``int64[B*length]``.
        With ``clamp``, positions past a row's capacity repeat its last slot. Positions must be in range."""
        pos = start[:, None] + np.arange(length, dtype=np.int64)
        if clamp:
            pos = np.minimum(pos, (self.capacity - 1)[:, None])
        ps = self.page_size
        pages = np.take_along_axis(self.page_table, pos // ps, axis=1)
        return (pages * ps + pos % ps).reshape(-1)

    def index(self, start: np.ndarray, length: int, clamp: bool = False) -> torch.Tensor:
        """``slots(...)`` as an int64 tensor on the pool's device; the last one is cached (layers of one step
        reuse it)."""
        key = (start.tobytes(), length, clamp)
        cached = self._index_cache
        if cached is not None and cached[0] == key:
            return cached[1]
        idx = torch.from_numpy(self.slots(start, length, clamp))
        if self.device.type != "cpu":
            idx = idx.to(self.device, non_blocking=True)
        self._index_cache = (key, idx)
        return idx
