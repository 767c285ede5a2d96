"""StateSpec: one kind of fixed-size per-request state (its shape and dtype), as a ``StatePool`` and
its ``StateSnapshots`` hold it."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class StateSpec:
    """One kind of per-request state: its per-request ``shape`` and ``dtype``."""

    shape: tuple[int, ...]
    dtype: torch.dtype = torch.float32
