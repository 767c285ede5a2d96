"""``smile.llm.LanguageModel`` implemented over a ``smile_llm.LanguageModel``."""

from __future__ import annotations

from typing import Any, cast

import numpy as np
from jpype import JArray, JClass, JImplements

from smile_llm import Completion, LanguageModel, SamplingParams

from ..errors import bridged, translated
from .chat import python_messages, python_template_vars
from .convert import checked_int, int_array
from .engine import InferenceEngineAdapter
from .pool import KvCachePoolAdapter
from .requests import JavaListener, java_completion, java_params, java_prompt, submit_async
from .sampling import BUILDER_NAMES, named_errors, python_params, single


@JImplements("smile.llm.LanguageModel", deferred=True)
@bridged
class LanguageModelAdapter:
    """``smile.llm.LanguageModel`` over a ``smile_llm.LanguageModel``."""

    def __init__(self, model: LanguageModel) -> None:
        self.model = model
        self._pool = KvCachePoolAdapter(model.pool)

    def encode(self, text: Any) -> np.ndarray:
        """Java ``int[] encode(String text)``; IllegalArgumentException for null or empty text."""
        if text is None:
            raise ValueError("text must not be null")
        return np.asarray(self.model.encode(str(text)), dtype=np.int32)

    def decode(self, tokens: Any) -> str:
        """Java ``String decode(int[] tokens)``: ``LanguageModel.decode`` (IllegalArgumentException for any id outside
        the vocabulary)."""
        return self.model.decode(int_array(tokens).tolist())

    # Java overloads of one name arrive at one Python method (JPype dispatches by name, default methods included);
    # the number of arguments tells Smile's positional forms from the SamplingParams forms.

    def generate(self, prompt: Any, *args: Any) -> Any:
        """Java ``Completion generate(int[] prompt, SamplingParams params[, GenerationListener listener])``
        (``_generate``) and Smile's ``generate(int[] prompt, int maxGenLen, double temperature, double topp, boolean
        logprobs, long seed, GenerationListener listener[, BooleanSupplier cancelRequested])`` (``_generate_smile``):
        ``LanguageModel.submit`` then its result on the calling thread (it advances the model while no other thread
        does), listener callbacks forwarded to Java. IllegalArgumentException for bad input, naming the field;
        CancellationException when cancelled."""
        if len(args) <= 2:
            return self._generate(prompt, *args)
        return self._generate_smile(prompt, *args)

    def _generate(self, prompt: Any, params: Any, listener: Any = None) -> Any:
        return self._run(java_prompt(prompt), single(python_params(params)), listener)

    def _generate_smile(self, prompt: Any, max_gen_len: int, temperature: float, topp: float, logprobs: bool,
                        seed: int, listener: Any, cancel: Any = None) -> Any:
        """A negative ``maxGenLen`` is refused; a negative ``seed`` is read as the unsigned 64-bit value of its bits,
        as in Python."""
        params = java_params(max_gen_len, temperature, topp, logprobs, seed)
        return self._run(java_prompt(prompt), params, listener,
                         None if cancel is None else (lambda: bool(cancel.getAsBoolean())))

    def _run(self, ids: list[int], params: SamplingParams, listener: Any, cancel: Any = None) -> Any:
        with named_errors(BUILDER_NAMES):  # checks of LanguageModel.request (a logit_bias or stop id outside the vocabulary)
            handle = self.model.submit(ids, params, listener=None if listener is None else JavaListener(listener),
                                       cancel=cancel)
        return java_completion(cast(Completion, handle.result()))  # one sample: params passed single()

    def generateSamples(self, prompt: Any, params: Any) -> Any:  # noqa: N802
        """Java ``List<Completion> generateSamples(int[] prompt, SamplingParams params)``: the ``n`` completions of
        one request (Python's ``generate(..., n=k)``), in order; an unmodifiable list."""
        p = python_params(params)
        with named_errors(BUILDER_NAMES):
            handle = self.model.submit(java_prompt(prompt), p)
        out = handle.result()
        completions = [java_completion(c) for c in (out if isinstance(out, list) else [out])]
        return JClass("java.util.List").copyOf(
            JClass("java.util.Arrays").asList(JArray(JClass("smile.llm.Completion"))(completions)))

    def submit(self, prompt: Any, *args: Any) -> Any:
        """Java ``CompletableFuture<Completion> submit(int[] prompt, SamplingParams params, GenerationListener
        listener)`` and Smile's ``submit(int[] prompt, int maxGenLen, double temperature, double topp, boolean
        logprobs, long seed, GenerationListener listener)``: queued at once, advanced by the model's serving thread;
        see ``requests.submit_async``."""
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
        """Java ``Flow.Publisher<String> stream(int[] prompt, SamplingParams params)`` and Smile's ``stream(int[]
        prompt, int maxGenLen, double temperature, double topp, long seed)``: a ``TextPublisher`` that submits the
        request (``submit``) when its subscriber arrives. Bad settings are refused here, before anything is
        queued (with ``SamplingParams``, the prompt and vocabulary checks of ``LanguageModel.request`` too)."""
        ids = java_prompt(prompt)
        if len(args) == 1:
            params = single(python_params(args[0]))
            with named_errors(BUILDER_NAMES):
                self.model.request(ids, params)  # validation only; the subscriber's request is queued later
        else:
            params = self._stream_params(*args)

        def submit_stream(listener: Any) -> Any:
            return self._submit(ids, params, listener)

        return JClass("smile.llm.TextPublisher").of(translated(submit_stream))

    def streamText(self, prompt: Any, params: Any) -> Any:  # noqa: N802
        """Java ``Stream<String> streamText(int[] prompt, SamplingParams params)``: a ``smile.llm.TextStream`` over a
        request queued now (IllegalArgumentException for bad input, nothing queued); closing the stream cancels
        it. (Implemented here, not by the interface's default method: JPype 1.7.1 proxies cannot run a Java default
        method that takes arguments, as they look it up by return type alone.)"""
        ids, p = java_prompt(prompt), single(python_params(params))

        def submit_stream(listener: Any) -> Any:
            return self._submit(ids, p, listener)

        return JClass("smile.llm.TextStream").open(translated(submit_stream))

    @staticmethod
    def _stream_params(max_gen_len: Any, temperature: Any, topp: Any, seed: Any) -> SamplingParams:
        return java_params(max_gen_len, temperature, topp, False, seed)

    def encodeChat(self, messages: Any, add_generation_prompt: Any = True,  # noqa: N802
                   template_vars: Any = None) -> np.ndarray:
        """Java ``int[] encodeChat(List<Message> messages[, boolean addGenerationPrompt, Map<String, Object>
        templateVars])``: ``LanguageModel.encode_chat`` of the messages as dicts (``chat.python_messages``) with the
        variables as keyword arguments (``tools`` among them). IllegalArgumentException as ``encode_chat``'s
        ValueError, and for a null list or message or a value a template cannot read."""
        return np.asarray(self._encode_chat(messages, add_generation_prompt, template_vars), dtype=np.int32)

    def _encode_chat(self, messages: Any, add_generation_prompt: Any, template_vars: Any) -> list[int]:
        return self.model.encode_chat(python_messages(messages), bool(add_generation_prompt),
                                      **python_template_vars(template_vars))

    def chat(self, messages: Any, *args: Any) -> Any:
        """Java ``Completion chat(List<Message> messages, Map<String, Object> templateVars, SamplingParams params,
        GenerationListener listener)`` and its short forms ``chat(messages, params[, listener])``: ``generate`` on
        ``encodeChat(messages, true, templateVars)``, as Python's ``LanguageModel.chat``. The settings are
        checked first, then the conversation; IllegalArgumentException for either, nothing queued."""
        if len(args) == 3:
            template_vars, params, listener = args
        else:
            template_vars, (params, listener) = None, self._params_listener(*args)
        p = single(python_params(params))
        return self._run(self._encode_chat(messages, True, template_vars), p, listener)

    @staticmethod
    def _params_listener(params: Any, listener: Any = None) -> tuple[Any, Any]:
        return params, listener

    def engine(self, max_in_flight: int, prefill_token_budget: int | None = None) -> Any:
        """Java ``InferenceEngine engine(int maxInFlight[, int prefillTokenBudget])``: attach a continuous-batching
        engine (IllegalArgumentException for values below 1, IllegalStateException while another is attached)."""
        return InferenceEngineAdapter.attach(self, max_in_flight, prefill_token_budget)

    def kvCachePool(self) -> Any:  # noqa: N802
        """Java ``kvCachePool()``: the model's pool (the same adapter every call)."""
        return self._pool

    def vocabSize(self) -> int:  # noqa: N802
        """Java ``vocabSize()``."""
        return checked_int(self.model.config.vocab_size, "vocabSize")

    def maxSeqLen(self) -> int:  # noqa: N802
        """Java ``maxSeqLen()``: the longest prompt plus new tokens one request may hold."""
        return checked_int(self.model.max_seq_len, "maxSeqLen")
