"""The official ``openai`` client against a live server: chat and completions, sync, async and streaming; ``n``,
stop and seed; ``json_schema`` through ``response_format`` (the output validates); usage with the prefix cache's
cached tokens; the project's own fields through ``extra_body``; and seeded outputs through HTTP equal in-process
``generate`` on the same model."""

from __future__ import annotations

import asyncio
import json

import jsonschema
import pytest

from smile_llm import LanguageModel

from .conftest import LiveServer, wait_unbound

openai = pytest.importorskip("openai")

MESSAGES = [{"role": "system", "content": "You write short answers."}, {"role": "user", "content": "Name a color."}]
PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 99}},
          "required": ["name", "age"], "additionalProperties": False}


def client(live: LiveServer) -> "openai.OpenAI":
    return openai.OpenAI(base_url=f"{live.url}/v1", api_key="unused", max_retries=0, timeout=60)


def test_chat_equals_in_process_generate(live: LiveServer, chat_model: LanguageModel) -> None:
    out = client(live).chat.completions.create(model="smile-test", messages=MESSAGES, max_tokens=24,
                                                temperature=0.8, seed=11)
    ids = chat_model.encode_chat(MESSAGES)
    expected = chat_model.generate(ids, 24, temperature=0.8, seed=11)
    assert out.choices[0].message.content == expected.text and out.choices[0].message.role == "assistant"
    assert out.choices[0].finish_reason == expected.finish_reason
    assert out.usage.prompt_tokens == len(ids) and out.usage.completion_tokens == len(expected.tokens)
    assert out.model == "smile-test" and out.id.startswith("chatcmpl-")
    wait_unbound(chat_model)


def test_completions_stop_n_and_seed(live: LiveServer, chat_model: LanguageModel) -> None:
    c = client(live)
    out = c.completions.create(model="smile-test", prompt="def main():\n", max_tokens=20, temperature=1.0, seed=3,
                               n=3, stop=["\n\n"])
    assert [ch.index for ch in out.choices] == [0, 1, 2]
    expected = chat_model.generate("def main():\n", 20, temperature=1.0, seed=3, n=3, stop=["\n\n"])
    assert [ch.text for ch in out.choices] == [e.text for e in expected]
    assert all("\n\n" not in ch.text for ch in out.choices)
    again = c.completions.create(model="smile-test", prompt="def main():\n", max_tokens=20, temperature=1.0, seed=3,
                                 n=3, stop=["\n\n"])
    assert [ch.text for ch in again.choices] == [ch.text for ch in out.choices]


def test_streaming_chat_and_completions(live: LiveServer, chat_model: LanguageModel) -> None:
    c = client(live)
    whole = c.chat.completions.create(model="smile-test", messages=MESSAGES, max_tokens=30, temperature=0)
    chunks = list(c.chat.completions.create(model="smile-test", messages=MESSAGES, max_tokens=30, temperature=0,
                                            stream=True, stream_options={"include_usage": True}))
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == whole.choices[0].message.content
    finals = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
    assert finals == [whole.choices[0].finish_reason]
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    streamed = "".join(ch.choices[0].text for ch in c.completions.create(
        model="smile-test", prompt="import os\n", max_tokens=25, temperature=0, stream=True))
    assert streamed == chat_model.generate("import os\n", 25).text
    wait_unbound(chat_model)


def test_async_client_concurrently(live: LiveServer, chat_model: LanguageModel) -> None:
    async def run() -> list[str]:
        ac = openai.AsyncOpenAI(base_url=f"{live.url}/v1", api_key="unused", max_retries=0, timeout=60)
        outs = await asyncio.gather(*[ac.completions.create(model="smile-test", prompt=f"x = {i}\n", max_tokens=16,
                                                            temperature=0) for i in range(6)])
        await ac.close()
        return [o.choices[0].text for o in outs]

    got = asyncio.run(run())
    assert got == [chat_model.generate(f"x = {i}\n", 16).text for i in range(6)]
    wait_unbound(chat_model)


def test_json_schema_response_format_validates(live: LiveServer) -> None:
    out = client(live).chat.completions.create(
        model="smile-test", messages=MESSAGES, max_tokens=60, temperature=1.0, seed=5,
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}})
    jsonschema.validate(json.loads(out.choices[0].message.content), PERSON)
    out = client(live).chat.completions.create(model="smile-test", messages=MESSAGES, max_tokens=60,
                                                response_format={"type": "json_object"}, temperature=0)
    assert isinstance(json.loads(out.choices[0].message.content), dict)


def test_usage_reports_cached_tokens(live: LiveServer) -> None:
    c = client(live)
    long = [{"role": "system", "content": "You are a careful assistant. " * 8}, {"role": "user", "content": "Hi."}]
    c.chat.completions.create(model="smile-test", messages=long, max_tokens=4, temperature=0)
    again = c.chat.completions.create(model="smile-test", messages=long, max_tokens=4, temperature=0)
    assert again.usage.prompt_tokens_details.cached_tokens >= 64


def test_project_fields_through_extra_body(live: LiveServer, chat_model: LanguageModel) -> None:
    out = client(live).completions.create(model="smile-test", prompt="for i in", max_tokens=20, temperature=0,
                                          extra_body={"speculative_tokens": 0, "regex": " range\\([0-9]\\):"})
    assert out.choices[0].text == chat_model.generate("for i in", 20, regex=" range\\([0-9]\\):").text
    assert out.choices[0].text.startswith(" range(")


def test_logprobs(live: LiveServer, chat_model: LanguageModel) -> None:
    out = client(live).chat.completions.create(model="smile-test", messages=MESSAGES, max_tokens=5, temperature=0,
                                                logprobs=True, top_logprobs=3)
    content = out.choices[0].logprobs.content
    expected = chat_model.generate(chat_model.encode_chat(MESSAGES), 5, logprobs=3)
    assert [e.logprob for e in content] == pytest.approx(expected.logprobs, abs=1e-6)
    assert all(len(e.top_logprobs) == 3 for e in content)


def test_ignore_eos_runs_to_max_tokens(live: LiveServer, chat_model: LanguageModel) -> None:
    out = client(live).completions.create(model="smile-test", prompt="x", max_tokens=40, temperature=0,
                                          extra_body={"ignore_eos": True})
    assert out.usage.completion_tokens == 40 and out.choices[0].finish_reason == "length"
    assert out.choices[0].text == chat_model.generate("x", 40, min_new_tokens=40).text
