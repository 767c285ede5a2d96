"""What clients get wrong, through ``httpx``: malformed JSON, wrong types, unknown fields, huge bodies and prompts,
unicode edge cases, unknown models, a missing or wrong key, a full queue; every error is an OpenAI error object with
the right status, never a 500. A client that disconnects mid-stream frees its request's pages. Health, models,
tokenize, detokenize and metrics."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
import pytest

from smile_llm import LanguageModel
from smile_llm.server import ServerSettings, create_app

from .conftest import KEY, LiveServer, wait_unbound

CHAT = "/v1/chat/completions"
MSG = [{"role": "user", "content": "hi"}]


def post(live: LiveServer, path: str, body: Any, **kw: Any) -> httpx.Response:
    content = body if isinstance(body, (bytes, str)) else json.dumps(body)
    return httpx.post(live.url + path, content=content, headers={"content-type": "application/json",
                                                                 **kw.pop("headers", {})}, timeout=60, **kw)


def error_of(r: httpx.Response, status: int) -> dict[str, Any]:
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error"} and {"message", "type", "param", "code"} <= set(body["error"])
    assert r.headers.get("x-request-id")
    return body["error"]


@pytest.mark.parametrize("body, param, words", [
    (b"{not json", None, "not valid JSON"),
    (b"[1, 2]", None, "must be a JSON object"),
    ({"messages": MSG, "temperature": "hot"}, "temperature", "valid number"),
    ({"messages": MSG, "max_tokens": -1}, "max_tokens", "max_tokens"),
    ({"messages": MSG, "temperature": -1}, "temperature", "temperature"),
    ({"messages": MSG, "top_p": 0}, "top_p", "top_p"),
    ({"messages": MSG, "n": 0}, "n", "n must be"),
    ({"messages": MSG, "n": 10_000}, "n", "n must be"),
    ({"messages": MSG, "max_tokens": 10**9}, "max_tokens", "over this server's limit"),
    ({"messages": []}, "messages", "at least 1"),
    ({"messages": [{"content": "no role"}]}, "messages.0.role", "required"),
    ({"messages": MSG, "stop": 5}, "stop", "string"),
    ({"messages": MSG, "logit_bias": {"x": 1}}, "logit_bias", "token ids"),
    ({"messages": MSG, "logit_bias": {"5": 500}}, "logit_bias", "logit_bias[5] must be a number"),
    ({"messages": MSG, "logit_bias": {"100000": 1}}, "logit_bias", "outside the vocabulary"),
    ({"messages": MSG, "seed": 10**30}, "seed", "seed must be in"),
    ({"messages": MSG, "regex": "a\ud800"}, "regex", "not valid Unicode"),
    ({"messages": MSG, "guided_grammar": "start: \"\ud800\""}, "grammar", "not valid Unicode"),
    ({"messages": MSG, "response_format": {"type": "json_schema"}}, "response_format", "schema"),
    ({"messages": MSG, "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "nope"}}}}, "json_schema", "refused"),
    ({"messages": MSG, "regex": "a("}, "regex", "unclosed group"),
    ({"prompt": "x", "messages": MSG, "tool_choice": "required"}, "tool_choice", "tool_choice"),
])
def test_bad_fields_are_400_naming_the_field(live: LiveServer, chat_model: LanguageModel, body: Any,
                                             param: str | None, words: str) -> None:
    err = error_of(post(live, CHAT, body), 400)
    assert err["param"] == param and words in err["message"], err
    wait_unbound(chat_model)


def test_unknown_fields_are_ignored(live: LiveServer) -> None:
    r = post(live, CHAT, {"messages": MSG, "max_tokens": 3, "temperature": 0, "frobnicate": True,
                          "metadata": {"a": 1}})
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["role"] == "assistant"


def test_unknown_model_is_404(live: LiveServer) -> None:
    err = error_of(post(live, CHAT, {"model": "gpt-9", "messages": MSG}), 404)
    assert err["param"] == "model" and err["code"] == "model_not_found"


def test_huge_body_and_prompt_are_413(live: LiveServer, chat_model: LanguageModel) -> None:
    error_of(post(live, CHAT, b'{"messages": "' + b"x" * (5 << 20) + b'"}'), 413)
    err = error_of(post(live, "/v1/completions", {"prompt": "word " * 500, "max_tokens": 2}), 413)
    assert err["param"] == "prompt" and "context" in err["message"]
    long = [{"role": "user", "content": "word " * 500}]
    err = error_of(post(live, CHAT, {"messages": long, "max_tokens": 2}), 413)
    assert err["param"] == "messages" and "over the model's context of" in err["message"]
    wait_unbound(chat_model)


def test_an_error_without_a_field_is_a_logged_500_never_a_guessed_400(
        live: LiveServer, chat_model: LanguageModel, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """A ValueError from deep inside the model names no request field: the server's own failure, logged with its
    traceback, not a 400 whose ``param`` is the message's first word."""
    def broken(*args: Any, **kwargs: Any) -> Any:
        raise ValueError("top_k of an internal table went wrong")

    monkeypatch.setattr(chat_model, "submit_samples", broken)
    with caplog.at_level("ERROR", logger="smile_llm.server"):
        err = error_of(post(live, CHAT, {"messages": MSG, "max_tokens": 2}), 500)
    assert err["param"] is None and "ValueError: top_k of an internal table" in err["message"]
    assert any(r.exc_info and "a request failed" in r.getMessage() for r in caplog.records)


def test_unicode_edges(live: LiveServer) -> None:
    for text in ("é\u0301 \U0001F600 \u200b", "\x00\x01", "\ud7ff\ue000", "ｆｕｌｌ"):
        r = post(live, "/v1/completions", {"prompt": text, "max_tokens": 4, "temperature": 0})
        assert r.status_code == 200, r.text
    error_of(post(live, CHAT, '{"messages": [{"role": "user", "content": "\\ud800"}]}'.encode()), 400)
    error_of(post(live, CHAT, b'{"messages": "\xff\xfe"}'), 400)


def test_a_missing_or_wrong_key_is_401(keyed: LiveServer) -> None:
    for headers in ({}, {"authorization": "Bearer wrong"}, {"authorization": KEY}, {"authorization": "Basic x"}):
        err = error_of(post(keyed, CHAT, {"messages": MSG}, headers=headers), 401)
        assert KEY not in err["message"]
    r = post(keyed, CHAT, {"messages": MSG, "max_tokens": 2}, headers={"authorization": f"Bearer {KEY}"})
    assert r.status_code == 200
    assert httpx.get(keyed.url + "/health").status_code == 200  # health and metrics need no key
    assert httpx.get(keyed.url + "/v1/models").status_code == 401


def test_a_full_queue_is_429_with_retry_after_counting_samples(chat_model: LanguageModel) -> None:
    """The queue counts samples: with 2 samples being admitted and a limit of 4, n=3 is refused and n=2 is
    not; n over the limit can never be queued (400 naming it)."""
    app = create_app(chat_model, ServerSettings(model_name="q", max_queued=4))
    server = LiveServer(app)
    try:
        app.state.smile.admitting = 2  # as if a request of n=2 were being admitted
        r = post(server, CHAT, {"messages": MSG, "n": 3, "max_tokens": 1})
        err = error_of(r, 429)
        assert r.headers["retry-after"] == "1" and "queue is full" in err["message"]
        assert post(server, CHAT, {"messages": MSG, "n": 2, "max_tokens": 1}).status_code == 200
        app.state.smile.admitting = 0
        assert error_of(post(server, CHAT, {"messages": MSG, "n": 5, "max_tokens": 1}), 400)["param"] == "n"
    finally:
        server.stop()


def test_loading_is_503(chat_model: LanguageModel) -> None:
    app = create_app(None, ServerSettings())
    server = LiveServer(app)
    try:
        error_of(httpx.get(server.url + "/health"), 503)
        error_of(post(server, CHAT, {"messages": MSG}), 503)
        app.state.smile.model = chat_model
        assert httpx.get(server.url + "/health").json() == {"status": "ok"}
        app.state.smile.draining = True
        error_of(httpx.get(server.url + "/health"), 503)
        error_of(post(server, CHAT, {"messages": MSG}), 503)
    finally:
        server.stop()


def test_a_disconnect_mid_stream_frees_the_pages(live: LiveServer, chat_model: LanguageModel) -> None:
    body = {"prompt": "def f():\n", "max_tokens": 900, "stream": True, "temperature": 1.0, "seed": 1,
            "extra": "x", "regex": "[a-z ]{800,900}"}
    with httpx.stream("POST", live.url + "/v1/completions", json=body, timeout=60) as r:
        assert r.status_code == 200
        lines = r.iter_lines()
        got = [next(lines) for _ in range(6)]
        assert all(not line or line.startswith("data: ") for line in got)
        assert chat_model.pool.bound_request_count == 1
    # the stream is closed: the request is cancelled within a step
    wait_unbound(chat_model, timeout=10)
    chat_model.pool.check_invariants()


def test_health_models_tokenize_detokenize_metrics(live: LiveServer, chat_model: LanguageModel) -> None:
    assert httpx.get(live.url + "/health").json() == {"status": "ok"}
    models = httpx.get(live.url + "/v1/models").json()
    assert models["data"][0]["id"] == "smile-test" and models["data"][0]["max_model_len"] == chat_model.max_seq_len
    tok = post(live, "/tokenize", {"prompt": "héllo"}).json()
    assert tok["tokens"] == chat_model.encode("héllo") and tok["count"] == 6
    assert post(live, "/detokenize", {"tokens": tok["tokens"]}).json() == {"prompt": "héllo"}
    chat = post(live, "/tokenize", {"messages": MSG}).json()
    assert chat["tokens"] == chat_model.encode_chat(MSG)
    error_of(post(live, "/detokenize", {"tokens": [10**9]}), 400)
    post(live, "/v1/completions", {"prompt": "a", "max_tokens": 3, "temperature": 0})
    text = httpx.get(live.url + "/metrics").text
    for name in ("smile_llm_time_to_first_token_seconds_bucket", "smile_llm_inter_token_latency_seconds_bucket",
                 "smile_llm_e2e_request_latency_seconds_count", "smile_llm_num_requests_running",
                 "smile_llm_num_requests_waiting", "smile_llm_kv_cache_pages_used", "smile_llm_prompt_tokens_total",
                 "smile_llm_cached_prompt_tokens_total", "smile_llm_generation_tokens_total",
                 "smile_llm_spec_decode_accepted_tokens_total", "smile_llm_prefix_cache_hit_rate",
                 "smile_llm_spec_decode_acceptance_rate"):
        assert name in text, name
    generated = [line for line in text.splitlines() if line.startswith("smile_llm_generation_tokens_total")]
    assert float(generated[0].split()[-1]) > 0
    time.sleep(0)
