"""Structured (constrained) generation from Java: ``smile.llm.SamplingParams``'s ``jsonSchema``, ``jsonObject``,
``regex``, ``grammar`` and ``choice`` reach Python's ``SamplingParams`` (only when set); a request built in Java
source (a small driver compiled here with javac against the bridge jar) gives Python's tokens and text, greedy and
seeded at temperature 1, and its output follows the constraint; a constraint the grammar engine refuses, an empty
one or two at once is an IllegalArgumentException naming the field and quoting the engine's message, with nothing
queued."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from .conftest import Jvm, require_java

require_java()
pytest.importorskip("llguidance", reason="structured generation needs the llguidance package")

from smile_llm.errors import ConstraintError  # noqa: E402
from smile_llm.serving.request import SamplingParams  # noqa: E402

PROMPT = "def fib(n):\n"
NEW_TOKENS = 64  # every constraint below completes well within it on the default model
SEED = 7
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 8},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "kind": {"enum": ["cat", "dog"]},
        "ok": {"type": "boolean"},
    },
    "required": ["name", "age", "kind", "ok"],
    "additionalProperties": False,
}
REGEX = r"[a-z]{3}-[0-9]{2,4}"
GRAMMAR = 'start: "(" num ("," num)* ")"\nnum: /[0-9]{1,3}/'
GRAMMAR_AS_REGEX = r"\([0-9]{1,3}(,[0-9]{1,3})*\)"
CHOICES = ["yes", "no", "maybe"]
# the Python keyword and value of each constraint; the driver sets the Java field from the same text
CONSTRAINTS: dict[str, Any] = {"json_schema": SCHEMA, "json_object": True, "regex": REGEX, "grammar": GRAMMAR,
                               "choice": CHOICES}

DRIVER = r"""
import java.util.Arrays;
import java.util.List;
import smile.llm.Completion;
import smile.llm.SamplingParams;
import smile.llm.python.Bridge;
import smile.llm.python.PythonLanguageModel;

/** Structured generation as a Java application writes it. */
public final class StructuredDriver {
    private StructuredDriver() {}

    static PythonLanguageModel lm() {
        return Bridge.languageModel();
    }

    /** The settings of one constraint (Python's field name), its value as text (choices: one per line). */
    public static SamplingParams params(String field, String value, int maxNewTokens, double temperature,
                                        long seed) {
        SamplingParams.Builder b = SamplingParams.builder().maxNewTokens(maxNewTokens).temperature(temperature)
                .seed(seed);
        switch (field) {
            case "json_schema": return b.jsonSchema(value).build();
            case "json_object": return b.jsonObject(true).build();
            case "regex": return b.regex(value).build();
            case "grammar": return b.grammar(value).build();
            case "choice": return b.choice(value.split("\n")).build();
            case "choiceList": return b.choice(List.of(value.split("\n"))).build();
            default: throw new IllegalArgumentException(field);
        }
    }

    /** Two constraints at once. */
    public static SamplingParams two(String pair) {
        SamplingParams.Builder b = SamplingParams.builder().maxNewTokens(8);
        switch (pair) {
            case "regex+choice": return b.regex("[a-z]+").choice("yes", "no").build();
            case "jsonSchema+jsonObject": return b.jsonSchema("{\"type\": \"object\"}").jsonObject(true).build();
            case "grammar+regex": return b.grammar("start: \"a\"").regex("a").build();
            default: throw new IllegalArgumentException(pair);
        }
    }

    public static Completion generate(String prompt, SamplingParams params) {
        return lm().generate(lm().encode(prompt), params);
    }

    /** The text of streamText, read to its end. */
    public static String streamText(String prompt, SamplingParams params) {
        try (var chunks = lm().streamText(lm().encode(prompt), params)) {
            return String.join("", chunks.toList());
        }
    }

    /** Each call that takes settings: "generate", "submit", "stream", "streamText". */
    public static void call(String how, SamplingParams params) {
        int[] prompt = lm().encode("x");
        switch (how) {
            case "generate": lm().generate(prompt, params); return;
            case "submit": lm().submit(prompt, params, null); return;
            case "stream": lm().stream(prompt, params); return;
            case "streamText": lm().streamText(prompt, params).close(); return;
            default: throw new IllegalArgumentException(how);
        }
    }

    /** The empty choice lists the builder refuses, and the nulls that clear the field. */
    public static List<String> emptyChoice() {
        List<String> refused = new java.util.ArrayList<>();
        for (Runnable r : Arrays.<Runnable>asList(
                () -> SamplingParams.builder().choice().build(),
                () -> SamplingParams.builder().choice(List.of()).build())) {
            try {
                r.run();
            } catch (IllegalArgumentException e) {
                refused.add(e.getMessage());
            }
        }
        SamplingParams cleared = SamplingParams.builder().choice("a").choice((List<String>) null).build();
        SamplingParams clearedArray = SamplingParams.builder().choice("a").choice((String[]) null).build();
        if (!cleared.choice().isEmpty() || !clearedArray.choice().isEmpty()) {
            throw new AssertionError("null must clear choice");
        }
        return refused;
    }
}
"""


@pytest.fixture(scope="module")
def driver(jvm: Jvm, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """``StructuredDriver`` compiled with ``javac --release 17`` against the bridge jar, loaded by a class loader
    whose parent holds the bridge (the session's JVM cannot take new class path entries)."""
    from java_bridge.build import bridge_jar, compile_java

    src = tmp_path_factory.mktemp("structured_src") / "StructuredDriver.java"
    src.write_text(DRIVER, encoding="utf-8")
    out = compile_java([src], tmp_path_factory.mktemp("structured_classes"), classpath=[bridge_jar()])
    url = jvm.cls("java.io.File")(str(out)).toURI().toURL()
    loader = jvm.cls("java.net.URLClassLoader")([url], jvm.cls("java.lang.ClassLoader").getSystemClassLoader())
    return jvm.jpype.JClass("StructuredDriver", loader=loader)


def builder(jvm: Jvm) -> Any:
    return jvm.cls("smile.llm.SamplingParams").builder()


def as_text(value: Any) -> str:
    """A constraint's value as the driver's text (the schema as JSON, choices one per line)."""
    if isinstance(value, dict):
        return json.dumps(value)
    if isinstance(value, list):
        return "\n".join(value)
    return str(value)


def assert_nothing_queued(jvm: Jvm) -> None:
    loop = jvm.model.serving_loop
    assert loop.num_waiting == 0 and loop.num_running == 0
    assert jvm.model.pool.bound_request_count == 0
    jvm.model.pool.check_invariants()


def assert_follows(field: str, text: str) -> None:
    """``text`` is a complete output of constraint ``field``."""
    if field == "json_schema":
        jsonschema = pytest.importorskip("jsonschema")
        jsonschema.validate(json.loads(text), SCHEMA)
    elif field == "json_object":
        assert isinstance(json.loads(text), dict), text
    elif field == "regex":
        assert re.fullmatch(REGEX, text), text
    elif field == "grammar":
        assert re.fullmatch(GRAMMAR_AS_REGEX, text), text
    else:
        assert text in CHOICES, text


def test_builder_fields_reach_python(jvm: Jvm) -> None:
    from java_bridge.adapters.sampling import python_params

    def py(b: Any) -> SamplingParams:
        return python_params(b.build())

    schema = json.dumps(SCHEMA)
    assert py(builder(jvm).jsonSchema(schema)) == SamplingParams(json_schema=schema)
    assert py(builder(jvm).jsonObject(True)) == SamplingParams(json_object=True)
    assert py(builder(jvm).regex(REGEX)) == SamplingParams(regex=REGEX)
    assert py(builder(jvm).grammar(GRAMMAR)) == SamplingParams(grammar=GRAMMAR)
    choices = jvm.jpype.JArray(jvm.jpype.JString)(CHOICES)
    assert py(builder(jvm).choice(choices)) == SamplingParams(choice=CHOICES)
    assert py(builder(jvm).choice(jvm.cls("java.util.Arrays").asList(choices))).choice == CHOICES
    with pytest.raises(ConstraintError, match=r"^choice: \[0\] must be a str, got java\.lang\.String\[\]$"):
        py(builder(jvm).choice(jvm.cls("java.util.List").of(choices)))  # one String[] element (a raw List)
    got = py(builder(jvm).regex(REGEX))
    assert got.constraint is not None and got.constraint.field == "regex"
    # unset: null, false, empty, and nothing passed to Python
    defaults = jvm.cls("smile.llm.SamplingParams").defaults()
    assert defaults.jsonSchema() is None and not defaults.jsonObject() and defaults.regex() is None
    assert defaults.grammar() is None and defaults.choice().isEmpty()
    assert python_params(defaults).constraint is None
    cleared = builder(jvm).regex(REGEX).regex(None).jsonObject(True).jsonObject(False).jsonSchema(None).grammar(None)
    assert python_params(cleared.build()) == SamplingParams()
    assert cleared.build().equals(defaults)


def test_value_semantics(jvm: Jvm) -> None:
    """Accessors, toBuilder, equals/hashCode and toString carry the constraint fields."""
    choices = jvm.jpype.JArray(jvm.jpype.JString)(CHOICES)
    every = [builder(jvm).jsonSchema(json.dumps(SCHEMA)).build(), builder(jvm).jsonObject(True).build(),
             builder(jvm).regex(REGEX).build(), builder(jvm).grammar(GRAMMAR).build(),
             builder(jvm).choice(choices).build()]
    defaults = jvm.cls("smile.llm.SamplingParams").defaults()
    for i, p in enumerate(every):
        copy = p.toBuilder().build()
        assert copy.equals(p) and copy.hashCode() == p.hashCode() and str(copy) == str(p)
        assert not p.equals(defaults)
        assert all(not p.equals(q) for j, q in enumerate(every) if j != i)
    assert str(every[0].jsonSchema()) == json.dumps(SCHEMA) and every[1].jsonObject()
    assert str(every[2].regex()) == REGEX and str(every[3].grammar()) == GRAMMAR
    assert [str(c) for c in every[4].choice()] == CHOICES
    with pytest.raises(jvm.cls("java.lang.UnsupportedOperationException")):
        every[4].choice().add("x")
    assert "regex=" + REGEX in str(every[2]) and "choice=[yes, no, maybe]" in str(every[4])


@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "seeded-t1"])
@pytest.mark.parametrize("field", list(CONSTRAINTS))
def test_java_equals_python_and_follows_the_constraint(jvm: Jvm, driver: Any, field: str, sampled: bool) -> None:
    temperature, seed = (1.0, SEED) if sampled else (0.0, 0)
    params = driver.params(field, as_text(CONSTRAINTS[field]), NEW_TOKENS, temperature, seed)
    c = driver.generate(PROMPT, params)
    py = jvm.model.generate(PROMPT, NEW_TOKENS, temperature=temperature, seed=seed, **{field: CONSTRAINTS[field]})
    text = str(c.text())
    assert [int(t) for t in c.tokens()] == py.tokens
    assert text == py.text and str(c.finishReason()) == py.finish_reason == "stop"
    stats = json.loads(str(c.statsJson()))
    assert stats["constraint_complete"] is True and py.stats["constraint_complete"] is True
    assert stats["forced_tokens"] == py.stats["forced_tokens"]
    assert_follows(field, text)
    assert_nothing_queued(jvm)


def test_choice_list_and_stream_text_equal_generate(jvm: Jvm, driver: Any) -> None:
    varargs = driver.params("choice", as_text(CHOICES), NEW_TOKENS, 1.0, SEED)
    listed = driver.params("choiceList", as_text(CHOICES), NEW_TOKENS, 1.0, SEED)
    assert varargs.equals(listed)
    want = jvm.model.generate(PROMPT, NEW_TOKENS, temperature=1.0, seed=SEED, choice=CHOICES).text
    assert str(driver.generate(PROMPT, listed).text()) == want
    schema = driver.params("json_schema", as_text(SCHEMA), NEW_TOKENS, 0.0, 0)
    assert str(driver.streamText(PROMPT, schema)) == jvm.model.generate(PROMPT, NEW_TOKENS, json_schema=SCHEMA).text
    assert_nothing_queued(jvm)


BAD = [  # (Java field, its value, Python field) -> the engine refuses it when the request is made
    ("regex", "[a-", "regex"),
    ("grammar", "start: foo", "grammar"),
    ("jsonSchema", '{"type": "object", "properties": {"a": {"type": "nonsense"}}}', "json_schema"),
]


@pytest.mark.parametrize("how", ["generate", "submit", "stream", "streamText"])
@pytest.mark.parametrize("java_field, value, py_field", BAD, ids=[b[0] for b in BAD])
def test_refused_constraint_names_the_field_and_quotes_the_engine(jvm: Jvm, driver: Any, how: str,
                                                                   java_field: str, value: str,
                                                                   py_field: str) -> None:
    with pytest.raises(ConstraintError) as py_info:
        jvm.model.generate("x", 4, **{py_field: value})
    py_msg = str(py_info.value)
    assert py_msg.startswith(f"{py_field}: the grammar engine refused it: ")
    params = getattr(builder(jvm).maxNewTokens(4), java_field)(value).build()
    with pytest.raises(jvm.cls("java.lang.IllegalArgumentException")) as info:
        driver.call(how, params)
    msg = str(info.value.getMessage())
    lead = py_field if java_field == py_field else f"{java_field} ({py_field})"
    assert msg == lead + py_msg[len(py_field):]  # the engine's own message, quoted whole
    assert_nothing_queued(jvm)


def test_invalid_regex_message(jvm: Jvm, driver: Any) -> None:
    params = builder(jvm).maxNewTokens(4).regex("[a-").build()
    with pytest.raises(jvm.cls("java.lang.IllegalArgumentException")) as info:
        driver.generate(PROMPT, params)
    msg = str(info.value.getMessage())
    assert msg.startswith("regex: the grammar engine refused it: ") and "unclosed character class" in msg
    assert_nothing_queued(jvm)


@pytest.mark.parametrize("pair, message", [
    ("regex+choice", "choice: give one constraint per request, got regex and choice"),
    ("jsonSchema+jsonObject",
     "jsonObject (json_object): give one constraint per request, got json_schema and json_object"),
    ("grammar+regex", "grammar: give one constraint per request, got regex and grammar"),
])
@pytest.mark.parametrize("how", ["generate", "submit", "streamText"])
def test_two_constraints_are_refused(jvm: Jvm, driver: Any, pair: str, message: str, how: str) -> None:
    with pytest.raises(jvm.cls("java.lang.IllegalArgumentException")) as info:
        driver.call(how, driver.two(pair))
    assert str(info.value.getMessage()) == message
    assert_nothing_queued(jvm)


@pytest.mark.parametrize("java_field, value, message", [
    ("regex", "", "regex: must not be empty"),
    ("grammar", "", "grammar: must not be empty"),
    ("jsonSchema", "", "jsonSchema (json_schema): must not be empty"),
    ("jsonSchema", "{not json", "jsonSchema (json_schema): is not valid JSON: "),
    ("jsonSchema", "[1, 2]", "jsonSchema (json_schema): must be a JSON object"),
])
def test_malformed_constraint_is_refused_by_name(jvm: Jvm, driver: Any, java_field: str, value: str,
                                                 message: str) -> None:
    params = getattr(builder(jvm).maxNewTokens(4), java_field)(value).build()
    with pytest.raises(jvm.cls("java.lang.IllegalArgumentException")) as info:
        driver.call("generate", params)
    assert str(info.value.getMessage()).startswith(message)
    assert_nothing_queued(jvm)


def test_choice_entries_and_empty_lists(jvm: Jvm, driver: Any) -> None:
    refused = [str(m) for m in driver.emptyChoice()]  # choice() and choice(List.of()): build() refuses them
    assert refused == ["choice: must hold at least one string (null clears it)"] * 2
    with_null = builder(jvm).maxNewTokens(4).choice(jvm.jpype.JArray(jvm.jpype.JString)(["a", None])).build()
    with pytest.raises(jvm.cls("java.lang.IllegalArgumentException")) as info:
        driver.call("generate", with_null)
    assert str(info.value.getMessage()) == "choice: [1] must be a str, got NoneType"
    empty_entry = builder(jvm).maxNewTokens(4).choice(jvm.jpype.JArray(jvm.jpype.JString)(["a", ""])).build()
    with pytest.raises(jvm.cls("java.lang.IllegalArgumentException")) as info:
        driver.call("submit", empty_entry)
    assert str(info.value.getMessage()) == "choice: [1] is empty"
    assert_nothing_queued(jvm)
