"""The torch backend's fused paths (``backend``; chosen by the plan, ``plan``):
attention handed to torch's fused kernels in a few calls instead of the chunked online softmax,
their parts merged by log-sum-exp.

- ``one_chunk_sdpa`` / ``one_chunk_flash``: a forward whose keys fit one chunk, in one fused call
  (with the LSE: torch's fused CPU kernel that returns it), or run by run over a one-row plan's
  consecutive slots read in place;
- ``shared_level`` / ``one_chunk_cascade``: a shared prefix's K/V read once for every row's queries;
- ``run_windows``: causal windows as an unmasked prefix plus a square ``is_causal`` block.
"""

from __future__ import annotations

import math

import torch

from .merge import LOG2E, merge_by_lse, merge_states
from .gather import buffers, gather_chunk, gather_rows, rows_view, slot_range
from .plan import AttentionPlan, CausalWindow, SdpaMask


def _cpu_flash(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, scale: float,
               attn_mask: torch.Tensor | None = None,
               is_causal: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """torch's fused attention kernel on the CPU, which also returns the natural-log LSE: the
    output ``[..., L, D]`` and the LSE ``[..., L]``."""
    flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    out, lse = flash(q, k, v, is_causal=is_causal, attn_mask=attn_mask, scale=scale)
    return out, lse


def shared_level(plan: AttentionPlan, qh: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 k_rows: torch.Tensor | None,
                 v_rows: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The online softmax's state ``(max, denominator, accumulator)`` after the shared prefix: its
    K/V gathered once and every row's queries (``qh`` ``[B, Hkv, G * Qmax, D]``, scaled) stacked
    into one attention call. Every query sees every shared key, so no mask is needed. Returns
    ``m = lse`` ``[B, Hkv, G * Qmax, 1]``, ``den = 1`` and ``acc`` = the normalised output
    ``[B, Hkv, G * Qmax, D]``."""
    shared = plan.shared
    assert shared is not None
    b, hkv, gq, d = qh.shape
    p = shared.num_tokens
    n = hkv * p * d
    k0 = gather_rows(k, k_rows, shared.rows, buffers(plan, k.dtype, 2, n)).view(1, hkv, p, d)
    v0 = gather_rows(v, v_rows, shared.rows, buffers(plan, v.dtype, 3, n)).view(1, hkv, p, d)
    q0 = qh.transpose(0, 1).reshape(1, hkv, b * gq, d)  # all rows' queries, per KV head
    if plan.fused_lse:  # the fused CPU kernel, which also returns the log-sum-exp
        out0, lse0 = _cpu_flash(q0, k0, v0, scale=1.0)
    else:
        s = torch.matmul(q0, k0.transpose(-1, -2))  # [1, Hkv, B * GQ, P]
        lse0 = torch.logsumexp(s, dim=-1)
        out0 = torch.matmul(torch.softmax(s, dim=-1), v0)
    acc = out0.view(hkv, b, gq, d).transpose(0, 1).contiguous()
    m = lse0.view(hkv, b, gq, 1).transpose(0, 1).contiguous()
    return m, torch.ones_like(m), acc


def one_chunk_cascade(plan: AttentionPlan, qh: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                      v_scale: float) -> torch.Tensor:
    """A CPU forward with a shared prefix and one chunk of the rows' own positions, without soft cap
    or LSE: the shared level (``shared_level``), the rows' own keys in one fused call that also
    returns the log-sum-exp (an additive mask, built once per forward, hides what a query must not
    see), and a log-sum-exp merge of the two. Every real query sees its own position, so the own
    level is never empty for it. Returns ``[B * Qmax, Hq, D]``."""
    # [B, Hkv, GQ, 1] and [B, Hkv, GQ, D]
    lse0, _, out0 = shared_level(plan, qh, k, v, rows_view(k), rows_view(v))
    kc, vc = gather_chunk(plan, k, v)
    additive, _ = _additive_mask(plan, qh.device)
    out1, lse1 = _cpu_flash(qh, kc, vc, attn_mask=additive, scale=1.0)
    return _query_rows(plan, merge_by_lse(out0, lse0, out1, lse1.unsqueeze(-1)), v_scale)


def one_chunk_sdpa(plan: AttentionPlan, qh: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   v_scale: float) -> torch.Tensor:
    """A forward whose whole KV fits one chunk, without soft cap or LSE (decode, verify windows,
    short prefill): one fused SDPA instead of the online softmax. ``qh`` is
    ``[B, Hkv, G * Qmax, D]`` fp32, already scaled. Slots past a row's end are zeroed in K and V
    (NaN-safe) and masked with the causal limits; a query with no key gives 0, like the general
    path. Returns ``[B * Qmax, Hq, D]``."""
    by_span = _span_attention(plan, qh, k, v)
    if by_span is not None:
        return _query_rows(plan, by_span[0], v_scale)
    kc, vc = gather_chunk(plan, k, v)
    additive, blind = _additive_mask(plan, qh.device)
    sdpa = torch.nn.functional.scaled_dot_product_attention
    out = sdpa(qh, kc, vc, attn_mask=additive, scale=1.0)
    if blind is not None:
        out = out.masked_fill(blind, 0.0)  # queries that see no key at all (SDPA gives NaN there)
    return _query_rows(plan, out, v_scale)


def one_chunk_flash(plan: AttentionPlan, qh: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    v_scale: float, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """``one_chunk_sdpa`` with the log-sum-exp, through torch's fused CPU kernel that returns it (a
    decode over the part of the keys a caller merges with another part, e.g. a draft chain's
    history). Returns the output ``[total_q, Hq, D]`` in ``dtype`` and the base-2 LSE
    ``[total_q, Hq]`` (-inf for a query that sees no key)."""
    by_span = _span_attention(plan, qh, k, v)
    if by_span is not None:
        out, lse = by_span
    else:
        kc, vc = gather_chunk(plan, k, v)
        additive, blind = _additive_mask(plan, qh.device)
        out, lse = _cpu_flash(qh, kc, vc, attn_mask=additive, scale=1.0)
        lse = lse.unsqueeze(-1)  # [B, Hkv, G * Qmax, 1]
        if blind is not None:
            out, lse = out.masked_fill(blind, 0.0), lse.masked_fill(blind, -math.inf)
    b, hkv, qmax = plan.batch, plan.num_kv_heads, plan.max_q
    lse = (lse * LOG2E).view(b, hkv, plan.num_qo_heads // hkv, qmax).permute(0, 3, 1, 2)
    lse = lse.reshape(b * qmax, -1)
    out = _query_rows(plan, out, v_scale)
    if plan.out_rows is not None:
        out, lse = out.index_select(0, plan.out_rows), lse.index_select(0, plan.out_rows)
    return out.to(dtype), lse.contiguous()


def _span_attention(plan: AttentionPlan, qh: torch.Tensor, k: torch.Tensor,
                    v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The one-chunk attention of a one-row plan whose slots form several runs (``KvChunk.spans``)
    over an fp32 cache, without a gather: each run's K/V are a strided view of the cache, attended
    in one fused CPU call that also returns the log-sum-exp, and the runs are merged by log-sum-exp
    (``merge_states``). ``qh`` is ``[1, Hkv, G * Qmax, D]`` fp32, already scaled. Returns the
    normalised output ``[1, Hkv, G * Qmax, D]`` and the natural-log LSE ``[1, Hkv, G * Qmax, 1]`` (a
    query that sees no key: 0 and -inf), or None when the plan or the cache does not allow it (fewer
    than two runs, a cache of another dtype or device or without a slot view); the caller then
    gathers. Equal to the gathered computation up to float rounding."""
    c = plan.chunks[0]
    if c.spans is None or len(c.spans) < 2 or k.dtype != torch.float32 or qh.device.type != "cpu":
        return None
    views = []
    for first, n in c.spans:
        kr, vr = slot_range(k, first, n), slot_range(v, first, n)
        if kr is None or vr is None:
            return None
        views.append((kr, vr))
    masks, any_blind = _span_masks(plan, qh.device)
    out = lse = None
    for (kr, vr), (mask, blind) in zip(views, masks):
        o, part = _cpu_flash(qh, kr, vr, attn_mask=mask, scale=1.0)  # [1, Hkv, GQ, D], [1, Hkv, GQ]
        part = part.unsqueeze(-1)
        if blind is not None:  # the kernel gives 0 and LSE 0 to a query that sees no key of the run
            part = part.masked_fill(blind, -math.inf)
        out, lse = (o, part) if out is None or lse is None else merge_states(out, lse, o, part)
    assert out is not None and lse is not None
    # a query blind in two merged runs got NaN weights (-inf - -inf); it sees no key: output 0
    if any_blind:
        out = out.masked_fill(lse == -math.inf, 0.0)
    return out, lse


def _span_masks(plan: AttentionPlan, device: torch.device) -> tuple[list[SdpaMask], bool]:
    """Each span's columns of the one-chunk additive mask (``_additive_mask``; a view) and the bool
    ``[1, 1, G * Qmax, 1]`` query rows that see no key of that span (None when every query sees
    one), built by the first layer and kept on the plan; ``(None, None)`` for every span of an
    unmasked plan (decode). The flag: some span has blind rows."""
    if plan.span_masks is None:
        spans = plan.chunks[0].spans
        assert spans is not None
        additive, _ = _additive_mask(plan, device)
        masks: list[SdpaMask] = []
        at = 0
        for _, n in spans:
            blind = None
            part = None if additive is None else additive[..., at : at + n]
            if part is not None:
                blind = (part == -math.inf).all(-1, keepdim=True)
                blind = blind if bool(blind.any()) else None
            masks.append((part, blind))
            at += n
        plan.span_masks = (masks, any(blind is not None for _, blind in masks))
    return plan.span_masks


def _additive_mask(plan: AttentionPlan, device: torch.device) -> SdpaMask:
    """The one-chunk paths' mask, built by the first layer and kept on the plan for the rest of the
    forward: an additive fp32 mask ``[B, 1, G * Qmax or 1, Lc]`` (0 where a query may see a key,
    -inf where not; None when it sees all) and the bool ``[B, 1, G * Qmax, 1]`` rows that see no key
    at all (None when there are none)."""
    if plan.sdpa_mask is None:
        b, hkv, qmax = plan.batch, plan.num_kv_heads, plan.max_q
        g = plan.num_qo_heads // hkv
        c = plan.chunks[0]
        seen = None  # True where a key may be seen
        if c.past_end is not None:
            seen = ~c.past_end.transpose(-1, -2)
        if c.hidden is not None:  # [B, 1, 1, Qmax, Lc] -> one row per (g, query), like qh
            hidden = c.hidden.expand(b, 1, g, qmax, c.num_tokens)
            visible = ~hidden.reshape(b, 1, g * qmax, c.num_tokens)
            seen = visible if seen is None else visible & seen
        additive = blind = None
        if seen is not None:
            additive = torch.zeros(seen.shape, device=device).masked_fill_(~seen, -math.inf)
            if not bool(seen.any(-1).all()):
                blind = ~seen.any(-1, keepdim=True)
        plan.sdpa_mask = (additive, blind)
    return plan.sdpa_mask


def _query_rows(plan: AttentionPlan, out: torch.Tensor, v_scale: float) -> torch.Tensor:
    """``out`` ``[B, Hkv, G * Qmax, D]`` times ``v_scale`` as ``[B * Qmax, Hq, D]``: head h =
    kv_head * G + g, as the GQA mapping requires."""
    if v_scale != 1.0:
        out = out * v_scale
    b, hkv, d, qmax = plan.batch, plan.num_kv_heads, plan.head_dim, plan.max_q
    g = plan.num_qo_heads // hkv
    out = out.view(b, hkv, g, qmax, d).permute(0, 3, 1, 2, 4)
    return out.reshape(b * qmax, plan.num_qo_heads, d)


def run_windows(plan: AttentionPlan, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                k_scale: float, v_scale: float,
                return_lse: bool) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """``run_attention`` of a plan of causal windows (``plan.windows``, which cover every query),
    one row at a time (``_window``)."""
    assert plan.windows is not None
    k_rows, v_rows = rows_view(k), rows_view(v)
    parts = []
    for w in plan.windows:
        # [1, Hq, S, D], [1, Hq, S, 1]
        o, row_lse = _window(plan, w, q, k, v, k_rows, v_rows, k_scale)
        if v_scale != 1.0:
            o.mul_(v_scale)
        parts.append((w, o[0].transpose(0, 1), row_lse[0, :, :, 0].T))  # [S, Hq, D], [S, Hq]
    # a lone window without keys before it comes out laid [S, Hq, D] (see _window): no copy
    if len(parts) == 1:
        out, lse = parts[0][1].contiguous().to(q.dtype), parts[0][2]
    else:
        out = torch.empty(plan.total_q, plan.num_qo_heads, plan.head_dim, dtype=q.dtype,
                          device=q.device)
        lse = torch.empty(plan.total_q, plan.num_qo_heads, device=q.device)
        for w, o, row_lse in parts:
            out[w.q_first : w.q_first + w.q_len] = o
            lse[w.q_first : w.q_first + w.q_len] = row_lse
    return (out, (lse * LOG2E).contiguous()) if return_lse else out


def _window(plan: AttentionPlan, w: CausalWindow, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
            k_rows: torch.Tensor | None, v_rows: torch.Tensor | None,
            k_scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """One row's causal window without its masked half: the window's own square causal block in one
    ``is_causal`` fused call, then each piece of the keys before it in one unmasked fused call
    (queries grouped by KV head, so K/V are not repeated), merged by log-sum-exp. Returns the fp32
    output ``[1, Hq, S, D]`` (before ``v_scale``) and the natural-log LSE ``[1, Hq, S, 1]``."""
    hq, hkv, d, s = plan.num_qo_heads, plan.num_kv_heads, plan.head_dim, w.q_len
    n = hq * s * d
    buf, qs = buffers(plan, torch.float32, 4, n)[1][:n], q[w.q_first : w.q_first + s]
    scale = plan.sm_scale * k_scale
    if w.prefix:  # head-major, so that the queries group by KV head for the keys before the window
        qh = buf.view(1, hq, s, d)
        torch.mul(qs.transpose(0, 1), scale, out=qh[0])
    else:  # token-major, so that the output (laid out like q) is [S, Hq, D] memory
        qh = buf.view(1, s, hq, d).transpose(1, 2)
        torch.mul(qs, scale, out=buf.view(s, hq, d))
    kb = gather_rows(k, k_rows, w.block, buffers(plan, k.dtype, 0, n)).view(1, hq, s, d)
    vb = gather_rows(v, v_rows, w.block, buffers(plan, v.dtype, 1, n)).view(1, hq, s, d)
    out, lse = _cpu_flash(qh, kb, vb, is_causal=True, scale=1.0)  # [1, Hq, S, D], [1, Hq, S]
    lse = lse.unsqueeze(-1)
    grouped = qh.view(1, hkv, hq // hkv * s, d) if w.prefix else qh
    for rows in w.prefix:
        n = rows.shape[0] * d
        kp = gather_rows(k, k_rows, rows, buffers(plan, k.dtype, 2, n)).view(1, hkv, -1, d)
        vp = gather_rows(v, v_rows, rows, buffers(plan, v.dtype, 3, n)).view(1, hkv, -1, d)
        out0, lse0 = _cpu_flash(grouped, kp, vp, scale=1.0)  # [1, Hkv, G * S, D], [1, Hkv, G * S]
        lse0 = lse0.reshape(1, hq, s, 1)
        merged = torch.logaddexp(lse, lse0)
        out0 = out0.reshape(1, hq, s, d).mul_((lse0 - merged).exp_())
        out = out.mul_((lse - merged).exp_()).add_(out0)
        lse = merged
    return out, lse
