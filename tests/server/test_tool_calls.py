"""Tool calls through the API: ``tool_choice="required"`` and a named function force the Qwen/Hermes
``<tool_call>{json}</tool_call>`` format through structured generation; the parsed calls' arguments equal the
model's own tool-call text (in-process, the same grammar) and validate against the tool's parameters; streamed
tool-call deltas add up to the plain response; the parser holds back a block until it is complete."""

from __future__ import annotations

import json

import jsonschema
import pytest

from smile_llm import LanguageModel
from smile_llm.server.tool_calls import ToolCall, ToolCallParser, check_tools, split_reply, tool_grammar

from .conftest import LiveServer

openai = pytest.importorskip("openai")

WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 10},
                                            "unit": {"enum": ["C", "F"]}},
           "required": ["city", "unit"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                           "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time", "parameters": {
             "type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}}, "required": ["zone"],
             "additionalProperties": False}}}]
MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]


def client(live: LiveServer) -> "openai.OpenAI":
    return openai.OpenAI(base_url=f"{live.url}/v1", api_key="unused", max_retries=0, timeout=60)


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_time"}}])
def test_forced_tool_calls_parse_and_equal_the_model_text(live: LiveServer, chat_model: LanguageModel,
                                                         choice: object) -> None:
    out = client(live).chat.completions.create(model="smile-test", messages=MESSAGES, tools=TOOLS,
                                                tool_choice=choice, max_tokens=200, temperature=1.0, seed=4)
    message = out.choices[0].message
    grammar = tool_grammar(check_tools(TOOLS, choice), choice)
    text = chat_model.generate(chat_model.encode_chat(MESSAGES, tools=TOOLS), 200, grammar=grammar,
                               temperature=1.0, seed=4).text
    content, calls = split_reply(text)
    assert message.tool_calls and [(c.function.name, c.function.arguments) for c in message.tool_calls] == \
        [(c.name, c.arguments) for c in calls]
    for call in message.tool_calls:
        schema = {"get_weather": WEATHER, "get_time": TOOLS[1]["function"]["parameters"]}[call.function.name]
        jsonschema.validate(json.loads(call.function.arguments), schema)
        assert call.id.startswith("call_") and call.type == "function"
        if isinstance(choice, dict):
            assert call.function.name == "get_time"
    if out.choices[0].finish_reason == "stop":
        pytest.fail("a reply with tool calls ends with finish_reason tool_calls")


def test_streamed_tool_calls_add_up(live: LiveServer) -> None:
    kw = dict(model="smile-test", messages=MESSAGES, tools=TOOLS, tool_choice="required", max_tokens=200,
              temperature=1.0, seed=9)
    whole = client(live).chat.completions.create(**kw)
    calls, reasons, content = [], [], ""
    for chunk in client(live).chat.completions.create(stream=True, **kw):
        for ch in chunk.choices:
            content += ch.delta.content or ""
            calls.extend(ch.delta.tool_calls or [])
            if ch.finish_reason:
                reasons.append(ch.finish_reason)
    assert [(c.function.name, c.function.arguments) for c in calls] == \
        [(c.function.name, c.function.arguments) for c in whole.choices[0].message.tool_calls]
    assert [c.index for c in calls] == list(range(len(calls)))
    assert reasons == [whole.choices[0].finish_reason]
    assert content.strip() == (whole.choices[0].message.content or "")


def test_bad_tools_and_choices_are_400(live: LiveServer) -> None:
    c = client(live)
    for kw in ({"tools": [{"type": "function", "function": {}}]}, {"tools": TOOLS, "tool_choice": "sometimes"},
               {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
               {"tool_choice": "required"},
               {"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}}):
        with pytest.raises(openai.BadRequestError):
            c.chat.completions.create(model="smile-test", messages=MESSAGES, max_tokens=4, **kw)


def test_auto_and_none_keep_plain_replies(live: LiveServer, chat_model: LanguageModel) -> None:
    for choice in ("auto", "none"):
        out = client(live).chat.completions.create(model="smile-test", messages=MESSAGES, tools=TOOLS,
                                                    tool_choice=choice, max_tokens=20, temperature=0)
        tools = TOOLS if choice == "auto" else None
        text = chat_model.generate(chat_model.encode_chat(MESSAGES, tools=tools), 20).text
        assert out.choices[0].message.content == split_reply(text)[0]


def test_the_parser_holds_back_a_block_until_it_is_complete() -> None:
    p = ToolCallParser()
    reply = 'ok <tool_c <tool_call>\n{"name": "f", "arguments": {"a": [1, "</tool"]}}\n</tool_call> done'
    parts = [part for ch in reply for part in p.feed(ch)] + p.finish()
    text = "".join(x for x in parts if isinstance(x, str))
    calls = [x for x in parts if isinstance(x, ToolCall)]
    assert text == "ok <tool_c  done" and len(calls) == 1
    assert calls[0].name == "f" and json.loads(calls[0].arguments) == {"a": [1, "</tool"]}
    assert split_reply('<tool_call>{"oops"}</tool_call>') == ('<tool_call>{"oops"}</tool_call>', [])
    assert split_reply("<tool_call>{\"name\": \"g\"}") == ("<tool_call>{\"name\": \"g\"}", [])
