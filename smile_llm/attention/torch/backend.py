"""The torch attention backend: paged attention in PyTorch with FlashInfer's semantics, on any
device (the CPU's backend, and CUDA's wherever FlashInfer cannot serve a model).

What it computes is stated by ``reference.reference_paged_attention`` (plain, obviously correct, and
the tests' oracle) and docs/contract.md, "Paged attention"; this backend computes the same up to
float rounding (fp32 accumulation, the output in q's dtype), fast. Its modules:

- ``plan``: ``plan`` once per forward: the gather indices and masks every layer shares, and
  the path ``run`` takes (the tuning knobs live there);
- ``run``: ``run`` once per layer: the chunked online softmax (any device, soft cap, any
  mask);
- ``fused``: the paths that hand the work to torch's fused kernels (one chunk, a shared
  prefix, causal windows, runs of consecutive slots read in place), merged by log-sum-exp;
- ``gather``: K/V rows of the paged cache gathered into fp32 workspaces kept on the plan.

This module holds the entry points, ``paged_attention`` (plan and run in one call) and
``TorchBackend`` (the ``AttentionBackend`` protocol), and the tensor checks they share.
"""

from __future__ import annotations

from typing import Literal, overload

import torch

from ...cache.metadata import FlashInferKvMetadata
from .plan import AttentionPlan, IndptrLike, MaskLike, plan_attention
from .run import check_run, run_attention, run_checked

__all__ = ["TorchBackend", "paged_attention"]


@overload
def paged_attention(q: torch.Tensor, k_layer: torch.Tensor, v_layer: torch.Tensor,
                    meta: FlashInferKvMetadata, *, qo_indptr: IndptrLike | None = ...,
                    causal: bool = ..., sm_scale: float | None = ...,
                    logits_soft_cap: float | None = ..., k_scale: float = ..., v_scale: float = ...,
                    return_lse: Literal[False] = ...,
                    custom_mask: MaskLike | None = ...) -> torch.Tensor: ...
@overload
def paged_attention(q: torch.Tensor, k_layer: torch.Tensor, v_layer: torch.Tensor,
                    meta: FlashInferKvMetadata, *, qo_indptr: IndptrLike | None = ...,
                    causal: bool = ..., sm_scale: float | None = ...,
                    logits_soft_cap: float | None = ..., k_scale: float = ..., v_scale: float = ...,
                    return_lse: Literal[True],
                    custom_mask: MaskLike | None = ...) -> tuple[torch.Tensor, torch.Tensor]: ...
@overload
def paged_attention(q: torch.Tensor, k_layer: torch.Tensor, v_layer: torch.Tensor,
                    meta: FlashInferKvMetadata, *, qo_indptr: IndptrLike | None = ...,
                    causal: bool = ..., sm_scale: float | None = ...,
                    logits_soft_cap: float | None = ..., k_scale: float = ..., v_scale: float = ...,
                    return_lse: bool = ..., custom_mask: MaskLike | None = ...
                    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]: ...
def paged_attention(q: torch.Tensor, k_layer: torch.Tensor, v_layer: torch.Tensor,
                    meta: FlashInferKvMetadata, *, qo_indptr: IndptrLike | None = None,
                    causal: bool = True, sm_scale: float | None = None,
                    logits_soft_cap: float | None = None, k_scale: float = 1.0,
                    v_scale: float = 1.0, return_lse: bool = False,
                    custom_mask: MaskLike | None = None
                    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Attention of ``q`` ``[total_q, Hq, D]`` over one layer's paged K/V
    (``[num_pages, page_size, Hkv, D]`` or ``[num_slots, Hkv, D]``) as listed by ``meta``. Decode
    when ``qo_indptr`` is None (one query per row); otherwise ``qo_indptr`` (int ``[B+1]``, any
    device) gives each row's queries, masked causally or by ``custom_mask`` (see
    ``plan_attention``). Returns ``[total_q, Hq, D]`` in q's dtype, or ``(out, lse)`` with ``lse``
    ``float32[total_q, Hq]`` base 2. ValueError on malformed input."""
    if not isinstance(meta, FlashInferKvMetadata):
        raise ValueError(f"meta must be a FlashInferKvMetadata, got {type(meta).__name__}")
    q, k, v = check_tensors(q, k_layer, v_layer, meta.page_size)
    plan = plan_attention(meta, num_qo_heads=q.shape[1], num_kv_heads=k.shape[2],
                          head_dim=q.shape[2], qo_indptr=qo_indptr, causal=causal,
                          sm_scale=sm_scale, logits_soft_cap=logits_soft_cap,
                          num_pages=k.shape[0], custom_mask=custom_mask)
    return run_attention(plan, q, k, v, k_scale=k_scale, v_scale=v_scale, return_lse=return_lse)


class TorchBackend:
    """The attention backend protocol over ``paged_attention``: ``plan`` once per forward (every
    layer shares the CSR), ``run`` once per layer. ``plan`` builds the gather indices and masks, so
    ``run`` only gathers and computes. Not thread-safe: one driver thread owns a backend. Its
    ``name`` is "reference", the name ``select_backend``'s ``prefer`` takes."""

    name = "reference"

    def __init__(self) -> None:
        self._plan: AttentionPlan | None = None
        self._dtypes: tuple[torch.dtype, torch.dtype] = (torch.float32, torch.float32)

    def plan(self, meta: FlashInferKvMetadata, *, num_qo_heads: int, num_kv_heads: int,
             head_dim: int, qo_indptr: torch.Tensor | None = None, causal: bool = True,
             sm_scale: float | None = None, logits_soft_cap: float | None = None,
             q_dtype: torch.dtype = torch.float32, kv_dtype: torch.dtype = torch.float32,
             custom_mask: torch.Tensor | None = None) -> None:
        """Validate ``meta`` and the shapes and precompute the forward's gather; ValueError on bad
        input (the previous plan is then dropped). ``custom_mask``: see ``plan_attention``."""
        self._plan = None
        self._plan = plan_attention(meta, num_qo_heads=num_qo_heads, num_kv_heads=num_kv_heads,
                                    head_dim=head_dim, qo_indptr=qo_indptr, causal=causal,
                                    sm_scale=sm_scale, logits_soft_cap=logits_soft_cap,
                                    custom_mask=custom_mask)
        self._dtypes = (q_dtype, kv_dtype)

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
        """``paged_attention`` of one layer under the current plan. RuntimeError before ``plan``;
        ValueError if the tensors do not match what was planned (shapes, ``q_dtype``/``kv_dtype``,
        device, page range)."""
        plan = self._plan
        if plan is None:
            raise RuntimeError("TorchBackend.run called before plan(); plan once per forward, then "
                               "run per layer")
        # Every layer of a forward passes tensors of the same shapes, dtypes, strides and device:
        # check the first call in full and later calls by that signature only (what the checks
        # read, nothing else).
        signature = (q.shape, q.dtype, q.device, k_layer.shape, k_layer.dtype, k_layer.stride(),
                     k_layer.device, v_layer.shape, v_layer.dtype, v_layer.stride(), k_scale,
                     v_scale)
        if signature != plan.checked:
            q, k, v = check_tensors(q, k_layer, v_layer, plan.page_size)
            q_dtype, kv_dtype = self._dtypes
            if q.dtype != q_dtype or k.dtype != kv_dtype:
                raise ValueError(f"planned q_dtype={q_dtype}, kv_dtype={kv_dtype} but got q "
                                 f"{q.dtype}, K/V {k.dtype}; pass the real dtypes to plan()")
            check_run(plan, q, k, v, k_scale, v_scale)
            plan.checked = signature
        else:
            k, v = k_layer, v_layer
            if k.dim() == 3:
                k, v = k.unflatten(0, (-1, plan.page_size)), v.unflatten(0, (-1, plan.page_size))
        return run_checked(plan, q, k, v, float(k_scale), float(v_scale), return_lse)


def check_tensors(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                  page_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(q, k, v)`` with K/V as 4-D NHD pages; ValueError on bad shapes, dtypes or devices."""
    if not all(isinstance(t, torch.Tensor) for t in (q, k, v)):
        raise ValueError(f"q, k_layer and v_layer must be torch.Tensor, got "
                         f"{type(q).__name__}, {type(k).__name__}, {type(v).__name__}")
    if q.dim() != 3:
        raise ValueError(f"q must be [total_q, Hq, D], got shape {tuple(q.shape)}")
    if k.shape != v.shape or k.dtype != v.dtype:
        raise ValueError(f"k_layer and v_layer must match, got {tuple(k.shape)} {k.dtype} and "
                         f"{tuple(v.shape)} {v.dtype}")
    if not (q.dtype.is_floating_point and k.dtype.is_floating_point):
        raise ValueError(f"q and K/V must be floating point, got {q.dtype} and {k.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k_layer and v_layer must share a device, got {q.device}, {k.device}, "
                         f"{v.device}")
    if k.dim() == 3:
        if page_size < 1 or k.shape[0] % page_size:
            raise ValueError(f"a [num_slots, Hkv, D] cache needs num_slots a multiple of "
                             f"page_size={page_size}, got {tuple(k.shape)}")
        k, v = k.unflatten(0, (-1, page_size)), v.unflatten(0, (-1, page_size))
    elif k.dim() != 4 or k.shape[1] != page_size:
        raise ValueError(f"k_layer/v_layer must be [num_pages, page_size={page_size}, Hkv, D] "
                         f"(NHD) or [num_slots, Hkv, D], got {tuple(k.shape)}")
    if k.shape[3] != q.shape[2]:
        raise ValueError(f"head dims differ: q has D={q.shape[2]}, K/V have D={k.shape[3]}")
    if k.shape[2] < 1 or q.shape[1] % k.shape[2]:
        raise ValueError(f"Hq={q.shape[1]} is not a multiple of Hkv={k.shape[2]}")
    return q, k, v
