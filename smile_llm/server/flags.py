"""The flags of ``smile-llm serve`` that configure the server (``add_server_flags``) and the
``ServerSettings`` they make (``settings_from``): the API key, the request and connection limits and
the drain. Light: importing it imports neither torch nor FastAPI, so ``--help`` stays fast."""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from . import settings as s


def positive_int(text: str) -> int:
    """argparse type: an int >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an int >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an int >= 1, got {value}")
    return value


def positive_float(text: str) -> float:
    """argparse type: a finite number > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}") from None
    if not 0 < value < math.inf:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {value}")
    return value


def add_server_flags(p: argparse.ArgumentParser) -> None:
    """The server's flags (docs/server.md lists them with their defaults)."""
    p.add_argument("--host", default="127.0.0.1", help="the address to listen on (127.0.0.1)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--api-key", help="the key clients must send (else SMILE_LLM_API_KEY)")
    p.add_argument("--api-key-file", help="a file holding the key (refused when empty)")
    p.add_argument("--served-model-name", default="smile-llm", help="the model's name in the API")
    p.add_argument("--max-body-bytes", type=positive_int, default=s.MAX_BODY_BYTES)
    p.add_argument("--max-tokens", type=positive_int, default=None,
                   help="the most tokens a request may ask for (default: the context)")
    p.add_argument("--max-n", type=positive_int, default=16,
                   help=f"the most samples one request may ask for (at most {s.MAX_N})")
    p.add_argument("--max-queued", type=positive_int, default=s.MAX_QUEUED,
                   help=f"samples waiting beyond this get 429 (default {s.MAX_QUEUED})")
    p.add_argument("--drain-timeout", type=float, default=30.0,
                   help="seconds a SIGTERM waits for in-flight requests")
    p.add_argument("--max-header-bytes", type=positive_int, default=s.MAX_HEADER_BYTES,
                   help=f"a larger request head is refused (default {s.MAX_HEADER_BYTES})")
    p.add_argument("--header-timeout", type=positive_float, default=s.HEADER_TIMEOUT_S,
                   help="seconds a request head may take to arrive (default "
                        f"{s.HEADER_TIMEOUT_S:g})")
    p.add_argument("--body-timeout", type=positive_float, default=s.BODY_TIMEOUT_S,
                   help=f"seconds a request body may take to arrive (default {s.BODY_TIMEOUT_S:g})")
    p.add_argument("--keep-alive-timeout", type=positive_float, default=s.KEEP_ALIVE_TIMEOUT_S,
                   help="seconds an idle kept-alive connection stays open (default "
                        f"{s.KEEP_ALIVE_TIMEOUT_S:g})")
    p.add_argument("--max-connections", type=positive_int, default=s.MAX_CONNECTIONS,
                   help=f"connections open at once (default {s.MAX_CONNECTIONS})")
    p.add_argument("--log-level", default="info",
                   help="uvicorn's and the server's logs, the access log included (info)")


def settings_from(args: argparse.Namespace, env_key: str | None) -> s.ServerSettings:
    """The settings the flags in ``args`` ask for; ``env_key``: the key when no flag gives one.
    ValueError saying why for a key file that cannot be read or holds no key (a server meant to
    need a key never serves without one), or an empty ``--api-key``."""
    key = args.api_key
    if key is None and args.api_key_file is not None:
        try:
            key = Path(args.api_key_file).read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as exc:
            reason = getattr(exc, "strerror", None) or str(exc)
            raise ValueError(f"--api-key-file: {reason}: {args.api_key_file}") from None
        if not key:
            raise ValueError(f"--api-key-file: {args.api_key_file} holds no key (it is empty); "
                             "refusing to serve without the key it was meant to hold")
    elif key is not None and not key.strip():
        raise ValueError("--api-key is empty")
    return s.ServerSettings(
        model_name=args.served_model_name, api_key=key.strip() if key else env_key,
        max_body_bytes=args.max_body_bytes, max_tokens=args.max_tokens, max_n=args.max_n,
        max_queued=args.max_queued, drain_timeout_s=max(args.drain_timeout, 0.0),
        max_header_bytes=args.max_header_bytes, header_timeout_s=args.header_timeout,
        body_timeout_s=args.body_timeout, keep_alive_timeout_s=args.keep_alive_timeout,
        max_connections=args.max_connections)
