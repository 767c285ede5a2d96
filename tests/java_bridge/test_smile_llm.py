"""Smile's ``smile.llm`` model API on the bridge: ``LanguageModel`` member for member as Smile
declares it, Smile's value types (``Message``, ``Role``, ``FinishReason``, ``ChatCompletion``,
asserted in Java by ``bridgetest.SmileRecordScenarios``), a model written against Smile's
interface alone (``smilestyle.EchoLanguageModel``) and application code that knows only Smile's
names (``smilestyle.SmileLlmClient``) running on the Python-backed model: greedy output equal to
Python's token for token, cancellation, and eight Java threads each getting its single-thread
output."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from .conftest import JAVA_TESTS, Jvm, require_java, scenario_names

require_java()

from .test_scenarios import run  # noqa: E402 - after require_java

SCENARIOS = scenario_names("SmileRecordScenarios.java")
NEW_TOKENS = 8 if os.environ.get("SMILE_TEST_SCALE", "full") == "ci" else 24
LISTENER = "smile.llm.GenerationListener"
CANCEL = "java.util.function.BooleanSupplier"
SAMPLING = ("int", "double", "double", "boolean", "long")
# Smile's interface (torch branch): (name, parameter types, return type, default?)
SMILE_LANGUAGE_MODEL = {
    ("family", (), "java.lang.String", False),
    ("name", (), "java.lang.String", False),
    ("maxSeqLen", (), "int", False),
    ("encodeChat", ("[Lsmile.llm.Message;",), "[I", False),
    ("generate", ("[I", *SAMPLING, LISTENER), "smile.llm.ChatCompletion", True),
    ("generate", ("[I", *SAMPLING, LISTENER, CANCEL), "smile.llm.ChatCompletion", False),
    ("chat", ("[Lsmile.llm.Message;", *SAMPLING, LISTENER), "smile.llm.ChatCompletion", True),
    ("chat", ("[Lsmile.llm.Message;", *SAMPLING, LISTENER, CANCEL), "smile.llm.ChatCompletion",
     False),
}


def client(jvm: Jvm) -> Any:
    return jvm.cls("smilestyle.SmileLlmClient")


def rows(jvm: Jvm, prompts: list[list[int]]) -> Any:
    return jvm.jpype.JArray(jvm.jpype.JInt, 2)([jvm.jpype.JArray(jvm.jpype.JInt)(p)
                                                for p in prompts])


def java_call(jvm: Jvm, fn: Any, *args: Any) -> Any:
    """``fn(*args)``; a Java exception fails the test with its Java stack trace."""
    try:
        return fn(*args)
    except jvm.jpype.JException as exc:
        pytest.fail(f"{fn} failed in Java:\n{exc.stacktrace()}", pytrace=False)


def test_language_model_is_smiles_interface_member_for_member(jvm: Jvm) -> None:
    """The same methods, parameter and return types, the same two default methods, varargs
    ``encodeChat``, no super-interface: a class implementing Smile's interface implements this
    one."""
    iface = jvm.cls("smile.llm.LanguageModel").class_
    got = {(str(m.getName()), tuple(str(p.getName()) for p in m.getParameterTypes()),
            str(m.getReturnType().getName()), bool(m.isDefault()))
           for m in iface.getDeclaredMethods()}
    assert got == SMILE_LANGUAGE_MODEL
    assert len(iface.getDeclaredMethods()) == len(SMILE_LANGUAGE_MODEL)
    assert [bool(m.isVarArgs()) for m in iface.getDeclaredMethods()
            if str(m.getName()) == "encodeChat"] == [True]
    assert len(iface.getInterfaces()) == 0 and len(iface.getDeclaredFields()) == 0
    sub = jvm.cls("smile.llm.python.PythonLanguageModel").class_
    assert iface.isAssignableFrom(sub)
    bridge = jvm.cls("smile.llm.python.Bridge").class_
    assert str(bridge.getMethod("languageModel").getReturnType().getName()) == sub.getName()


def test_value_types_have_smiles_components_and_constants(jvm: Jvm) -> None:
    def components(name: str) -> list[tuple[str, str]]:
        return [(str(c.getName()), str(c.getType().getName()))
                for c in jvm.cls(name).class_.getRecordComponents()]

    assert components("smile.llm.Message") == [("role", "smile.llm.Role"),
                                               ("content", "java.lang.String")]
    assert components("smile.llm.ChatCompletion") == [
        ("model", "java.lang.String"), ("content", "java.lang.String"), ("promptTokens", "[I"),
        ("completionTokens", "[I"), ("reason", "smile.llm.FinishReason"), ("logprobs", "[F")]
    assert [str(r.name()) for r in jvm.cls("smile.llm.Role").values()] == [
        "system", "user", "assistant", "ipython"]
    assert [str(r.name()) for r in jvm.cls("smile.llm.FinishReason").values()] == [
        "stop", "length", "function_call", "content_filter"]
    ctors = jvm.cls("smile.llm.Message").class_.getConstructors()
    assert [[str(p.getName()) for p in c.getParameterTypes()] for c in ctors] == [
        ["smile.llm.Role", "java.lang.String"]]


@pytest.mark.parametrize("name", SCENARIOS)
def test_smile_record_scenario(jvm: Jvm, name: str) -> None:
    run(jvm, "SmileRecordScenarios", name)


def test_scenario_names_match_java(jvm: Jvm) -> None:
    names = jvm.cls("bridgetest.Scenarios").names("bridgetest.SmileRecordScenarios")
    assert sorted(SCENARIOS) == [str(n) for n in names]
    assert len(SCENARIOS) >= 5


def test_a_model_written_against_smiles_interface_compiles_against_the_jar_alone(
        jvm: Jvm, tmp_path: Path) -> None:
    """``EchoLanguageModel`` implements exactly Smile's abstract members; with the client that knows
    only Smile's names it compiles with nothing but the bridge jar on the class path, and the
    client's checks pass on it (Smile's default methods call the full forms)."""
    from java_bridge.build import bridge_jar, compile_java

    sources = [JAVA_TESTS / "smilestyle" / f for f in ("EchoLanguageModel.java",
                                                        "SmileLlmClient.java")]
    out = compile_java(sources, tmp_path / "classes", classpath=[bridge_jar()])
    assert (out / "smilestyle" / "EchoLanguageModel.class").is_file()
    calls = str(java_call(jvm, client(jvm).checkEcho))
    assert calls == "generate,generate+cancel,chat,encodeChat,generate,encodeChat"


@pytest.mark.parametrize("logprobs", [False, True])
def test_smile_generate_on_the_bridge_equals_python(jvm: Jvm, logprobs: bool) -> None:
    prompt = jvm.model.encode("def fib(n):\n")
    lm = jvm.bridge.languageModel()
    c = java_call(jvm, client(jvm).generate, lm, prompt, NEW_TOKENS, logprobs)
    py = jvm.model.generate(prompt, NEW_TOKENS, logprobs=logprobs)
    assert [int(t) for t in c.completionTokens()] == py.tokens
    assert str(c.content()) == py.text and str(c.reason().name()) == py.finish_reason
    assert [int(t) for t in c.promptTokens()] == py.prompt_tokens and str(c.model()) == "default"
    if logprobs:
        assert py.logprobs is not None
        assert [float(x) for x in c.logprobs()] == pytest.approx(py.logprobs, abs=1e-4)
    assert jvm.model.pool.bound_request_count == 0


@pytest.mark.parametrize("polls", [0, 3])
def test_smile_generate_cancelled_on_the_bridge(jvm: Jvm, polls: int) -> None:
    """A ``cancelRequested`` that answers true ends Smile's generate with CancellationException
    (GenerationCancelled's message), the request's KV released."""
    prompt = jvm.model.encode("class Stack:\n")
    message = str(java_call(jvm, client(jvm).cancel, jvm.bridge.languageModel(), prompt, 16,
                            polls))
    assert message.startswith("aborted")
    assert jvm.model.pool.bound_request_count == 0
    jvm.model.pool.check_invariants()


def test_smile_chat_without_a_template_is_illegal_argument(jvm: Jvm, plain_model: Any) -> None:
    """A model without a chat template (the embedded one's folder without its template files):
    Smile's chat names the files looked for."""
    message = jvm.cls("smile.llm.Message")
    dialog = jvm.jpype.JArray(message)([message.user("hi")])
    plain = jvm.bridge.get("plainModel", jvm.cls("smile.llm.python.PythonLanguageModel"))
    with pytest.raises(jvm.jpype.JClass("java.lang.IllegalArgumentException"),
                       match="no chat template: looked for chat_template.jinja and 'chat_template' in "
                             "tokenizer_config.json"):
        client(jvm).chat(plain, 4, dialog)
    assert plain_model.pool.bound_request_count == 0


def test_smile_chat_on_the_embedded_model_renders_its_chatml_template(jvm: Jvm) -> None:
    """The embedded model carries a ChatML template: Smile's chat (checked in Java to equal generate
    on encodeChat) answers Python's chat on the same dialog, token for token."""
    message = jvm.cls("smile.llm.Message")
    dialog = jvm.jpype.JArray(message)([message.system("be brief"), message.user("hi")])
    c = java_call(jvm, client(jvm).chat, jvm.bridge.languageModel(), NEW_TOKENS, dialog)
    py = jvm.model.chat([{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}],
                        NEW_TOKENS)
    prompt = [int(t) for t in c.promptTokens()]
    assert bytes(prompt) == (b"<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
                             b"<|im_start|>assistant\n")
    assert prompt == py.prompt_tokens and [int(t) for t in c.completionTokens()] == py.tokens
    assert str(c.content()) == py.text
    assert jvm.model.pool.bound_request_count == 0


@pytest.mark.timeout(180, method="thread")
def test_eight_java_threads_of_a_smile_client_get_their_single_thread_output(jvm: Jvm) -> None:
    """``SmileLlmClient.concurrentGreedy`` first generates each prompt alone from one thread, then
    from eight threads at once (checked equal in Java); both equal Python's greedy output."""
    prompts = [jvm.model.encode(f"def worker_{i}(queue):\n    ") for i in range(8)]
    got = java_call(jvm, client(jvm).concurrentGreedy, jvm.bridge.languageModel(),
                    rows(jvm, prompts), NEW_TOKENS)
    assert [[int(t) for t in r] for r in got] == [jvm.model.generate(p, NEW_TOKENS).tokens
                                                  for p in prompts]
    assert jvm.model.pool.bound_request_count == 0
    jvm.model.pool.check_invariants()
