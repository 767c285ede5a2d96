"""Paged attention over the pool's FlashInfer CSR: its semantics (``reference``), the torch backend
(``torch/``: FlashInfer's semantics on any device), the FlashInfer backend (imported lazily,
CUDA only) and the chooser between them."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .backend import AttentionBackend, select_backend
from .flashinfer import FlashInferBackend, flashinfer_available, import_flashinfer

if TYPE_CHECKING:
    from .torch.backend import TorchBackend, paged_attention

__all__ = [
    "AttentionBackend",
    "FlashInferBackend",
    "TorchBackend",
    "flashinfer_available",
    "import_flashinfer",
    "paged_attention",
    "select_backend",
]

_FROM_TORCH_BACKEND = ("paged_attention", "TorchBackend")


def __getattr__(name: str) -> object:
    # The torch backend is loaded on first use, so this package imports on its own.
    if name in _FROM_TORCH_BACKEND:
        from .torch import backend as torch_backend

        return getattr(torch_backend, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
