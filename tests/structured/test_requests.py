"""Constrained requests as a server meets them: bad constraints refused at the call with nothing queued, a grammar
failure or a cancellation ending that request alone with its matcher and pages released, and the same output from
every entry point (engine, stream, chat, threads)."""

from __future__ import annotations

import gc
import json
import threading
import weakref
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from smile_llm import LanguageModel, SamplingParams
from smile_llm.engine import InferenceEngine
from smile_llm.errors import ConstraintError, GenerationCancelled, GrammarError
from smile_llm.sampling import grammar_compiler
from smile_llm.sampling.grammar_state import GrammarState

from .conftest import SCHEMAS
from .test_validity import REGEX


def assert_clean(model: LanguageModel) -> None:
    model.pool.check_invariants()
    assert model.pool.bound_request_count == 0 and model.serving_loop.num_waiting == 0 and model.serving_loop.num_running == 0


@pytest.mark.parametrize("kw, field", [({"regex": "a("}, "regex"), ({"grammar": "start: nope"}, "grammar"),
                                       ({"json_schema": {"type": "integer", "minimum": "x"}}, "json_schema"),
                                       ({"regex": "a", "json_object": True}, "json_object")])
def test_bad_constraints_are_refused_at_the_call(byte_model: LanguageModel, kw: dict, field: str) -> None:
    for call in (lambda: byte_model.generate("x", 5, **kw), lambda: byte_model.generate_batch(["x", "y"], 5, **kw),
                 lambda: byte_model.stream("x", 5, **kw), lambda: byte_model.submit("x", SamplingParams(**kw))):
        with pytest.raises(ConstraintError) as info:
            call()
        assert info.value.field == field
    assert_clean(byte_model)


def test_a_repeated_schema_is_not_recompiled(byte_model: LanguageModel) -> None:
    schema = {"type": "object", "properties": {"k": {"enum": ["v", "w"]}}, "required": ["k"],
              "additionalProperties": False}
    byte_model.generate("x", 20, json_schema=schema)
    before = byte_model.grammars.compiled
    outs = byte_model.generate_batch(["a", "b", "c"], 20, json_schema=json.dumps(schema))
    assert byte_model.grammars.compiled == before and all(json.loads(c.text)["k"] in "vw" for c in outs)


class FailingState(GrammarState):
    """A grammar state whose engine fails after three tokens."""

    def mask(self) -> Any:
        if self.consumed >= 3:
            raise GrammarError("the grammar engine failed: injected")
        return super().mask()

    def forced(self, limit: int) -> list[int]:
        return [] if self.consumed >= 3 else super().forced(limit)


def test_a_grammar_failure_fails_that_request_alone(byte_model: LanguageModel,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    bad_regex = "[xyz]{10,20}"
    alone = [byte_model.generate("p", 30, regex=REGEX).tokens, byte_model.generate("q", 30).tokens]
    start = grammar_compiler.CompiledGrammar.start

    def start_failing(self: Any) -> GrammarState:
        state = start(self)
        if self.constraint.source != grammar_compiler.CompiledGrammar.__dict__.get("_bad", ""):
            return state
        state.__class__ = FailingState
        return state

    bad = SamplingParams(max_new_tokens=30, regex=bad_regex).constraint
    assert bad is not None
    monkeypatch.setattr(grammar_compiler.CompiledGrammar, "_bad", bad.source, raising=False)
    monkeypatch.setattr(grammar_compiler.CompiledGrammar, "start", start_failing)
    handles = [byte_model.submit("p", SamplingParams(max_new_tokens=30, regex=REGEX)),
               byte_model.submit("r", SamplingParams(max_new_tokens=30, regex=bad_regex, speculative_tokens=0)),
               byte_model.submit("q", SamplingParams(max_new_tokens=30))]
    with pytest.raises(GrammarError, match="injected"):
        handles[1].result(60)
    assert [handles[0].result(60).tokens, handles[2].result(60).tokens] == alone
    assert_clean(byte_model)


def test_cancel_releases_the_matcher_and_the_pages(byte_model: LanguageModel,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    states: list[weakref.ref] = []
    start = grammar_compiler.CompiledGrammar.start

    def recording(self: Any) -> GrammarState:
        state = start(self)
        states.append(weakref.ref(state))
        return state

    monkeypatch.setattr(grammar_compiler.CompiledGrammar, "start", recording)
    polls = [0]

    def cancel() -> bool:
        polls[0] += 1
        return polls[0] > 4

    handle = byte_model.submit("c", SamplingParams(max_new_tokens=60, regex="[a-z]{50,60}"), cancel=cancel)
    with pytest.raises(GenerationCancelled):
        handle.result(60)
    assert_clean(byte_model)
    gc.collect()
    assert states and all(state() is None for state in states)  # (the compile-time probe too)


def test_a_grammar_that_cannot_start_fails_that_request_alone(byte_model: LanguageModel,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    expected = byte_model.generate("q", 20).tokens

    def broken(self: Any) -> GrammarState:
        raise MemoryError("no room for a matcher copy")

    monkeypatch.setattr(grammar_compiler.CompiledGrammar, "start", broken)
    handles = [byte_model.submit("r", SamplingParams(max_new_tokens=20, regex=REGEX)),
               byte_model.submit("q", SamplingParams(max_new_tokens=20))]
    with pytest.raises(MemoryError, match="no room"):
        handles[0].result(60)
    assert handles[1].result(60).tokens == expected
    assert_clean(byte_model)


def test_engine_stream_and_threads_give_the_same_output(byte_model: LanguageModel) -> None:
    schema = SCHEMAS["person"]
    kw: dict[str, Any] = {"json_schema": schema, "temperature": 1.0, "seed": 17}
    expected = byte_model.generate("who: ", 60, **kw)
    jsonschema.validate(json.loads(expected.text), schema)
    assert "".join(chunk.text for chunk in byte_model.stream("who: ", 60, **kw)) == expected.text
    with InferenceEngine(byte_model, max_batch_size=4) as engine:
        got = engine.generate("who: ", SamplingParams(max_new_tokens=60, **kw))
        assert not isinstance(got, list) and got.tokens == expected.tokens
    results: list[Any] = [None] * 6
    prompts = [f"row {i}: " for i in range(6)]
    alone = [byte_model.generate(p, 60, **kw).tokens for p in prompts]

    def call(i: int) -> None:
        results[i] = byte_model.generate(prompts[i], 60, **kw).tokens

    threads = [threading.Thread(target=call, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert results == alone
    assert_clean(byte_model)


def test_chat_takes_a_schema(bpe_checkpoint: Any, tmp_path: Path) -> None:
    folder, _ = bpe_checkpoint
    for f in folder.iterdir():
        (tmp_path / f.name).write_bytes(f.read_bytes())
    (tmp_path / "chat_template.jinja").write_text(
        "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}assistant: ")
    model = LanguageModel.from_pretrained(tmp_path, max_seq_len=256)
    c = model.chat([{"role": "user", "content": "a person please"}], 80, json_schema=SCHEMAS["person"],
                   temperature=1.0, seed=2)
    assert c.finish_reason == "stop"
    jsonschema.validate(json.loads(c.text), SCHEMAS["person"])
    model.close()
