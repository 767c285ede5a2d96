"""The OpenAI-compatible HTTP server: ``create_app`` (FastAPI) and ``serve`` (uvicorn, with
SIGTERM draining); ``smile-llm serve`` runs it. Replicas on Ray Serve (``replicas/``: the ingress,
the replicas and the cache-aware router; docs/scale_out.md) import Ray, and only they do. The
names load on first use (PEP 562), so reading ``settings`` imports neither torch nor FastAPI."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..lazy import lazy_getattr

if TYPE_CHECKING:
    from .app import create_app
    from .serve import serve
    from .settings import ServerSettings

_SOURCES = {"ServerSettings": ".settings", "create_app": ".app", "serve": ".serve"}
__all__ = ["ServerSettings", "create_app", "serve"]


__getattr__ = lazy_getattr(__name__, globals(), _SOURCES)
