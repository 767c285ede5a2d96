"""Argument checks shared by the cache's public verbs (each raises ValueError with what was asked
and why)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch


def as_int(value: Any, name: str, minimum: int = 0, maximum: int | None = None) -> int:
    """``value`` as a Python int in ``[minimum, maximum]``; bools, floats and strings are
    rejected."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    value = int(value)
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{name} must be <= {maximum}, got {value}")
    return value


def as_layer(layer: Any, num_layers: int) -> int:
    """``layer`` as an int in ``[0, num_layers)``; a plain in-range int passes without further
    checks (put and get run once per layer)."""
    if type(layer) is int and 0 <= layer < num_layers:
        return layer
    return as_int(layer, "layer", minimum=0, maximum=num_layers - 1)


def as_positions(value: Any, name: str, batch: int) -> np.ndarray:
    """An int (same for every row) or one int per row, as ``int64[batch]`` of non-negative
    positions."""
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        if value < 0:
            raise ValueError(f"{name} must be >= 0, got {value}")
        return np.full(batch, int(value), dtype=np.int64)
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu().numpy()
    arr = np.asarray(value)
    if arr.dtype.kind not in "iu" or arr.ndim != 1:
        raise ValueError(f"{name} must be an int or a 1-D int sequence, got {value!r}")
    if len(arr) != batch:
        raise ValueError(f"{name} has {len(arr)} entries but the active step has {batch} rows")
    if len(arr) and arr.min() < 0:
        raise ValueError(f"{name} must be >= 0, got {arr.tolist()}")
    return arr.astype(np.int64, copy=True)


def same_device(a: torch.device, b: torch.device) -> bool:
    """``cuda`` and ``cuda:0`` are the same device when 0 is the current one."""
    if a.type != b.type:
        return False
    if a.type != "cuda" or a.index == b.index:
        return True
    current = torch.cuda.current_device()
    a_index = a.index if a.index is not None else current
    return a_index == (b.index if b.index is not None else current)


def as_device(value: Any, name: str = "device") -> torch.device:
    """``value`` (a device string such as ``"cpu"`` or ``"cuda:0"``, or a ``torch.device``) as a
    device this process can allocate on; ValueError naming ``name`` otherwise (an int, an unknown
    type, ``meta``, a missing accelerator)."""
    if not isinstance(value, (str, torch.device)):
        raise ValueError(f"{name} must be a device string such as 'cpu' or 'cuda:0', or a "
                         f"torch.device, got {type(value).__name__} {value!r}")
    try:
        device = torch.device(value)
    except (RuntimeError, TypeError) as e:
        raise ValueError(f"{name} {value!r} is not a torch device ({e})") from None
    if device.type == "meta":
        raise ValueError(f"{name} 'meta' holds no data; use 'cpu' or 'cuda'")
    try:
        torch.empty(0, device=device)
    # what torch raises for a device this build or machine lacks: no driver, "not compiled with
    # CUDA", no backend
    except (RuntimeError, AssertionError, NotImplementedError) as e:
        first_line = str(e).splitlines()[0]
        raise ValueError(f"{name} {str(device)!r} is not available here ({first_line})") from None
    return device
