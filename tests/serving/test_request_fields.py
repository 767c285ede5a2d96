"""Request errors carry their field (``RequestError.field``): every check of ``SamplingParams`` and of the model's one
validation raises with the field it names, and the server's ``param`` and the Java bridge's renaming read that
attribute, never the message's words. An error without a field is the server's own failure. Request errors survive
pickling (a Ray replica sends them back) with their field. ``submit_samples`` validates once and gives each sample
its own listener."""

from __future__ import annotations

import pickle
from typing import Any

import numpy as np
import pytest

from smile_llm import (ConstraintError, LanguageModel, PromptTooLongError, RequestError, RequestTypeError,
                       SampleGroup, SamplingParams)
from smile_llm.server.errors import from_model_error


@pytest.fixture(scope="module")
def lm():
    model = LanguageModel.default(max_batch_size=4, max_seq_len=128)
    yield model
    model.close()


# (keyword arguments of SamplingParams, the field the error names); each message leads with that field
BAD_PARAMS: list[tuple[dict[str, Any], str]] = [
    ({"max_new_tokens": -1}, "max_new_tokens"), ({"max_new_tokens": 1.5}, "max_new_tokens"),
    ({"temperature": -1.0}, "temperature"), ({"temperature": "hot"}, "temperature"),
    ({"top_p": 0.0}, "top_p"), ({"seed": 2**70}, "seed"), ({"speculative_tokens": -2}, "speculative_tokens"),
    ({"draft_sampling": "maybe"}, "draft_sampling"), ({"logprobs": 25}, "logprobs"),
    ({"prompt_logprobs": 99}, "prompt_logprobs"), ({"draft_tree": (9, 9, 9, 9, 9, 9, 9, 9)}, "draft_tree"),
    ({"draft_tree": (2, 1), "speculative_tokens": 3}, "speculative_tokens"), ({"n": 0}, "n"),
    ({"top_k": -1}, "top_k"), ({"min_p": 2.0}, "min_p"), ({"repetition_penalty": 0.0}, "repetition_penalty"),
    ({"min_new_tokens": -1}, "min_new_tokens"), ({"logit_bias": {-1: 1.0}}, "logit_bias"),
    ({"logit_bias": {5: 500.0}}, "logit_bias"), ({"stop": [None]}, "stop"), ({"regex": ""}, "regex"), ({"json_schema": "{"}, "json_schema"),
    ({"regex": "a\ud800"}, "regex"), ({"grammar": "start: \"\ud800\""}, "grammar"),
]


@pytest.mark.parametrize("kwargs, field", BAD_PARAMS, ids=[f"{k}" for k, _ in BAD_PARAMS])
def test_every_sampling_check_raises_with_its_field(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(RequestError) as info:
        SamplingParams(**kwargs)
    error = info.value
    assert error.field == field and str(error).startswith(field) and error.after_field() is not None
    api = from_model_error(error, {"max_new_tokens": "max_tokens"})
    assert api.status == 400 and api.param == ("max_tokens" if field == "max_new_tokens" else field)
    expected = str(error).replace("max_new_tokens", "max_tokens", 1) if field == "max_new_tokens" else str(error)
    assert api.message == expected


@pytest.mark.parametrize("prompt, params, field, words", [
    ("", SamplingParams(), "prompt", "the prompt is empty"),
    ([300], SamplingParams(), "prompt", "token 300 is outside the vocabulary"),
    ("x" * 200, SamplingParams(), "prompt", "exceeds max_seq_len 128"),
    ("x", SamplingParams(logit_bias={1000: 1.0}), "logit_bias", "outside the vocabulary"),
    ("x", SamplingParams(stop=[999]), "stop", "stop entries must be token ids in [0, 257)"),
    ("x", SamplingParams(n=2), "listener", "takes no listener"),
    (5, SamplingParams(), "prompt", "prompt must be"),
    ([10**30], SamplingParams(), "prompt", "prompt"),
    (np.array([1.5, 2.0]), SamplingParams(), "prompt", "prompt"),
    ("a\ud800b", SamplingParams(), "prompt", "prompt is not valid Unicode"),
])
def test_the_models_validation_raises_with_the_field(lm: LanguageModel, prompt: Any, params: SamplingParams,
                                                     field: str, words: str) -> None:
    listener = (lambda text: None) if params.n > 1 else None
    with pytest.raises(RequestError) as info:
        lm.request(prompt, params, listener=listener)
    assert info.value.field == field and words in str(info.value)
    assert lm.pool.bound_request_count == 0


def test_a_too_long_prompt_is_typed_with_its_counts(lm: LanguageModel) -> None:
    with pytest.raises(PromptTooLongError) as info:
        lm.request([1] * 129)
    assert (info.value.tokens, info.value.max_seq_len, info.value.field) == (129, 128, "prompt")
    assert isinstance(info.value, ValueError)


def test_renaming_reads_the_field_and_touches_only_a_leading_one() -> None:
    error = RequestError("logit_bias[5] must be a number in [-100, 100], got 500", field="logit_bias")
    assert error.renamed("logitBias (logit_bias)") == \
        "logitBias (logit_bias)[5] must be a number in [-100, 100], got 500"
    # a message that does not lead with its field keeps its words, whatever they are
    other = RequestError("token 7 is outside the vocabulary", field="prompt")
    assert other.after_field() is None and other.renamed("x") == str(other)
    assert from_model_error(other).param == "prompt"
    assert RequestError("top_kx must", field="top_k").after_field() is None


def test_an_error_without_a_field_is_the_servers_own_failure(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("ERROR", logger="smile_llm.server"):
        api = from_model_error(ValueError("temperature of the sampler's table is broken"))
    assert api.status == 500 and api.param is None and "ValueError" in api.message
    assert any("a request failed" in r.getMessage() for r in caplog.records)
    assert from_model_error(TypeError("x")).status == 500


@pytest.mark.parametrize("error", [
    RequestError("top_k must be >= 0", field="top_k"), RequestTypeError("seed must be an int", field="seed"),
    ConstraintError("must not be empty", field="regex"), PromptTooLongError(300, 128),
], ids=lambda e: type(e).__name__)
def test_request_errors_pickle_with_their_field(error: RequestError) -> None:
    back = pickle.loads(pickle.dumps(error))
    assert type(back) is type(error) and str(back) == str(error) and back.field == error.field
    assert back.__dict__ == error.__dict__


def test_a_request_type_error_is_a_type_error_and_a_value_error() -> None:
    error = RequestTypeError("n must be an int", field="n")
    assert isinstance(error, TypeError) and isinstance(error, ValueError) and error.field == "n"


class Collect:
    def __init__(self) -> None:
        self.tokens: list[int] = []

    def on_token(self, token_id: int) -> None:
        self.tokens.append(token_id)


def test_submit_samples_gives_each_sample_its_listener_and_equals_generate_n(lm: LanguageModel) -> None:
    params = SamplingParams(max_new_tokens=12, temperature=0.8, seed=7)
    listeners = [Collect() for _ in range(3)]
    group = lm.submit_samples("def main(", params, listeners)
    assert isinstance(group, SampleGroup) and len(group.handles) == 3
    out = group.result(timeout=60)
    assert [c.tokens for c in out] == [x.tokens for x in listeners]
    # the same samples as one n=3 request without listeners (sample i draws with params.sample(i))
    same = lm.generate("def main(", 12, temperature=0.8, seed=7, n=3)
    assert [c.tokens for c in same] == [c.tokens for c in out]
    one = lm.submit_samples("def main(", params, [Collect()])
    assert isinstance(one, SampleGroup) and len(one.handles) == 1 and one.result(timeout=60)[0].tokens


def test_submit_samples_validates_once_and_binds_nothing_on_a_refusal(lm: LanguageModel,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    validate = type(lm.serving_context).request

    def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(kwargs.get("listeners") is not None)
        return validate(self, *args, **kwargs)

    monkeypatch.setattr(type(lm.serving_context), "request", counted)
    lm.submit_samples("x", SamplingParams(max_new_tokens=2), [Collect() for _ in range(4)]).result(timeout=60)
    assert calls == [True]  # one validation for the four samples
    monkeypatch.undo()
    with pytest.raises(RequestError) as info:
        lm.submit_samples("x", SamplingParams(), [])
    assert info.value.field == "listeners"
    with pytest.raises(RequestError) as info:
        lm.submit_samples("", SamplingParams(max_new_tokens=4), [Collect(), Collect()])
    assert info.value.field == "prompt"
    with pytest.raises(RequestError) as info:
        lm.serving_context.request("x", SamplingParams(n=2), listeners=[Collect()])
    assert info.value.field == "listeners"
    assert lm.pool.bound_request_count == 0 and lm.serving_loop.num_waiting == 0


def test_the_servers_sample_limit_is_the_requests() -> None:
    from smile_llm.server.settings import MAX_N, ServerSettings
    from smile_llm.serving.request import MAX_SAMPLES

    assert MAX_N == MAX_SAMPLES and ServerSettings(max_n=MAX_N).max_n == MAX_N
    with pytest.raises(ValueError, match="max_n must be at most 128"):
        ServerSettings(max_n=MAX_N + 1)


def test_segment_errors_name_the_segment_fields(lm: LanguageModel) -> None:
    for bad in ("", [999]):
        with pytest.raises(RequestError) as info:
            lm.register_segment(bad)
        assert info.value.field == "segment", info.value
    segment = lm.register_segment("def f():\n    return 1\n")
    try:
        handle = lm.submit("x", SamplingParams(max_new_tokens=2, segments=["#\n", segment]))
        lm.release_segment(segment)  # before its splice: it fails there, naming the request's field
        with pytest.raises(RequestError) as info:
            handle.result(timeout=60)
        assert info.value.field == "segments" and "the segment at position" in str(info.value)
    finally:
        lm.release_segment(segment)
    assert lm.pool.bound_request_count == 0
