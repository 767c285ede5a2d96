"""A property-based fuzz of the whole HTTP API from its own OpenAPI schema (``schemathesis``, through the ASGI app
in process): whatever body, header or path parameter it generates, no answer is a 5xx, every error is an OpenAI
error object, and afterwards the serving loop still answers and no request is left bound. Then the hostile shapes
that once crashed, hung or 500ed the server (deep and huge JSON, loose types, malformed parts, tools and tool
choices, self-referring, exploding and chained schemas, chained grammars), mixed into valid bodies by
``hypothesis`` and sent to a live server as raw JSON text: the same properties. Bounded: examples per operation
(small at CI scale), server limits of 8 tokens and 2 samples per request."""

from __future__ import annotations

import os
import json
from typing import Any

import pytest

import httpx

from smile_llm import LanguageModel
from smile_llm.server import ServerSettings, create_app

from .conftest import LiveServer, wait_unbound

schemathesis = pytest.importorskip("schemathesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

EXAMPLES = 25 if os.environ.get("SMILE_TEST_SCALE", "full") == "ci" else 120


@pytest.fixture(scope="module")
def api_schema(chat_model: LanguageModel) -> Any:
    app = create_app(chat_model, ServerSettings(model_name="smile-test", max_tokens=8, max_n=2))
    return schemathesis.openapi.from_asgi("/openapi.json", app)


def operations(schema: Any) -> list[Any]:
    return [result.ok() for result in schema.get_all_operations()]


def test_no_input_is_a_server_error(api_schema: Any, chat_model: LanguageModel) -> None:
    ops = operations(api_schema)
    assert {op.path for op in ops} >= {"/v1/chat/completions", "/v1/completions", "/tokenize", "/detokenize",
                                       "/v1/models", "/health", "/metrics"}
    for op in ops:
        @given(op.as_strategy())
        @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                  suppress_health_check=list(HealthCheck))
        def one(case: Any) -> None:
            response = case.call()
            assert response.status_code < 500, (case.method, case.path, case.body, response.text)
            if response.status_code >= 400:
                body = response.json()
                assert set(body) == {"error"} and isinstance(body["error"]["message"], str), response.text
            wait_unbound(chat_model)

        one()


def test_the_loop_is_alive_afterwards(chat_model: LanguageModel) -> None:
    assert chat_model.generate("x", 3, temperature=0).tokens == chat_model.generate("x", 3, temperature=0).tokens
    wait_unbound(chat_model)
    chat_model.pool.check_invariants()


def _chain(n: int) -> dict[str, Any]:
    defs: dict[str, Any] = {f"d{i}": {"$ref": f"#/$defs/d{i + 1}"} for i in range(n)}
    defs[f"d{n}"] = {"type": "integer"}
    return {"$defs": defs, "$ref": "#/$defs/d0"}


def _any_of(depth: int, width: int) -> dict[str, Any]:
    """``width ** depth`` alternatives in a few hundred bytes: each level refers to the one below ``width``
    times."""
    defs: dict[str, Any] = {"a0": {"type": "integer"}}
    for i in range(1, depth + 1):
        defs[f"a{i}"] = {"anyOf": [{"$ref": f"#/$defs/a{i - 1}"}] * width}
    return {"$defs": defs, "$ref": f"#/$defs/a{depth}"}


SCHEMAS = [{"$ref": "#"}, {"type": "object", "properties": {"a": {"$ref": "#"}}, "required": ["a"]}, _chain(3000),
           _chain(200), _any_of(8, 10), {"type": "nope"}, {"type": "object", "additionalProperties": {"$ref": "#"}},
           {"type": "array", "items": {"$ref": "#/$defs/missing"}}, {"enum": []}]
GRAMMARS = ["start: r0\n" + "\n".join(f"r{i}: r{i + 1}" for i in range(3000)) + '\nr3000: "x"',
            "start: " + "(" * 5000 + '"x"' + ")" * 5000, 'start: "a"+ "b"*', "start: start"]
DEEP = "[" * 100_000 + "]" * 100_000
HOSTILE = [
    ("max_tokens", [True, "3", 3.5, -1, 10**30, [], None]),
    ("n", [True, "2", 0, 10**6, {}]),
    ("stream", ["yes", 1, [], None]),
    ("temperature", [True, "1", float("inf"), -5, {}]),
    ("stop", [5, [5], [""] * 1000, {"a": 1}, "x" * 10_000]),
    ("seed", [True, "1", 10**30, -(10**30)]),
    ("logit_bias", [{"x": 1}, {"1": "a"}, [1], {str(i): 100 for i in range(5000)}]),
    ("messages", [[5], [{"role": "user", "content": [5]}], [{"role": "user", "content": [{"type": "text",
                                                                                          "text": 5}]}],
                  [{"role": 5, "content": "x"}], [{"role": "user", "content": {"a": 1}}], "hi", []]),
    ("tools", [[5], ["f"], [{"type": "function", "function": "f"}], {"a": 1},
               [{"type": "function", "function": {"name": "f", "parameters": s_}} for s_ in SCHEMAS[:3]]]),
    ("tool_choice", [{"type": "function", "function": "f"}, None, ["required"], 5, "required",
                     {"type": "function", "function": {"name": ["f"]}}]),
    ("parallel_tool_calls", ["no", 1, None]),
    ("response_format", [{"type": "json_schema", "json_schema": {"name": "x", "schema": s_}} for s_ in SCHEMAS]
     + [{"type": "xml"}, "json", {"type": "json_schema", "json_schema": "x"}]),
    ("json_schema", SCHEMAS + ["{not json", 5]),
    ("grammar", GRAMMARS + [5, ""]),
    ("regex", ["(" * 5000 + ")" * 5000, "a{1000}{1000}{1000}", 5]),
    ("prompt", [[10**9], [-1], [True], 5, {"a": 1}]),
]


@st.composite
def hostile_bodies(draw: Any) -> tuple[str, str]:
    """A valid chat or completion body with one to three fields replaced by hostile values, as JSON text."""
    chat = draw(st.booleans())
    body: dict[str, Any] = {"model": "smile-test", "max_tokens": 4}
    body.update({"messages": [{"role": "user", "content": "hi"}]} if chat else {"prompt": "x"})
    for field, values in draw(st.lists(st.sampled_from(HOSTILE), min_size=1, max_size=3,
                                       unique_by=lambda h: h[0])):
        body[field] = draw(st.sampled_from(values))
    deep = draw(st.sampled_from([None, "messages", "max_tokens", "tools"]))
    text = json.dumps(body)
    if deep is not None:  # too deep for json.dumps: spliced into the text
        text = text[:-1] + f', "{deep}": {DEEP}' + "}"
    return ("/v1/chat/completions" if chat else "/v1/completions"), text


@pytest.fixture(scope="module")
def fuzzed(chat_model: LanguageModel) -> Any:
    server = LiveServer(create_app(chat_model, ServerSettings(model_name="smile-test", max_tokens=8, max_n=2)))
    yield server
    server.stop()


def test_no_hostile_body_is_a_server_error(fuzzed: LiveServer, chat_model: LanguageModel) -> None:
    with httpx.Client(timeout=60) as client:
        @given(hostile_bodies())
        @settings(max_examples=EXAMPLES * 4, deadline=None, derandomize=True, database=None,
                  suppress_health_check=list(HealthCheck))
        def one(case: tuple[str, str]) -> None:
            path, text = case
            r = client.post(fuzzed.url + path, content=text, headers={"content-type": "application/json"})
            assert r.status_code < 500, (path, text[:300], r.text)
            if r.status_code >= 400:
                body = r.json()
                assert set(body) == {"error"} and isinstance(body["error"]["message"], str), r.text
            wait_unbound(chat_model)

        one()
    r = httpx.post(fuzzed.url + "/v1/completions", json={"prompt": "x", "max_tokens": 2}, timeout=60)
    assert r.status_code == 200
