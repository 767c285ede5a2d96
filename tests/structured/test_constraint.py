"""The constraint fields before any model: type and size checks naming the field, one constraint per request, the
compiled-grammar cache, and a request's grammar state (masks along paths equal to stepping, forced tokens, valid
prefixes) over the byte tokenizer's token table."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from smile_llm import SamplingParams
from smile_llm.errors import ConstraintError
from smile_llm.text.tokenizer import ByteTokenizer
from smile_llm.sampling import constraint as C
from smile_llm.sampling.grammar_compiler import CACHE_SIZE, GrammarCompiler
from smile_llm.sampling.token_mask import mask_logits, mask_on_device, only_token

VOCAB = 260  # bytes, <|endoftext|> (256) and three more specials


def compiler() -> GrammarCompiler:
    return GrammarCompiler(ByteTokenizer(VOCAB, 256), VOCAB, (256,))


def allowed(mask: np.ndarray) -> list[int]:
    bits = np.unpackbits(mask.view(np.uint8), bitorder="little")[:VOCAB]
    return np.flatnonzero(bits).tolist()


@pytest.mark.parametrize("fields, field, words", [
    ({"json_schema": 3}, "json_schema", "must be a JSON object"),
    ({"json_schema": "{not json"}, "json_schema", "is not valid JSON"),
    ({"json_schema": ""}, "json_schema", "must not be empty"),
    ({"json_object": "yes"}, "json_object", "must be a bool"),
    ({"regex": 5}, "regex", "must be a str"),
    ({"regex": ""}, "regex", "must not be empty"),
    ({"grammar": b"start: x"}, "grammar", "must be a str"),
    ({"choice": "yes"}, "choice", "must be a list of strings"),
    ({"choice": []}, "choice", "at least one"),
    ({"choice": ["a", 1]}, "choice", "[1] must be a str"),
    ({"choice": ["a", ""]}, "choice", "[1] is empty"),
    ({"regex": "a", "choice": ["a"]}, "choice", "one constraint per request, got regex and choice"),
    ({"json_schema": {}, "json_object": True}, "json_object", "got json_schema and json_object"),
    ({"regex": "x" * (C.MAX_SOURCE_CHARS + 1)}, "regex", "over the limit"),
    ({"choice": ["a"] * (C.MAX_CHOICES + 1)}, "choice", "over the limit"),
])
def test_bad_fields_name_the_field(fields: dict, field: str, words: str) -> None:
    with pytest.raises(ConstraintError) as info:
        SamplingParams(**fields)
    assert info.value.field == field and str(info.value).startswith(f"{field}: ") and words in str(info.value)
    assert isinstance(info.value, ValueError)


def test_schema_depth_and_size_limits() -> None:
    deep: dict = {"type": "object"}
    node = deep
    for _ in range(C.MAX_SCHEMA_DEPTH):
        node["properties"] = {"a": {"type": "object"}}
        node = node["properties"]["a"]
    with pytest.raises(ConstraintError, match=f"nests deeper than {C.MAX_SCHEMA_DEPTH}"):
        SamplingParams(json_schema=deep)
    big = {"enum": ["x" * 1000] * (C.MAX_SOURCE_CHARS // 1000 + 1)}
    with pytest.raises(ConstraintError, match="over the limit"):
        SamplingParams(json_schema=big)


def test_no_constraint_and_equal_sources() -> None:
    assert SamplingParams().constraint is None
    a = SamplingParams(json_schema={"type": "integer"}).constraint
    b = SamplingParams(json_schema=json.dumps({"type": "integer"})).constraint
    assert a is not None and a == b and a.field == "json_schema"
    assert SamplingParams(json_object=True).constraint.field == "json_object"  # type: ignore[union-attr]


def test_engine_errors_quote_the_engine() -> None:
    comp = compiler()
    for fields, field, quote in ((dict(regex="a("), "regex", "unclosed group"),
                                 (dict(grammar="start: foo"), "grammar", 'unknown name: "foo"'),
                                 (dict(json_schema={"type": "nope"}), "json_schema", "nope")):
        constraint = SamplingParams(**fields).constraint
        assert constraint is not None
        with pytest.raises(ConstraintError) as info:
            comp.compile(constraint)
        assert info.value.field == field and quote in str(info.value)
    assert comp.compiled == 0


def test_compiled_grammars_are_cached_lru() -> None:
    comp = compiler()
    first = comp.compile(C.constraint_of(regex="[ab]+"))  # type: ignore[arg-type]
    assert comp.compile(C.constraint_of(regex="[ab]+")) is first and comp.compiled == 1  # type: ignore[arg-type]
    for i in range(CACHE_SIZE):
        comp.compile(C.constraint_of(regex=f"x{i}"))  # type: ignore[arg-type]
    assert comp.compiled == CACHE_SIZE + 1
    assert comp.compile(C.constraint_of(regex="[ab]+")) is not first  # evicted, recompiled
    assert comp.compiled == CACHE_SIZE + 2


def test_choice_matches_exactly_its_strings() -> None:
    options = ['say "hi"', "back\\slash", "tab\there", "ünï"]
    comp = compiler()
    grammar = comp.compile(C.constraint_of(choice=options))  # type: ignore[arg-type]
    for option in options:
        state = grammar.start()
        for byte in option.encode():
            state.advance(byte)
        assert state.terminated and state.complete
    state = grammar.start()
    assert state.valid_prefix(list(b"say 'hi'")) == 4


def test_masks_along_paths_equal_stepping() -> None:
    grammar = compiler().compile(C.constraint_of(json_schema={  # type: ignore[arg-type]
        "type": "object", "properties": {"a": {"type": "integer"}, "b": {"enum": ["xy", "xz"]}},
        "required": ["a", "b"], "additionalProperties": False}))
    text = list(b'{"a": 12, "b": "xz"}')
    state = grammar.start()
    stepped = []
    for t in text:
        stepped.append(state.mask().copy())
        state.advance(t)
    assert state.terminated and state.complete
    fresh = grammar.start()
    along = fresh.masks([text[:j] for j in range(len(text))])
    assert np.array_equal(along, np.stack(stepped))
    assert fresh.consumed == 0 and np.array_equal(fresh.mask(), stepped[0])  # state unchanged
    # a tree's paths in any order, and a refused path: unreachable, all allowed
    paths = [text[:3], [ord("x")], text[:1], text[:5] + [ord("q"), ord("1")]]
    got = fresh.masks(paths)
    assert np.array_equal(got[0], stepped[3]) and np.array_equal(got[2], stepped[1])
    assert (got[1] == -1).all() and (got[3] == -1).all()
    assert allowed(stepped[0]) == [ord("{")]


def test_forced_tokens_and_valid_prefix() -> None:
    grammar = compiler().compile(C.constraint_of(json_schema={  # type: ignore[arg-type]
        "type": "object", "properties": {"name": {"type": "string"}, "role": {"enum": ["admin", "audit"]}},
        "required": ["name", "role"], "additionalProperties": False}))
    state = grammar.start()
    assert bytes(state.forced(100)) == b'{"name": "'
    assert bytes(state.forced(3)) == b'{"n'
    for t in b'{"name": "x"':
        state.advance(t)
    assert bytes(state.forced(100)) == b', "role": "a'
    assert state.valid_prefix(list(b', "role": "b')) == 11
    assert state.consumed == len(b'{"name": "x"')


def test_masking_logits_and_only_token() -> None:
    mask = np.zeros((2, 9), dtype=np.int32)  # 288 ids
    mask[0, 0] = 0b1010  # 1 and 3
    mask[1, 8] = np.int32(-2**31)  # only 287
    logits = torch.arange(2 * 270, dtype=torch.float32).reshape(2, 270)
    out = mask_logits(logits, mask)
    assert torch.isfinite(out[0]).nonzero().flatten().tolist() == [1, 3]
    assert out[0, 3] == logits[0, 3]
    assert torch.isinf(out[1]).all()  # 287 lies past these logits
    rng = np.random.default_rng(0)
    for vocab in (270, 288, 300):  # narrower than the mask, as wide, wider
        words = rng.integers(-2**31, 2**31, size=(3, 9), dtype=np.int64).astype(np.int32)
        x = torch.randn(3, vocab, generator=torch.Generator().manual_seed(vocab)).to(torch.bfloat16)
        assert torch.equal(mask_logits(x, words), mask_on_device(x, words))
    assert only_token(mask[0]) is None and only_token(mask[1]) == 287
    assert only_token(np.zeros(9, dtype=np.int32)) is None


def test_a_constraint_the_vocabulary_cannot_begin_is_refused() -> None:
    small = GrammarCompiler(ByteTokenizer(97, 1), 97, (1,))  # ids 0-96: no lowercase letters
    with pytest.raises(ConstraintError, match="regex: no token of the model can begin"):
        small.compile(C.constraint_of(regex="[a-z]+"))  # type: ignore[arg-type]
    state = small.compile(C.constraint_of(regex="[0-9A-F]{2}")).start()  # type: ignore[arg-type]
    assert allowed(state.mask()) == list(range(48, 58)) + list(range(65, 71))


def test_a_forced_chain_masks_are_computed_once() -> None:
    """The verify window that appends forced tokens reads the masks ``forced`` computed, equal to fresh ones."""
    grammar = compiler().compile(C.constraint_of(json_schema={  # type: ignore[arg-type]
        "type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"],
        "additionalProperties": False}))
    state = grammar.start()
    chain = state.forced(100)
    assert bytes(chain) == b'{"name": "'
    paths = [chain[:j] for j in range(len(chain) + 1)]
    fresh = grammar.start().masks(paths)
    computed = []
    real = state._compute
    state._compute = lambda out, scan: (computed.append(1), real(out, scan))  # type: ignore[method-assign]
    assert np.array_equal(state.masks(paths), fresh) and computed == []
    state.advance(chain[0])  # a new state: the chain no longer applies
    assert np.array_equal(state.masks([[]]), fresh[1:2]) and computed == [1]
