"""The torch backend's ``run`` (``backend``): one layer under a plan (``plan``). The
general path is the chunked online softmax here (any device, soft cap, any mask); the plan's fused
paths go to ``fused``."""

from __future__ import annotations

import math

import torch

from .merge import LOG2E
from .fused import one_chunk_cascade, one_chunk_flash, one_chunk_sdpa, run_windows, shared_level
from .gather import buffers, gather_rows, rows_view, zero_past_end
from .plan import AttentionPlan, check_real


def run_attention(plan: AttentionPlan, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *,
                  k_scale: float = 1.0, v_scale: float = 1.0,
                  return_lse: bool = False) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """One layer under ``plan``; ``k``/``v`` 4-D NHD pages (see ``check_tensors``). ValueError when
    they do not match the plan."""
    check_run(plan, q, k, v, k_scale, v_scale)
    return run_checked(plan, q, k, v, float(k_scale), float(v_scale), return_lse)


def check_run(plan: AttentionPlan, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
              k_scale: float, v_scale: float) -> None:
    """ValueError unless ``q`` and the 4-D ``k``/``v`` fit ``plan`` and the scales are finite
    reals."""
    hq, hkv, d = plan.num_qo_heads, plan.num_kv_heads, plan.head_dim
    if q.shape[0] != plan.total_q:
        raise ValueError(f"q has {q.shape[0]} query rows but the plan has {plan.total_q} "
                         f"(qo_indptr[-1], or B for decode: one query per row; pass qo_indptr "
                         f"otherwise)")
    if tuple(q.shape[1:]) != (hq, d) or tuple(k.shape[2:]) != (hkv, d):
        raise ValueError(f"planned q heads [{hq}, {d}] and K/V heads [{hkv}, {d}], got q "
                         f"{tuple(q.shape)} and K/V {tuple(k.shape)}")
    if plan.max_page >= k.shape[0]:
        raise ValueError(f"meta lists page {plan.max_page}, outside the cache's {k.shape[0]} pages")
    if k.device != plan.device:
        raise ValueError(f"K/V on {k.device} but meta on {plan.device}; keep them on one device")
    check_real(k_scale, "k_scale")
    check_real(v_scale, "v_scale")


def run_checked(plan: AttentionPlan, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                k_scale: float, v_scale: float,
                return_lse: bool) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """``run_attention`` after ``check_run`` passed for these shapes: the plan's fused paths
    (``fused``), or the online softmax over the plan's chunks, each gathered into fp32, its
    scores soft-capped and masked, and the running max, denominator and accumulator rescaled by it
    (after the shared prefix's level, when there is one)."""
    if plan.windows is not None:
        return run_windows(plan, q, k, v, k_scale, v_scale, return_lse)
    b, hq, hkv, d = plan.batch, plan.num_qo_heads, plan.num_kv_heads, plan.head_dim
    qmax = plan.max_q
    g = hq // hkv
    cap = plan.soft_cap
    scale = plan.sm_scale * k_scale / (cap if cap else 1.0)
    qp = q if plan.q_rows is None else q.index_select(0, plan.q_rows)  # [B*Qmax, Hq, D]
    # fp32, pre-scaled, queries grouped by KV head
    qh = torch.empty(b, hkv, g, qmax, d, device=plan.device)
    torch.mul(qp.reshape(b, qmax, hkv, g, d).permute(0, 2, 3, 1, 4), scale, out=qh)
    qh = qh.view(b, hkv, g * qmax, d)

    # one chunk with its LSE on the CPU's fused kernel (which needs keys and queries)
    if len(plan.chunks) == 1 and not cap and return_lse and plan.shared is None and \
            plan.fused_lse and plan.chunks[0].num_tokens and plan.total_q:
        return one_chunk_flash(plan, qh, k, v, v_scale, q.dtype)
    # a fused path for a forward whose own keys fit one chunk, without soft cap or LSE
    one_chunk = None
    if len(plan.chunks) == 1 and not cap and not return_lse:
        if plan.shared is not None:  # the cascade needs torch's fused CPU kernel with the LSE
            one_chunk = one_chunk_cascade if plan.fused_lse else None  # else: the online softmax
        else:
            one_chunk = one_chunk_sdpa
    if one_chunk is not None:
        out = one_chunk(plan, qh, k, v, v_scale)  # [B * Qmax, Hq, D] fp32
        if plan.out_rows is not None:
            out = out.index_select(0, plan.out_rows)
        return out.to(q.dtype)

    k_rows, v_rows = rows_view(k), rows_view(v)
    if plan.shared is not None:
        m, den, acc = shared_level(plan, qh, k, v, k_rows, v_rows)
    else:
        m = torch.full((b, hkv, g * qmax, 1), -math.inf, device=plan.device)  # running logit max
        den = torch.zeros_like(m)  # running sum of exp(logit - max)
        acc = torch.zeros(b, hkv, g * qmax, d, device=plan.device)  # running sum of that times v
    k_buf, v_buf = buffers(plan, k.dtype, 0), buffers(plan, v.dtype, 1)
    for c in plan.chunks:
        lc = c.num_tokens
        kc = gather_rows(k, k_rows, c.rows, k_buf).view(b, hkv, lc, d)  # fp32
        vc = gather_rows(v, v_rows, c.rows, v_buf).view(b, hkv, lc, d)
        zero_past_end(vc, c)  # unwritten slots may hold NaN; p = 0 there must stay 0
        s = torch.matmul(qh, kc.transpose(-1, -2))  # [B, Hkv, G*Qmax, Lc]
        if cap:
            s.tanh_().mul_(cap)
        if c.hidden is not None:
            s.view(b, hkv, g, qmax, lc).masked_fill_(c.hidden, -math.inf)
        m_new = torch.maximum(m, s.amax(-1, keepdim=True))
        shift = m_new.masked_fill(m_new == -math.inf, 0.0)  # rows that saw nothing stay at p = 0
        s.sub_(shift).exp_()
        alpha = (m - shift).exp_()
        den.mul_(alpha).add_(s.sum(-1, keepdim=True))
        acc.mul_(alpha).add_(torch.matmul(s, vc))
        m = m_new

    # queries that saw no key: output 0, LSE -inf (NaN from NaN data still propagates)
    blind = den == 0
    out = torch.where(blind, 0.0, acc / den.masked_fill(blind, 1.0)) * v_scale
    out = out.view(b, hkv, g, qmax, d).permute(0, 3, 1, 2, 4).reshape(b * qmax, hq, d)
    if plan.out_rows is not None:
        out = out.index_select(0, plan.out_rows)
    out = out.to(q.dtype)  # [total_q, Hq, D]
    if not return_lse:
        return out
    lse = ((m + den.log()) * LOG2E).view(b, hkv, g, qmax).permute(0, 3, 1, 2).reshape(b * qmax, hq)
    if plan.out_rows is not None:
        lse = lse.index_select(0, plan.out_rows)
    return out, lse.contiguous()  # lse: float32[total_q, Hq], base 2
