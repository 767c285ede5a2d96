"""Chat from Java against Python's ``encode_chat`` and ``chat`` on the same conversation: Smile's
``encodeChat(Message...)`` and ``chat(Message[], ...)``, and the bridge's list forms
(``smile.llm.Message`` mixed with ``smile.llm.python.ChatMessage``) through a template that reads
every optional field (tool calls with nested arguments, reasoning, tool call ids, tools, thinking on
and off); the Java-side checks are ``bridgetest.ChatScenarios``."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from typing import Any

import pytest

from .conftest import Jvm, require_java, scenario_names

require_java()

from .test_scenarios import run  # noqa: E402 - after require_java

SCENARIOS = scenario_names("ChatScenarios.java")

TEMPLATE = """{%- if tools %}
{{- '<|im_start|>system\\n# Tools\\n' }}
{%- for tool in tools %}
{{- tool | tojson }}
{{- '\\n' }}
{%- endfor %}
{{- '<|im_end|>\\n' }}
{%- endif %}
{%- for message in messages %}
{%- if message.role not in ['system', 'user', 'assistant', 'tool'] %}
{{- raise_exception('unknown role: ' + message.role) }}
{%- endif %}
{{- '<|im_start|>' + message.role + '\\n' }}
{%- if message.reasoning_content %}
{{- '<think>\\n' + message.reasoning_content + '\\n</think>\\n' }}
{%- endif %}
{%- if message.content %}
{{- message.content }}
{%- endif %}
{%- for call in message.tool_calls or [] %}
{{- '\\n<tool_call>\\n' + {'name': call.function.name, 'arguments': call.function.arguments} | tojson }}
{{- '\\n</tool_call>' }}
{%- endfor %}
{%- if message.tool_call_id %}
{{- ' [' + message.tool_call_id + ']' }}
{%- endif %}
{{- '<|im_end|>\\n' }}
{%- endfor %}
{%- if add_generation_prompt %}
{{- '<|im_start|>assistant\\n' }}
{%- if enable_thinking is defined and enable_thinking is false %}
{{- '<think>\\n\\n</think>\\n\\n' }}
{%- endif %}
{%- endif %}"""

ARGUMENTS = {"prefix": "the fox", "limit": 3, "exact": True, "score": 2.5, "tags": ["a", "b"], "none": None,
             "ids": [1, 2], "big": 1 << 40}
CONVERSATION = [  # ChatScenarios.conversation()
    {"role": "system", "content": "the radix tree remembers every prefix"},
    {"role": "user", "content": "the quick brown fox jumps über"},
    {"role": "assistant", "content": None,
     "tool_calls": [{"type": "function", "function": {"name": "lookup", "arguments": ARGUMENTS}}],
     "reasoning_content": "look it up first"},
    {"role": "tool", "content": "paged attention keeps keys", "tool_call_id": "call_1"},
    {"role": "user", "content": "tokens flow from the prompt into the cache"},
]
TOOLS = [{"type": "function", "function": {"name": "lookup", "description": "finds a prefix ü",
                                           "parameters": {"type": "object", "properties": {}}}}]
TEMPLATE_VARS: dict[str, dict[str, Any]] = {  # ChatScenarios.templateVars(name)
    "none": {}, "no_thinking": {"enable_thinking": False}, "tools_thinking": {"tools": TOOLS, "enable_thinking": True}}


@pytest.fixture(scope="module")
def chat_model(jvm: Jvm, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The default model with ``TEMPLATE`` as its chat template, registered for Java as "chatModel"."""
    from java_bridge.adapters import LanguageModelAdapter
    from smile_llm import LanguageModel
    from smile_llm.models.shipped import DEFAULT_MODEL_DIR

    folder = tmp_path_factory.mktemp("chat_model")
    for f in ("config.json", "model.safetensors", "smile_tokenizer.json"):
        shutil.copy(DEFAULT_MODEL_DIR / f, folder / f)
    (folder / "chat_template.jinja").write_text(TEMPLATE, encoding="utf-8")
    model = LanguageModel.from_pretrained(folder, max_seq_len=1024, max_batch_size=2)
    jvm.bridge.register("chatModel", LanguageModelAdapter(model))
    yield model
    model.close()


DIALOG = [  # ChatScenarios.dialog(): Smile's Message[]
    {"role": "system", "content": "the radix tree remembers every prefix"},
    {"role": "user", "content": "the quick brown fox jumps über"},
    {"role": "assistant", "content": "paged attention keeps keys"},
    {"role": "user", "content": "tokens flow from the prompt into the cache"},
]


def drivers(jvm: Jvm) -> Any:
    return jvm.cls("bridgetest.ChatScenarios")


def test_java_messages_become_the_python_dicts(jvm: Jvm, chat_model: Any) -> None:
    """Every value kind in the optional fields arrives with its Python type (json.dumps tells True from 1)."""
    from java_bridge.adapters.chat import python_messages

    got = python_messages(drivers(jvm).conversation())
    assert json.dumps(got) == json.dumps(CONVERSATION)


@pytest.mark.parametrize("generation_prompt", [True, False])
@pytest.mark.parametrize("variables", sorted(TEMPLATE_VARS))
def test_encode_chat_equals_python(jvm: Jvm, chat_model: Any, generation_prompt: bool, variables: str) -> None:
    got = [int(t) for t in drivers(jvm).encodeChat(generation_prompt, variables)]
    want = chat_model.encode_chat(CONVERSATION, add_generation_prompt=generation_prompt,
                                  **TEMPLATE_VARS[variables])
    assert got == want
    assert "über" in chat_model.decode(got) and "<tool_call>" in chat_model.decode(got)


@pytest.mark.parametrize("variables", ["no_thinking", "tools_thinking"])
def test_chat_equals_python_chat(jvm: Jvm, chat_model: Any, variables: str) -> None:
    c = drivers(jvm).chat(variables, 6)  # the listener's text and the prompt are checked in Java
    kwargs = dict(TEMPLATE_VARS[variables])
    py = chat_model.chat(CONVERSATION, 6, tools=kwargs.pop("tools", None), chat_template_kwargs=kwargs)
    assert [int(t) for t in c.tokens()] == py.tokens
    assert str(c.text()) == py.text and str(c.finishReason()) == py.finish_reason
    assert chat_model.pool.bound_request_count == 0


def test_smile_encode_chat_equals_python(jvm: Jvm, chat_model: Any) -> None:
    """Smile's ``encodeChat(Message...)``: each Role's name is the template's role."""
    from java_bridge.adapters.chat import python_messages

    assert python_messages(drivers(jvm).dialog()) == DIALOG
    got = [int(t) for t in drivers(jvm).encodeDialog()]  # varargs, array and list forms agree
    assert got == chat_model.encode_chat(DIALOG)


@pytest.mark.parametrize("logprobs", [False, True])
def test_smile_chat_equals_python_chat(jvm: Jvm, chat_model: Any, logprobs: bool) -> None:
    """Smile's ``chat(Message[], ...)`` (greedy) returns Python's ``chat`` as a ChatCompletion."""
    # the listener's text, the prompt and equality with generate are checked in Java
    c = drivers(jvm).chatDialog(6, logprobs)
    py = chat_model.chat(DIALOG, 6, logprobs=logprobs)
    assert [int(t) for t in c.completionTokens()] == py.tokens
    assert [int(t) for t in c.promptTokens()] == py.prompt_tokens
    assert str(c.content()) == py.text and str(c.reason().name()) == py.finish_reason
    assert str(c.model()) == chat_model.folder.name
    if logprobs:
        assert py.logprobs is not None
        assert [float(x) for x in c.logprobs()] == pytest.approx(py.logprobs, abs=1e-4)
    else:
        assert c.logprobs() is None
    assert chat_model.pool.bound_request_count == 0


@pytest.mark.parametrize("name", SCENARIOS)
def test_chat_scenario(jvm: Jvm, chat_model: Any, plain_model: Any, name: str) -> None:
    run(jvm, "ChatScenarios", name)
    for model in (chat_model, plain_model, jvm.model):
        assert model.pool.bound_request_count == 0
        assert model.serving_loop.num_waiting == 0 and model.serving_loop.num_running == 0
        model.pool.check_invariants()


def test_scenario_names_match_java(jvm: Jvm) -> None:
    assert sorted(SCENARIOS) == [str(n) for n in jvm.cls("bridgetest.Scenarios").names("bridgetest.ChatScenarios")]
    assert len(SCENARIOS) >= 3

