"""A timing proxy around a model's drafter: how much of decoding the drafts cost."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import torch

from ..speculative.drafters import Drafter

if TYPE_CHECKING:
    from ..language_model import LanguageModel
    from ..serving.request_row import RequestRow


class TimedDrafter:
    """Forwards every ``Drafter`` call to ``inner`` and adds the wall time of each ``propose``
    (including a CUDA synchronize when the drafts are on a GPU, so queued kernels count) to
    ``propose_s``; a token-tree ``propose_tree`` is timed the same way, and exists on the proxy
    exactly when ``inner`` has it. Other attributes (e.g. the drafter's ``pool``) read through.
    ``isinstance(TimedDrafter(d), Drafter)`` holds."""

    def __init__(self, inner: Drafter) -> None:
        self.inner = inner
        self.propose_s = 0.0
        self.propose_calls = 0

    @property
    def num_speculative_tokens(self) -> int:
        return self.inner.num_speculative_tokens

    def take(self) -> tuple[float, int]:
        """The propose time and call count since the last ``take``, and reset them."""
        out = (self.propose_s, self.propose_calls)
        self.propose_s, self.propose_calls = 0.0, 0
        return out

    def bind(self, seq: RequestRow, final_len: int) -> bool:
        return self.inner.bind(seq, final_len)

    def ready(self, seq: RequestRow) -> bool:
        return self.inner.ready(seq)

    def max_batch(self, n: int) -> int:
        return self.inner.max_batch(n)

    def propose(self, seqs: list[RequestRow], n: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        return self._timed(self.inner.propose, seqs, n)

    def _timed(self, call: Any, *args: Any) -> Any:
        begin = time.perf_counter()
        out = call(*args)
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.synchronize()
        self.propose_s += time.perf_counter() - begin
        self.propose_calls += 1
        return out

    def extend(self, seq: RequestRow, hidden: torch.Tensor, start: int) -> None:
        self.inner.extend(seq, hidden, start)

    def absorb(self, seqs: list[RequestRow]) -> None:
        self.inner.absorb(seqs)

    def commit(self, seq: RequestRow, hidden: torch.Tensor) -> None:
        self.inner.commit(seq, hidden)

    def release(self, seq: RequestRow) -> None:
        self.inner.release(seq)

    def close(self) -> None:
        self.inner.close()

    def __getattr__(self, name: str) -> Any:
        if name == "inner":  # not set yet (e.g. during unpickling): no recursion
            raise AttributeError(name)
        value = getattr(self.inner, name)
        if name == "propose_tree" and callable(value):
            return lambda *args: self._timed(value, *args)
        return value


def install_timer(lm: LanguageModel) -> TimedDrafter:
    """Wrap ``lm``'s drafter in a ``TimedDrafter`` where the scheduler and the model runner read it
    (``lm.runner.drafter``); returns the proxy. ValueError when ``lm`` has no drafter. Call before
    the model's first request (the proxy then sees every bind and release)."""
    if lm.drafter is None:
        raise ValueError("the model has no drafter to time")
    if isinstance(lm.drafter, TimedDrafter):
        return lm.drafter
    proxy = TimedDrafter(lm.drafter)
    assert isinstance(proxy, Drafter)
    lm.runner.drafter = proxy
    return proxy
