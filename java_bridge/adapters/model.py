"""``smile.llm.python.PythonLanguageModel`` (Smile's ``smile.llm.LanguageModel`` and the bridge's
additions) implemented over a ``smile_llm.LanguageModel``."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import numpy as np
from jpype import JArray, JClass, JImplements, JString

from smile_llm import Completion, LanguageModel, SamplingParams

from ..errors import bridged, translated
from .chat import python_messages, python_template_vars
from .convert import checked_int, int_array
from .executor import ModelExecutorAdapter
from .pool import KvCachePoolAdapter
from .requests import (
    JavaListener,
    java_chat_completion,
    java_completion,
    java_params,
    java_prompt,
    submit_async,
)
from .sampling import BUILDER_NAMES, named_errors, python_params, single
from .segments import SegmentAdapter, python_segment


def model_name(model: LanguageModel) -> str:
    """The name Java's ``name()`` answers: the checkpoint folder's name, ``"default"`` for a model
    built without one."""
    if model.folder is None:
        return "default"
    return Path(model.folder).name or Path(model.folder).resolve().name or "default"


@JImplements("smile.llm.python.PythonLanguageModel", deferred=True)
@bridged
class LanguageModelAdapter:
    """``smile.llm.python.PythonLanguageModel`` over a ``smile_llm.LanguageModel``."""

    def __init__(self, model: LanguageModel) -> None:
        self.model = model
        self._pool = KvCachePoolAdapter(model.pool)
        self._name = model_name(model)
        self._executor = ModelExecutorAdapter(self)

    def family(self) -> str:
        """Java ``String family()``: the checkpoint's ``model_type`` (``"qwen3"``, ``"llama"``,
        ``"qwen3_5"``, ...)."""
        return str(self.model.config.model_type)

    def name(self) -> str:
        """Java ``String name()``: ``model_name`` (the checkpoint folder's name)."""
        return self._name

    def encode(self, text: Any) -> np.ndarray:
        """Java ``int[] encode(String text)``; IllegalArgumentException for null or empty text."""
        if text is None:
            raise ValueError("text must not be null")
        return np.asarray(self.model.encode(str(text)), dtype=np.int32)

    def decode(self, tokens: Any) -> str:
        """Java ``String decode(int[] tokens)``: ``LanguageModel.decode`` (IllegalArgumentException
        for any id outside the vocabulary)."""
        return self.model.decode(int_array(tokens).tolist())

    # Java overloads of one name arrive at one Python method (JPype dispatches by name, default
    # methods included); the number of arguments tells Smile's positional forms from the
    # SamplingParams forms.

    def generate(self, prompt: Any, *args: Any) -> Any:
        """Java ``Completion generate(int[] prompt, SamplingParams params[, GenerationListener
        listener])`` (``_generate``) and Smile's ``ChatCompletion generate(int[] prompt, int
        maxGenLen, double temperature, double topp, boolean logprobs, long seed, GenerationListener
        listener[, BooleanSupplier cancelRequested])`` (``_generate_smile``):
        ``LanguageModel.submit`` then its result on the calling thread (it advances the model while
        no other thread does), listener callbacks forwarded to Java. IllegalArgumentException for
        bad input, naming the field; CancellationException when cancelled."""
        if len(args) <= 2:
            return self._generate(prompt, *args)
        return self._generate_smile(prompt, *args)

    def _generate(self, prompt: Any, params: Any, listener: Any = None) -> Any:
        return java_completion(self._run(java_prompt(prompt), single(python_params(params)),
                                         listener))

    def _generate_smile(self, prompt: Any, max_gen_len: int, temperature: float, topp: float,
                        logprobs: bool, seed: int, listener: Any, cancel: Any = None) -> Any:
        """A negative ``maxGenLen`` is refused; a negative ``seed`` is read as the unsigned 64-bit
        value of its bits, as in Python. Returns Smile's ``ChatCompletion`` (model ``name()``)."""
        params = java_params(max_gen_len, temperature, topp, logprobs, seed)
        return self._smile_run(java_prompt(prompt), params, listener, cancel)

    def _smile_run(self, ids: list[int], params: SamplingParams, listener: Any,
                   cancel: Any) -> Any:
        """One request of Smile's positional forms: ``cancel`` is a Java ``BooleanSupplier`` or
        null; the result is a ``smile.llm.ChatCompletion``."""
        poll = None if cancel is None else (lambda: bool(cancel.getAsBoolean()))
        return java_chat_completion(self._name, self._run(ids, params, listener, poll))

    def _run(self, ids: list[int], params: SamplingParams, listener: Any,
             cancel: Any = None) -> Completion:
        # checks of LanguageModel.request (a logit_bias or stop id outside the vocabulary)
        with named_errors(BUILDER_NAMES):
            handle = self.model.submit(ids, params, listener=None if listener is None
                                       else JavaListener(listener), cancel=cancel)
        # one sample: params passed single()
        return cast(Completion, handle.result())

    def generateSamples(self, prompt: Any, params: Any) -> Any:  # noqa: N802
        """Java ``List<Completion> generateSamples(int[] prompt, SamplingParams params)``: the ``n``
        completions of one request (Python's ``generate(..., n=k)``), in order; an unmodifiable
        list."""
        p = python_params(params)
        with named_errors(BUILDER_NAMES):
            handle = self.model.submit(java_prompt(prompt), p)
        out = handle.result()
        completions = [java_completion(c) for c in (out if isinstance(out, list) else [out])]
        return JClass("java.util.List").copyOf(
            JClass("java.util.Arrays").asList(JArray(JClass("smile.llm.Completion"))(completions)))

    def submit(self, prompt: Any, *args: Any) -> Any:
        """Java ``CompletableFuture<Completion> submit(int[] prompt, SamplingParams params,
        GenerationListener listener)`` and Smile's ``submit(int[] prompt, int maxGenLen, double
        temperature, double topp, boolean logprobs, long seed, GenerationListener listener)``:
        queued at once, advanced by the model's serving thread; see ``requests.submit_async``."""
        if len(args) == 2:
            params, listener = single(python_params(args[0])), args[1]
        else:
            params, listener = self._smile_params(*args)
        return self._submit(java_prompt(prompt), params, listener)

    def _submit(self, ids: list[int], params: SamplingParams, listener: Any) -> Any:
        with named_errors(BUILDER_NAMES):
            return submit_async(self.model, ids, params, listener)

    @staticmethod
    def _smile_params(max_gen_len: Any, temperature: Any, topp: Any, logprobs: Any, seed: Any,
                      listener: Any) -> tuple[SamplingParams, Any]:
        return java_params(max_gen_len, temperature, topp, logprobs, seed), listener

    def stream(self, prompt: Any, *args: Any) -> Any:
        """Java ``Flow.Publisher<String> stream(int[] prompt, SamplingParams params)`` and Smile's
        ``stream(int[] prompt, int maxGenLen, double temperature, double topp, long seed)``: a
        ``TextPublisher`` that submits the request (``submit``) when its subscriber arrives. Bad
        settings are refused here, before anything is queued (with ``SamplingParams``, the prompt
        and vocabulary checks of ``LanguageModel.request`` too)."""
        ids = java_prompt(prompt)
        if len(args) == 1:
            params = single(python_params(args[0]))
            with named_errors(BUILDER_NAMES):
                # validation only; the subscriber's request is queued later
                self.model.request(ids, params)
        else:
            params = self._stream_params(*args)

        def submit_stream(listener: Any) -> Any:
            return self._submit(ids, params, listener)

        return JClass("smile.llm.TextPublisher").of(translated(submit_stream))

    def streamText(self, prompt: Any, params: Any) -> Any:  # noqa: N802
        """Java ``Stream<String> streamText(int[] prompt, SamplingParams params)``: a
        ``smile.llm.TextStream`` over a request queued now (IllegalArgumentException for bad input,
        nothing queued); closing the stream cancels it. (Implemented here, not by the interface's
        default method: JPype 1.7.1 proxies cannot run a Java default method that takes arguments,
        as they look it up by return type alone.)"""
        ids, p = java_prompt(prompt), single(python_params(params))

        def submit_stream(listener: Any) -> Any:
            return self._submit(ids, p, listener)

        return JClass("smile.llm.TextStream").open(translated(submit_stream))

    @staticmethod
    def _stream_params(max_gen_len: Any, temperature: Any, topp: Any, seed: Any) -> SamplingParams:
        return java_params(max_gen_len, temperature, topp, False, seed)

    def encodeChat(self, messages: Any, *args: Any) -> np.ndarray:  # noqa: N802
        """Smile's ``int[] encodeChat(Message... dialog)`` (the varargs arrive as one array) and the
        bridge's ``int[] encodeChat(List<? extends TemplateMessage> messages[, boolean
        addGenerationPrompt, Map<String, Object> templateVars])``: ``LanguageModel.encode_chat`` of
        the turns as dicts (``chat.python_messages``) with the variables as keyword arguments
        (``tools`` among them). IllegalArgumentException as ``encode_chat``'s ValueError, and for a
        null or empty dialog, a null turn or a value a template cannot read."""
        # a lone null is either form's argument: name both
        what = "dialog (messages)" if messages is None and not args else None
        return np.asarray(self._encode_chat(messages, *args, what=what), dtype=np.int32)

    def _encode_chat(self, messages: Any, add_generation_prompt: Any = True,
                     template_vars: Any = None, *, what: str | None = None) -> list[int]:
        return self.model.encode_chat(python_messages(messages, what),
                                      bool(add_generation_prompt),
                                      **python_template_vars(template_vars))

    def chat(self, messages: Any, *args: Any) -> Any:
        """Smile's ``ChatCompletion chat(Message[] dialog, int maxGenLen, double temperature, double
        topp, boolean logprobs, long seed, GenerationListener listener[, BooleanSupplier
        cancelRequested])`` (``_chat_smile``) and the bridge's ``Completion chat(List<? extends
        TemplateMessage> messages, Map<String, Object> templateVars, SamplingParams params,
        GenerationListener listener)`` with its short forms ``chat(messages, params[, listener])``:
        ``generate`` on ``encodeChat(messages, true, templateVars)``, as Python's
        ``LanguageModel.chat``. The settings are checked first, then the conversation;
        IllegalArgumentException for either, nothing queued."""
        if len(args) >= 6:
            return self._chat_smile(messages, *args)
        if len(args) == 3:
            template_vars, params, listener = args
        else:
            template_vars, (params, listener) = None, self._params_listener(*args)
        p = single(python_params(params))
        ids = self._encode_chat(messages, True, template_vars, what="messages")
        return java_completion(self._run(ids, p, listener))

    def _chat_smile(self, dialog: Any, max_gen_len: int, temperature: float, topp: float,
                    logprobs: bool, seed: int, listener: Any, cancel: Any = None) -> Any:
        params = java_params(max_gen_len, temperature, topp, logprobs, seed)
        ids = self._encode_chat(dialog, True, None, what="dialog")
        return self._smile_run(ids, params, listener, cancel)

    @staticmethod
    def _params_listener(params: Any, listener: Any = None) -> tuple[Any, Any]:
        return params, listener

    def executor(self) -> Any:
        """Java ``ModelExecutor executor()``: the model's ``PythonModelExecutor`` (the same object
        every call)."""
        return self._executor

    def engine(self, max_in_flight: Any, prefill_token_budget: Any = None) -> Any:
        """Java ``InferenceEngine engine(int maxInFlight[, int prefillTokenBudget])``: Smile's
        ``new InferenceEngine(executor(), maxInFlight, maxInFlight, prefillTokenBudget,
        DEFAULT_ADMISSION_TIMEOUT_MS)`` (IllegalArgumentException for values below 1,
        IllegalStateException while another engine is attached)."""
        engine = JClass("smile.llm.engine.InferenceEngine")
        budget = (engine.DEFAULT_PREFILL_TOKEN_BUDGET if prefill_token_budget is None
                  else int(prefill_token_budget))
        return engine(self._executor, int(max_in_flight), int(max_in_flight), budget,
                      engine.DEFAULT_ADMISSION_TIMEOUT_MS)

    def registerSegment(self, segment: Any) -> SegmentAdapter:  # noqa: N802
        """Java ``Segment registerSegment(String text)`` and ``registerSegment(int[] tokens)``:
        ``LanguageModel.register_segment`` (KvCacheExhaustedException without room,
        IllegalArgumentException for null, empty or too long input and on a model that cannot
        splice, naming why)."""
        if segment is None:
            raise ValueError("segment must not be null: give its text or token ids")
        value = str(segment) if isinstance(segment, JString) else int_array(segment).tolist()
        return SegmentAdapter(self.model.register_segment(value))

    def releaseSegment(self, segment: Any) -> bool:  # noqa: N802
        """Java ``boolean releaseSegment(Segment segment)``: ``LanguageModel.release_segment``
        (IllegalArgumentException for null or another model's segment)."""
        if segment is None:
            raise ValueError("segment must not be null")
        return bool(self.model.release_segment(python_segment(segment)))

    def kvCachePool(self) -> Any:  # noqa: N802
        """Java ``kvCachePool()``: the model's pool (the same adapter every call)."""
        return self._pool

    def vocabSize(self) -> int:  # noqa: N802
        """Java ``vocabSize()``."""
        return checked_int(self.model.config.vocab_size, "vocabSize")

    def maxSeqLen(self) -> int:  # noqa: N802
        """Java ``maxSeqLen()``: the longest prompt plus new tokens one request may hold."""
        return checked_int(self.model.max_seq_len, "maxSeqLen")
