"""ServerState: what the routes of one app share, and what a drain waits for."""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

from .errors import ApiError
from .generation import Generation
from .metrics import ServerMetrics
from .settings import ServerSettings

if TYPE_CHECKING:
    from ..language_model import LanguageModel


class ServerState:
    """What the routes share: the model (None while it loads: every call but ``/metrics`` gets
    503), the settings, the metrics, whether the server drains (set by ``serve`` on SIGTERM: new
    requests and ``/health`` then get 503), and the requests in flight (``admitting`` between
    admission and their Generation, then ``generations`` until their response ended), which the
    drain waits for. Touched on the event loop only."""

    def __init__(self, model: LanguageModel | None, settings: ServerSettings) -> None:
        self.model, self.settings = model, settings
        self.metrics = ServerMetrics(self)
        self.draining = False
        self.created = int(time.time())
        self.admitting = 0  # samples admitted whose Generation is not made yet
        self.generations: set[Generation] = set()
        self.cut_reason: str | None = None

    def loaded(self) -> LanguageModel:
        """The model; 503 while it loads."""
        if self.model is None:
            raise ApiError(503, "the model is loading", headers={"Retry-After": "5"})
        return self.model

    @property
    def busy(self) -> bool:
        """Whether any request is in flight."""
        return self.admitting > 0 or bool(self.generations)

    async def cut(self, reason: str) -> None:
        """End every request in flight, and every one admitted later, with a 503 (``reason``; a
        stream gets it as an error event): the end of a drain."""
        self.cut_reason = reason
        generations = list(self.generations)

        def cut_all() -> None:
            for gen in generations:
                gen.cut(reason)
        await asyncio.to_thread(cut_all)
