"""Tool calls in the Qwen / Hermes format the chat templates teach: ``<tool_call>`` + a JSON
object ``{"name": ..., "arguments": {...}}`` + ``</tool_call>``, one block per call.

- ``ToolCallParser`` splits a reply (as it streams, or whole) into content and calls: text outside
  the blocks is content; text that may be the start of a block is held back until it is known; a
  block that does not hold a JSON object with a string ``name`` stays content, as written.
- ``tool_grammar`` forces calls with structured generation, for ``tool_choice="required"`` (one
  or more calls of any tool) or a named function (calls of that tool only): each call's arguments
  follow the tool's ``parameters`` schema.
- ``check_tools`` checks a request's ``tools`` and ``tool_choice`` (400 naming the field).
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

from ..sampling.constraint import JSON_LAYOUT
from .errors import ApiError

OPEN, CLOSE = "<tool_call>", "</tool_call>"


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


class ToolCallParser:
    """Feed a reply's text as it comes; each ``feed`` returns what is now known: content (str) and
    calls (``ToolCall``), in order. ``finish`` returns what was held back."""

    def __init__(self) -> None:
        self.pending = ""
        self.calls = 0

    def feed(self, text: str) -> list[str | ToolCall]:
        self.pending += text
        out: list[str | ToolCall] = []
        while self.pending:
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
            call = _call_of(block[len(OPEN): end])
            if call is None:
                out.append(block)
            else:
                self.calls += 1
                out.append(call)
        return [x for x in out if not isinstance(x, str) or x]

    def finish(self) -> list[str | ToolCall]:
        """The held-back text (an unfinished block stays content)."""
        rest, self.pending = self.pending, ""
        return [rest] if rest else []


def _partial_open(text: str) -> int:
    """How many trailing characters of ``text`` could begin ``<tool_call>``."""
    for n in range(min(len(OPEN) - 1, len(text)), 0, -1):
        if OPEN.startswith(text[-n:]):
            return n
    return 0


def _call_of(body: str) -> ToolCall | None:
    try:
        obj = json.loads(body)
    except json.JSONDecodeError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    return ToolCall(obj["name"], json.dumps(args, ensure_ascii=False),
                    "call_" + uuid.uuid4().hex[:24])


def split_reply(text: str) -> tuple[str | None, list[ToolCall]]:
    """A whole reply's content (None when only calls) and calls."""
    parser = ToolCallParser()
    parts = parser.feed(text) + parser.finish()
    calls = [p for p in parts if isinstance(p, ToolCall)]
    content = "".join(p for p in parts if isinstance(p, str))
    if calls:
        content = content.strip()
    return (content or None) if calls else content, calls


def check_tools(tools: list[dict[str, Any]] | None, choice: Any) -> list[dict[str, Any]]:
    """The functions of ``tools`` (``{"name", "description", "parameters"}``); 400 naming the
    field for a malformed tool or a ``tool_choice`` that names no tool."""
    functions = []
    for i, tool in enumerate(tools or []):
        fn = tool.get("function") if tool.get("type", "function") == "function" else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise ApiError(400, f'tools[{i}] must be {{"type": "function", "function": {{"name": '
                           '..., "parameters": {...}}}}', param=f"tools.{i}")
        params = fn.get("parameters", {"type": "object"})
        if not isinstance(params, dict):
            raise ApiError(400, f"tools[{i}].function.parameters must be a JSON schema object",
                           param=f"tools.{i}.function.parameters")
        functions.append({**fn, "parameters": params})
    if choice in (None, "none", "auto"):
        return functions
    if choice == "required":
        if not functions:
            raise ApiError(400, 'tool_choice "required" needs tools', param="tool_choice")
        return functions
    name = choice.get("function", {}).get("name") if isinstance(choice, dict) else None
    if not isinstance(name, str) or name not in {f["name"] for f in functions}:
        raise ApiError(400, 'tool_choice must be "none", "auto", "required" or {"type": '
                       '"function", "function": {"name": NAME}} naming one of tools',
                       param="tool_choice")
    return functions


def tool_grammar(functions: list[dict[str, Any]], choice: Any) -> str | None:
    """The Lark grammar (llguidance) forcing tool calls for ``choice`` ("required" or a named
    function); None for "auto" and "none"."""
    if choice in (None, "none", "auto"):
        return None
    if isinstance(choice, dict):
        functions = [f for f in functions if f["name"] == choice["function"]["name"]]
    options = []
    for fn in functions:
        schema = {"type": "object", "properties": {"name": {"const": fn["name"]},
                                                   "arguments": fn["parameters"]},
                  "required": ["name", "arguments"], "additionalProperties": False,
                  "x-guidance": JSON_LAYOUT}
        options.append(f"%json {json.dumps(schema)}")
    rules = "\n".join(f"call_{i}: {option}" for i, option in enumerate(options))
    alternatives = " | ".join(f"call_{i}" for i in range(len(options)))
    return (f'start: call+\ncall: "{OPEN}\\n" ({alternatives}) "\\n{CLOSE}"\n{rules}\n')
