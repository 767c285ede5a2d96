"""``smile.llm.python.PythonModelExecutor``: Smile's ``ModelExecutor`` of the bridged model. Java's
``InferenceEngine`` recognises it and serves its requests on the model's Python serving loop
(``attachEngine``); the step API is not offered (its methods throw
``UnsupportedOperationException``)."""

from __future__ import annotations

from typing import Any

import numpy as np
from jpype import JClass, JImplements

from ..errors import bridged
from .convert import checked_int, int_array
from .engine import ModelAdapter, ServingEngineAdapter

NO_STEP_API = ("the bridged Python model has no Java step API: {} is not supported; submit "
               "requests to new InferenceEngine(lm.executor(), ...), which serves them on the "
               "model's Python serving loop")


@JImplements("smile.llm.python.PythonModelExecutor", deferred=True)
@bridged
class ModelExecutorAdapter:
    """The executor of ``model_adapter`` (a ``LanguageModelAdapter``)."""

    def __init__(self, model_adapter: ModelAdapter) -> None:
        self._model_adapter = model_adapter
        self._model = model_adapter.model

    def model(self) -> Any:
        """Java ``model()``: the model's adapter."""
        return self._model_adapter

    def kvCachePool(self) -> Any:  # noqa: N802
        """Java ``kvCachePool()``: the model's pool."""
        return self._model_adapter.kvCachePool()  # type: ignore[attr-defined]

    def padToken(self) -> int:  # noqa: N802
        """Java ``padToken()``: the checkpoint's pad id, else its first end-of-sequence id, else
        0."""
        pad = getattr(self._model.config, "pad_token_id", None)
        eos = tuple(self._model.config.eos_token_ids)
        return checked_int(pad if pad is not None else eos[0] if eos else 0, "padToken")

    def stopTokens(self) -> np.ndarray:  # noqa: N802
        """Java ``int[] stopTokens()``: the end-of-sequence ids."""
        return np.asarray(list(self._model.config.eos_token_ids), dtype=np.int32)

    def decode(self, tokens: Any) -> str:
        """Java ``decode(int[] tokens)``."""
        return self._model.decode(int_array(tokens).tolist())

    def tryDecode(self, tokens: Any, skip_special: Any) -> str:  # noqa: N802
        """Java ``tryDecode(int[] tokens, boolean skipSpecial)``: the text, or
        ``CharacterCodingException`` when it ends inside a UTF-8 character."""
        text = self._model.decode(int_array(tokens).tolist())
        if text.endswith("\ufffd"):
            raise JClass("java.nio.charset.CharacterCodingException")()
        return text

    def supportsStepApi(self) -> bool:  # noqa: N802
        """Java ``supportsStepApi()``: false."""
        return False

    def maxSeqLen(self) -> int:  # noqa: N802
        """Java ``maxSeqLen()``."""
        return checked_int(self._model.max_seq_len, "maxSeqLen")

    def attachEngine(self, max_in_flight: Any, prefill_token_budget: Any) -> Any:  # noqa: N802
        """Java ``attachEngine(int maxInFlight, int prefillTokenBudget)``."""
        return ServingEngineAdapter.attach(self._model_adapter, max_in_flight,
                                           prefill_token_budget)

    @staticmethod
    def _unsupported(what: str) -> Any:
        return JClass("java.lang.UnsupportedOperationException")(NO_STEP_API.format(what))

    def bind(self, prompt: Any, total_capacity: Any) -> int:
        """Java ``bind``: not supported."""
        raise self._unsupported("bind")

    def prefixLen(self, request_id: Any) -> int:  # noqa: N802
        """Java ``prefixLen``: not supported."""
        raise self._unsupported("prefixLen")

    def prefill(self, request_id: Any, prompt: Any, prefix_len: Any) -> Any:
        """Java ``prefill``: not supported."""
        raise self._unsupported("prefill")

    def prefillChunk(self, request_id: Any, prompt: Any, start: Any, end: Any) -> Any:  # noqa: N802
        """Java ``prefillChunk``: not supported."""
        raise self._unsupported("prefillChunk")

    def decodeStep(self, request_ids: Any, last_tokens: Any, positions: Any) -> Any:  # noqa: N802
        """Java ``decodeStep``: not supported."""
        raise self._unsupported("decodeStep")

    def finish(self, request_id: Any, sequence_tokens: Any) -> None:
        """Java ``finish``: not supported."""
        raise self._unsupported("finish")

    def evict(self, request_id: Any) -> None:
        """Java ``evict``: not supported."""
        raise self._unsupported("evict")
