"""``smile.llm.LanguageModel`` implemented over a ``smile_llm.LanguageModel``."""

from __future__ import annotations

from typing import Any

import numpy as np
from jpype import JClass, JImplements

from smile_llm.model import LanguageModel

from ..errors import bridged, translated
from .convert import checked_int, int_array
from .engine import InferenceEngineAdapter
from .pool import KvCachePoolAdapter
from .requests import JavaListener, java_completion, java_params, java_prompt, submit_async


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

    def generate(self, prompt: Any, max_gen_len: int, temperature: float, topp: float, logprobs: bool, seed: int,
                 listener: Any, cancel: Any = None) -> Any:
        """Java ``Completion generate(int[] prompt, int maxGenLen, double temperature, double topp, boolean logprobs,
        long seed, GenerationListener listener[, BooleanSupplier cancelRequested])``: ``LanguageModel.generate`` on
        the calling thread (it advances the model while no other thread does), listener callbacks forwarded to
        Java. IllegalArgumentException for bad input (a negative ``maxGenLen`` included; a negative ``seed`` is read
        as the unsigned 64-bit value of its bits, as in Python), CancellationException when cancelled."""
        params = java_params(max_gen_len, temperature, topp, logprobs, seed)
        handle = self.model.submit(java_prompt(prompt), params,
                                   listener=None if listener is None else JavaListener(listener),
                                   cancel=None if cancel is None else (lambda: bool(cancel.getAsBoolean())))
        return java_completion(handle.result())

    def submit(self, prompt: Any, max_gen_len: int, temperature: float, topp: float, logprobs: bool, seed: int,
               listener: Any) -> Any:
        """Java ``CompletableFuture<Completion> submit(...)`` (same arguments as ``generate``): queued at once, advanced
        by the model's serving thread; see ``requests.submit_async``."""
        return submit_async(self.model, java_prompt(prompt), java_params(max_gen_len, temperature, topp, logprobs,
                                                                         seed), listener)

    def stream(self, prompt: Any, max_gen_len: int, temperature: float, topp: float, seed: int) -> Any:
        """Java ``Flow.Publisher<String> stream(...)``: a ``TextPublisher`` that submits the request (``submit``) when
        its subscriber arrives. Bad input is refused here, before anything is queued."""
        ids, params = java_prompt(prompt), java_params(max_gen_len, temperature, topp, False, seed)

        def submit_stream(listener: Any) -> Any:
            return submit_async(self.model, ids, params, listener)

        return JClass("smile.llm.TextPublisher").of(translated(submit_stream))

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
