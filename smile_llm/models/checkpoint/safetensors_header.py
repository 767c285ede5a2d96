"""Reading a safetensors file's header without trusting it.

A safetensors file is an 8-byte little-endian header length N, N bytes of JSON
(``{"__metadata__": {str: str}, name: {"dtype", "shape", "data_offsets": [begin, end]}, ...}``) and
the data section, in which every tensor's bytes lie at ``[begin, end)``. ``read_header`` checks
everything the ``safetensors`` library would otherwise fail on with an error that names neither the
file nor the tensor, before any tensor is read: the length fits the file and the library's limit,
the JSON is an object without duplicate names, each dtype is known, each shape is a list of
non-negative integers, ``end - begin`` is ``prod(shape) * itemsize``, and the tensors tile the data
section exactly (sorted by offset, each starts where the previous one ended, no overlap, no gap, the
last one ends at the end of the file: a truncated file fails here). Every failure is a
``CheckpointError`` naming the file and, where there is one, the tensor.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...errors import CheckpointError

# the dtypes torch can load, in bytes
DTYPE_SIZES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "I16": 2, "U16": 2,
               "F16": 2, "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8}
MAX_HEADER_BYTES = 100_000_000  # the safetensors library's own limit on N
MAX_DIMS = 64  # dimensions of one tensor
METADATA_KEY = "__metadata__"


@dataclass(frozen=True)
class TensorInfo:
    """One tensor as the header describes it (checked): ``begin``/``end`` are byte offsets in
    the data section."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int


@dataclass(frozen=True)
class SafetensorsHeader:
    """A checked header: the file, its tensors by name (in the header's order), its string metadata,
    and where the data section starts (``8 + N``)."""

    path: Path
    tensors: dict[str, TensorInfo]
    metadata: dict[str, str]
    data_start: int

    def shapes(self) -> dict[str, tuple[int, ...]]:
        """Every tensor's shape by name."""
        return {name: t.shape for name, t in self.tensors.items()}


def read_header(path: Path) -> SafetensorsHeader:
    """The checked header of the safetensors file ``path`` (see the module doc). CheckpointError
    naming the file (and the tensor) for anything the library would refuse or misread; OSError when
    the file cannot be read."""
    with open(path, "rb") as handle:
        size = handle.seek(0, 2)
        handle.seek(0)
        if size < 8:
            raise CheckpointError(f"is {size} bytes: too short for a safetensors header (8-byte "
                                  "length first)", path=path)
        n = int.from_bytes(handle.read(8), "little")
        if n > MAX_HEADER_BYTES:
            raise CheckpointError(f"declares a {n}-byte header; safetensors allows at most "
                                  f"{MAX_HEADER_BYTES}", path=path)
        if 8 + n > size:
            raise CheckpointError(f"declares a {n}-byte header but the file holds only {size - 8} "
                                  "bytes after the length: truncated or not a safetensors file",
                                  path=path)
        raw = handle.read(n)
    try:
        parsed = json.loads(raw.decode("utf-8"), object_pairs_hook=_no_duplicates)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise CheckpointError(f"has a header that is not valid JSON: {exc}", path=path) from None
    if not isinstance(parsed, dict):
        raise CheckpointError(f"has a header that is a JSON {type(parsed).__name__}, not an object",
                              path=path)
    metadata = _metadata(path, parsed.pop(METADATA_KEY, None))
    tensors = {name: _tensor(path, name, entry) for name, entry in parsed.items()}
    _check_layout(path, tensors, size - 8 - n)
    return SafetensorsHeader(path, tensors, metadata, 8 + n)


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"the name {key!r} appears twice")
        out[key] = value
    return out


def _metadata(path: Path, raw: Any) -> dict[str, str]:
    if raw is None:
        return {}
    if not isinstance(raw, dict) or not all(isinstance(v, str) for v in raw.values()):
        raise CheckpointError(f"has a {METADATA_KEY!r} entry that is not an object of strings",
                              path=path, field=METADATA_KEY)
    return dict(raw)


def _tensor(path: Path, name: str, entry: Any) -> TensorInfo:
    def bad(message: str) -> CheckpointError:
        return CheckpointError(f"tensor {name!r} {message}", path=path, field=name)

    if not isinstance(entry, dict):
        raise bad(f"is described by a JSON {type(entry).__name__}, not an object")
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if not isinstance(dtype, str) or dtype not in DTYPE_SIZES:
        raise bad(f"has dtype {dtype!r}; known dtypes are {sorted(DTYPE_SIZES)}")
    if not isinstance(shape, list) or len(shape) > MAX_DIMS or not all(_is_count(d) for d in shape):
        raise bad(f"has shape {shape!r}; a shape is a list of at most {MAX_DIMS} non-negative "
                  "integers")
    if not isinstance(offsets, list) or len(offsets) != 2 or \
            not all(_is_count(o) for o in offsets) or offsets[0] > offsets[1]:
        raise bad(f"has data_offsets {offsets!r}; they are [begin, end] with 0 <= begin <= end")
    begin, end = offsets
    nbytes = math.prod(shape) * DTYPE_SIZES[dtype]
    if end - begin != nbytes:
        raise bad(f"has shape {tuple(shape)} of {dtype} ({nbytes} bytes) but data_offsets "
                  f"[{begin}, {end}] span {end - begin} bytes")
    return TensorInfo(name, dtype, tuple(shape), begin, end)


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _check_layout(path: Path, tensors: dict[str, TensorInfo], data_bytes: int) -> None:
    """The tensors tile ``[0, data_bytes)`` exactly, as the library requires."""
    pos, previous = 0, None
    for t in sorted(tensors.values(), key=lambda t: (t.begin, t.end)):
        if t.begin < pos:
            raise CheckpointError(f"tensor {t.name!r} at bytes [{t.begin}, {t.end}) overlaps "
                                  f"tensor {previous!r}, which ends at byte {pos}", path=path,
                                  field=t.name)
        if t.begin > pos:
            raise CheckpointError(f"tensor {t.name!r} starts at byte {t.begin} but the data before "
                                  f"it ends at byte {pos}: the bytes in between belong to no "
                                  "tensor", path=path, field=t.name)
        if t.end > data_bytes:
            raise CheckpointError(f"tensor {t.name!r} ends at byte {t.end} of the data "
                                  f"section but the file holds only {data_bytes} data bytes: "
                                  "the file is truncated", path=path, field=t.name)
        pos, previous = t.end, t.name
    if pos != data_bytes:
        raise CheckpointError(f"holds {data_bytes - pos} bytes after its last tensor's data (the "
                              f"header describes {pos} of {data_bytes} data bytes)", path=path)
