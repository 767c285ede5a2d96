"""Normalising host-side int arrays (token ids, slot ids) at the API boundary."""

from __future__ import annotations

from typing import Any

import numpy as np

EMPTY = np.zeros(0, dtype=np.int64)
EMPTY.setflags(write=False)


def as_int_array(values: Any, what: str, non_negative: bool = True) -> np.ndarray:
    """Return ``values`` as a 1-D int64 numpy array (a copy only when needed).

    Accepts any int sequence, numpy integer array or integer torch tensor. Raises ValueError for
    ``None``, non-integer elements (floats, bools, strings), more than one dimension or
    (``non_negative``) negative values."""
    if values is None:
        raise ValueError(f"{what} must be a sequence of non-negative ints, got None")
    if hasattr(values, "detach") and hasattr(values, "cpu"):  # a torch.Tensor (torch not imported)
        values = values.detach().cpu().numpy()
    elif isinstance(values, (list, tuple)):
        odd = [t for t in set(map(type, values))
               if t is bool or not issubclass(t, (int, np.integer))]
        # nested sequences are left to the ndim check below
        nested = all(issubclass(t, (list, tuple, np.ndarray)) for t in odd)
        if odd and not nested:
            raise ValueError(f"{what} must hold ints, got elements of type {odd[0].__name__}")
    elif not hasattr(values, "__len__") and hasattr(values, "__iter__"):  # a generator, an iterator
        values = list(values)
        return as_int_array(values, what, non_negative)
    try:
        arr = np.asarray(values)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{what} must be a sequence of non-negative ints: {exc}") from None
    if arr.size == 0:
        return EMPTY
    if arr.dtype.kind not in "iu":
        raise ValueError(f"{what} must hold ints, got elements of type {arr.dtype} "
                         f"(first: {arr.flat[0]!r})")
    if arr.ndim != 1:
        raise ValueError(f"{what} must be 1-D, got shape {arr.shape}")
    arr = arr.astype(np.int64, copy=False)
    if non_negative and arr.min() < 0:
        raise ValueError(f"{what} must be non-negative, got {int(arr.min())} at index "
                         f"{int(arr.argmin())}")
    return arr
