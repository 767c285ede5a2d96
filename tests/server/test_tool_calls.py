"""Tool calls through the API, as OpenAI defines them: ``tool_choice="required"`` and a named function force the
Qwen/Hermes ``<tool_call>{json}</tool_call>`` format through structured generation; the parsed calls' arguments
equal the model's own tool-call text (in-process, the same grammar) and validate against the tool's parameters; a
named function and ``parallel_tool_calls=false`` give exactly one call and ``finish_reason="tool_calls"``; a reply
cut by ``max_tokens`` inside a call says "length" and never returns the partial markup; undeclared argument keys
are refused; streamed tool-call deltas add up to the plain response; the parser holds back a block until it is
complete; malformed tools and choices are 400s naming the field."""

from __future__ import annotations

import json

import jsonschema
import pytest

from smile_llm import LanguageModel
from smile_llm.server.tool_calls import ToolCall, ToolCallParser, ToolChoice, split_reply

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
    grammar = ToolChoice.of(TOOLS, choice).grammar()
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
    assert message.content is None and "<tool_call>" not in text[len(text.rstrip()):]
    assert out.choices[0].finish_reason in ("tool_calls", "length")
    if isinstance(choice, dict):  # a named function: exactly one call, then the reply ends
        assert len(message.tool_calls) == 1 and out.choices[0].finish_reason == "tool_calls"


@pytest.mark.parametrize("seed", [1, 4, 7])
def test_no_parallel_calls_gives_exactly_one_call_and_ends(live: LiveServer, seed: int) -> None:
    out = client(live).chat.completions.create(model="smile-test", messages=MESSAGES, tools=TOOLS,
                                                tool_choice="required", parallel_tool_calls=False,
                                                max_tokens=300, temperature=1.0, seed=seed)
    choice = out.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    assert len(choice.message.tool_calls) == 1
    call = choice.message.tool_calls[0]
    schema = {"get_weather": WEATHER, "get_time": TOOLS[1]["function"]["parameters"]}[call.function.name]
    jsonschema.validate(json.loads(call.function.arguments), schema)


def test_a_reply_cut_inside_a_call_says_length_without_markup(live: LiveServer) -> None:
    for stream in (False, True):
        kw = dict(model="smile-test", messages=MESSAGES, tools=TOOLS, tool_choice="required", max_tokens=12,
                  temperature=0)
        if not stream:
            choice = client(live).chat.completions.create(**kw).choices[0]
            content, calls, reason = choice.message.content, choice.message.tool_calls or [], choice.finish_reason
        else:
            content, calls, reasons = "", [], []
            for chunk in client(live).chat.completions.create(stream=True, **kw):
                for ch in chunk.choices:
                    content += ch.delta.content or ""
                    calls.extend(ch.delta.tool_calls or [])
                    reasons += [ch.finish_reason] if ch.finish_reason else []
            reason = reasons[0]
        assert reason == "length" and calls == [], (stream, reason, calls)
        assert "<tool" not in (content or "") and "{" not in (content or ""), (stream, content)


def test_undeclared_argument_keys_are_refused(live: LiveServer) -> None:
    """A tool whose parameters schema does not say ``additionalProperties``: its calls hold only the declared
    keys, each at most once (the rule of vLLM's and SGLang's default grammar backend)."""
    open_tool = [{"type": "function", "function": {"name": "lookup", "parameters": {
        "type": "object", "properties": {"in": {"type": "string", "maxLength": 6}}}}}]
    for seed in range(4):
        out = client(live).chat.completions.create(
            model="smile-test", messages=[{"role": "user", "content": "Look it up: in in in"}], tools=open_tool,
            tool_choice="required", parallel_tool_calls=False, max_tokens=120, temperature=1.0, seed=seed)
        call = out.choices[0].message.tool_calls[0]
        pairs = json.loads(call.function.arguments, object_pairs_hook=lambda kv: kv)
        assert {k for k, _ in pairs} <= {"in"} and len(pairs) == len({k for k, _ in pairs}), pairs


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


@pytest.mark.parametrize("kw, param", [
    ({"tools": [{"type": "function", "function": {}}]}, "tools.0"),
    ({"tools": ["get_weather"]}, "tools.0"),
    ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": "f"}}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": ["get_time"]}}}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": {"type": "other", "function": {"name": "get_time"}}}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": ["required"]}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": 3}, "tool_choice"),
    ({"tools": TOOLS, "parallel_tool_calls": "no"}, "parallel_tool_calls"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}}, "tool_choice")])
def test_bad_tools_and_choices_are_400_naming_the_field(live: LiveServer, kw: dict[str, object], param: str) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client(live).chat.completions.create(model="smile-test", messages=MESSAGES, max_tokens=4,
                                             extra_body=kw)
    assert caught.value.body["param"] == param, caught.value.body


def test_a_null_tool_choice_is_auto(live: LiveServer, chat_model: LanguageModel) -> None:
    out = client(live).chat.completions.create(model="smile-test", messages=MESSAGES, max_tokens=8,
                                                temperature=0, extra_body={"tools": TOOLS, "tool_choice": None})
    text = chat_model.generate(chat_model.encode_chat(MESSAGES, tools=TOOLS), 8).text
    assert out.choices[0].message.content == split_reply(text, "length")[0]


def test_auto_and_none_keep_plain_replies(live: LiveServer, chat_model: LanguageModel) -> None:
    for choice in ("auto", "none"):
        out = client(live).chat.completions.create(model="smile-test", messages=MESSAGES, tools=TOOLS,
                                                    tool_choice=choice, max_tokens=20, temperature=0)
        tools = TOOLS if choice == "auto" else None
        completion = chat_model.generate(chat_model.encode_chat(MESSAGES, tools=tools), 20)
        assert out.choices[0].message.content == split_reply(completion.text, completion.finish_reason)[0]


def test_the_parser_holds_back_a_block_until_it_is_complete() -> None:
    p = ToolCallParser()
    reply = 'ok <tool_c <tool_call>\n{"name": "f", "arguments": {"a": [1, "</tool"]}}\n</tool_call> done'
    parts = [part for ch in reply for part in p.feed(ch)] + p.finish()
    text = "".join(x for x in parts if isinstance(x, str))
    calls = [x for x in parts if isinstance(x, ToolCall)]
    assert text == "ok <tool_c  done" and len(calls) == 1
    assert calls[0].name == "f" and json.loads(calls[0].arguments) == {"a": [1, "</tool"]}
    assert split_reply('<tool_call>{"oops"}</tool_call>') == ('<tool_call>{"oops"}</tool_call>', [])


def test_an_unfinished_block_is_never_content() -> None:
    for reason in ("stop", "length"):
        assert split_reply('hi <tool_call>{"name": "g"', reason) == ("hi ", [])
    assert split_reply("a <tool_ca", "length") == ("a ", []) and split_reply("a <tool_ca", "stop") == ("a <tool_ca", [])
    done = '<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>\n<tool_call>\n{"name": "f", "argu'
    content, calls = split_reply(done, "length")
    assert content is None and [(c.name, c.arguments) for c in calls] == [("f", '{"x": 1}')]


def test_the_stop_string_closes_the_one_call_of_auto_without_parallel_calls() -> None:
    choice = ToolChoice.of(TOOLS, "auto", False)
    assert choice.stop_texts() == ["</tool_call>"] and choice.max_calls == 1
    assert ToolChoice.of(TOOLS, "auto").stop_texts() == [] and ToolChoice.of(TOOLS, "required", False).stop_texts() == []
    text = 'Sure. <tool_call>\n{"name": "get_time", "arguments": {"zone": "UTC"}}\n'  # the stop string cut here
    content, calls = split_reply(text, "stop", choice.max_calls, closed_by_stop=True)
    assert content == "Sure." and [(c.name, c.arguments) for c in calls] == [("get_time", '{"zone": "UTC"}')]
    parser = ToolCallParser(max_calls=1)
    two = '<tool_call>{"name": "a"}</tool_call> and <tool_call>{"name": "b"}</tool_call> tail'
    parts = parser.feed(two) + parser.finish()
    assert [p.name for p in parts if isinstance(p, ToolCall)] == ["a"] and parts[1:] == []


def test_a_block_nested_too_deeply_stays_text() -> None:
    deep = "<tool_call>" + '{"name": "f", "arguments": ' + "[" * 100_000 + "]" * 100_000 + "}</tool_call>"
    content, calls = split_reply(deep)
    assert calls == [] and content == deep
    huge = '<tool_call>{"name": "f", "arguments": {"n": ' + "9" * 5000 + "}}</tool_call>"
    assert split_reply(huge) == (huge, [])


def test_the_grammars_of_each_choice() -> None:
    named = ToolChoice.of(TOOLS, {"type": "function", "function": {"name": "get_time"}}).grammar()
    assert named is not None and named.startswith("start: call\n") and "get_weather" not in named
    one = ToolChoice.of(TOOLS, "required", False).grammar()
    many = ToolChoice.of(TOOLS, "required").grammar()
    assert one is not None and one.startswith("start: call\n") and "get_weather" in one and "get_time" in one
    assert many is not None and many.startswith('start: call ("\\n" call)*\n')
    assert ToolChoice.of(TOOLS, "auto").grammar() is None and ToolChoice.of(TOOLS, "none").grammar() is None
    assert not ToolChoice.of(TOOLS, "none").templated and not ToolChoice.of(None, None).templated
