"""Reading a request body as untrusted input: its size, its read time, its content type, its JSON
and its fields, each refused with a 4xx OpenAI error object before anything else sees the body.

- more than ``max_body_bytes`` (declared or sent): 413, read no further;
- not all of it within ``body_timeout_s`` (a client that stalls, or declares a ``Content-Length``
  larger than what it sends): 408;
- a ``Content-Type`` other than JSON (``application/json``, ``*/*+json``; none at all is taken as
  JSON): 415, as OpenAI refuses ``text/plain`` and form bodies;
- not UTF-8 JSON, nested too deep for the parser, or an integer over Python's 4,300 digits: 400;
- not an object, or a field of the wrong type (strictly: ``"3"`` is not an integer, ``true`` not
  a number, ``"yes"`` not a boolean): 400 naming the field (``param``).
"""

from __future__ import annotations

import asyncio
import json
from typing import TypeVar

from fastapi import Request
from pydantic import BaseModel, ValidationError

from .errors import ApiError

B = TypeVar("B", bound=BaseModel)
# pydantic's tags of union members and function validators, left out of a field's path
TYPE_TAGS = {"str", "int", "float", "bool", "list", "dict", "none"}


async def read_raw_body(request: Request, limit: int, timeout_s: float) -> bytes:
    """The body's bytes: 413 over ``limit`` bytes (read no further), 408 when it has not all
    arrived within ``timeout_s`` seconds."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise ApiError(413, f"the body is {declared} bytes, over the limit of {limit}")

    async def read() -> bytes:
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise ApiError(413, f"the body is over the limit of {limit} bytes")
            chunks.append(chunk)
        return b"".join(chunks)

    try:
        return await asyncio.wait_for(read(), timeout_s)
    except asyncio.TimeoutError:
        raise ApiError(408, f"the body did not arrive within {timeout_s:g} s") from None


def check_content_type(request: Request) -> None:
    """415 unless the body is declared JSON (or not declared at all)."""
    declared = request.headers.get("content-type")
    if declared is None:
        return
    media = declared.split(";", 1)[0].strip().lower()
    if media != "application/json" and not media.endswith("+json"):
        raise ApiError(415, f"the body must be JSON (Content-Type: application/json), got "
                       f"{media or 'an empty Content-Type'}")


def parse_json(raw: bytes) -> object:
    """The JSON value of ``raw``; 400 for bytes that are not UTF-8 JSON, nest deeper than the
    parser's recursion limit, or hold an integer over Python's digit limit."""
    try:
        return json.loads(raw)
    except RecursionError:
        raise ApiError(400, "the body is not valid JSON: it nests too deeply") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ApiError(400, f"the body is not valid JSON: {exc}") from None
    except ValueError as exc:  # int() refusing over 4,300 digits
        raise ApiError(400, f"the body is not valid JSON: {exc}") from None


async def read_body(request: Request, kind: type[B], limit: int, timeout_s: float) -> B:
    """The body as ``kind``, validated strictly (see the module docstring for every refusal)."""
    check_content_type(request)
    data = parse_json(await read_raw_body(request, limit, timeout_s))
    if not isinstance(data, dict):
        raise ApiError(400, f"the body must be a JSON object, got {type(data).__name__}")
    return validated(kind, data)


def validated(kind: type[B], data: dict[str, object]) -> B:
    """``data`` as ``kind``, strictly; 400 naming the first field at fault."""
    try:
        return kind.model_validate(data, strict=True)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"] if isinstance(p, int) or not (
            p in TYPE_TAGS or "[" in p or p.startswith(("function-", "literal"))))
        raise ApiError(400, f"{where}: {first['msg']}", param=where or None) from None
    except RecursionError:
        raise ApiError(400, "the body nests too deeply") from None
