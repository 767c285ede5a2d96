"""Hostile constraints never crash the process: the grammar engine recurses as it builds a grammar, so what reaches it
is bounded (``schema_limits``, ``grammar_limits``, ``regex_limits``) and it builds on a compile thread with a large
stack (``compile_thread``). The reproductions that crashed the process (a flat chain of 3,000 ``$ref``s, 3,000 Lark
rules in a chain) run in a subprocess, so the suite survives a regression; each limit is refused with a
``ConstraintError`` naming the field and the limit; a constraint just inside every limit still compiles (the deepest
of them would overflow the main thread's 8 MiB stack); an engine failure while generating fails that request alone
with a ``GrammarLimitError`` naming the field."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from typing import Any

import pytest

from smile_llm import LanguageModel, SamplingParams
from smile_llm.errors import ConstraintError, GrammarError
from smile_llm.text.tokenizer import ByteTokenizer
from smile_llm.sampling import compile_thread, grammar_limits as G, regex_limits as R, schema_limits as S
from smile_llm.sampling.grammar_compiler import GrammarCompiler
from smile_llm.errors import GrammarLimitError

VOCAB = 260


def compiler() -> GrammarCompiler:
    return GrammarCompiler(ByteTokenizer(VOCAB, 256), VOCAB, (256,))


def ref_chain(n: int) -> dict[str, Any]:
    """``{"$defs": {"d0": {"$ref": "#/$defs/d1"}, ..., "d<n>": {"type": "integer"}}, "$ref": "#/$defs/d0"}``."""
    defs: dict[str, Any] = {f"d{i}": {"$ref": f"#/$defs/d{i + 1}"} for i in range(n)}
    defs[f"d{n}"] = {"type": "integer"}
    return {"$defs": defs, "$ref": "#/$defs/d0"}


def pointer_chain(n: int) -> dict[str, Any]:
    """A chain of ``n`` references through ``properties`` (no definitions): ``p0`` refers to ``p1``, and so on."""
    props: dict[str, Any] = {f"p{i}": {"$ref": f"#/properties/p{i + 1}"} for i in range(n)}
    props[f"p{n}"] = {"type": "integer"}
    return {"type": "object", "properties": props, "required": ["p0"], "additionalProperties": False}


def lark_chain(n: int, nest: int = 0) -> str:
    """``start: r0``, ``r0: r1``, ..., ``r<n-1>: "x"``: a chain of ``n + 1`` rules, each body under ``nest``
    parentheses."""
    rules = ["start: r0"] + [f"r{i}: " + "(" * nest + f'"a" r{i + 1}' + ")" * nest for i in range(n - 1)]
    return "\n".join(rules + [f'r{n - 1}: "x"']) + "\n"


def refused(field: str, words: str, **kw: Any) -> ConstraintError:
    with pytest.raises(ConstraintError) as info:
        compiler().compile(SamplingParams(**kw).constraint)  # type: ignore[arg-type]
    assert info.value.field == field and words in str(info.value), str(info.value)
    return info.value


CRASHERS = '''
import json, sys
from smile_llm import SamplingParams
from smile_llm.errors import ConstraintError
from smile_llm.text.tokenizer import ByteTokenizer
from smile_llm.sampling.grammar_compiler import GrammarCompiler
from tests.structured.test_limits import lark_chain, pointer_chain, ref_chain
comp = GrammarCompiler(ByteTokenizer(260, 256), 260, (256,))
cases = {"ref_chain": {"json_schema": ref_chain(3000)}, "pointer_chain": {"json_schema": pointer_chain(3000)},
         "lark_chain": {"grammar": lark_chain(3000)},
         "json_in_lark": {"grammar": "start: j\\nj: %json " + json.dumps(ref_chain(3000))}}
for name, kw in cases.items():
    try:
        comp.compile(SamplingParams(**kw).constraint)
    except ConstraintError as exc:
        print(name, "ConstraintError", exc.field, exc, flush=True)
    else:
        print(name, "compiled", flush=True)
'''


def test_the_crash_reproductions_are_refused_in_a_subprocess() -> None:
    """These crashed the process (a stack overflow in the engine); here they run in a child, which must exit 0 having
    refused each with a ConstraintError naming the field and the limit."""
    assert len(json.dumps(ref_chain(3000))) < 128 * 1024  # under MAX_SOURCE_CHARS: only the new limits refuse it
    done = subprocess.run([sys.executable, "-c", CRASHERS], capture_output=True, text=True, timeout=120,
                          cwd=str(__import__("pathlib").Path(__file__).parents[2]))
    assert done.returncode == 0, (done.returncode, done.stdout, done.stderr[-2000:])
    lines = dict(line.split(" ", 1) for line in done.stdout.splitlines())
    assert lines["ref_chain"].startswith("ConstraintError json_schema json_schema: has 3001 definitions")
    assert lines["pointer_chain"].startswith("ConstraintError json_schema json_schema: follows $ref inside $ref "
                                             "3000 deep, over the limit of 128 (MAX_REF_CHAIN)")
    assert lines["lark_chain"].startswith("ConstraintError grammar grammar: references rules inside rules 3001 deep")
    assert lines["json_in_lark"].startswith("ConstraintError grammar grammar: %json schema 1: has 3001 definitions")


def test_just_inside_every_limit_compiles() -> None:
    """Constraints at the limits compile (from the calling thread, through the compile thread); the deepest of these
    needs 16-24 MiB of stack, more than the main thread's 8 MiB."""
    comp = compiler()
    deepest_lark = lark_chain(G.MAX_RULE_DEPTH - 1, nest=G.MAX_GRAMMAR_NESTING)
    assert G.check_grammar(deepest_lark, "grammar").depth == G.MAX_RULE_DEPTH
    defs: dict[str, Any] = {}
    for i in range(S.MAX_REF_CHAIN):  # 128 references, each under 29 levels of items
        inner: Any = {"$ref": f"#/$defs/d{i + 1}"} if i + 1 < S.MAX_REF_CHAIN else {"type": "integer"}
        for _ in range(29):
            inner = {"items": inner}
        defs[f"d{i}"] = inner
    deepest_schema = {"$defs": defs, "$ref": "#/$defs/d0"}
    cases: list[tuple[dict[str, Any], bytes]] = [  # (the constraint, the bytes it forces first)
        ({"grammar": deepest_lark}, b"aaaaaaaa"), ({"json_schema": deepest_schema}, b""),
        ({"json_schema": pointer_chain(S.MAX_REF_CHAIN)}, b'{"p0": '),
        ({"json_schema": {"allOf": [{"anyOf": [{"type": "integer", "minimum": i, "maximum": i} for i in range(10)]},
                                    {"anyOf": [{"type": "integer"}] * 100}]}}, b""),  # 10 x 100 alternatives
        ({"regex": "(" * R.MAX_REGEX_NESTING + "x" + ")" * R.MAX_REGEX_NESTING}, b"x"),
        ({"grammar": "start: " + "(" * G.MAX_GRAMMAR_NESTING + '"x"' + ")" * G.MAX_GRAMMAR_NESTING}, b"x"),
    ]
    for kw, forced in cases:
        grammar = comp.compile(SamplingParams(**kw).constraint)  # type: ignore[arg-type]
        assert bytes(grammar.start().forced(8)) == forced, list(kw)


@pytest.mark.parametrize("kw, field, words", [
    ({"json_schema": pointer_chain(S.MAX_REF_CHAIN + 1)}, "json_schema", "(MAX_REF_CHAIN)"),
    ({"json_schema": ref_chain(S.MAX_DEFINITIONS)}, "json_schema", "(MAX_DEFINITIONS)"),
    ({"json_schema": {"type": "array", "prefixItems": [{}] * (S.MAX_SCHEMA_NODES + 1)}},
     "json_schema", "(MAX_SCHEMA_NODES)"),
    ({"json_schema": {"allOf": [{"anyOf": [{"const": i} for i in range(8)]}] * 4}}, "json_schema",
     "the schema expands to over 1000 alternatives"),
    ({"json_schema": {"type": "object", "properties": {"a": {"type": ["integer", "string"], "anyOf": [
        {"const": i} for i in range(S.MAX_SCHEMA_ALTERNATIVES // 2 + 1)]}}}}, "json_schema",
     "its subschema #/properties/a expands"),
    ({"json_schema": {"type": "string", "pattern": "(" * 65 + "a" + ")" * 65}}, "json_schema",
     "#/pattern: a regular expression nests 65 levels deep, over the limit of 64 (MAX_REGEX_NESTING)"),
    ({"regex": "a" + "{1,2}" * 65}, "regex", "(MAX_REGEX_NESTING)"),
    ({"grammar": "start: /" + "[a" * 65 + "]" * 65 + "/"}, "grammar", "(MAX_REGEX_NESTING)"),
    ({"grammar": "start: " + "[" * 25 + '"x"' + "]" * 25}, "grammar", "(MAX_GRAMMAR_NESTING)"),
    ({"grammar": "start: " + " | ".join(f"r{i}" for i in range(5000)) + "\n" +
      "".join(f'r{i}: "{i}"\n' for i in range(5000))}, "grammar", "(MAX_GRAMMAR_RULES)"),
    ({"grammar": lark_chain(G.MAX_RULE_DEPTH)}, "grammar", "(MAX_RULE_DEPTH)"),
    ({"grammar": 'start: "<" j ">"\nj: %json ' + json.dumps(pointer_chain(200))}, "grammar",
     "%json schema 1: follows $ref inside $ref 200 deep"),
    ({"json_schema": '{"a": ' * 5000 + "1" + "}" * 5000}, "json_schema", "nests deeper than 32"),
    ({"grammar": "start: j\nj: %json " + '{"a": ' * 5000 + "1" + "}" * 5000}, "grammar",
     "a %json body nests deeper than 32"),
])
def test_each_limit_is_refused_naming_the_field(kw: dict, field: str, words: str) -> None:
    error = refused(field, words, **kw)
    assert isinstance(error, ValueError)


@pytest.mark.parametrize("schema", [
    {"$ref": "#"},
    {"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"},
    {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"allOf": [{"$ref": "#/$defs/a"}]}}, "$ref": "#/$defs/a"},
    {"type": "object", "properties": {"kid": {"$ref": "#"}}, "required": ["kid"]},
    {"type": "array", "items": {"$ref": "#"}, "minItems": 1},
    {"type": "object", "properties": {"x": {"type": "integer"}, "loop": {"$ref": "#/$defs/loop"}},
     "$defs": {"loop": {"type": "object", "properties": {"next": {"$ref": "#/$defs/loop"}}, "required": ["next"]}}},
], ids=["root", "self", "mutual", "required", "items", "optional_path"])
def test_a_recursion_without_a_way_out_is_refused(schema: dict) -> None:
    refused("json_schema", "has no finite value", json_schema=schema)


@pytest.mark.parametrize("schema, text", [
    ({"type": "object", "properties": {"v": {"enum": [1, 2]}, "kids": {"type": "array", "items": {"$ref": "#"}}},
      "required": ["v", "kids"]}, '{"v": 1, "kids": [{"v": 2, "kids": []}]}'),
    ({"$defs": {"node": {"type": "object", "properties": {"next": {"anyOf": [{"$ref": "#/$defs/node"},
                                                                            {"type": "null"}]}}, "required": ["next"]}},
      "$ref": "#/$defs/node"}, '{"next": {"next": null}}'),
], ids=["tree", "linked_list"])
def test_a_recursion_with_a_way_out_compiles(schema: dict, text: str) -> None:
    state = compiler().compile(SamplingParams(json_schema=schema).constraint).start()  # type: ignore[arg-type]
    data = list(text.encode())
    assert state.valid_prefix(data) == len(data)
    for t in data:
        state.advance(t)
    assert state.complete


def test_a_lark_scan_finds_rules_references_and_inline_schemas() -> None:
    facts = G.check_grammar('// c: d\nstart: a "b:c" /x:y/ <|s:t|> b::0x0\n  | a\na.2: "a" # e: f\n'
                            'b::_ : "b" %if is_ones([0:3])\nc[lazy]: %json {"type": "object", "x": "}"}\n', "grammar")
    assert facts.rules == 4 and facts.depth == 2 and facts.schemas == ({"type": "object", "x": "}"},)
    assert G.check_grammar("start: a\na: start | 'x'\n", "grammar").depth == 2  # a cycle counts each rule once


def test_regex_nesting_counts_groups_classes_and_stacked_repetitions() -> None:
    cases = {"abc": 0, "(a)": 1, "(?:(?:x))": 2, "a{2}{2}": 2, "a*?": 1, "[a[b]]": 2, "[]a]": 1, r"\(\(": 0,
             "[(]": 1, r"\p{Greek}+": 1, "[[:alpha:]]": 1, "a{x}": 0, "(?i)abc": 1}
    assert {p: R.regex_nesting(p) for p in cases} == cases


def test_the_compile_thread_runs_work_with_a_large_stack_from_any_thread() -> None:
    """Results and exceptions come back to the caller, from several threads at once; the work runs on a compile
    thread (a call from one runs inline)."""
    names: list[str] = []

    def job(x: int) -> int:
        names.append(threading.current_thread().name)
        if x < 0:
            raise KeyError(x)
        return compile_thread.on_compile_thread(lambda: x * 2)  # nested: inline

    results: list[int] = []
    threads = [threading.Thread(target=lambda i=i: results.append(compile_thread.on_compile_thread(job, i)))
               for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(results) == [2 * i for i in range(8)]
    assert all(n.startswith("grammar-compile-") for n in names)
    with pytest.raises(KeyError):
        compile_thread.on_compile_thread(job, -1)
    assert compile_thread.COMPILE_STACK_BYTES >= 256 << 20


def test_an_engine_limit_while_generating_fails_that_request_alone(byte_model: LanguageModel) -> None:
    """This regex compiles, then exhausts the engine's lexer after a few tokens: that request fails with a
    GrammarLimitError naming its field (a ConstraintError and a GrammarError); the request beside it finishes."""
    expected = byte_model.generate("q", 20).tokens
    heavy = "(a|b)" + "{1,3}" * 8
    handles = [byte_model.submit("r", SamplingParams(max_new_tokens=40, regex=heavy)),
               byte_model.submit("q", SamplingParams(max_new_tokens=20))]
    with pytest.raises(GrammarLimitError) as info:
        handles[0].result(60)
    assert info.value.field == "regex" and "the grammar engine failed" in str(info.value)
    assert isinstance(info.value, ConstraintError) and isinstance(info.value, GrammarError)
    assert handles[1].result(60).tokens == expected
    byte_model.pool.check_invariants()
    assert byte_model.pool.bound_request_count == 0
