"""Java values to Python and back at the bridge: int arrays, checked integer returns, direct
ByteBuffers viewed as tensors without a copy (Java NIO position/limit semantics), and Smile's value
types (``KvCacheLayout``, ``smile.deep.tensor.Device``/``ScalarType``)."""

from __future__ import annotations

import math
import threading
import warnings
from typing import Any

import numpy as np
import torch
from jpype import JByte, JClass

from smile_llm import KvCacheLayout

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
          "float64": torch.float64, "float8_e4m3fn": torch.float8_e4m3fn,
          "float8_e5m2": torch.float8_e5m2}

# torch warns (once per process) that a tensor over a read-only buffer could be written through. The
# bridge views read-only buffers only as input (put), which it only reads, so that message is
# silenced around those views; the lock keeps two such views from interleaving their save and
# restore of the warning filters.
_quiet_view = threading.Lock()


def checked_int(x: Any, what: str, bits: int = 32) -> int:
    """``x`` as the return value of a Java ``int`` (``bits=32``) or ``long`` (``bits=64``) method.
    TypeError for anything but an integer in that type's range: JPype converts a return value after
    the bridged method has returned, where a failure would reach Java as its own unmapped proxy
    exception, so it is checked here."""
    if type(x) is not int:  # the common case is an exact int: one type check
        if isinstance(x, bool) or not isinstance(x, (int, np.integer)):
            raise TypeError(f"{what} must return an integer, got {type(x).__name__} {x!r}")
        x = int(x)
    if not -(1 << (bits - 1)) <= x < 1 << (bits - 1):
        raise TypeError(f"{what} must return a Java {'int' if bits == 32 else 'long'}, got {x} "
                        "(out of range)")
    return x


def int_array(a: Any) -> np.ndarray:
    """A Java ``int[]``/``long[]`` (or varargs) as int64 numpy (one copy); ValueError for null.

    Always a copy: ``np.asarray`` of a ``long[]`` is a view of JPype's buffer over the Java array,
    and when that view is released while an error unwinds (JPype 1.7.1 releases the array elements
    through JNI), the Java exception already raised for the caller is dropped: ``free(long[])`` then
    returned normally instead of throwing. (Direct ByteBuffer views do not have this problem.)"""
    if a is None:
        raise ValueError("array argument must not be null")
    return np.array(a, dtype=np.int64)


def int_or_array(a: Any) -> int | np.ndarray:
    """A Java ``int`` (one value for every active row) as a Python int, or an ``int[]`` (one per
    row) as ``int_array`` reads it: the overloads of the step verbs (``sealLength(int)`` and
    ``sealLength(int[])``) arrive at one Python method."""
    if isinstance(a, int) and not isinstance(a, bool):
        return int(a)
    return int_array(a)


_native_order: Any = None  # java.nio.ByteOrder.nativeOrder(), looked up once


def buffer_view(buf: Any, dtype: torch.dtype, shape: tuple[int, ...], what: str, *,
                output: bool) -> torch.Tensor:
    """A zero-copy tensor over the ``prod(shape)`` elements of a direct native-order ByteBuffer that
    start at its ``position()``, like Java's absolute bulk methods: the buffer's position and limit
    are left as they are, and ``remaining()`` must hold the elements (more is fine). ``output``: the
    bridge writes into the view (``get``), so a read-only buffer is refused; an input view of a
    read-only buffer reads it in place.

    ValueError (IllegalArgumentException), naming ``what``, for null, a heap buffer, another byte
    order, a read-only output buffer, or too few bytes remaining."""
    global _native_order
    if buf is None:
        raise ValueError(f"{what} must not be null")
    if not buf.isDirect():
        raise ValueError(f"{what} must be a direct ByteBuffer "
                         f"(ByteBuffer.allocateDirect(n).order(nativeOrder())), not a heap buffer")
    if _native_order is None:
        _native_order = JClass("java.nio.ByteOrder").nativeOrder()
    if buf.order() != _native_order:
        raise ValueError(f"{what} must be in native byte order: call "
                         ".order(ByteOrder.nativeOrder()) (slice(), duplicate() and "
                         "asReadOnlyBuffer() return big-endian buffers)")
    if output and buf.isReadOnly():
        raise ValueError(f"{what} is a read-only ByteBuffer, but the pool writes its output into "
                         "it")
    n = math.prod(shape)
    need = n * dtype.itemsize
    position, limit = int(buf.position()), int(buf.limit())
    if limit - position < need:
        raise ValueError(f"{what} has {limit - position} bytes remaining (position {position}, "
                         f"limit {limit}), need {need} for {list(shape)} {dtype}")
    # torch.frombuffer rejects count=0; an empty put/get is valid (the pool treats it as a no-op)
    if n == 0:
        return torch.empty(shape, dtype=dtype)
    if not buf.isReadOnly():
        return torch.frombuffer(buf, dtype=dtype, count=n, offset=position).view(shape)
    with _quiet_view, warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given buffer is not writable",
                                category=UserWarning)
        return torch.frombuffer(buf, dtype=dtype, count=n, offset=position).view(shape)


def storage_dtype(name: Any) -> torch.dtype:
    """A storage dtype from its torch name (``"float32"``, ``"torch.bfloat16"``); ValueError for a
    dtype the pool cannot store."""
    key = str(name).removeprefix("torch.")
    if key not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {key!r}")
    return DTYPES[key]


def python_layout(layout: Any) -> KvCacheLayout:
    """A Java ``smile.llm.cache.KvCacheLayout`` as the Python one; ValueError for null."""
    if layout is None:
        raise ValueError("layout must not be null")
    return KvCacheLayout(int(layout.numLayers()), int(layout.numKvHeads()), int(layout.headDim()),
                         int(layout.maxBatchSize()), int(layout.maxSeqLen()))


def python_device(device: Any) -> str:
    """A device string from Java (``Device.toString()``, such as ``"cuda:0"``); ValueError for
    null."""
    if device is None:
        raise ValueError("device must not be null")
    return str(device)


_DEVICE_TYPES = {"cpu": "CPU", "cuda": "CUDA", "mps": "MPS"}


def java_device(device: torch.device) -> Any:
    """``smile.deep.tensor.Device`` of a torch device (no index: -1, "the current device", as in
    Smile)."""
    if device.type not in _DEVICE_TYPES:
        raise RuntimeError(f"the pool is on {device}, which smile.deep.tensor.Device cannot name")
    kind = getattr(JClass("smile.deep.tensor.DeviceType"), _DEVICE_TYPES[device.type])
    return JClass("smile.deep.tensor.Device")(kind, JByte(-1 if device.index is None
                                                          else device.index))


def java_scalar_type(dtype: torch.dtype) -> Any:
    """``smile.deep.tensor.ScalarType`` of a torch dtype."""
    return JClass("smile.deep.tensor.ScalarType").ofTorchName(str(dtype))
