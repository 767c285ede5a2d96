"""Paged attention over the pool's FlashInfer CSR: the pure-PyTorch reference (FlashInfer's exact semantics), the
FlashInfer backend (imported lazily, CUDA only) and the chooser between them."""

from __future__ import annotations

from typing import Any

from .backend import AttentionBackend, select_backend
from .flashinfer import FlashInferBackend, flashinfer_available, import_flashinfer

__all__ = [
    "AttentionBackend",
    "FlashInferBackend",
    "ReferenceBackend",
    "flashinfer_available",
    "import_flashinfer",
    "paged_attention",
    "select_backend",
]

_FROM_REFERENCE = ("paged_attention", "ReferenceBackend")


def __getattr__(name: str) -> Any:
    # The reference is loaded on first use, so this package imports on its own.
    if name in _FROM_REFERENCE:
        from . import reference

        return getattr(reference, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
