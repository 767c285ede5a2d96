"""The attention backend protocol, and the chooser between FlashInfer and the torch backend.

A backend is planned once per forward on the step's CSR (every layer shares the plan) and run once
per layer::

    backend = select_backend(pool.device)
    backend.plan(meta, num_qo_heads=Hq, num_kv_heads=Hkv, head_dim=D, qo_indptr=None,
                 q_dtype=.., kv_dtype=..)
    for layer in range(num_layers):
        out = backend.run(q[layer], pool.key_layer(layer), pool.value_layer(layer),
                          k_scale=pool.k_scale, v_scale=pool.v_scale)

FlashInfer is chosen on CUDA when it imports and, given the model's :class:`AttentionShape`, when
its kernels serve that shape (``flashinfer_limits.model_limit``: head dims 64, 128 and 256,
fp16/bf16 queries, KV of the query dtype or FP8); the torch backend (``TorchBackend``, named
"reference") everywhere else. Neither this module nor the chooser imports FlashInfer off CUDA.
"""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass
from typing import Literal, Protocol, overload, runtime_checkable

import torch

from ..cache.metadata import FlashInferKvMetadata
from .flashinfer import FlashInferBackend, import_flashinfer
from .flashinfer_limits import model_limit

_log = logging.getLogger(__name__)

BACKEND_NAMES = ("reference", "flashinfer")
_warned_fallback = False


@runtime_checkable
class AttentionBackend(Protocol):
    """Paged attention over a FlashInfer CSR (docs/contract.md; its semantics are
    ``reference.reference_paged_attention``)."""

    name: str

    def plan(self, meta: FlashInferKvMetadata, *, num_qo_heads: int, num_kv_heads: int,
             head_dim: int, qo_indptr: torch.Tensor | None = None, causal: bool = True,
             sm_scale: float | None = None, logits_soft_cap: float | None = None,
             q_dtype: torch.dtype = torch.float32, kv_dtype: torch.dtype = torch.float32,
             custom_mask: torch.Tensor | None = None) -> None:
        """Once per forward, outside any CUDA-graph capture; all layers share it. Decode when
        ``qo_indptr`` is None (one query per row); ragged prefill / verify otherwise (int32
        ``[B+1]``). ``custom_mask`` (with ``qo_indptr``; FlashInfer's format): bool, each row's
        ``[qo_len, kv_len]`` block row-major, concatenated; True where the query sees the key
        (replaces the causal mask; a token-tree verify window)."""
        ...

    @overload
    def run(self, q: torch.Tensor, k_layer: torch.Tensor, v_layer: torch.Tensor, *,
            k_scale: float = ..., v_scale: float = ...,
            return_lse: Literal[False] = ...) -> torch.Tensor: ...
    @overload
    def run(self, q: torch.Tensor, k_layer: torch.Tensor, v_layer: torch.Tensor, *,
            k_scale: float = ..., v_scale: float = ...,
            return_lse: Literal[True]) -> tuple[torch.Tensor, torch.Tensor]: ...
    @overload
    def run(self, q: torch.Tensor, k_layer: torch.Tensor, v_layer: torch.Tensor, *,
            k_scale: float = ..., v_scale: float = ...,
            return_lse: bool = ...) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]: ...
    def run(self, q: torch.Tensor, k_layer: torch.Tensor, v_layer: torch.Tensor, *,
            k_scale: float = 1.0, v_scale: float = 1.0,
            return_lse: bool = False) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Once per layer: ``q`` ``[total_q, Hq, D]``, ``k_layer``/``v_layer``
        ``[num_pages, page_size, Hkv, D]`` (or ``[num_slots, Hkv, D]``). Returns
        ``[total_q, Hq, D]`` in q's dtype, or ``(out, lse)`` (base-2 LSE ``[total_q, Hq]``)."""
        ...


@dataclass(frozen=True)
class AttentionShape:
    """What a model's attention asks of a backend: its head dim, query and KV heads (this
    rank's), the query dtype (the model's compute dtype) and the KV pool's storage dtype."""

    head_dim: int
    num_qo_heads: int
    num_kv_heads: int
    q_dtype: torch.dtype
    kv_dtype: torch.dtype

    def flashinfer_limit(self) -> str | None:
        """Why FlashInfer's kernels cannot serve this shape, every reason named
        (``flashinfer_limits.model_limit``), or None when they can."""
        return model_limit(head_dim=self.head_dim, num_qo_heads=self.num_qo_heads,
                           num_kv_heads=self.num_kv_heads, q_dtype=self.q_dtype,
                           kv_dtype=self.kv_dtype)


def _torch_backend() -> AttentionBackend:
    from .torch.backend import TorchBackend  # loaded on first use

    return TorchBackend()  # device-agnostic: it runs wherever the tensors are


def companion_backend(backend: AttentionBackend, device: str | torch.device) -> AttentionBackend:
    """A second backend of ``backend``'s kind on ``device`` (``select_backend``'s choice for a kind
    it does not name), for work that keeps a plan of its own while ``backend`` is planned again (a
    draft chain)."""
    return select_backend(device, prefer=backend.name if backend.name in BACKEND_NAMES else None)


def select_backend(device: str | torch.device, prefer: str | None = None, *,
                   shape: AttentionShape | None = None) -> AttentionBackend:
    """The attention backend for ``device``: FlashInfer on CUDA when it imports and its kernels
    serve ``shape`` (a model's attention; None: not checked), the torch backend (named "reference")
    everywhere else.

    ``prefer="reference"`` forces the torch backend. ``prefer="flashinfer"`` raises RuntimeError off
    CUDA (FlashInfer has no CPU kernels), ImportError, with the install hint, when FlashInfer does
    not import, and ValueError naming the limit when its kernels cannot serve ``shape``. With
    ``prefer=None`` a CUDA device without a working FlashInfer gets the torch backend (logged
    once), and a ``shape`` FlashInfer cannot serve gets it with one warning naming every reason
    (each call: one per model). ValueError for any other ``prefer``."""
    if prefer is not None and prefer not in BACKEND_NAMES:
        raise ValueError(f"prefer must be None or one of {BACKEND_NAMES}, got {prefer!r}")
    device = torch.device(device)
    if prefer == "reference":
        return _torch_backend()
    on_cuda = device.type == "cuda" and torch.cuda.is_available()
    if not on_cuda:
        if prefer == "flashinfer":
            raise RuntimeError(f"prefer='flashinfer' needs a CUDA device; got {device} "
                               f"(torch.cuda.is_available() = {torch.cuda.is_available()}). "
                               f"FlashInfer has no CPU kernels: use prefer=None or 'reference' off "
                               f"CUDA")
        return _torch_backend()
    try:
        import_flashinfer()
    except ImportError as exc:
        if prefer == "flashinfer":
            raise
        global _warned_fallback
        if not _warned_fallback:
            _warned_fallback = True
            _log.warning("FlashInfer unavailable on %s (%s); attention runs on the pure-PyTorch "
                         "reference", device, exc)
        return _torch_backend()
    limit = None if shape is None else shape.flashinfer_limit()
    if limit is not None:
        if prefer == "flashinfer":
            raise ValueError(f"prefer='flashinfer', but FlashInfer cannot serve this model on "
                             f"{device}: {limit}")
        warnings.warn(f"FlashInfer cannot serve this model on {device}: {limit}. Its attention "
                      f"runs on the PyTorch reference backend", RuntimeWarning, stacklevel=2)
        return _torch_backend()
    return FlashInferBackend(device)
