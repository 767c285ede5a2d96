"""What a request may constrain its output to: one of a JSON schema (``json_schema``), any JSON
object (``json_object``), a regular expression (``regex``), a Lark grammar in llguidance's syntax
(``grammar``) or a list of strings (``choice``). ``Constraint`` is the checked field, ready to be
compiled by ``grammar_compiler.GrammarCompiler``; its ``source`` is the llguidance grammar text.

Checked here, before anything is compiled (``ConstraintError``, a ValueError naming the field):
the type of each field, that at most one is given, the size limits below, and the bounds of
``schema_limits`` (schemas, also those a grammar inlines with ``%json``), ``grammar_limits``
(Lark grammars) and ``regex_limits`` (every regex), which keep the engine's recursive work within a
compile thread's stack (``compile_thread``, where every call into the engine that builds a grammar
runs).

A ``json_schema`` is closed before it is compiled (``closed_schema``): an object schema that does
not say ``additionalProperties`` (nor ``unevaluatedProperties``/``patternProperties``) admits only
its declared properties. JSON output (``json_schema``, ``json_object``, and the ``%json`` parts of a
grammar) never repeats a key in an object (``key_guard``). It follows ``json.dumps``'s layout
(``", "`` between items, ``": "`` after keys, no other whitespace), which bounds it and leaves most
of its punctuation forced (``jump_forward``); a schema may ask for other layouts through
llguidance's own ``"x-guidance"`` key (e.g. ``{"whitespace_flexible": true}``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ..errors import ConstraintError
from .closed_schema import closed_schema
from .compile_thread import on_compile_thread
from .grammar_limits import check_grammar
from .regex_limits import check_regex
from .schema_limits import MAX_SCHEMA_DEPTH, check_schema, nesting

__all__ = ["ANY_JSON_OBJECT", "CONSTRAINT_FIELDS", "JSON_LAYOUT", "MAX_CHOICES",
           "MAX_CHOICE_CHARS", "MAX_SCHEMA_DEPTH", "MAX_SOURCE_CHARS", "Constraint",
           "closed_schema", "constraint_of"]

CONSTRAINT_FIELDS = ("json_schema", "json_object", "regex", "grammar", "choice")
MAX_SOURCE_CHARS = 128 * 1024  # a schema (as JSON text), regex or grammar longer than this
MAX_CHOICES = 1024
MAX_CHOICE_CHARS = 4096  # one choice
# json.dumps's layout: bounded output, forced punctuation
JSON_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
# json_object=True, as OpenAI's response_format json_object: any object (said so, as not closed)
ANY_JSON_OBJECT = {"type": "object", "additionalProperties": True}


@dataclass(frozen=True)
class Constraint:
    """One checked constraint: the request field it came from (``field``), its llguidance
    grammar text (``source``; equal constraints have equal sources) and how its JSON objects are
    kept from repeating keys (``keys``: ``"json"`` when the whole output is JSON, ``"embedded"``
    when JSON objects sit in a grammar's text, None for no JSON; see ``key_guard``). Equal
    constraints compile once (the compiled-grammar cache's key)."""

    field: str
    source: str
    keys: str | None = None


def constraint_of(json_schema: Any = None, json_object: Any = False, regex: Any = None,
                  grammar: Any = None, choice: Any = None) -> Constraint | None:
    """The constraint the fields ask for, None when none does (a ``json_schema`` closed by
    ``closed_schema``). ConstraintError naming the field for a wrong type, a value over its limit
    (``MAX_SOURCE_CHARS``, ``MAX_SCHEMA_DEPTH``, ``MAX_CHOICES``, ``MAX_CHOICE_CHARS``, and those of
    ``schema_limits``, ``grammar_limits`` and ``regex_limits``), a schema with a subschema that has
    no finite value, an empty choice list or regex, or two fields at once. The grammar engine's
    own checks come when the constraint is compiled."""
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
    from llguidance import LLMatcher

    if json_schema is not None:
        return Constraint("json_schema", _schema_grammar(json_schema, "json_schema"), "json")
    if json_object:
        return Constraint("json_object", _schema_grammar(ANY_JSON_OBJECT, "json_object"), "json")
    if regex is not None:
        _check_text(regex, "regex")
        check_regex(regex, "regex")
        return Constraint("regex", on_compile_thread(LLMatcher.grammar_from_regex, regex))
    if grammar is not None:
        _check_text(grammar, "grammar")
        facts = check_grammar(grammar, "grammar")
        return Constraint("grammar", on_compile_thread(LLMatcher.grammar_from_lark, grammar),
                          "embedded" if facts.schemas else None)
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
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:  # a lone surrogate: not text the grammar engine can read
        raise ConstraintError(f"is not valid Unicode text: {exc.reason} at character {exc.start}",
                              field=field) from None


def _schema_grammar(schema: Any, field: str) -> str:
    if isinstance(schema, str):
        _check_text(schema, field)
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as exc:
            raise ConstraintError(f"is not valid JSON: {exc}", field=field) from None
        except RecursionError:
            raise ConstraintError(f"nests deeper than {MAX_SCHEMA_DEPTH} objects and arrays",
                                  field=field) from None
    if not isinstance(schema, dict):
        raise ConstraintError(f"must be a JSON object (a dict or its JSON text), got "
                              f"{type(schema).__name__}", field=field)
    if nesting(schema, MAX_SCHEMA_DEPTH + 1) > MAX_SCHEMA_DEPTH:
        raise ConstraintError(f"nests deeper than {MAX_SCHEMA_DEPTH} objects and arrays",
                              field=field)
    try:
        text = json.dumps(schema, allow_nan=False)  # key order kept: properties come in order
    except (TypeError, ValueError) as exc:
        raise ConstraintError(f"is not JSON-serialisable: {exc}", field=field) from None
    if len(text) > MAX_SOURCE_CHARS:
        raise ConstraintError(f"is {len(text)} characters as JSON, over the limit of "
                              f"{MAX_SOURCE_CHARS}", field=field)
    check_schema(schema, field)
    if field == "json_schema":
        schema = closed_schema(schema)
        check_schema(schema, field)  # as the engine will see it (closing adds open twins)
        text = json.dumps(schema)
    from llguidance import LLMatcher

    try:
        return on_compile_thread(LLMatcher.grammar_from_json_schema, text,
                                 JSON_LAYOUT)  # type: ignore[arg-type]
    except ValueError as exc:
        raise ConstraintError(str(exc), field=field) from None


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
    return on_compile_thread(LLMatcher.grammar_from_lark, f"start: {options}")
