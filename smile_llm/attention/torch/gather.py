"""Reading K/V out of the paged cache for the torch backend (``backend``): cache rows (slot *
Hkv + head) of an NHD cache gathered into fp32 workspaces kept on the plan across layers, and views
of the cache where its strides allow reading it in place."""

from __future__ import annotations

import torch

from .plan import AttentionPlan, KvChunk


def gather_chunk(plan: AttentionPlan, k: torch.Tensor,
                 v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V of the plan's one chunk as fp32 ``[B, Hkv, Lc, D]`` in the workspace, slots past each
    row's end zeroed (they may hold NaN, and 0 * NaN is NaN). A one-row plan over consecutive slots
    of an fp32 cache gets views of the cache instead (no copy; such a plan has no slot past its
    row's end)."""
    c = plan.chunks[0]
    if c.first_slot is not None and k.dtype == torch.float32:
        k_view = slot_range(k, c.first_slot, c.num_tokens)
        v_view = slot_range(v, c.first_slot, c.num_tokens)
        if k_view is not None and v_view is not None:
            return k_view, v_view
    shape = (plan.batch, plan.num_kv_heads, c.num_tokens, plan.head_dim)
    kc = gather_rows(k, rows_view(k), c.rows, buffers(plan, k.dtype, 0)).view(shape)
    vc = gather_rows(v, rows_view(v), c.rows, buffers(plan, v.dtype, 1)).view(shape)
    zero_past_end(kc, c)
    zero_past_end(vc, c)
    return kc, vc


def zero_past_end(gathered: torch.Tensor, c: KvChunk) -> None:
    """Zero the slots past each row's end in a gathered chunk ``[B, Hkv, Lc, D]`` (contiguous): one
    ``index_fill_`` of the planned rows, not a masked fill over the whole chunk."""
    if c.zero_rows is not None:
        gathered.view(-1, gathered.shape[-1]).index_fill_(0, c.zero_rows, 0.0)


def slot_range(cache: torch.Tensor, first: int, n: int) -> torch.Tensor | None:
    """Slots ``[first, first + n)`` of the NHD ``cache`` as a ``[1, Hkv, n, D]`` view, or None if
    its strides allow no such view."""
    try:
        slots = cache.view(-1, cache.shape[2], cache.shape[3])
    except RuntimeError:
        return None
    return slots[first : first + n].transpose(0, 1).unsqueeze(0)


def rows_view(cache: torch.Tensor) -> torch.Tensor | None:
    """The NHD cache as ``[num_slots * Hkv, D]`` rows, or None if its strides allow no such view."""
    try:
        return cache.view(-1, cache.shape[-1])
    except RuntimeError:
        return None


def buffers(plan: AttentionPlan, dtype: torch.dtype, which: int,
            n: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Flat ``(raw, fp32)`` gather buffers of at least ``n`` elements (default: the largest per-row
    chunk), kept on the plan across layers under ``which``: 0/1 for a chunk's (or a causal window's
    block's) K/V, 2/3 for the shared prefix's (or the keys before a causal window), 4 for a causal
    window's queries. A request for more than the kept size replaces them."""
    ws = plan.workspace.get((dtype, which))
    if ws is None or (n is not None and ws[1].shape[0] < n):
        if n is None:
            longest = max((c.num_tokens for c in plan.chunks), default=0)
            n = plan.batch * longest * plan.num_kv_heads * plan.head_dim
        raw = torch.empty(n if dtype != torch.float32 else 0, dtype=dtype, device=plan.device)
        ws = raw, torch.empty(n, dtype=torch.float32, device=plan.device)
        plan.workspace[(dtype, which)] = ws
    return ws


def gather_rows(cache: torch.Tensor, cache_rows: torch.Tensor | None, rows: torch.Tensor,
                buf: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """Rows ``rows`` (slot * Hkv + head) of the NHD ``cache`` as fp32 ``[len(rows), D]`` in the
    workspace: one ``index_select`` (plus a cast unless fp32); an advanced index when the cache's
    strides allow no row view."""
    raw, f32 = buf
    d = cache.shape[3]
    n = rows.shape[0] * d
    out = f32[:n].view(-1, d)
    if cache_rows is None:
        slot, head = rows.div(cache.shape[2], rounding_mode="floor"), rows.remainder(cache.shape[2])
        page = slot.div(cache.shape[1], rounding_mode="floor")
        return out.copy_(cache[page, slot.remainder(cache.shape[1]), head])
    if cache_rows.dtype == torch.float32:
        return torch.index_select(cache_rows, 0, rows, out=out)
    return out.copy_(torch.index_select(cache_rows, 0, rows, out=raw[:n].view(-1, d)))
