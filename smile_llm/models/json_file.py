"""Reading a small JSON file of a model folder (``config.json``, the shard index,
``tokenizer_config.json``, ``smile_tokenizer.json``) as untrusted input: its size is bounded before
it is read, and anything that is not JSON becomes the caller's typed error."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any


def read_json(path: Path, max_bytes: int, error: Callable[[str], Exception]) -> Any:
    """The JSON value in ``path``. ``error(message)`` is raised (message ``"is N bytes; ..."`` or
    ``"is not valid JSON: ..."``) when the file has more than ``max_bytes`` bytes, is not UTF-8, is
    not JSON or nests too deeply; OSError as ``open`` raises it."""
    size = path.stat().st_size
    if size > max_bytes:
        raise error(f"is {size} bytes; at most {max_bytes} are read")
    try:
        return json.loads(path.read_bytes())
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise error(f"is not valid JSON: {exc}") from None
