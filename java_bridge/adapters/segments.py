"""``smile.llm.python.Segment`` over a Python ``smile_llm.Segment``, and the pieces of a Java
``SamplingParams.segments()`` list as Python's ``segments`` pieces.

Java holds the adapter (a JPype proxy); when it hands the proxy back (in a ``segments`` list, to
``releaseSegment``), JPype returns the same Python object, whose ``segment`` is the registered
handle."""

from __future__ import annotations

from typing import Any

import numpy as np
from jpype import JArray, JImplements, JString

from smile_llm import Segment

from ..errors import bridged
from .convert import checked_int


@JImplements("smile.llm.python.Segment", deferred=True)
@bridged
class SegmentAdapter:
    """``smile.llm.python.Segment`` over ``segment`` (one adapter per registration)."""

    def __init__(self, segment: Segment) -> None:
        self.segment = segment

    def id(self) -> int:
        """Java ``int id()``: the segment's id."""
        return checked_int(self.segment.segment_id, "id")

    def tokens(self) -> np.ndarray:
        """Java ``int[] tokens()``: its token ids (a new array)."""
        return np.asarray(self.segment.tokens, dtype=np.int32)

    def length(self) -> int:
        """Java ``int length()``."""
        return checked_int(self.segment.length, "length")

    def toString(self) -> str:  # noqa: N802
        return repr(self.segment)


def python_segment(value: Any) -> Any:
    """The Python ``Segment`` of a Java ``Segment`` the bridge made (anything else as it is, for
    Python's checks to name)."""
    return value.segment if isinstance(value, SegmentAdapter) else value


def python_pieces(pieces: Any) -> list[Any] | None:
    """A Java ``segments()`` list as Python pieces: ``String`` as str, ``List<Integer>`` or an int
    array as a list of ints, a bridge ``Segment`` as its Python handle; anything else passes for
    ``SamplingParams`` to refuse by name. None for an empty list."""
    out: list[Any] = []
    for piece in pieces:
        if isinstance(piece, JString):
            out.append(str(piece))
        elif isinstance(piece, SegmentAdapter):
            out.append(piece.segment)
        elif isinstance(piece, JArray) or (hasattr(piece, "toArray") and hasattr(piece, "size")):
            out.append([int(t) for t in piece])
        else:
            out.append(piece)
    return out or None
