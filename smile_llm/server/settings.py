"""ServerSettings: what ``smile-llm serve`` is configured with (its flags), and the limits every
request and connection is checked against before it reaches the model."""

from __future__ import annotations

from dataclasses import dataclass, fields

MAX_BODY_BYTES = 4 << 20  # a request body larger than this is refused (413) before it is parsed
MAX_QUEUED = 256  # samples waiting for the model beyond this are refused (429)
RETRY_AFTER_S = 1  # what a 429 tells the client to wait
MAX_HEADER_BYTES = 32 << 10  # a request head (request line and headers) larger than this: 431
HEADER_TIMEOUT_S = 10.0  # a request head must arrive within this (a slow client is disconnected)
BODY_TIMEOUT_S = 30.0  # a request body must arrive within this (408)
KEEP_ALIVE_TIMEOUT_S = 5.0  # an idle kept-alive connection closes after this
MAX_CONNECTIONS = 512  # connections open at once; one more is answered 503 and closed
# the samples one request may ask for: SamplingParams' own limit (serving.request.MAX_SAMPLES; a
# test checks they agree), kept here so that reading the settings imports no model code
MAX_N = 128


@dataclass(frozen=True)
class ServerSettings:
    """``model_name``: what ``/v1/models`` lists and requests may name (another name is 404);
    ``api_key``: the bearer key every ``/v1`` call must present (None: no key); the request
    limits: ``max_body_bytes``, ``max_tokens`` (a request's ``max_tokens``; None: the model's
    context), ``max_n`` and ``max_queued`` (samples waiting); ``drain_timeout_s``: how long a
    SIGTERM waits for in-flight requests; the connection limits: ``max_header_bytes``,
    ``header_timeout_s``, ``body_timeout_s``, ``keep_alive_timeout_s``, ``max_connections``.
    ValueError for a limit that is not positive, a ``max_n`` over ``MAX_N``, or an empty
    ``api_key``."""

    model_name: str = "smile-llm"
    api_key: str | None = None
    max_body_bytes: int = MAX_BODY_BYTES
    max_tokens: int | None = None
    max_n: int = 16
    max_queued: int = MAX_QUEUED
    drain_timeout_s: float = 30.0
    max_header_bytes: int = MAX_HEADER_BYTES
    header_timeout_s: float = HEADER_TIMEOUT_S
    body_timeout_s: float = BODY_TIMEOUT_S
    keep_alive_timeout_s: float = KEEP_ALIVE_TIMEOUT_S
    max_connections: int = MAX_CONNECTIONS

    def __post_init__(self) -> None:
        if self.api_key is not None and not self.api_key:
            raise ValueError("api_key must not be empty (None serves without a key)")
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in ("model_name", "api_key", "max_tokens", "drain_timeout_s") or \
                    value is None:
                continue
            if not value > 0:
                raise ValueError(f"{f.name} must be positive, got {value}")
        if self.drain_timeout_s < 0:
            raise ValueError(f"drain_timeout_s must be >= 0, got {self.drain_timeout_s}")
        if self.max_n > MAX_N:
            raise ValueError(f"max_n must be at most {MAX_N} (the samples one request may ask "
                             f"for), got {self.max_n}")
