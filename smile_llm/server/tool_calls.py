"""Tool calls in the Qwen / Hermes format the chat templates teach: ``<tool_call>`` + a JSON
object ``{"name": ..., "arguments": {...}}`` + ``</tool_call>``, one block per call, as OpenAI's
``tools`` / ``tool_choice`` / ``parallel_tool_calls`` define them:

- ``ToolChoice.of`` checks a request's ``tools``, ``tool_choice`` and ``parallel_tool_calls`` (400
  naming the field) and says what the reply may hold.
- ``"auto"``: text, calls or both; with ``parallel_tool_calls=false`` at most one call (the
  reply stops at the end of the first call: ``stop_texts``).
- ``"required"``: forced by structured generation (``grammar``) to be one or more complete calls
  of any tool (exactly one with ``parallel_tool_calls=false``) and nothing else; a named function
  forces exactly one call of that function. Each call's arguments follow the tool's ``parameters``
  schema, whose objects admit only their declared keys unless the schema says
  ``additionalProperties`` (``sampling.constraint.closed_schema``).
- ``ToolCallParser`` splits a reply (as it streams, or whole) into content and calls: text outside
  the blocks is content; text that may be the start of a block is held back until it is known; a
  complete block that does not hold a JSON object with a string ``name`` stays content, as
  written; a block the reply ends inside (cut by ``max_tokens``) is dropped, never content.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

from ..sampling.constraint import JSON_LAYOUT, closed_schema
from .errors import ApiError

OPEN, CLOSE = "<tool_call>", "</tool_call>"
CHOICE_FORM = ('tool_choice must be "none", "auto", "required" or {"type": "function", '
               '"function": {"name": NAME}} naming one of tools')


@dataclass(frozen=True)
class ToolCall:
    """One parsed call: ``name`` and its ``arguments`` as JSON text; ``id`` for the response."""

    name: str
    arguments: str
    id: str

    def as_openai(self, index: int | None = None) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id, "type": "function",
                               "function": {"name": self.name, "arguments": self.arguments}}
        if index is not None:
            out["index"] = index
        return out


@dataclass(frozen=True)
class ToolChoice:
    """What a chat request's tools allow: ``functions`` (each ``{"name", "parameters", ...}``),
    ``mode`` ("none", "auto", "required" or "named"), ``name`` (the named function), ``parallel``
    (more than one call allowed)."""

    functions: tuple[dict[str, Any], ...]
    mode: str
    name: str | None = None
    parallel: bool = True

    @staticmethod
    def of(tools: Any, choice: Any, parallel: Any = None) -> ToolChoice:
        """The checked fields; ApiError 400 naming the field for a malformed tool, a choice of
        another form or naming no tool, "required" or a named function without tools, or a
        ``parallel_tool_calls`` that is not a bool."""
        functions = _functions(tools)
        if parallel is not None and not isinstance(parallel, bool):
            raise ApiError(400, "parallel_tool_calls must be a boolean",
                           param="parallel_tool_calls")
        allow_many = True if parallel is None else parallel
        if choice is None:
            return ToolChoice(functions, "auto" if functions else "none", parallel=allow_many)
        if choice in ("none", "auto"):
            return ToolChoice(functions, choice, parallel=allow_many)
        if choice == "required":
            if not functions:
                raise ApiError(400, 'tool_choice "required" needs tools', param="tool_choice")
            return ToolChoice(functions, "required", parallel=allow_many)
        fn = choice.get("function") if isinstance(choice, dict) else None
        name = fn.get("name") if isinstance(fn, dict) else None
        names = {f["name"] for f in functions}
        if not isinstance(choice, dict) or choice.get("type", "function") != "function" or \
                not isinstance(name, str) or name not in names:
            raise ApiError(400, CHOICE_FORM, param="tool_choice")
        return ToolChoice(functions, "named", name, parallel=False)

    @property
    def templated(self) -> bool:
        """Whether the tools go to the chat template and the reply is parsed for calls."""
        return self.mode != "none" and bool(self.functions)

    @property
    def max_calls(self) -> int | None:
        """The most calls the reply may hold (None: no limit)."""
        return None if self.parallel else 1

    def grammar(self) -> str | None:
        """The Lark grammar (llguidance) forcing the calls of "required" or a named function:
        one call, or one or more separated by a newline; None for "auto" and "none"."""
        if self.mode not in ("required", "named"):
            return None
        functions = [f for f in self.functions if self.mode == "required" or f["name"] == self.name]
        rules = []
        for i, fn in enumerate(functions):
            arguments = closed_schema(fn["parameters"])
            schema = {"type": "object", "properties": {"name": {"const": fn["name"]},
                                                       "arguments": arguments},
                      "required": ["name", "arguments"], "additionalProperties": False,
                      "x-guidance": JSON_LAYOUT}
            rules.append(f"call_{i}: %json {json.dumps(schema)}")
        alternatives = " | ".join(f"call_{i}" for i in range(len(functions)))
        start = "start: call" if self.max_calls == 1 else 'start: call ("\\n" call)*'
        return (f'{start}\ncall: "{OPEN}\\n" ({alternatives}) "\\n{CLOSE}"\n'
                + "\n".join(rules) + "\n")

    def stop_texts(self) -> list[str]:
        """Stop strings the reply needs: the end of the first call for "auto" with one call at
        most (the parser restores it: ``ToolCallParser(closed_by_stop=True)``)."""
        return [CLOSE] if self.mode == "auto" and self.templated and not self.parallel else []


def _functions(tools: Any) -> tuple[dict[str, Any], ...]:
    if tools is None:
        return ()
    if not isinstance(tools, list):
        raise ApiError(400, "tools must be a list of tools", param="tools")
    functions = []
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, dict) and \
            tool.get("type", "function") == "function" else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise ApiError(400, f'tools[{i}] must be {{"type": "function", "function": {{"name": '
                           '..., "parameters": {...}}}}', param=f"tools.{i}")
        params = fn.get("parameters", {"type": "object"})
        if not isinstance(params, dict):
            raise ApiError(400, f"tools[{i}].function.parameters must be a JSON schema object",
                           param=f"tools.{i}.function.parameters")
        functions.append({**fn, "parameters": params})
    return tuple(functions)


class ToolCallParser:
    """Feed a reply's text as it comes; each ``feed`` returns what is now known: content (str) and
    calls (``ToolCall``), in order. ``finish`` returns what was held back. ``max_calls``: calls
    past it, and the text after them, are dropped. ``closed_by_stop``: the reply was stopped by
    the stop string ``</tool_call>`` (cut from the text), so a block it ends inside is closed."""

    def __init__(self, max_calls: int | None = None, closed_by_stop: bool = False) -> None:
        self.pending = ""
        self.calls = 0
        self.max_calls, self.closed_by_stop = max_calls, closed_by_stop

    @property
    def full(self) -> bool:
        return self.max_calls is not None and self.calls >= self.max_calls

    def feed(self, text: str) -> list[str | ToolCall]:
        if self.full:
            return []
        self.pending += text
        out: list[str | ToolCall] = []
        while self.pending and not self.full:
            at = self.pending.find(OPEN)
            if at < 0:
                keep = _partial_open(self.pending)
                if len(self.pending) > keep:
                    out.append(self.pending[: len(self.pending) - keep])
                    self.pending = self.pending[len(self.pending) - keep:]
                break
            if at:
                out.append(self.pending[:at])
                self.pending = self.pending[at:]
            end = self.pending.find(CLOSE)
            if end < 0:
                break  # a block still open: wait for its end
            block = self.pending[: end + len(CLOSE)]
            self.pending = self.pending[end + len(CLOSE):]
            out.append(self._block(block))
        if self.full:
            self.pending = ""
        return [x for x in out if not isinstance(x, str) or x]

    def _block(self, block: str) -> str | ToolCall:
        call = _call_of(block[len(OPEN): -len(CLOSE)])
        if call is None:
            return block
        self.calls += 1
        return call

    def finish(self, cut: bool = False) -> list[str | ToolCall]:
        """The held-back text: a block the reply ended inside is a call when the stop string
        closed it, else dropped; a trailing prefix of ``<tool_call>`` is content unless the reply
        was ``cut`` by its token limit."""
        rest, self.pending = self.pending, ""
        if not rest or self.full:
            return []
        if rest.startswith(OPEN):
            if self.closed_by_stop and not cut:
                block = self._block(rest + CLOSE)
                return [block] if isinstance(block, ToolCall) else []
            return []
        return [] if cut else [rest]


def _partial_open(text: str) -> int:
    """How many trailing characters of ``text`` could begin ``<tool_call>``."""
    for n in range(min(len(OPEN) - 1, len(text)), 0, -1):
        if OPEN.startswith(text[-n:]):
            return n
    return 0


def _call_of(body: str) -> ToolCall | None:
    """The call a block's body holds; None when it is not a JSON object with a string name (or
    nests too deeply for the parser, or holds an integer over Python's digit limit)."""
    try:
        obj = json.loads(body)
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            return None
        args = obj.get("arguments", obj.get("parameters", {}))
        arguments = json.dumps(args, ensure_ascii=False)
    except (ValueError, RecursionError):  # JSONDecodeError is a ValueError
        return None
    return ToolCall(obj["name"], arguments, "call_" + uuid.uuid4().hex[:24])


def split_reply(text: str, finish_reason: str = "stop", max_calls: int | None = None,
                closed_by_stop: bool = False) -> tuple[str | None, list[ToolCall]]:
    """A whole reply's content (None when only calls) and calls; ``finish_reason`` "length"
    when the reply was cut by its token limit (see ``ToolCallParser``)."""
    parser = ToolCallParser(max_calls, closed_by_stop)
    parts = parser.feed(text) + parser.finish(cut=finish_reason == "length")
    calls = [p for p in parts if isinstance(p, ToolCall)]
    content = "".join(p for p in parts if isinstance(p, str))
    if calls:
        content = content.strip()
    return (content or None) if calls else content, calls
