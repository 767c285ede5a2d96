"""Java values to Python and back at the bridge: int arrays, checked integer returns, and direct ByteBuffers
viewed as tensors without a copy."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from jpype import JClass

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
          "float8_e4m3fn": torch.float8_e4m3fn, "float8_e5m2": torch.float8_e5m2}


def checked_int(x: Any, what: str) -> int:
    """``x`` as a Java int/long return value; TypeError for anything but an integer."""
    if isinstance(x, bool) or not isinstance(x, (int, np.integer)):
        raise TypeError(f"{what} must return an integer, got {type(x).__name__} {x!r}")
    return int(x)


def int_array(a: Any) -> np.ndarray:
    """A Java ``int[]``/``long[]`` (or varargs) as int64 numpy (one copy); ValueError for null.

    Always a copy: ``np.asarray`` of a ``long[]`` is a view of JPype's buffer over the Java array, and when that
    view is released while an error unwinds (JPype 1.7.1 releases the array elements through JNI), the Java
    exception already raised for the caller is dropped: ``free(long[])`` then returned normally instead of
    throwing. (Direct ByteBuffer views do not have this problem.)"""
    if a is None:
        raise ValueError("array argument must not be null")
    return np.array(a, dtype=np.int64)


_native_order: Any = None  # java.nio.ByteOrder.nativeOrder(), looked up once


def buffer_view(buf: Any, dtype: torch.dtype, shape: tuple[int, ...], what: str) -> torch.Tensor:
    """A zero-copy tensor over a direct ByteBuffer's first ``prod(shape)`` elements."""
    global _native_order
    if buf is None:
        raise ValueError(f"{what} must not be null")
    if not buf.isDirect():
        raise ValueError(f"{what} must be a direct ByteBuffer (ByteBuffer.allocateDirect(n).order(nativeOrder()))")
    if _native_order is None:
        _native_order = JClass("java.nio.ByteOrder").nativeOrder()
    if buf.order() != _native_order:
        raise ValueError(f"{what} must be in native byte order: call .order(ByteOrder.nativeOrder())")
    n = math.prod(shape)
    need = n * dtype.itemsize
    if buf.capacity() < need:
        raise ValueError(f"{what} holds {buf.capacity()} bytes, need {need} for {list(shape)} {dtype}")
    if n == 0:  # torch.frombuffer rejects count=0; an empty put/get is valid (the pool treats it as a no-op)
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(buf, dtype=dtype, count=n).view(shape)
