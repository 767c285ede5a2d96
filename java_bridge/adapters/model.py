"""``smile.llm.LanguageModel`` implemented over a ``smile_llm.LanguageModel``."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
from jpype import JArray, JClass, JFloat, JImplements, JInt

from smile_llm.model import LanguageModel

from ..errors import bridged
from .convert import checked_int, int_array
from .pool import KvCachePoolAdapter


class _JavaListener:
    """A ``GenerationListener`` (Java) seen from ``generate()``."""

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
        long seed, GenerationListener listener[, BooleanSupplier cancelRequested])``: ``LanguageModel.generate`` (a
        negative ``maxGenLen`` means 0; a negative ``seed`` is read as the unsigned 64-bit value of its bits, as in
        Python),
        listener callbacks forwarded to Java. IllegalArgumentException for bad input,
        CancellationException when cancelled."""
        if prompt is None:
            raise ValueError("prompt must not be null")
        ids = int_array(prompt).tolist()
        out = self.model.generate(
            ids, max(0, int(max_gen_len)), temperature=float(temperature), top_p=float(topp),
            logprobs=bool(logprobs), seed=int(seed), listener=None if listener is None else _JavaListener(listener),
            cancel=None if cancel is None else (lambda: bool(cancel.getAsBoolean())))
        lp = None if out.logprobs is None else JArray(JFloat)(out.logprobs)
        return JClass("smile.llm.Completion")(out.text, JArray(JInt)(out.prompt_tokens), JArray(JInt)(out.tokens),
                                              out.finish_reason, lp, json.dumps(out.stats, default=str))

    def kvCachePool(self) -> Any:  # noqa: N802
        """Java ``kvCachePool()``: the model's pool (the same adapter every call)."""
        return self._pool

    def vocabSize(self) -> int:  # noqa: N802
        """Java ``vocabSize()``."""
        return checked_int(self.model.config.vocab_size, "vocabSize")

    def maxSeqLen(self) -> int:  # noqa: N802
        """Java ``maxSeqLen()``: the longest prompt plus new tokens one request may hold."""
        return checked_int(self.model.max_seq_len, "maxSeqLen")
