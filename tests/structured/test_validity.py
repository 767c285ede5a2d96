"""Sampled constrained outputs are valid: hundreds of outputs at temperature 1 from the shipped model on bounded
schemas validate with ``jsonschema``, regex outputs fullmatch, choices are members, Lark-grammar outputs match the
equivalent regex, and ``json_object`` outputs are JSON objects. None of these bounded constraints ends at the
token limit; an unbounded one that cannot finish ends with ``finish_reason="length"`` and says so."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest

from smile_llm import LanguageModel

from .conftest import CI, SCHEMAS

SAMPLES = 20 if CI else 40  # per constraint: 5 schemas and 4 other constraints make 180 (360) outputs
LIMIT = 120  # every bounded constraint here finishes far below it

REGEX = r"[a-z]{2,6}-[0-9]{1,3}( [A-Z][a-z]{0,4})?"
GRAMMAR = 'start: item ("," item)~0..3\nitem: WORD "=" NUMBER\nWORD: /[a-z]{1,4}/\nNUMBER: /[0-9]{1,2}/\n'
GRAMMAR_AS_REGEX = r"[a-z]{1,4}=[0-9]{1,2}(,[a-z]{1,4}=[0-9]{1,2}){0,3}"
CHOICES = ["alpha", "beta", "gamma delta", "alphabet", 'quo"te']


@pytest.fixture(scope="module")
def model(byte_model: LanguageModel) -> LanguageModel:
    return byte_model


def sampled(model: LanguageModel, prompt: str, seed: int, **constraint: object) -> list:
    return model.generate(prompt, LIMIT, n=SAMPLES, temperature=1.0, seed=seed, **constraint)  # type: ignore


@pytest.mark.parametrize("name", list(SCHEMAS))
def test_sampled_json_validates(model: LanguageModel, name: str) -> None:
    schema = SCHEMAS[name]
    outs = sampled(model, f"A {name} record: ", 100 + len(name), json_schema=schema)
    assert len(outs) == SAMPLES
    at_limit = 0
    for c in outs:
        if c.finish_reason == "length":  # a number's digits are unbounded: rare, and reported
            assert not c.stats["constraint_complete"] and len(c.tokens) == LIMIT
            at_limit += 1
            continue
        assert c.finish_reason == "stop" and c.stats["constraint_complete"], c.text
        jsonschema.validate(json.loads(c.text), schema)
    assert at_limit <= SAMPLES // 10
    assert len({c.text for c in outs}) > 1  # temperature 1 does sample


def test_sampled_regex_choice_grammar_and_json_object(model: LanguageModel) -> None:
    for c in sampled(model, "code: ", 7, regex=REGEX):
        assert c.finish_reason == "stop" and re.fullmatch(REGEX, c.text), c.text
    seen = set()
    for c in sampled(model, "pick: ", 8, choice=CHOICES):
        assert c.finish_reason == "stop" and c.text in CHOICES, c.text
        seen.add(c.text)
    assert len(seen) > 1
    for c in sampled(model, "pairs: ", 9, grammar=GRAMMAR):
        assert c.finish_reason == "stop" and re.fullmatch(GRAMMAR_AS_REGEX, c.text), c.text
    objects = sampled(model, "json: ", 10, json_object=True)
    for c in objects:
        if c.finish_reason == "stop":
            assert isinstance(json.loads(c.text), dict), c.text
        else:  # any JSON object is unbounded: the limit may come first, and is reported
            assert c.finish_reason == "length" and not c.stats["constraint_complete"]


def test_a_grammar_that_cannot_finish_ends_at_the_limit_and_says_so(model: LanguageModel) -> None:
    c = model.generate("x", 20, regex="a{50}b")
    assert c.finish_reason == "length" and c.text == "a" * 20 and c.stats["constraint_complete"] is False
    # one that can stop before the limit but need not: complete, and still "length"
    c = model.generate("x", 10, regex="[ab]+")
    assert c.finish_reason in ("length", "stop") and re.fullmatch("[ab]+", c.text)
    assert c.stats["constraint_complete"] is True


def test_free_requests_report_no_constraint(model: LanguageModel) -> None:
    c = model.generate("x", 4, speculative_tokens=0)
    assert "constraint_complete" not in c.stats and "forced_tokens" not in c.stats
