"""``smile.llm.engine.InferenceEngine`` implemented over ``smile_llm.engine.InferenceEngine``."""

from __future__ import annotations

from typing import Any, Protocol

from jpype import JClass, JImplements

from smile_llm import InferenceEngine, LanguageModel

from ..errors import bridged
from .convert import checked_int
from .requests import java_params, java_prompt, submit_async

# Java InferenceEngine.DEFAULT_PREFILL_TOKEN_BUDGET (tested equal)
DEFAULT_PREFILL_TOKEN_BUDGET = InferenceEngine.DEFAULT_PREFILL_TOKENS_PER_STEP


class ModelAdapter(Protocol):
    """The Java model an engine is attached to (``ModelAdapter``): it wraps ``model``."""

    model: LanguageModel


@JImplements("smile.llm.engine.InferenceEngine", deferred=True)
@bridged
class InferenceEngineAdapter:
    """A Python ``InferenceEngine`` (serving thread, batch size, prefill budget) attached to the
    model of ``model_adapter``. Requests go through the same path as ``LanguageModel.submit`` from
    Java."""

    def __init__(self, model_adapter: ModelAdapter, engine: InferenceEngine) -> None:
        self._model_adapter = model_adapter
        self.engine = engine

    @classmethod
    def attach(cls, model_adapter: ModelAdapter, max_in_flight: Any,
               prefill_token_budget: Any = None) -> InferenceEngineAdapter:
        """A new engine on the adapter's model. ValueError for values below 1, RuntimeError while
        another engine is attached."""
        budget = (DEFAULT_PREFILL_TOKEN_BUDGET if prefill_token_budget is None
                  else int(prefill_token_budget))
        for name, value in (("maxInFlight", int(max_in_flight)), ("prefillTokenBudget", budget)):
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        return cls(model_adapter, InferenceEngine(model_adapter.model, int(max_in_flight),
                                                  prefill_tokens_per_step=budget))

    def submit(self, request: Any) -> Any:
        """Java ``GenerationHandle submit(GenerationRequest)``: queued at once on the engine
        (IllegalArgumentException for a bad field, IllegalStateException after shutdown)."""
        if request is None:
            raise ValueError("request must not be null")
        params = java_params(request.maxGenLen(), request.temperature(), request.topp(),
                             request.logprobs(), request.seed())
        future = submit_async(self.engine.model, java_prompt(request.promptTokens()), params,
                              request.listener(), submit=self.engine.submit)
        return JClass("smile.llm.engine.GenerationHandle").of(future.requestId(), future)

    def model(self) -> Any:
        """Java ``model()``: the model's adapter."""
        return self._model_adapter

    def maxInFlight(self) -> int:  # noqa: N802
        """Java ``maxInFlight()``."""
        return checked_int(self.engine.max_batch_size, "maxInFlight")

    def prefillTokenBudget(self) -> int:  # noqa: N802
        """Java ``prefillTokenBudget()``."""
        return checked_int(self.engine.prefill_tokens_per_step, "prefillTokenBudget")

    def queueSize(self) -> int:  # noqa: N802
        """Java ``queueSize()``: requests not yet admitted."""
        return checked_int(self.engine.num_waiting, "queueSize")

    def inFlight(self) -> int:  # noqa: N802
        """Java ``inFlight()``: requests admitted into the pool."""
        return checked_int(self.engine.num_running, "inFlight")

    def kvFreeSlots(self) -> int:  # noqa: N802
        """Java ``kvFreeSlots()``."""
        return checked_int(self.engine.model.pool.free_slots, "kvFreeSlots")

    def kvFreePages(self) -> int:  # noqa: N802
        """Java ``kvFreePages()``."""
        return checked_int(self.engine.model.pool.free_pages, "kvFreePages")

    def shutdown(self, wait: Any, cancel_pending: Any) -> None:
        """Java ``shutdown(boolean wait, boolean cancelPending)``: ``InferenceEngine.shutdown``."""
        self.engine.shutdown(bool(wait), bool(cancel_pending))

    def close(self) -> None:
        """Java ``close()``: ``shutdown(true, false)``."""
        self.engine.shutdown(True, False)
