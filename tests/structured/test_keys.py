"""JSON object keys. An object schema that does not say ``additionalProperties`` (nor ``unevaluatedProperties`` /
``patternProperties``) admits only its declared properties (``closed_schema``; composition keeps its meaning), and no
JSON output ever repeats a key in an object (``key_guard``): under ``json_object``, explicitly open objects and the
``%json`` parts of a grammar, keys compared decoded, greedy or sampled, batched, speculated or forced. Oracles: the
json module's own string decoder (``objects_keys``), ``json.loads`` with an ``object_pairs_hook``, ``jsonschema``."""

from __future__ import annotations

import copy
import json
from json.decoder import scanstring  # type: ignore[attr-defined]
from typing import Any

import jsonschema
import numpy as np
import pytest

from smile_llm import LanguageModel
from smile_llm.text.tokenizer import ByteTokenizer
from smile_llm.sampling.constraint import JSON_LAYOUT, closed_schema, constraint_of
from smile_llm.sampling.grammar_compiler import GrammarCompiler
from smile_llm.errors import GrammarLimitError
from smile_llm.sampling.key_guard import KeyScan, KeyTable

VOCAB = 260
NEW = 40
# prompts that push the shipped model to repeat a key, to write undeclared ones
REPEATING = '{"a": 1, "a": 1, "a": 1, "a": 1, "a": 1}\n' * 2
IN_ON_AT = '{"in": "in", "in": "in", "in": "in", "in": "in"}\n' * 2
EXTRA = '{"name": "Ada", "city": "Paris", "age": 36, "job": "poet"}\n' * 2
FINITE = {"type": "object", "patternProperties": {"^(in|on|at)$": {"enum": ["in", "on", "at"]}},
          "additionalProperties": False}  # three keys at most: a repeat is the only way to go on
PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 99}},
          "required": ["name"]}
GENERAL_ESCAPES = {"json_allow_general_unicode_escapes": True}


def compiler() -> GrammarCompiler:
    return GrammarCompiler(ByteTokenizer(VOCAB, 256), VOCAB, (256,))


COMPILER = compiler()


def state_after(text: str, **kw: Any) -> Any:
    state = COMPILER.compile(constraint_of(**kw)).start()  # type: ignore[arg-type]
    for t in text.encode():
        state.advance(t)
    return state


def admits(text: str, **kw: Any) -> bool:
    """Whether the constraint's grammar takes ``text`` whole (the byte tokenizer: one token a byte)."""
    state = COMPILER.compile(constraint_of(**kw)).start()  # type: ignore[arg-type]
    data = list(text.encode())
    if state.valid_prefix(data) < len(data):
        return False
    for t in data:
        state.advance(t)
    return bool(state.complete)


def objects_keys(text: str) -> list[list[str]]:
    """The keys of every JSON object in ``text`` (JSON, perhaps cut short), each object's in order: its strings right
    after ``{`` or ``,``, decoded by the json module."""
    out: list[list[str]] = []
    stack: list[int | None] = []  # index in out of each open object, None for an array
    want_key, i = False, 0
    while i < len(text):
        c = text[i]
        if c == '"':
            try:
                value, i = scanstring(text, i + 1)
            except ValueError:  # cut short inside a string
                break
            if want_key and stack and stack[-1] is not None:
                out[stack[-1]].append(value)
            want_key = False
            continue
        if c == "{":
            out.append([])
            stack.append(len(out) - 1)
            want_key = True
        elif c == "[":
            stack.append(None)
        elif c in "}]" and stack:
            stack.pop()
        elif c == ",":
            want_key = bool(stack) and stack[-1] is not None
        i += 1
    return out


def no_repeated_key(text: str) -> bool:
    return all(len(keys) == len(set(keys)) for keys in objects_keys(text))


def pairs_hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [k for k, _ in pairs]
    assert len(keys) == len(set(keys)), keys
    return dict(pairs)


# ---------------------------------------------------------------------------------------------- closing objects
INT = {"type": "integer"}
X_DEF = {"type": "object", "properties": {"a": INT}}


@pytest.mark.parametrize("schema, admitted, refused", [
    ({"type": "object", "properties": {"a": INT}}, ['{"a": 1}', "{}"], ['{"a": 1, "b": 2}', '{"b": 2}']),
    ({"type": "object", "properties": {"o": {"type": "object", "properties": {"x": INT}}}},
     ['{"o": {"x": 1}}'], ['{"o": {"x": 1, "y": 2}}']),
    ({"type": "object"}, ["{}"], ['{"k": 1}']),
    ({"type": "object", "properties": {"a": INT}, "additionalProperties": True}, ['{"a": 1, "z": [2]}'], []),
    ({"type": "object", "additionalProperties": INT}, ['{"z": 2}'], ['{"z": "s"}']),
    ({"type": "object", "patternProperties": {"^x": INT}}, ['{"x1": 1}', '{"y": "any"}'], ['{"x1": "s"}']),
    ({"allOf": [{"type": "object", "properties": {"a": INT}}, {"properties": {"b": INT}}]},
     ['{"a": 1, "b": 2}'], ['{"a": 1, "c": 3}']),
    ({"$defs": {"X": X_DEF}, "allOf": [{"$ref": "#/$defs/X"}, {"properties": {"b": INT}}]},
     ['{"a": 1, "b": 2}'], ['{"a": 1, "c": 3}']),
    ({"$defs": {"X": X_DEF}, "$ref": "#/$defs/X", "properties": {"b": INT}}, ['{"a": 1, "b": 2}'], ['{"c": 1}']),
    ({"type": "object", "properties": {"kind": INT}, "anyOf": [{"properties": {"x": INT}},
                                                               {"properties": {"y": INT}}]},
     ['{"kind": 1, "x": 2}', '{"kind": 1, "y": 3}'], ['{"kind": 1, "x": 2, "y": 3}', '{"z": 1}']),
    ({"$defs": {"X": X_DEF}, "type": "object", "properties": {"p": {"$ref": "#/$defs/X"}}},
     ['{"p": {"a": 1}}'], ['{"p": {"a": 1, "b": 2}}']),
    ({"type": "object", "properties": {"v": INT, "kids": {"type": "array", "items": {"$ref": "#"}}}},
     ['{"v": 1, "kids": [{"v": 2}]}'], ['{"v": 1, "kids": [{"v": 2, "w": 3}]}']),
    ({"type": ["object", "null"], "properties": {"a": INT}}, ["null", '{"a": 1}'], ['{"b": 1}']),
], ids=["plain", "nested", "empty", "open", "typed_extra", "pattern", "allOf", "allOf_ref", "ref_siblings",
        "anyOf_branches", "ref_alone", "recursive", "nullable"])
def test_objects_admit_only_declared_properties(schema: dict, admitted: list[str], refused: list[str]) -> None:
    for text in admitted:
        assert admits(text, json_schema=schema), text
        jsonschema.validate(json.loads(text), schema)  # closing only narrows what JSON Schema admits
    for text in refused:
        assert not admits(text, json_schema=schema), text


def test_json_object_admits_any_object() -> None:
    assert admits('{"anything": [1, {"k": 2, "j": {}}], "b": null}', json_object=True)


def test_closed_schema_is_a_closed_copy() -> None:
    """The server's tool grammar calls it on each tool's parameters: it never changes its argument, passes anything
    that is not a schema object through, and does not raise on hostile input (the limits refuse that later)."""
    schema = {"type": "object", "properties": {"o": {"type": "object"}}, "$defs": {"X": X_DEF}}
    before = copy.deepcopy(schema)
    closed = closed_schema(schema)
    assert schema == before and closed is not schema
    assert closed == {"type": "object", "properties": {"o": {"type": "object", "additionalProperties": False,
                                                              "properties": {}}},
                      "$defs": {"X": {**X_DEF, "additionalProperties": False}}, "additionalProperties": False}
    assert closed_schema(closed) == closed  # closing twice changes nothing more
    for value in (True, None, "text", [1]):
        assert closed_schema(value) == value
    deep: dict[str, Any] = {}
    node = deep
    for _ in range(200):
        node["items"] = {}
        node = node["items"]
    assert closed_schema(deep) is deep  # deeper than MAX_SCHEMA_DEPTH: refused later, as written
    chain = {"$defs": {f"d{i}": {"$ref": f"#/$defs/d{(i + 1) % 3000}"} for i in range(3000)},
             "allOf": [{"$ref": "#/$defs/d0"}]}  # a cycle of 3,000 references, composed: no recursion, no error
    assert closed_schema(chain)["allOf"][0]["$ref"].startswith("#/$defs/open-")


def tool_grammar(name: str, parameters: dict[str, Any]) -> str:
    """A forced tool call as the server writes one: ``<tool_call>``, a ``%json`` object of the name and the arguments
    (the tool's parameters closed), ``</tool_call>``."""
    call = {"type": "object", "properties": {"name": {"const": name}, "arguments": closed_schema(parameters)},
            "required": ["name", "arguments"], "additionalProperties": False, "x-guidance": JSON_LAYOUT}
    return f'start: call ("\\n" call)*\ncall: "<tool_call>\\n" call_0 "\\n</tool_call>"\ncall_0: %json {json.dumps(call)}\n'


def test_a_tool_grammar_closes_arguments_and_guards_their_keys() -> None:
    """Forced tool calls with ``closed_schema`` on the parameters: undeclared argument keys are refused, and an
    argument that is explicitly an open object cannot repeat a key (the grammar's ``%json`` parts are guarded)."""
    params = {"type": "object", "properties": {"city": {"type": "string"},
                                               "extra": {"type": "object", "additionalProperties": True}}}
    grammar = tool_grammar("f", params)
    assert constraint_of(grammar=grammar).keys == "embedded"  # type: ignore[union-attr]
    ok = '<tool_call>\n{"name": "f", "arguments": {"city": "x", "extra": {"k": 1, "j": 2}}}\n</tool_call>'
    assert admits(ok, grammar=grammar)
    assert not admits(ok.replace('"city"', '"town"'), grammar=grammar)
    state = state_after(ok[: ok.index('"j"')], grammar=grammar)
    assert state.valid_prefix(list(b'"k"')) == 2 and state.valid_prefix(list(b'"j"')) == 3


# ---------------------------------------------------------------------------------------------- the guard
@pytest.mark.parametrize("kw, text, refused, allowed", [
    ({"json_object": True}, '{"a": 1, "', 'a"', 'ab"'),
    ({"json_object": True}, '{"ab": 1, "a', 'b"', 'a"'),
    ({"json_object": True}, '{"a": {"a": 1, "', 'a"', 'b"'),
    ({"json_object": True}, '{"a": {"b": 1}, "', 'a"', 'b"'),
    ({"json_object": True}, '{"l": [{"a": 1}, {"b": 1, "', 'b"', 'a"'),
    ({"json_schema": {"type": "object", "additionalProperties": True, "x-guidance": GENERAL_ESCAPES}},
     '{"a\\u0062": 1, "', 'ab"', 'a\\u0063"'),
    ({"json_schema": {"type": "object", "additionalProperties": True, "x-guidance": GENERAL_ESCAPES}},
     '{"ab": 1, "a\\u00', '62"', '63"'),
    ({"json_schema": {"type": "object", "additionalProperties": True, "x-guidance": GENERAL_ESCAPES}},
     '{"\U0001F600": 1, "\\ud83d', '\\ude00"', '\\ude01"'),
    ({"json_schema": {"type": "object", "properties": {"a": INT}, "additionalProperties": True,
                      "x-guidance": GENERAL_ESCAPES}}, '{"a": 1, "', '\\u0061"', 'b"'),
    ({"json_schema": {"type": "object", "patternProperties": {"^[ab]$": INT}}}, '{"a": 1, "b": 2, "', 'a"', 'c"'),
], ids=["first", "prefix", "nested", "outer", "array", "escaped", "mid_escape", "surrogates", "declared", "pattern"])
def test_a_repeated_key_is_never_admitted(kw: dict, text: str, refused: str, allowed: str) -> None:
    """``refused`` ends with the quote that would close a key its object holds: all but that quote is admitted."""
    state = state_after(text, **kw)
    assert state.valid_prefix(list(refused.encode())) == len(refused.encode()) - 1
    assert state.valid_prefix(list(allowed.encode())) == len(allowed.encode())


def test_masks_forced_and_valid_prefix_follow_the_guard() -> None:
    """Masks along a verify window's paths equal stepping, a path through a repeated key is unreachable, and the
    forced chain finishes an object whose key set ran out."""
    kw: dict[str, Any] = {"json_schema": {"type": "object", "patternProperties": {"^[ab]$": {"enum": [1, 2]}},
                                          "additionalProperties": False}}
    text = list(b'{"a": 1, "b": 2}')
    state, stepped = state_after("", **kw), []
    for t in text:
        stepped.append(state.mask().copy())
        state.advance(t)
    assert state.terminated
    fresh = state_after("", **kw)
    assert np.array_equal(fresh.masks([text[:j] for j in range(len(text))]), np.stack(stepped))
    repeat = list(b'{"a": 1, "a"')
    rows = state_after("", json_object=True).masks([repeat[:j] for j in range(len(repeat) + 1)])
    assert (rows[-1] == -1).all() and not (rows[-2] == -1).all()  # after the refused quote: unreachable
    rows = fresh.masks([repeat[:j] for j in range(len(repeat) + 1)])
    assert (rows[-2] == -1).all() and not (rows[-3] == -1).all()  # "a can only become "a": unreachable too
    assert fresh.valid_prefix(repeat) == len(repeat) - 1
    after_a = state_after('{"a": 1, "', **kw)
    assert bytes(after_a.forced(10)) == b'b": '  # "a" is held: "b" is the only key left
    assert bytes(state_after('{"a": 1, "b": 1', **kw).forced(10)) == b"}"  # no key left: "," is refused
    assert state_after('{"a": 1', **kw).valid_prefix(list(b', "b"')) == 5  # while one is left, it is not


def test_a_guard_that_leaves_no_token_fails_naming_the_field() -> None:
    """Literal text in a grammar with ``%json`` parts is guarded too: a grammar that can only repeat a key fails
    with a GrammarLimitError naming the field."""
    grammar = 'start: "{\\"a\\": 1, \\"a\\": 2}" | j\nj: %json {"type": "integer"}\n'
    state = state_after('{"a": 1', grammar=grammar)
    with pytest.raises(GrammarLimitError) as info:
        state.mask()
    assert info.value.field == "grammar" and "repeat a key" in str(info.value)


def test_tokens_that_write_a_whole_key_are_guarded() -> None:
    """Multi-byte tokens that open and close a key by themselves, or close one key and write another, are followed
    byte by byte (a table of such tokens, without a grammar)."""
    words = [b'{', b'"a"', b': 1', b', "a"', b', "b"', b'"', b'a', b'"}', b'a", "a"', b'a", "c"', b'}', b', ']
    table = KeyTable(words)
    everything = np.full(1, -1, dtype=np.int32)
    scan = KeyScan("json").advance(b'{"a": 1')
    forbidden = scan.forbidden(table, everything)
    assert forbidden is not None and sorted(forbidden.tolist()) == [3]  # ', "a"'
    assert scan.repeats_key(b', "a"') and not scan.repeats_key(b', "b"')
    inside = KeyScan("json").advance(b'{"a": 1, "b": 2, "')
    assert sorted(inside.forbidden(table, everything).tolist()) == [8, 9]  # both close "a" ('"' closes "")
    assert KeyScan("json").advance(b'{"a": 1, "c": 2, "').repeats_key(b'b", "c"')  # the second key repeats
    assert KeyScan("embedded").advance(b'text "a" {"a": 1, "').repeats_key(b'a"')


# ---------------------------------------------------------------------------------------------- the shipped model
def check_outputs(outs: list[Any], schema: dict | None = None, finish: bool = False) -> None:
    for c in outs:
        assert no_repeated_key(c.text), c.text
        if c.finish_reason == "stop":
            value = json.loads(c.text, object_pairs_hook=pairs_hook)
            if schema is not None:
                jsonschema.validate(value, schema)
        else:
            assert not finish, c.text


def test_json_object_never_repeats_a_key(byte_model: LanguageModel) -> None:
    """A prompt of objects that repeat one key (greedy, unguarded, the model writes ``"<": "<", "<": ...``): greedy
    and sampled (a batch of 4 rows), plain and speculative (which give the same tokens), no output repeats a key."""
    for kw in ({}, {"n": 4, "temperature": 1.0, "seed": 11}):
        plain = byte_model.generate(REPEATING, NEW, json_object=True, speculative_tokens=0, **kw)
        speculated = byte_model.generate(REPEATING, NEW, json_object=True, speculative_tokens=3, **kw)
        outs = plain if isinstance(plain, list) else [plain]
        spec = speculated if isinstance(speculated, list) else [speculated]
        assert [c.tokens for c in spec] == [c.tokens for c in outs]
        check_outputs(outs, {"type": "object"})


def test_a_finite_key_set_ends_its_object(byte_model: LanguageModel) -> None:
    """Three possible keys and a prompt that repeats one: every output, greedy or sampled with three seeds, plain or
    speculative, closes its object before a repeat (never stuck, never at the limit), some after all three keys."""
    every: list[Any] = []
    for kw in ({}, {"n": 4, "temperature": 1.0, "seed": 11}, {"n": 4, "temperature": 1.0, "seed": 12},
               {"n": 4, "temperature": 1.0, "seed": 13, "speculative_tokens": 3}):
        outs = byte_model.generate(IN_ON_AT, NEW, json_schema=FINITE, **kw)  # type: ignore[arg-type]
        outs = outs if isinstance(outs, list) else [outs]
        check_outputs(outs, FINITE, finish=True)
        assert all(c.stats["constraint_complete"] for c in outs)
        every.extend(outs)
    assert any(len(objects_keys(c.text)[0]) == 3 for c in every)


def test_undeclared_properties_are_never_written(byte_model: LanguageModel) -> None:
    """A prompt of objects with more keys than the schema declares: the open schema takes them, the schema that does
    not say additionalProperties never does."""
    open_out = byte_model.generate(EXTRA, NEW, json_schema={**PERSON, "additionalProperties": True})
    assert set(objects_keys(open_out.text)[0]) - {"name", "age"}  # the prompt does push undeclared keys
    for kw in ({}, {"n": 4, "temperature": 1.0, "seed": 11}):
        outs = byte_model.generate(EXTRA, NEW, json_schema=PERSON, **kw)  # type: ignore[arg-type]
        outs = outs if isinstance(outs, list) else [outs]
        check_outputs(outs, PERSON, finish=True)
        assert all(set(objects_keys(c.text)[0]) <= {"name", "age"} for c in outs)


def test_multi_byte_tokens_never_repeat_a_key(bpe_model: LanguageModel) -> None:
    """A random model over a BPE vocabulary (tokens holding quotes and punctuation together): sampled outputs of
    ``json_object`` and of the finite key set never repeat a key; speculation (n-gram) gives the same tokens."""
    for kw in ({"json_object": True}, {"json_schema": FINITE}):
        outs = bpe_model.generate(IN_ON_AT, NEW, n=4, temperature=1.0, seed=5, speculative_tokens=0, **kw)
        spec = bpe_model.generate(IN_ON_AT, NEW, n=4, temperature=1.0, seed=5, speculative_tokens=3, **kw)
        assert [c.tokens for c in spec] == [c.tokens for c in outs]
        check_outputs(outs, kw.get("json_schema"))
