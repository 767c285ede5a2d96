"""Java generation arguments to a validated request, and a finished request back to Java, for every
caller of the bridge: the synchronous ``generate``, ``submit`` (a ``CompletableFuture``) and the
engine's ``GenerationRequest``; results as the bridge's ``Completion`` or Smile's
``ChatCompletion``.

Asynchronous requests report to a Java ``smile.llm.python.AsyncGeneration``: the serving thread only
hands it each listener event and, through ``RequestHandle.add_done_callback``, the outcome; the Java
side delivers them in order on its own delivery threads and completes the future last.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any, cast

from jpype import JArray, JClass, JFloat, JImplements, JInt

from smile_llm import Completion, GenerationListener, LanguageModel, RequestHandle, SamplingParams

from ..errors import bridged, to_java
from .convert import int_array
from .sampling import SMILE_NAMES, named_errors


def java_params(max_gen_len: Any, temperature: Any, topp: Any, logprobs: Any,
                seed: Any) -> SamplingParams:
    """``SamplingParams`` from the arguments of Smile's positional ``generate``, validated there
    (the one validation of Python and Java callers alike: a negative ``maxGenLen`` is refused, never
    clamped). ValueError naming the Java parameter and the Python field; a negative ``seed`` is read
    as the unsigned value of its 64 bits. (The ``smile.llm.SamplingParams`` form is
    ``sampling.python_params``.)"""
    with named_errors(SMILE_NAMES):
        return SamplingParams(int(max_gen_len), float(temperature), float(topp), int(seed),
                              bool(logprobs))


def java_prompt(prompt: Any) -> list[int]:
    """A Java ``int[]`` prompt as a list; ValueError for null (the vocabulary is checked by
    ``ServingContext.request``)."""
    if prompt is None:
        raise ValueError("prompt must not be null")
    return int_array(prompt).tolist()


def java_completion(out: Completion) -> Any:
    """A ``smile.llm.Completion`` record of ``out``, with its top-k and prompt logprobs when it has
    them."""
    lp = None if out.logprobs is None else JArray(JFloat)(out.logprobs)
    return JClass("smile.llm.Completion")(out.text, JArray(JInt)(out.prompt_tokens),
                                          JArray(JInt)(out.tokens), out.finish_reason, lp,
                                          json.dumps(out.stats, default=str),
                                          logprob_maps(out.top_logprobs),
                                          logprob_maps(out.prompt_logprobs))


def java_chat_completion(model: str, out: Completion) -> Any:
    """Smile's ``smile.llm.ChatCompletion`` record of ``out`` attributed to ``model``: text, prompt
    and generated ids, the ``FinishReason`` of ``out.finish_reason`` and the logprobs (or null); the
    stats and top-k logprobs of ``java_completion`` have no place in it."""
    lp = None if out.logprobs is None else JArray(JFloat)(out.logprobs)
    return JClass("smile.llm.ChatCompletion")(model, out.text, JArray(JInt)(out.prompt_tokens),
                                              JArray(JInt)(out.tokens),
                                              JClass("smile.llm.FinishReason")
                                              .valueOf(out.finish_reason), lp)


def logprob_maps(rows: Sequence[dict[int, float] | None] | None) -> Any:
    """A Java ``List<Map<Integer, Float>>`` of ``rows`` (dict order kept, a None row stays null), or
    null."""
    if rows is None:
        return None
    ids = JArray(JInt, 2)([None if r is None else JArray(JInt)(list(r.keys())) for r in rows])
    values = JArray(JFloat, 2)([None if r is None else JArray(JFloat)(list(r.values()))
                                for r in rows])
    return JClass("smile.llm.python.Logprobs").maps(ids, values)


class JavaListener(GenerationListener):
    """A Java ``GenerationListener`` seen from the scheduler (Python's listener protocol)."""

    def __init__(self, listener: Any) -> None:
        self._l = listener

    def on_input_tokens(self, n: int) -> None:
        self._l.onInputTokens(int(n))

    def on_cached_input_tokens(self, n: int) -> None:
        self._l.onCachedInputTokens(int(n))

    def on_generated_tokens(self, n: int) -> None:
        self._l.onGeneratedTokens(int(n))

    def on_thinking_tokens(self, n: int) -> None:
        self._l.onThinkingTokens(int(n))

    def on_text(self, chunk: str) -> None:
        self._l.onText(chunk)


@JImplements("java.lang.Runnable", deferred=True)
@bridged
class CancelRequest:
    """The cancel action of a Java ``GenerationFuture``: ``RequestHandle.cancel`` (pages free on
    return)."""

    def __init__(self, handle: RequestHandle) -> None:
        self._handle = handle

    def run(self) -> None:
        """Cancel the request; nothing if it already ended."""
        self._handle.cancel()


def submit_async(model: LanguageModel, prompt: Any, params: SamplingParams, listener: Any,
                 submit: Callable[..., Any] | None = None) -> Any:
    """Queue one request (``params`` of one sample) for a Java caller and return its
    ``GenerationFuture`` at once. ``submit`` queues it (default ``model.submit``; an engine passes
    its own). The model's serving thread is started if none runs (``ServingLoop.serve_until_idle``).
    ``RequestError`` for bad input, before anything is queued."""
    delivery = JClass("smile.llm.python.AsyncGeneration")(listener)
    handle = cast(RequestHandle,
                  (submit or model.submit)(prompt, params, listener=None if listener is None
                                           else JavaListener(delivery)))
    delivery.attach(handle.request_number, CancelRequest(handle))
    handle.add_done_callback(lambda h: _settle(delivery, h))
    model.serving_loop.serve_until_idle()
    return delivery.future()


def _settle(delivery: Any, handle: RequestHandle) -> None:
    error = handle.exception(0)
    if error is None:
        delivery.complete(java_completion(handle.result(0)))
    else:
        delivery.fail(to_java(error))
