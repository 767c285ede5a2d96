"""A property-based fuzz of the whole HTTP API from its own OpenAPI schema (``schemathesis``, through the ASGI app
in process): whatever body, header or path parameter it generates, no answer is a 5xx, every error is an OpenAI
error object, and afterwards the serving loop still answers and no request is left bound. Bounded: examples per
operation (small at CI scale), server limits of 8 tokens and 2 samples per request."""

from __future__ import annotations

import os
from typing import Any

import pytest

from smile_llm import LanguageModel
from smile_llm.server import ServerSettings, create_app

from .conftest import wait_unbound

schemathesis = pytest.importorskip("schemathesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402

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
