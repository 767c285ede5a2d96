"""What a request may constrain its output to: one of a JSON schema (``json_schema``), any JSON
object (``json_object``), a regular expression (``regex``), a Lark grammar in llguidance's syntax
(``grammar``) or a list of strings (``choice``). ``Constraint`` is the checked field, ready to be
compiled by ``grammar_compiler.GrammarCompiler``; its ``source`` is the llguidance grammar text.

Checked here, before anything is compiled (``ConstraintError``, a ValueError naming the field):
the type of each field, that at most one is given, and the size limits below. JSON output follows
``json.dumps``'s layout (``", "`` between items, ``": "`` after keys, no other whitespace), which
bounds it and leaves most of its punctuation forced (``jump_forward``); a schema may ask for other
layouts through llguidance's own ``"x-guidance"`` key (e.g. ``{"whitespace_flexible": true}``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ..errors import ConstraintError

CONSTRAINT_FIELDS = ("json_schema", "json_object", "regex", "grammar", "choice")
MAX_SOURCE_CHARS = 128 * 1024  # a schema (as JSON text), regex or grammar longer than this
MAX_SCHEMA_DEPTH = 32  # nesting of objects and arrays in a schema
MAX_CHOICES = 1024
MAX_CHOICE_CHARS = 4096  # one choice
# json.dumps's layout: bounded output, forced punctuation
JSON_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
ANY_JSON_OBJECT = {"type": "object"}  # json_object=True, as OpenAI's response_format json_object


@dataclass(frozen=True)
class Constraint:
    """One checked constraint: the request field it came from (``field``) and its llguidance
    grammar text (``source``; equal constraints have equal sources, the compiled-grammar cache's
    key)."""

    field: str
    source: str


def constraint_of(json_schema: Any = None, json_object: Any = False, regex: Any = None,
                  grammar: Any = None, choice: Any = None) -> Constraint | None:
    """The constraint the fields ask for, None when none does. ConstraintError naming the field
    for a wrong type, a value over its limit (``MAX_SOURCE_CHARS``, ``MAX_SCHEMA_DEPTH``,
    ``MAX_CHOICES``, ``MAX_CHOICE_CHARS``), an empty choice list or regex, or two fields at once.
    The grammar engine's own checks come when the constraint is compiled."""
    if not isinstance(json_object, bool):
        raise ConstraintError(f"must be a bool, got {json_object!r}", field="json_object")
    given = [name for name, value in (("json_schema", json_schema), ("regex", regex),
                                      ("grammar", grammar), ("choice", choice))
             if value is not None]
    if json_object:
        given.insert(1, "json_object")
    if len(given) > 1:
        raise ConstraintError(f"give one constraint per request, got {' and '.join(given)}",
                              field=given[1])
    if json_schema is not None:
        return Constraint("json_schema", _schema_grammar(json_schema))
    if json_object:
        return Constraint("json_object", _schema_grammar(ANY_JSON_OBJECT))
    if regex is not None:
        _check_text(regex, "regex")
        from llguidance import LLMatcher

        return Constraint("regex", LLMatcher.grammar_from_regex(regex))
    if grammar is not None:
        _check_text(grammar, "grammar")
        from llguidance import LLMatcher

        return Constraint("grammar", LLMatcher.grammar_from_lark(grammar))
    if choice is not None:
        return Constraint("choice", _choice_grammar(choice))
    return None


def _check_text(value: Any, field: str) -> None:
    if not isinstance(value, str):
        raise ConstraintError(f"must be a str, got {type(value).__name__}", field=field)
    if not value:
        raise ConstraintError("must not be empty", field=field)
    if len(value) > MAX_SOURCE_CHARS:
        raise ConstraintError(f"is {len(value)} characters, over the limit of {MAX_SOURCE_CHARS}",
                              field=field)


def _schema_grammar(schema: Any) -> str:
    field = "json_schema"
    if isinstance(schema, str):
        _check_text(schema, field)
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as exc:
            raise ConstraintError(f"is not valid JSON: {exc}", field=field) from None
    if not isinstance(schema, dict):
        raise ConstraintError(f"must be a JSON object (a dict or its JSON text), got "
                              f"{type(schema).__name__}", field=field)
    depth = _depth(schema, MAX_SCHEMA_DEPTH + 1)
    if depth > MAX_SCHEMA_DEPTH:
        raise ConstraintError(f"nests deeper than {MAX_SCHEMA_DEPTH} objects and arrays",
                              field=field)
    try:
        text = json.dumps(schema, allow_nan=False)  # key order kept: properties come in order
    except (TypeError, ValueError) as exc:
        raise ConstraintError(f"is not JSON-serialisable: {exc}", field=field) from None
    if len(text) > MAX_SOURCE_CHARS:
        raise ConstraintError(f"is {len(text)} characters as JSON, over the limit of "
                              f"{MAX_SOURCE_CHARS}", field=field)
    from llguidance import LLMatcher

    try:
        return LLMatcher.grammar_from_json_schema(
            text, defaults=JSON_LAYOUT)  # type: ignore[arg-type]
    except ValueError as exc:
        raise ConstraintError(str(exc), field=field) from None


def _depth(value: Any, limit: int) -> int:
    """Nesting of dicts and lists in ``value``, counted up to ``limit`` (no deeper walk)."""
    if limit <= 0 or not isinstance(value, (dict, list)):
        return 0
    items = value.values() if isinstance(value, dict) else value
    return 1 + max((_depth(v, limit - 1) for v in items), default=0)


def _choice_grammar(choice: Any) -> str:
    field = "choice"
    if isinstance(choice, (str, bytes)) or not isinstance(choice, (list, tuple)):
        raise ConstraintError(f"must be a list of strings, got {type(choice).__name__}",
                              field=field)
    if not choice:
        raise ConstraintError("must hold at least one string", field=field)
    if len(choice) > MAX_CHOICES:
        raise ConstraintError(f"holds {len(choice)} strings, over the limit of {MAX_CHOICES}",
                              field=field)
    for i, option in enumerate(choice):
        if not isinstance(option, str):
            raise ConstraintError(f"[{i}] must be a str, got {type(option).__name__}", field=field)
        if not option:
            raise ConstraintError(f"[{i}] is empty", field=field)
        if len(option) > MAX_CHOICE_CHARS:
            raise ConstraintError(f"[{i}] is {len(option)} characters, over the limit of "
                                  f"{MAX_CHOICE_CHARS}", field=field)
    from llguidance import LLMatcher

    # Lark string literals take JSON's escapes; each option is matched as written
    options = " | ".join(json.dumps(option) for option in dict.fromkeys(choice))
    return LLMatcher.grammar_from_lark(f"start: {options}")
