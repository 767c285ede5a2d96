"""The bridged model's side of ``smile.llm.engine.InferenceEngine``: the Python engine it attaches
(``smile.llm.python.PythonServingEngine``) over ``smile_llm.engine.InferenceEngine``. The Java class
owns the handles, the admission timeout and the counters; requests go through the same path as
``LanguageModel.submit`` from Java (``requests.submit_async``)."""

from __future__ import annotations

from typing import Any, Protocol

from jpype import JImplements

from smile_llm import InferenceEngine, LanguageModel

from ..errors import bridged
from .convert import checked_int
from .requests import java_params, java_prompt, submit_async


class ModelAdapter(Protocol):
    """The Java model an engine is attached to (``ModelAdapter``): it wraps ``model``."""

    model: LanguageModel


@JImplements("smile.llm.python.PythonServingEngine", deferred=True)
@bridged
class ServingEngineAdapter:
    """A Python ``InferenceEngine`` (serving thread, batch size, prefill budget) attached to the
    model of ``model_adapter`` for one Java ``InferenceEngine``."""

    def __init__(self, model_adapter: ModelAdapter, engine: InferenceEngine) -> None:
        self._model_adapter = model_adapter
        self.engine = engine
        self._speculative_max_batch = model_adapter.model.speculative_max_batch

    @classmethod
    def attach(cls, model_adapter: ModelAdapter, max_in_flight: Any,
               prefill_token_budget: Any) -> ServingEngineAdapter:
        """A new engine on the adapter's model. ValueError for values below 1, RuntimeError while
        another engine is attached."""
        for name, value in (("maxInFlight", int(max_in_flight)),
                            ("prefillTokenBudget", int(prefill_token_budget))):
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        engine = InferenceEngine(model_adapter.model, int(max_in_flight),
                                 prefill_tokens_per_step=int(prefill_token_budget))
        return cls(model_adapter, engine)

    def submit(self, prompt: Any, request: Any, listener: Any) -> Any:
        """Java ``CompletableFuture<Completion> submit(int[] prompt, GenerationRequest request,
        GenerationListener listener)``: queued at once on the engine (IllegalArgumentException for
        a bad field, IllegalStateException after ``detach``)."""
        params = java_params(request.maxGenLen(), request.temperature(), request.topp(),
                             request.logprobs(), request.seed())
        return submit_async(self.engine.model, java_prompt(prompt), params, listener,
                            submit=self.engine.submit)

    def queueSize(self) -> int:  # noqa: N802
        """Java ``queueSize()``: requests of the model not yet admitted."""
        return checked_int(self.engine.num_waiting, "queueSize")

    def inFlight(self) -> int:  # noqa: N802
        """Java ``inFlight()``: requests of the model admitted into the pool."""
        return checked_int(self.engine.num_running, "inFlight")

    def activeDecodeCount(self) -> int:  # noqa: N802
        """Java ``activeDecodeCount()``: running rows that have generated a token."""
        running = list(self.engine.scheduler.running)
        return checked_int(sum(1 for seq in running if seq.tokens), "activeDecodeCount")

    def setMaxSpeculativeConcurrency(self, n: Any) -> None:  # noqa: N802
        """Java ``setMaxSpeculativeConcurrency(int n)``: the model's ``speculative_max_batch``
        (``n >= 0``; a negative ``n`` is no limit)."""
        self.engine.model.speculative_max_batch = None if int(n) < 0 else int(n)

    def detach(self) -> None:
        """Java ``detach()``: ``InferenceEngine.shutdown`` cancelling the engine's requests; the
        model's speculation limit from before the engine returns."""
        try:
            self.engine.shutdown(wait=False, cancel_pending=True)
        finally:
            self.engine.model.speculative_max_batch = self._speculative_max_batch
