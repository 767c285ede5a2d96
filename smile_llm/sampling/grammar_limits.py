"""Bounds on a Lark grammar (llguidance's syntax), checked before the grammar engine sees it
(``check_grammar``), and what it tells of the grammar (``GrammarFacts``).

The engine compiles a rule's body by recursion into each rule it references and has not compiled
yet, ~3.1 KB of native stack a level: on the 8 MiB main-thread stack a chain ``start: r0``,
``r0: r1``, ... of 2,644 rules compiles and one of ~2,660 crashes the process (a segfault, no
exception); a 64 MiB thread holds ~21,000. Every compile runs on a compile thread with a 256 MiB
stack (``compile_thread``), and the limits keep every grammar far inside it:

- ``MAX_GRAMMAR_RULES`` = 4,096 rules and terminals (a large real grammar, SQL or C, has a few
  hundred);
- ``MAX_RULE_DEPTH`` = 512: the longest chain of rule references (an upper bound: every rule of a
  recursive group counts once), 5x below the main thread's crash by itself;
- ``MAX_GRAMMAR_NESTING`` = 24 levels of ``(...)`` and ``[...]`` (the engine refuses 30 itself,
  "lark grammar too deeply nested"). The deepest grammar within the limits (512 rules in a chain,
  each under 24 parentheses) needs 20-24 MiB of stack, a tenth of the compile thread's;
- each ``/regex/`` within ``regex_limits.MAX_REGEX_NESTING``, and each inline ``%json {...}``
  schema within the limits of ``schema_limits``.

The scan follows the grammar's lexical structure (strings, regexes, comments, special tokens,
``%json``/``%regex``/``%llguidance`` JSON bodies) and does not otherwise parse it: syntax errors are
left to the engine, whose messages are more precise.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from ..errors import ConstraintError
from .regex_limits import check_regex
from .reference_graph import longest_chain
from .schema_limits import MAX_SCHEMA_DEPTH, check_schema, nesting

MAX_GRAMMAR_RULES = 4096
MAX_RULE_DEPTH = 512
MAX_GRAMMAR_NESTING = 24

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_\-]*")
_JSON_DIRECTIVES = ("json", "regex", "llguidance")  # %name followed by a JSON object


@dataclass(frozen=True)
class GrammarFacts:
    """What ``check_grammar`` found: ``rules`` (definitions), ``depth`` (the longest chain of
    references, an upper bound), ``schemas`` (the inline ``%json`` schemas, in order)."""

    rules: int
    depth: int
    schemas: tuple[Any, ...]


def check_grammar(text: str, field: str) -> GrammarFacts:
    """ConstraintError naming ``field`` when the Lark grammar ``text`` is over one of the limits
    of this module, holds a regex over ``MAX_REGEX_NESTING``, or an inline ``%json`` schema over
    the limits of ``schema_limits`` (or one that is not JSON). Its facts otherwise."""
    lines = _scan(text, field)
    definitions: dict[str, list[str]] = {}  # rule -> the names its body mentions
    current: list[str] | None = None
    schemas: list[Any] = []
    for tokens in lines:
        head = _definition(tokens)
        if head is not None:
            current = definitions.setdefault(head[0], [])
            body = tokens[head[1]:]
        elif tokens and tokens[0][0] == "%":
            current = None  # a directive (%ignore, %import, ...): its own line
            body = tokens
        else:
            body = tokens  # a continuation line ("| ...") of the current rule
        for kind, value in body:
            if kind == "name" and current is not None:
                current.append(value)
            elif kind == "json":
                schemas.append(value)
        if len(definitions) > MAX_GRAMMAR_RULES:
            raise ConstraintError(f"defines over {MAX_GRAMMAR_RULES} rules and terminals, over "
                                  "the limit (MAX_GRAMMAR_RULES)", field=field)
    edges = {rule: [n for n in dict.fromkeys(names) if n in definitions]
             for rule, names in definitions.items()}
    depth = longest_chain(edges)
    if depth > MAX_RULE_DEPTH:
        raise ConstraintError(f"references rules inside rules {depth} deep, over the limit of "
                              f"{MAX_RULE_DEPTH} (MAX_RULE_DEPTH)", field=field)
    for i, schema in enumerate(schemas):
        if not isinstance(schema, dict):
            continue  # not a schema: the engine says so
        if nesting(schema, MAX_SCHEMA_DEPTH + 1) > MAX_SCHEMA_DEPTH:
            raise ConstraintError(f"%json schema {i + 1}: nests deeper than {MAX_SCHEMA_DEPTH} "
                                  "objects and arrays", field=field)
        try:
            check_schema(schema, field)
        except ConstraintError as exc:
            message = str(exc)[len(field) + 2:]
            raise ConstraintError(f"%json schema {i + 1}: {message}", field=field) from None
    return GrammarFacts(len(definitions), depth, tuple(schemas))


def _definition(tokens: list[tuple[str, Any]]) -> tuple[str, int] | None:
    """(rule name, index of its body's first token) when a line defines a rule: a name first,
    then optionally ``.priority``, ``[options]`` or ``::param``, then ``:``."""
    if not tokens or tokens[0][0] != "name":
        return None
    i = 1
    while i < len(tokens) and tokens[i][0] != ":":
        kind = tokens[i][0]
        if kind not in ("param", "priority", "options"):
            return None
        i += 1
    return (tokens[0][1], i + 1) if i < len(tokens) else None


def _scan(text: str, field: str) -> list[list[tuple[str, Any]]]:
    """The grammar's tokens, one list per logical line: ("name", name), (":", ""), ("%", name),
    ("json", parsed body or None), ("param"|"priority"|"options", ""), ("x", char) for any other
    punctuation; strings, regexes (checked here), special tokens and comments are skipped. A line
    that continues a rule (starting with ``|``) is its own list; the parenthesis nesting is
    checked as it goes."""
    lines: list[list[tuple[str, Any]]] = [[]]
    depth = 0
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == "\n":
            lines.append([])
            i += 1
        elif c in " \t\r":
            i += 1
        elif text.startswith("//", i) or c == "#":
            end = text.find("\n", i)
            i = n if end < 0 else end
        elif c == '"':
            i = _skip_quoted(text, i, '"')
            i += 1 if text.startswith("i", i) else 0
        elif c == "/":
            end = _skip_quoted(text, i, "/")
            check_regex(text[i + 1 : end - 1], field)
            i = end
            while i < n and text[i] in "imslux":
                i += 1
        elif c == "<":
            end = text.find(">", i)
            i = n if end < 0 else end + 1
        elif c == "%":
            match = _NAME.match(text, i + 1)
            name = match.group() if match else ""
            i = match.end() if match else i + 1
            lines[-1].append(("%", name))
            if name in _JSON_DIRECTIVES:
                j = i
                while j < n and text[j] in " \t\r\n":
                    j += 1
                if j < n and text[j] == "{":
                    end = _skip_braces(text, j)
                    body: Any
                    try:
                        body = json.loads(text[j:end])
                    except json.JSONDecodeError:
                        body = None  # not JSON: the engine says so
                    except RecursionError:
                        raise ConstraintError(f"a %{name} body nests deeper than "
                                              f"{MAX_SCHEMA_DEPTH} objects and arrays",
                                              field=field) from None
                    if name == "json":
                        lines[-1].append(("json", body))
                    i = end
        elif c.isascii() and (c.isalpha() or c == "_"):
            match = _NAME.match(text, i)
            assert match is not None  # (it starts with a letter or "_")
            i = match.end()
            if text.startswith("::", i):  # a parametric reference or definition: name::param
                lines[-1].append(("name", match.group()))
                i += 2
                param = re.compile(r"[A-Za-z0-9_]+").match(text, i)
                i = param.end() if param else i
                lines[-1].append(("param", ""))
            else:
                lines[-1].append(("name", match.group()))
        elif c == "." and lines[-1] and len(lines[-1]) == 1 and lines[-1][0][0] == "name":
            match = re.compile(r"\.-?[0-9]+").match(text, i)  # a priority, rule.2
            i = match.end() if match else i + 1
            lines[-1].append(("priority", ""))
        elif c == "[" and len(lines[-1]) == 1 and lines[-1][0][0] == "name" and \
                _is_options(text, i):
            i = text.find("]", i) + 1  # lexeme options, rule[lazy]
            lines[-1].append(("options", ""))
        else:
            if c in "([":
                depth += 1
                if depth > MAX_GRAMMAR_NESTING:
                    raise ConstraintError(f"nests parentheses and brackets over "
                                          f"{MAX_GRAMMAR_NESTING} deep, over the limit "
                                          "(MAX_GRAMMAR_NESTING)", field=field)
            elif c in ")]":
                depth = max(0, depth - 1)
            elif c == "{":  # a repetition, x{2,3}: skip its counts
                end = text.find("}", i)
                i = n if end < 0 else end
            lines[-1].append((":" if c == ":" and not text.startswith("::", i) else "x", c))
            i += 1
    # a line starting with "|" continues the rule above: kept apart, it is never a definition
    return [line for line in lines if line]


def _is_options(text: str, i: int) -> bool:
    """Whether the ``[`` at ``i`` (after a line's first name) holds lexeme options followed by
    the definition's colon, ``rule[stop="x"]:``."""
    end = text.find("]", i)
    return end > 0 and text[end + 1 : end + 2] == ":" or \
        end > 0 and text[end + 1 :].lstrip(" \t").startswith(":")


def _skip_quoted(text: str, i: int, quote: str) -> int:
    """The index after the literal that opens with ``quote`` at ``i`` (backslash escapes; the end
    of the text when unterminated)."""
    j = i + 1
    while j < len(text):
        if text[j] == "\\":
            j += 2
        elif text[j] == quote:
            return j + 1
        elif text[j] == "\n" and quote == "/":
            return j  # not a regex after all: leave the rest of the line to the engine
        else:
            j += 1
    return len(text)


def _skip_braces(text: str, i: int) -> int:
    """The index after the JSON object that opens at ``i`` (strings skipped)."""
    depth = 0
    j = i
    while j < len(text):
        c = text[j]
        if c == '"':
            j = _skip_quoted(text, j, '"')
            continue
        if c in "{[":
            depth += 1
        elif c in "}]":
            depth -= 1
            if depth == 0:
                return j + 1
        j += 1
    return len(text)
