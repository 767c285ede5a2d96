"""Generation from Java through Smile's ``smile.llm.LanguageModel.generate`` (a ``ChatCompletion``)
and the bridge's ``SamplingParams`` form (a ``Completion`` with stats), with Java listeners, against
Python's ``generate``."""

from __future__ import annotations

import json
import os
from typing import Any

import pytest

from .conftest import Jvm, require_java

require_java()

NEW_TOKENS = 8 if os.environ.get("SMILE_TEST_SCALE", "full") == "ci" else 24
PROMPT = "def fib(n):\n"


def java_generate(jvm: Jvm, prompt: list[int], n: int, temperature: float = 0.0, seed: int = 0,
                  logprobs: bool = False, stats: bool = False) -> Any:
    """Smile's ``LanguageModel.generate`` (or with ``stats`` the bridge's ``generate(int[],
    SamplingParams, listener)``) called from Java with a recording listener; the listener checks
    run in Java."""
    drivers = jvm.cls("bridgetest.GenerationDrivers")
    call = drivers.generateWithStats if stats else drivers.generate
    try:
        return call(jvm.bridge.languageModel(), prompt, n, temperature, seed, logprobs)
    except jvm.jpype.JException as exc:
        pytest.fail(f"generate from Java failed:\n{exc.stacktrace()}", pytrace=False)


@pytest.fixture
def prompt(jvm: Jvm) -> list[int]:
    # called through Java
    lm = jvm.jpype.JObject(jvm.model_adapter, jvm.cls("smile.llm.python.PythonLanguageModel"))
    return [int(t) for t in lm.encode(PROMPT)]


def test_the_registered_model_is_the_adapter(jvm: Jvm, prompt: list[int]) -> None:
    lm = jvm.bridge.languageModel()
    assert prompt == jvm.model.encode(PROMPT)
    assert int(lm.vocabSize()) == jvm.model.config.vocab_size
    assert int(lm.maxSeqLen()) == jvm.model.max_seq_len
    assert str(lm.decode(prompt)) == PROMPT
    assert int(lm.kvCachePool().numSlots()) == jvm.model.pool.num_slots
    assert str(lm.name()) == "default"
    assert str(lm.family()) == jvm.model.config.model_type == "qwen3"


def test_greedy_tokens_and_text_equal_python_generate(jvm: Jvm, prompt: list[int]) -> None:
    """Smile's form: a ChatCompletion equal to Python's Completion token for token."""
    c = java_generate(jvm, prompt, NEW_TOKENS)  # listener text == content() is checked in Java
    py = jvm.model.generate(prompt, NEW_TOKENS)
    assert [int(t) for t in c.completionTokens()] == py.tokens
    assert str(c.content()) == py.text
    assert str(c.reason().name()) == py.finish_reason
    assert [int(t) for t in c.promptTokens()] == prompt
    assert c.logprobs() is None and str(c.model()) == "default"


def test_stats_form_equals_the_smile_form(jvm: Jvm, prompt: list[int]) -> None:
    """The SamplingParams form's Completion carries the stats; its toChatCompletion equals Smile's
    form."""
    c = java_generate(jvm, prompt, NEW_TOKENS, stats=True)
    smile = java_generate(jvm, prompt, NEW_TOKENS)
    stats = json.loads(str(c.statsJson()))
    assert stats["prompt_tokens"] == len(prompt) and stats["generated_tokens"] == len(c.tokens())
    same = c.toChatCompletion("default")
    assert str(same.model()) == str(smile.model()) and str(same.content()) == str(smile.content())
    assert list(same.completionTokens()) == list(smile.completionTokens())
    assert list(same.promptTokens()) == list(smile.promptTokens())
    assert same.reason() == smile.reason()


@pytest.mark.parametrize("stats", [False, True])
def test_logprobs_one_per_token_and_equal_to_python(jvm: Jvm, prompt: list[int],
                                                    stats: bool) -> None:
    c = java_generate(jvm, prompt, NEW_TOKENS, logprobs=True, stats=stats)
    tokens = c.tokens() if stats else c.completionTokens()
    py = jvm.model.generate(prompt, NEW_TOKENS, logprobs=True)
    assert py.logprobs is not None
    assert len(c.logprobs()) == len(tokens) == len(py.tokens)
    assert [float(x) for x in c.logprobs()] == pytest.approx(py.logprobs, abs=1e-4)


def test_seeded_sampling_equals_python(jvm: Jvm, prompt: list[int]) -> None:
    c = java_generate(jvm, prompt, NEW_TOKENS, temperature=0.8, seed=1234)
    py = jvm.model.generate(prompt, NEW_TOKENS, temperature=0.8, seed=1234)
    assert [int(t) for t in c.completionTokens()] == py.tokens


def test_repeat_prompt_reuses_the_cached_prefix(jvm: Jvm) -> None:
    long_prompt = jvm.model.encode(PROMPT * 4)  # 48 tokens: the repeat matches two 16-token pages
    java_generate(jvm, long_prompt, 2)
    # the Java listener's cached count is checked against the input
    java_generate(jvm, long_prompt, 2)
    assert int(jvm.cls("bridgetest.GenerationDrivers").lastCached) == 32
    c = java_generate(jvm, long_prompt, 2, stats=True)  # and against the stats
    assert json.loads(str(c.statsJson()))["cached_tokens"] == 32


def test_compose_fans_out_in_argument_order(jvm: Jvm) -> None:
    both = [str(e) for e in jvm.cls("bridgetest.GenerationDrivers").composeOrder()]  # asserts in Java
    assert both[:2] == ["a:in:10", "b:in:10"] and both[-1] == "b:text:hi"


def test_to_publisher_streams_the_text(jvm: Jvm, prompt: list[int]) -> None:
    text = str(jvm.cls("bridgetest.GenerationDrivers").publisherChunks(jvm.bridge.languageModel(), prompt, 4))
    assert text == jvm.model.generate(prompt, 4).text


@pytest.mark.timeout(120, method="thread")
def test_java_threads_calling_generate_at_once_get_their_solo_output(jvm: Jvm) -> None:
    """Eight Java threads call Smile's LanguageModel.generate on one model at once: the calls are
    batched on the model's scheduler and each returns its solo greedy output; no binding is left
    behind."""
    prompts = [jvm.model.encode(f"def handler_{i}(request):\n    ") for i in range(8)]
    solo = [jvm.model.generate(p, NEW_TOKENS).tokens for p in prompts]
    rows = jvm.jpype.JArray(jvm.jpype.JInt, 2)([jvm.jpype.JArray(jvm.jpype.JInt)(p) for p in prompts])
    try:
        got = jvm.cls("bridgetest.GenerationDrivers").concurrentGreedy(jvm.bridge.languageModel(), rows, NEW_TOKENS)
    except jvm.jpype.JException as exc:
        pytest.fail(f"concurrent generate from Java failed:\n{exc.stacktrace()}", pytrace=False)
    assert [list(map(int, r)) for r in got] == solo
    assert jvm.model.pool.bound_request_count == 0
    jvm.model.pool.check_invariants()
