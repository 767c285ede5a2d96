"""Reading a small JSON file of a model folder (``config.json``, the shard index,
``tokenizer_config.json``, ``smile_tokenizer.json``) as untrusted input: its size is bounded before
it is read, and anything that is not JSON (not UTF-8, malformed, nested too deeply to parse, an
integer too long to convert) becomes the caller's typed error."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any


def read_json(path: Path, max_bytes: int, error: Callable[[str], Exception]) -> Any:
    """The JSON value in ``path``. ``error(message)`` is raised (message ``"is N bytes; ..."`` or
    ``"is not valid JSON: ..."``) when the file has more than ``max_bytes`` bytes, is not UTF-8, is
    not JSON, nests too deeply or holds an integer too long to read; OSError as ``open`` raises
    it."""
    size = path.stat().st_size
    if size > max_bytes:
        raise error(f"is {size} bytes; at most {max_bytes} are read")
    try:
        return json.loads(path.read_bytes())
    except (ValueError, RecursionError) as exc:
        raise error(f"is not valid JSON: {json_error_reason(exc)}") from None


def json_error_reason(exc: ValueError | RecursionError) -> str:
    """Why ``json.loads`` refused a text, in one line: its own message, or what nests too deeply
    or which integer is too long (``json.loads`` raises RecursionError and a plain ValueError
    for those, not JSONDecodeError)."""
    if isinstance(exc, RecursionError):
        return "it nests arrays or objects too deeply"
    if isinstance(exc, (json.JSONDecodeError, UnicodeDecodeError)):
        return str(exc)
    if "integer string conversion" in str(exc):
        return "it holds an integer of more digits than Python reads (4300)"
    return " ".join(str(exc).split())
