"""What paged attention computes, as plain code: the obviously correct version that every backend
matches (``torch/backend`` up to float rounding, FlashInfer's kernels within their precision) and
the tests' oracle. Slow by design: a loop over rows, dense matrices, no chunking.

The contract (docs/contract.md, "Paged attention"), on the CSR a FlashInfer wrapper is planned with:

- Gather: row b reads pages ``indices[indptr[b]:indptr[b+1]]`` in order, every slot of each but
  the last, of which it reads ``last_page_len[b]``: ``kv_len = (pages - 1) * page_size +
  last_page_len`` (0 for no pages). Slots past ``kv_len`` are never read.
- GQA: query head h reads KV head ``h // (Hq / Hkv)``.
- Logits: ``q . k * sm_scale * k_scale`` (``sm_scale`` default ``1/sqrt(D)``); with a soft cap,
  ``cap * tanh(logits / cap)``, before masking. FP8 K/V is only cast; ``v_scale`` multiplies the
  output.
- Masks: decode (no ``qo_indptr``; one query per row) sees all ``kv_len`` keys. With
  ``qo_indptr`` and ``causal``, bottom-right aligned: query i of a row of ``qo_len`` queries sees
  keys ``j <= i + kv_len - qo_len``. A ``custom_mask`` (needs ``qo_indptr``) replaces the causal
  mask: bool, each row's ``[qo_len, kv_len]`` block row-major, concatenated; True where query i
  sees key j.
- Softmax over the keys a query sees; LSE in base 2 (``logsumexp(logits) * log2(e)``). A query
  that sees no key (an empty row, ``qo_len > kv_len`` under causal, an all-False mask row) gives
  output 0 and LSE ``-inf``. NaN in a key or value a query sees reaches its output.

Backends accumulate in fp32 and return the output in q's dtype and the LSE in fp32; this reference
computes, and returns both, in the ``dtype`` it is given (float64 by default).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from ..cache.metadata import FlashInferKvMetadata


def reference_paged_attention(
        q: torch.Tensor, k_layer: torch.Tensor, v_layer: torch.Tensor, meta: FlashInferKvMetadata,
        *, qo_indptr: torch.Tensor | np.ndarray | Sequence[int] | None = None, causal: bool = True,
        sm_scale: float | None = None, logits_soft_cap: float | None = None, k_scale: float = 1.0,
        v_scale: float = 1.0, custom_mask: torch.Tensor | np.ndarray | None = None,
        dtype: torch.dtype = torch.float64) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of ``q`` ``[total_q, Hq, D]`` over one layer's paged K/V
    (``[num_pages, page_size, Hkv, D]`` or ``[num_slots, Hkv, D]``) as ``meta`` lists it, by the
    contract above; the arguments mean what they mean to ``paged_attention``.

    Computed in ``dtype`` (float64, or float32), on q's device. Returns ``(out, lse)``: ``out``
    ``[total_q, Hq, D]`` and the base-2 ``lse`` ``[total_q, Hq]``, both in ``dtype``. Inputs are
    taken as well formed (the backends validate them)."""
    ps, hkv, d = meta.page_size, k_layer.shape[-2], k_layer.shape[-1]
    k_pages = k_layer.reshape(-1, ps, hkv, d)
    v_pages = v_layer.reshape(-1, ps, hkv, d)
    group = q.shape[1] // hkv
    scale = (1.0 / math.sqrt(d) if sm_scale is None else sm_scale) * k_scale
    indptr, indices = meta.indptr.tolist(), meta.indices.tolist()
    last_page_len = meta.last_page_len.tolist()
    batch = len(last_page_len)
    qo = list(range(batch + 1)) if qo_indptr is None else torch.as_tensor(qo_indptr).tolist()
    mask = None
    if custom_mask is not None:
        mask = torch.as_tensor(custom_mask).reshape(-1).to(device=q.device, dtype=torch.bool)
    out = torch.zeros(q.shape, dtype=dtype, device=q.device)
    lse = torch.full(q.shape[:2], -math.inf, dtype=dtype, device=q.device)
    mask_at = 0  # where this row's block of custom_mask starts
    for b in range(batch):
        pages = indices[indptr[b] : indptr[b + 1]]
        kv_len = (len(pages) - 1) * ps + last_page_len[b] if pages else 0
        q_len = qo[b + 1] - qo[b]
        if kv_len == 0 or q_len == 0:  # no key, or no query: outputs stay 0, LSEs -inf
            mask_at += q_len * kv_len
            continue
        # the row's keys in order, each query head beside the KV head it reads: [kv_len, Hq, D]
        k = k_pages[pages].reshape(-1, hkv, d)[:kv_len].repeat_interleave(group, dim=1)
        v = v_pages[pages].reshape(-1, hkv, d)[:kv_len].repeat_interleave(group, dim=1)
        if mask is not None:
            seen = mask[mask_at : mask_at + q_len * kv_len].view(q_len, kv_len)
        elif causal and qo_indptr is not None:
            query = torch.arange(q_len, device=q.device)[:, None]
            seen = torch.arange(kv_len, device=q.device)[None, :] <= query + kv_len - q_len
        else:
            seen = torch.ones(q_len, kv_len, dtype=torch.bool, device=q.device)
        mask_at += q_len * kv_len
        row_out, row_lse = dense_reference_attention(
            q[qo[b] : qo[b + 1]].transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1),
            scale=scale, soft_cap=logits_soft_cap, seen=seen, dtype=dtype)  # per query head
        out[qo[b] : qo[b + 1]] = row_out.transpose(0, 1) * v_scale
        lse[qo[b] : qo[b + 1]] = (row_lse / math.log(2)).T
    return out, lse


def dense_reference_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, scale: float,
                              soft_cap: float | None = None, seen: torch.Tensor | None = None,
                              dtype: torch.dtype = torch.float64
                              ) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax attention of ``q`` ``[..., Lq, D]`` over dense ``k``/``v`` ``[..., L, D]`` in
    ``dtype``: logits ``q . k * scale``, soft-capped (``soft_cap * tanh(logits / soft_cap)``), then
    masked where ``seen`` (bool, broadcast to ``[..., Lq, L]``; None: all seen) is False. Returns
    the output ``[..., Lq, D]`` and the natural-log LSE ``[..., Lq]``; a query that sees no key
    gives 0 and ``-inf``."""
    logits = q.to(dtype) @ k.to(dtype).transpose(-1, -2) * scale
    if soft_cap:
        logits = soft_cap * torch.tanh(logits / soft_cap)
    if seen is not None:
        logits = logits.masked_fill(~seen, -math.inf)
    lse = torch.logsumexp(logits, dim=-1, keepdim=True)
    p = torch.where(lse == -math.inf, 0.0, torch.exp(logits - lse))
    return p @ v.to(dtype), lse[..., 0]
