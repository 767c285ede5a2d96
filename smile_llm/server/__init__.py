"""The OpenAI-compatible HTTP server: ``create_app`` (FastAPI) and ``serve`` (uvicorn, with
SIGTERM draining); ``smile-llm serve`` runs it. Replicas on Ray Serve (``ray_app``: the ingress,
the replicas and the cache-aware router; docs/scale_out.md) import Ray, and only they do."""

from .app import create_app
from .serve import serve
from .settings import ServerSettings

__all__ = ["ServerSettings", "create_app", "serve"]
