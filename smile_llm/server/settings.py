"""ServerSettings: what ``smile-llm serve`` is configured with (its flags), and the limits every
request is checked against before it reaches the model."""

from __future__ import annotations

from dataclasses import dataclass

MAX_BODY_BYTES = 4 << 20  # a request body larger than this is refused (413) before it is parsed
MAX_QUEUED = 256  # requests waiting for the model beyond this are refused (429)
RETRY_AFTER_S = 1  # what a 429 tells the client to wait


@dataclass(frozen=True)
class ServerSettings:
    """``model_name``: what ``/v1/models`` lists and requests may name (another name is 404);
    ``api_key``: the bearer key every ``/v1`` call must present (None: no key); the limits:
    ``max_body_bytes``, ``max_tokens`` (a request's ``max_tokens``; None: the model's context),
    ``max_n`` and ``max_queued``; ``drain_timeout_s``: how long a SIGTERM waits for in-flight
    requests."""

    model_name: str = "smile-llm"
    api_key: str | None = None
    max_body_bytes: int = MAX_BODY_BYTES
    max_tokens: int | None = None
    max_n: int = 16
    max_queued: int = MAX_QUEUED
    drain_timeout_s: float = 30.0
