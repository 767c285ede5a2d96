"""``smile.llm.SamplingParams`` from Java: every builder field reaches Python's ``SamplingParams``; generation with
the processors and warpers equals Python's; each bad value is an IllegalArgumentException naming the field by its
Java and Python names, in every call that takes settings, with nothing queued or bound; the ``Stream`` and
``Flow.Publisher`` forms; n samples and top-k / prompt logprobs against Python; token-tree drafts
(``draftTree``) and adaptive draft counts (``speculativeTokensAuto``) against Python and plain decoding. The
Java-side checks are ``bridgetest.SamplingScenarios``."""

from __future__ import annotations

import json
import os
from typing import Any

import pytest

from .conftest import Jvm, require_java, scenario_names

require_java()

from smile_llm.serving.request import SamplingParams  # noqa: E402

from .test_scenarios import run  # noqa: E402 - after require_java

SCENARIOS = scenario_names("SamplingScenarios.java")
NEW_TOKENS = 8 if os.environ.get("SMILE_TEST_SCALE", "full") == "ci" else 24
PROMPT = "def fib(n):\n"  # SamplingScenarios.prompt()
SPECULATIVE_TOKENS = 24  # past the default model's leading spaces after PROMPT, so drafts are rejected too


@pytest.fixture
def java(jvm: Jvm) -> Any:
    scenarios = jvm.cls("bridgetest.SamplingScenarios")
    scenarios.newTokens = NEW_TOKENS
    return scenarios


def builder(jvm: Jvm) -> Any:
    return jvm.cls("smile.llm.SamplingParams").builder()


def ids(jvm: Jvm) -> Any:
    return jvm.jpype.JArray(jvm.jpype.JInt)(jvm.model.encode(PROMPT))


def assert_nothing_queued(jvm: Jvm) -> None:
    loop = jvm.model.serving_loop
    assert loop.num_waiting == 0 and loop.num_running == 0
    assert jvm.model.pool.bound_request_count == 0
    jvm.model.pool.check_invariants()


def test_every_builder_field_reaches_python(jvm: Jvm, java: Any) -> None:
    from java_bridge.adapters.sampling import python_params

    want = SamplingParams(max_new_tokens=7, temperature=0.7, top_p=0.9, seed=-5, logprobs=3,
                          stop=["\n\n", "return", 10, 11], speculative_tokens=2, draft_sampling="sample", top_k=40,
                          min_p=0.05, repetition_penalty=1.1, presence_penalty=0.5, frequency_penalty=-0.5,
                          logit_bias={5: -2.0, 7: 1.5}, min_new_tokens=3, n=4, prompt_logprobs=2, draft_tree=(2, 3))
    got = python_params(java.everyField())
    assert got == want
    assert got.seed == (1 << 64) - 5  # a negative Java long seed: its 64 bits, as in Python
    assert python_params(jvm.cls("smile.llm.SamplingParams").defaults()) == SamplingParams()
    assert python_params(builder(jvm).logprobs(True).build()).logprobs is True
    assert python_params(builder(jvm).logprobs(jvm.jpype.JInt(0)).build()).logprobs is True


def test_draft_tree_and_auto_reach_python(jvm: Jvm) -> None:
    from java_bridge.adapters.sampling import python_params

    def py(b: Any) -> SamplingParams:
        return python_params(b.build())

    integer = jvm.jpype.JObject(3, "java.lang.Integer")
    assert py(builder(jvm).speculativeTokensAuto()).speculative_tokens == "auto"
    assert py(builder(jvm).speculativeTokensAuto().speculativeTokens(integer)).speculative_tokens == 3
    assert py(builder(jvm).speculativeTokensAuto().speculativeTokens(None)).speculative_tokens is None
    assert py(builder(jvm).speculativeTokens(integer).speculativeTokensAuto()).speculative_tokens == "auto"
    assert py(builder(jvm).draftTree(3, 2, 2)).draft_tree == (3, 2, 2)
    assert py(builder(jvm).draftTree(3, 2, 2).speculativeTokens(integer)).draft_tree == (3, 2, 2)
    assert py(builder(jvm).draftTree(3, 2, 2).draftTree()).draft_tree is None
    assert py(builder(jvm).draftTree(3, 2, 2).draftTree(None)).draft_tree is None


@pytest.mark.parametrize("options", [
    {"repetition_penalty": 1.3, "logit_bias": {32: -5.0}, "min_new_tokens": 4},
    {"presence_penalty": 0.6, "frequency_penalty": 0.4, "stop": ["\n\n"], "speculative_tokens": 0},
    {"temperature": 0.8, "top_k": 40, "min_p": 0.05, "top_p": 0.9, "seed": 1234, "draft_sampling": "sample"},
], ids=["penalties-bias-min", "presence-frequency-stop", "sampled-topk-minp"])
def test_generate_with_options_equals_python(jvm: Jvm, java: Any, options: dict[str, Any]) -> None:
    b = builder(jvm).maxNewTokens(NEW_TOKENS)
    setters = {"repetition_penalty": "repetitionPenalty", "min_new_tokens": "minNewTokens", "top_k": "topK",
               "min_p": "minP", "top_p": "topP", "presence_penalty": "presencePenalty", "seed": "seed",
               "frequency_penalty": "frequencyPenalty", "temperature": "temperature", "draft_sampling": "draftSampling"}
    for name, value in options.items():
        if name == "logit_bias":
            bias = jvm.cls("java.util.HashMap")()
            for token, b_ in value.items():
                bias.put(jvm.jpype.JObject(token, "java.lang.Integer"), jvm.jpype.JObject(b_, "java.lang.Double"))
            b = b.logitBias(bias)
        elif name == "stop":
            b = b.stop(jvm.jpype.JArray(jvm.jpype.JString)(value))
        elif name == "speculative_tokens":
            b = b.speculativeTokens(jvm.jpype.JObject(value, "java.lang.Integer"))
        else:
            b = getattr(b, setters[name])(value)
    c = java.generate(ids(jvm), b.build())  # listener text and a clean pool are checked in Java
    py = jvm.model.generate(PROMPT, NEW_TOKENS, **options)
    assert [int(t) for t in c.tokens()] == py.tokens
    assert str(c.text()) == py.text and str(c.finishReason()) == py.finish_reason


def stats(completion: Any) -> dict[str, Any]:
    return dict(json.loads(str(completion.statsJson())))


def speculative_counts(s: dict[str, Any]) -> tuple[int, int, int]:
    return s["speculative_rounds"], s["proposed_drafts"], s["accepted_drafts"]


def recording(monkeypatch: pytest.MonkeyPatch, owner: Any, method: str) -> list[tuple[Any, ...]]:
    """The arguments of each call of ``owner.method`` from now on (the method still runs)."""
    calls: list[tuple[Any, ...]] = []
    real = getattr(owner, method)

    def record(*args: Any) -> Any:
        calls.append(args)
        return real(*args)

    monkeypatch.setattr(owner, method, record)
    return calls


def test_draft_tree_generate_equals_python_and_plain(jvm: Jvm, java: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    params = builder(jvm).maxNewTokens(SPECULATIVE_TOKENS).draftTree(3, 2, 2).build()
    trees = recording(monkeypatch, jvm.model.drafter, "propose_tree")
    c = java.generate(ids(jvm), params)  # listener text and a clean pool are checked in Java
    assert trees and all(tuple(branching) == (3, 2, 2) for _, branching in trees)  # tree rounds, from Java
    py = jvm.model.generate(PROMPT, SPECULATIVE_TOKENS, draft_tree=(3, 2, 2))
    plain = jvm.model.generate(PROMPT, SPECULATIVE_TOKENS, speculative_tokens=0)
    assert [int(t) for t in c.tokens()] == py.tokens == plain.tokens
    assert str(c.text()) == py.text == plain.text and str(c.finishReason()) == py.finish_reason
    got = stats(c)
    assert got["speculative_rounds"] > 0 and got["draft_errors"] == 0
    assert speculative_counts(got) == speculative_counts(py.stats)  # the same tree rounds as Python's
    assert_nothing_queued(jvm)


def test_speculative_tokens_auto_generate_equals_python_and_plain(jvm: Jvm, java: Any,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    params = builder(jvm).maxNewTokens(SPECULATIVE_TOKENS).speculativeTokensAuto().build()
    choices = recording(monkeypatch, jvm.model.runner.draft_policy, "choose")
    c = java.generate(ids(jvm), params)
    assert choices  # the model's draft policy chose the rounds' drafts
    py = jvm.model.generate(PROMPT, SPECULATIVE_TOKENS, speculative_tokens="auto")
    plain = jvm.model.generate(PROMPT, SPECULATIVE_TOKENS, speculative_tokens=0)
    assert [int(t) for t in c.tokens()] == py.tokens == plain.tokens
    assert str(c.text()) == py.text == plain.text and str(c.finishReason()) == py.finish_reason
    got = stats(c)  # the policy's k depends on measured step times: only that it drafted, cleanly
    assert got["speculative_rounds"] > 0 and got["draft_errors"] == 0
    assert_nothing_queued(jvm)


TREE = "draftTree (draft_tree) must have 1..7 depths of 1..8 alternatives each and at most 32 nodes in all"
BAD = [  # SamplingScenarios.bad(name) -> what the IllegalArgumentException's message holds
    ("maxNewTokens", "maxNewTokens (max_new_tokens) must be >= 0"),
    ("temperature", "temperature must be a finite number"),
    ("topP", "topP (top_p) must be in (0, 1]"),
    ("topK", "topK (top_k) must be >= 0"),
    ("minP", "minP (min_p) must be in [0.0, 1.0]"),
    ("repetitionPenalty", "repetitionPenalty (repetition_penalty) must be > 0"),
    ("presencePenalty", "presencePenalty (presence_penalty) must be in [-2.0, 2.0]"),
    ("frequencyPenalty", "frequencyPenalty (frequency_penalty) must be in [-2.0, 2.0]"),
    ("logitBias", "logitBias (logit_bias)[5] must be a number in [-100, 100]"),
    ("logitBiasVocabulary", "logitBias (logit_bias) keys must be token ids in [0, 257)"),
    ("minNewTokens", "minNewTokens (min_new_tokens) must be >= 0"),
    ("speculativeTokens", 'speculativeTokens (speculative_tokens) must be None, "auto" or an int >= 0'),
    ("draftTree", f"{TREE}, got (0,)"),
    ("draftTreeDepth", f"{TREE}, got (1, 1, 1, 1, 1, 1, 1, 1)"),
    ("draftTreeNodes", f"{TREE}, got (8, 8, 8, 8, 8)"),
    ("draftTreeAuto", "speculativeTokens (speculative_tokens) (auto) must be None or the depth of draft_tree (3)"),
    ("draftTreeDepthMismatch", "speculativeTokens (speculative_tokens) (2) must be None or the depth of draft_tree"),
    ("draftSampling", 'draftSampling (draft_sampling) must be "greedy" or "sample"'),
    ("stopTokenIds", "stop entries must be token ids in [0, 257)"),
    ("stopNull", "stop entries must be token ids (ints >= 0) or strings, got None"),
    ("logprobs", "logprobs must be a bool or an int in [0, 20]"),
    ("promptLogprobs", "promptLogprobs (prompt_logprobs) must be None or an int in [0, 20]"),
    ("n", "n must be in [1, 128]"),
]


@pytest.mark.parametrize("how", ["generate", "submit", "stream", "streamText", "generateSamples"])
@pytest.mark.parametrize("name, message", BAD)
def test_bad_value_is_refused_by_name_with_nothing_queued(jvm: Jvm, java: Any, how: str, name: str,
                                                          message: str) -> None:
    with pytest.raises(jvm.cls("java.lang.IllegalArgumentException")) as info:
        java.call(how, java.bad(name))
    assert message in str(info.value.getMessage())
    assert_nothing_queued(jvm)


@pytest.mark.parametrize("how", ["generate", "submit", "stream", "streamText", "generateSamples"])
def test_draft_tree_refused_by_name_without_a_tree_drafter(jvm: Jvm, java: Any, how: str,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(jvm.model.runner, "drafter", None)  # the request check reads it; the decoder is not reached
    params = builder(jvm).maxNewTokens(4).draftTree(3, 2, 2).build()
    with pytest.raises(jvm.cls("java.lang.IllegalArgumentException")) as info:
        java.call(how, params)
    assert "draftTree (draft_tree): this model's drafter (NoneType) does not propose token trees" in str(
        info.value.getMessage())
    assert_nothing_queued(jvm)


@pytest.mark.parametrize("how", ["generate", "submit", "stream", "streamText"])
def test_one_completion_calls_refuse_n_samples(jvm: Jvm, java: Any, how: str) -> None:
    with pytest.raises(jvm.cls("java.lang.IllegalArgumentException"), match="use generateSamples"):
        java.call(how, java.bad("nForOne"))
    assert_nothing_queued(jvm)


def test_stream_text_equals_generate(jvm: Jvm, java: Any) -> None:
    params = builder(jvm).maxNewTokens(NEW_TOKENS).repetitionPenalty(1.3).build()
    text = str(java.streamText(ids(jvm), params))  # read to its end in try-with-resources; pool audited in Java
    assert text == jvm.model.generate(PROMPT, NEW_TOKENS, repetition_penalty=1.3).text


def test_n_samples_equal_python(jvm: Jvm, java: Any) -> None:
    params = builder(jvm).maxNewTokens(NEW_TOKENS).temperature(0.9).seed(11).n(3).build()
    got = [[int(t) for t in c.tokens()] for c in java.generateSamples(ids(jvm), params)]
    want = [c.tokens for c in jvm.model.generate(PROMPT, NEW_TOKENS, temperature=0.9, seed=11, n=3)]
    assert got == want and len(got) == 3
    one = java.generateSamples(ids(jvm), builder(jvm).maxNewTokens(NEW_TOKENS).build())
    assert [int(t) for t in one.get(0).tokens()] == jvm.model.generate(PROMPT, NEW_TOKENS).tokens


def java_rows(maps: Any) -> list[dict[int, float] | None]:
    """A Java ``List<Map<Integer, Float>>`` as Python dicts, in the map's order."""
    return [None if m is None else {int(k): float(m.get(k)) for k in m.keySet()} for m in maps]


def test_top_and_prompt_logprobs_equal_python(jvm: Jvm, java: Any) -> None:
    params = builder(jvm).maxNewTokens(NEW_TOKENS).logprobs(jvm.jpype.JInt(3)).promptLogprobs(
        jvm.jpype.JObject(2, "java.lang.Integer")).build()
    c = java.generate(ids(jvm), params)
    py = jvm.model.generate(PROMPT, NEW_TOKENS, logprobs=3, prompt_logprobs=2)
    assert py.top_logprobs is not None and py.prompt_logprobs is not None and py.logprobs is not None
    top, prompt = java_rows(c.topLogprobs()), java_rows(c.promptLogprobs())
    assert len(top) == len(py.top_logprobs) == len(py.tokens)
    for got, want in zip(top + prompt, py.top_logprobs + py.prompt_logprobs):
        assert (got is None) == (want is None)
        if want is not None:
            assert got is not None and list(got) == list(want)  # same ids, same order
            assert list(got.values()) == pytest.approx(list(want.values()), abs=1e-5)
    assert prompt[0] is None and len(prompt) == len(py.prompt_tokens)
    assert [float(x) for x in c.logprobs()] == pytest.approx(py.logprobs, abs=1e-5)
    plain = java.generate(ids(jvm), builder(jvm).maxNewTokens(2).build())
    assert plain.topLogprobs() is None and plain.promptLogprobs() is None


@pytest.mark.timeout(120, method="thread")
@pytest.mark.parametrize("name", SCENARIOS)
def test_sampling_scenario(jvm: Jvm, java: Any, name: str) -> None:
    run(jvm, "SamplingScenarios", name)
    assert_nothing_queued(jvm)


def test_scenario_names_match_java(jvm: Jvm) -> None:
    names = jvm.cls("bridgetest.Scenarios").names("bridgetest.SamplingScenarios")
    assert sorted(SCENARIOS) == [str(n) for n in names]
    assert len(SCENARIOS) >= 4


def test_every_language_model_method_is_implemented_in_python(jvm: Jvm) -> None:
    """JPype 1.7.1 proxies cannot run a Java default method that takes arguments (the proxy looks it up by return
    type alone), so the adapters implement every such method of their interfaces themselves."""
    from java_bridge.adapters import LanguageModelAdapter
    from java_bridge.adapters.engine import ServingEngineAdapter
    from java_bridge.adapters.executor import ModelExecutorAdapter

    for iface, adapter in (("smile.llm.python.PythonLanguageModel", LanguageModelAdapter),
                           ("smile.llm.python.PythonModelExecutor", ModelExecutorAdapter),
                           ("smile.llm.python.PythonServingEngine", ServingEngineAdapter)):
        methods = jvm.cls(iface).class_.getMethods()
        missing = sorted({str(m.getName()) for m in methods if m.getParameterCount() > 0
                          and not jvm.cls("java.lang.reflect.Modifier").isStatic(m.getModifiers())
                          and not hasattr(adapter, str(m.getName()))})
        assert missing == [], f"{iface}: no Python method for {missing}"


def test_the_sampling_example_runs(jvm: Jvm, capfd: pytest.CaptureFixture[str]) -> None:
    """``java_bridge/examples/SamplingExample.java`` (compiled with the drivers) on the registered default model,
    whose ChatML chat template answers the chat step."""
    jvm.cls("SamplingExample").main(jvm.jpype.JArray(jvm.jpype.JString)(["16"]))
    jvm.cls("java.lang.System").out.flush()
    printed = capfd.readouterr().out
    chat = [{"role": "system", "content": "You answer in one line."},
            {"role": "user", "content": "What is a radix tree?"},
            {"role": "assistant", "content": "A prefix tree."}, {"role": "user", "content": "And a trie?"}]
    prompt = f"chat prompt: {len(jvm.model.encode_chat(chat))} tokens"
    for line in ("greedy:", "penalised:", "streamed:", "sample 3:", "token 2:", "assistant: ", prompt,
                 "refused: topK (top_k) must be >= 0", "pool: 0 bound"):
        assert line in printed, printed
    assert "chat: skipped" not in printed, printed
    assert_nothing_queued(jvm)
