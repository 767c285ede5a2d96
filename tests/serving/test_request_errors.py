"""Argument errors that say what is accepted: a misspelled keyword suggests the closest name and lists every one the
call takes, a prompt of the wrong kind (an int, bytes, a nested list) says a prompt is a str or a sequence of token
ids, ``generate_batch`` refuses a lone string, and a plain callable given as ``listener`` receives the text chunks.
Every error is typed (RequestTypeError: a TypeError and a ValueError), names the field, and binds nothing."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from smile_llm import LanguageModel
from smile_llm.engine import InferenceEngine, SamplingParams
from smile_llm import RequestTypeError

PROMPT = "def main(argv):\n"
NEW = 12


@pytest.fixture(scope="module")
def lm():
    model = LanguageModel.default(max_batch_size=2, max_seq_len=256)
    yield model
    model.close()


def assert_nothing_bound(lm: LanguageModel) -> None:
    assert lm.pool.bound_request_count == 0
    assert lm.serving_loop.num_running == 0 and lm.serving_loop.num_waiting == 0


# ---------------------------------------------------------------------------------------------- keywords
CALLS = {
    "generate()": lambda lm, **kw: lm.generate(PROMPT, NEW, **kw),
    "generate_batch()": lambda lm, **kw: lm.generate_batch([PROMPT], NEW, **kw),
    "stream()": lambda lm, **kw: lm.stream(PROMPT, NEW, **kw),
    "astream()": lambda lm, **kw: lm.astream(PROMPT, NEW, **kw),
    "chat()": lambda lm, **kw: lm.chat([{"role": "user", "content": "hi"}], NEW, **kw),
}


@pytest.mark.parametrize("call", list(CALLS))
@pytest.mark.parametrize("typo, meant", [("max_new_token", "max_new_tokens"), ("temprature", "temperature"),
                                         ("top_q", "top_p"), ("min_new_token", "min_new_tokens")])
def test_a_misspelled_keyword_suggests_the_closest_and_lists_every_accepted_name(lm, call, typo, meant):
    with pytest.raises(TypeError) as info:
        CALLS[call](lm, **{typo: 1})
    message = str(info.value)
    assert isinstance(info.value, RequestTypeError) and isinstance(info.value, ValueError)
    shown = "stream()" if call == "astream()" else call
    assert f"{shown} got an unexpected keyword argument {typo!r}; did you mean {meant!r}?" in message
    for name in ("max_new_tokens", "temperature", "top_p", "top_k", "seed", "stop", "logprobs", "n"):
        assert name in message
    assert ("listener" in message) == (call in ("generate()", "chat()"))
    assert_nothing_bound(lm)


def test_an_unrelated_keyword_lists_the_accepted_names_without_a_guess(lm):
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'qqqq'; generate\(\) accepts max_new_tokens, "
                                        r"temperature"):
        lm.generate(PROMPT, NEW, qqqq=1)


def test_stream_refuses_a_listener_by_name(lm):
    with pytest.raises(TypeError, match="stream\\(\\) got an unexpected keyword argument 'listener'"):
        lm.stream(PROMPT, NEW, listener=print)


# ---------------------------------------------------------------------------------------------- prompts
BAD_PROMPTS = {
    "int": (123, "got int 123; for a single token id give \\[123\\]"),
    "bytes": (b"import os", "got bytes b'import os': decode bytes to a str first"),
    "bytearray": (bytearray(b"ab"), "got bytearray"),
    "None": (None, "got NoneType None"),
    "float": (1.5, "got float 1.5"),
    "dict": ({1: 2}, "got dict"),
    "set": ({1, 2}, "got set"),
    "0-d array": (np.array(5), "got a 0-D ndarray of shape \\(\\)"),
    "2-D tensor": (torch.ones(2, 3, dtype=torch.long), "got a 2-D Tensor of shape \\(2, 3\\)"),
    "nested list": ([[1, 2], [3]], "prompt\\[0\\] is list \\[1, 2\\]; a list of prompts goes to generate_batch"),
    "list of str": (["a", "b"], "prompt\\[0\\] is str 'a'"),
    "float id": ([1, 2.5], "prompt\\[1\\] is float 2.5"),
    "bool id": ([True], "prompt\\[0\\] is bool True"),
}


@pytest.mark.parametrize("case", list(BAD_PROMPTS))
def test_a_prompt_of_the_wrong_kind_says_what_is_accepted(lm, case):
    prompt, detail = BAD_PROMPTS[case]
    for call in (lambda: lm.generate(prompt, NEW), lambda: lm.stream(prompt, NEW), lambda: lm.submit(prompt)):
        with pytest.raises(RequestTypeError, match="prompt must be a str or a sequence of int token ids[;,] .*" + detail):
            call()
    assert_nothing_bound(lm)


def test_prompts_of_every_accepted_kind_still_generate(lm):
    want = lm.generate(PROMPT, NEW).tokens
    ids = lm.encode(PROMPT)
    for prompt in (ids, tuple(ids), np.array(ids), torch.tensor(ids), iter(ids), [np.int64(t) for t in ids]):
        assert lm.generate(prompt, NEW).tokens == want


def test_generate_batch_refuses_a_lone_string_and_names_the_bad_prompt(lm):
    for prompts in ("text", b"text"):
        with pytest.raises(RequestTypeError, match="prompts must be a list of prompts .* got (str|bytes): for one "
                                                   "prompt give \\[prompt\\] or call generate\\(\\)"):
            lm.generate_batch(prompts, NEW)
    with pytest.raises(RequestTypeError, match="prompts must be a list"):
        lm.generate_batch(5, NEW)  # type: ignore[arg-type]
    with pytest.raises(RequestTypeError, match="prompts\\[1\\] must be a str or a sequence of int token ids"):
        lm.generate_batch([PROMPT, 7], NEW)
    with pytest.raises(RequestTypeError, match="prompts\\[0\\] must be .* got int 1"):
        lm.generate_batch([1, 2, 3], NEW)  # token ids, not prompts
    assert_nothing_bound(lm)
    assert [c.text for c in lm.generate_batch([PROMPT], NEW)] == [lm.generate(PROMPT, NEW).text]


# ---------------------------------------------------------------------------------------------- listeners
def test_a_plain_callable_listener_receives_the_text_chunks(lm, capsys):
    chunks: list[str] = []
    c = lm.generate(PROMPT, NEW, listener=chunks.append)
    assert chunks and "".join(chunks) == c.text
    lambda_chunks: list[str] = []
    assert lm.generate(PROMPT, NEW, listener=lambda text: lambda_chunks.append(text)).text == c.text
    assert lambda_chunks == chunks
    lm.generate(PROMPT, NEW, listener=print)
    assert capsys.readouterr().out == "".join(chunk + "\n" for chunk in chunks)
    with InferenceEngine(lm, 2) as engine:
        engine_chunks: list[str] = []
        assert engine.submit(PROMPT, SamplingParams(max_new_tokens=NEW), engine_chunks.append).result(120).text == c.text
        assert engine_chunks == chunks


def test_a_raising_callable_listener_fails_its_request_alone(lm):
    def boom(text: str) -> None:
        raise KeyError("listener broke")

    with pytest.raises(KeyError, match="listener broke"):
        lm.generate(PROMPT, NEW, listener=boom)
    assert_nothing_bound(lm)


@pytest.mark.parametrize("listener, match", [(object(), "got object"), (5, "got int 5"), ("print", "got str"),
                                             (InferenceEngine, "got the class InferenceEngine; pass "
                                                               "InferenceEngine\\(\\)")])
def test_a_listener_that_is_neither_a_listener_nor_a_callable_is_refused(lm, listener, match):
    with pytest.raises(RequestTypeError, match="listener must be a GenerationListener .*" + match):
        lm.generate(PROMPT, NEW, listener=listener)
    assert_nothing_bound(lm)
