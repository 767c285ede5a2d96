"""The OpenAI-compatible HTTP server: ``create_app`` (FastAPI) and ``serve`` (uvicorn, with
SIGTERM draining); ``smile-llm serve`` runs it."""

from .app import create_app
from .serve import serve
from .settings import ServerSettings

__all__ = ["ServerSettings", "create_app", "serve"]
