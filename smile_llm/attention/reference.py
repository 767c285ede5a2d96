"""Paged attention in pure PyTorch with FlashInfer's semantics, and the backend that serves it on any device.

The contract (docs/contract.md, "Paged attention"), on the same CSR a FlashInfer wrapper is planned with:

- Gather order: row b reads pages ``indices[indptr[b]:indptr[b+1]]`` in order, all ``page_size`` slots of each but
  the last, which gives ``last_page_len[b]``; ``kv_len = (pages - 1) * page_size + last_page_len`` (0 for no pages).
- GQA: query head h uses KV head ``h // (Hq / Hkv)``.
- Scales: ``sm_scale`` (default ``1/sqrt(D)``) times ``k_scale`` scales the logits; ``v_scale`` multiplies the output.
  FP8 K/V is only cast (no per-token dequantisation). Soft cap: ``logits = cap * tanh(logits / cap)``, before masking.
- Masks: decode (no ``qo_indptr``) sees all of ``kv_len``; prefill/verify with ``causal`` is bottom-right aligned:
  query i of a row with ``qo_len`` queries sees ``kv_idx <= i + kv_len - qo_len``.
- fp32 accumulation; the output has q's dtype; LSE is base 2 (``logsumexp(logits) * log2(e)``).
- Defined where FlashInfer is not: a query that sees no key (an empty row, or ``qo_len > kv_len`` under causal) gives
  output 0 and LSE ``-inf``; slots past ``kv_len`` are never read into a result, so unwritten (NaN) slots there are
  harmless.

The work runs over chunks of kv pages with an online softmax: ``plan`` lists each chunk's cache rows (one per
slot and KV head, head-major), so ``run`` gathers a chunk with one ``index_select`` (no loop per token or page),
casts it to fp32 and multiplies it in one batched matmul.
The chunk is sized to stay in cache; scores held at once are ``O(B * Hq * max_qo_len * chunk)``.

One row in one chunk (single-stream decode, verify, short prefill; no soft cap) on the CPU: an fp32 cache is read in
place, without a gather. The row's slots are cut into runs of consecutive slots (``_Chunk.spans``; a FIFO free list
hands out one or two); each run is a strided view of the cache, attended in one fused call, and two or more runs are
merged by their log-sum-exps. Rows whose runs average fewer than ``SPAN_MIN_TOKENS`` slots are gathered instead.

Shared prefix (cascade): when every row of a forward starts with the same pages (requests sharing a cached system
prompt) and every query comes after them, ``plan`` splits those ``P`` positions off as one shared level. ``run``
gathers their K/V once (not once per row) and attends all rows' queries to them in one call, then continues the
online softmax over each row's own pages. The result equals the per-row computation up to float rounding.

Causal windows (prefill, whole or chunked; CPU, no soft cap): when a forward has a window of at least
``CAUSAL_SPLIT_MIN`` queries and no shared prefix, every row's keys split into the keys before its window, which all
its queries see (one unmasked fused call per piece of at most ``CHUNK_BYTES`` of K/V), and the window's own square
causal block (one fused ``is_causal`` call, whose masked tiles the kernel skips); the parts are merged by their
log-sum-exps. Nothing masked is computed, and no scores are held (the fused kernel tiles them).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal, overload

import numpy as np
import torch

from smile_llm.cache.metadata import FlashInferKvMetadata

from .merge import merge_by_lse, merge_states

LOG2E = 1.4426950408889634
CHUNK_BYTES = 32 << 20  # per kv chunk: its fp32 K and V plus its scores (measured best on a 2-core CPU)
CASCADE_MIN_TOKENS = 128  # a shared prefix shorter than this is attended per row (the split costs more than it saves)
CPU_FLASH_LSE = True  # the cascade on the CPU uses torch's fused kernel that returns the LSE (off: plain matmuls)
CAUSAL_SPLIT_MIN = 64  # a causal window this long skips its masked half (see _CausalWindow)
SPAN_MIN_TOKENS = 128  # a one-row chunk is read in place, run by run, while its runs average at least this many slots


@dataclass(frozen=True)
class _Chunk:
    """Positions ``[first, first + num_tokens)`` (whole pages) of every row."""

    rows: torch.Tensor  # int64[B * Hkv * Lc] rows of the cache viewed [num_slots * Hkv, D], head-major per batch row
    num_tokens: int  # Lc; positions past a row's pages read page 0's slots (masked)
    hidden: torch.Tensor | None  # bool[B, 1, 1, Qmax, Lc]: a query must not see this key; None if all visible
    past_end: torch.Tensor | None  # bool[B, 1, Lc, 1]: slot past the row's kv_len (its V is zeroed); None if none
    zero_rows: torch.Tensor | None = None  # int64: those slots' rows in the gathered [B * Hkv * Lc, D] chunk
    # one row's slots as runs of consecutive slots (first slot, length), in position order: fp32 K/V read in place
    spans: tuple[tuple[int, int], ...] | None = None

    @property
    def first_slot(self) -> int | None:
        """The first slot of a one-row chunk whose slots are all consecutive (one span), else None."""
        return self.spans[0][0] if self.spans is not None and len(self.spans) == 1 else None


@dataclass(frozen=True)
class _CausalWindow:
    """One row's causal window: queries ``[q_first, q_first + q_len)`` of q (``1 <= q_len <= kv_len``), the last
    ``q_len`` of the row's ``kv_len`` positions. Every query sees all keys before the window; query i of the window
    sees its keys ``0..i`` (bottom-right causal)."""

    q_first: int
    q_len: int
    prefix: list[torch.Tensor]  # int64[Hkv * Lp] cache rows of each piece of the keys before the window, head-major
    block: torch.Tensor  # int64[Hq * q_len] cache rows of the window's own keys, one run per query head (GQA)


@dataclass
class AttentionPlan:
    """What ``run`` needs besides q, K and V: gather indices and masks, built once per forward."""

    batch: int
    num_qo_heads: int
    num_kv_heads: int
    head_dim: int
    page_size: int
    total_q: int
    max_q: int  # longest qo_len; rows are padded to it
    max_page: int  # largest page id listed (-1 if none)
    sm_scale: float
    soft_cap: float | None
    device: torch.device
    q_rows: torch.Tensor | None  # int64[B * Qmax] row of q for each padded query; None when the identity
    out_rows: torch.Tensor | None  # int64[total_q] padded query of each output row; None when the identity
    chunks: list[_Chunk]  # every row's own positions (after the shared prefix, if any)
    shared: _Chunk | None = None  # the shared prefix: rows int64[Hkv * P] of its slots, read once for every row
    workspace: dict[tuple[torch.dtype, int], tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)
    # the one-chunk paths' additive mask and blind query rows (``_additive_mask``), built by the first layer
    sdpa_mask: tuple[torch.Tensor | None, torch.Tensor | None] | None = None
    # each span's columns of that mask and its blind query rows, and whether any has some (``_span_masks``)
    span_masks: tuple[list[tuple[torch.Tensor | None, torch.Tensor | None]], bool] | None = None
    checked: tuple[Any, ...] | None = None  # the signature of the tensors a ReferenceBackend.run last checked
    windows: list[_CausalWindow] | None = None  # causal windows split into prefix and diagonal; chunks unused

    @property
    def causal_window(self) -> bool:
        """Whether ``run`` takes the causal-window split (``_CausalWindow``)."""
        return self.windows is not None


@overload
def paged_attention(q: torch.Tensor, k_layer: torch.Tensor, v_layer: torch.Tensor, meta: FlashInferKvMetadata, *,
                    qo_indptr: Any = ..., causal: bool = ..., sm_scale: float | None = ...,
                    logits_soft_cap: float | None = ..., k_scale: float = ..., v_scale: float = ...,
                    return_lse: Literal[False] = ..., custom_mask: Any = ...) -> torch.Tensor: ...
@overload
def paged_attention(q: torch.Tensor, k_layer: torch.Tensor, v_layer: torch.Tensor, meta: FlashInferKvMetadata, *,
                    qo_indptr: Any = ..., causal: bool = ..., sm_scale: float | None = ...,
                    logits_soft_cap: float | None = ..., k_scale: float = ..., v_scale: float = ...,
                    return_lse: Literal[True], custom_mask: Any = ...) -> tuple[torch.Tensor, torch.Tensor]: ...
@overload
def paged_attention(q: torch.Tensor, k_layer: torch.Tensor, v_layer: torch.Tensor, meta: FlashInferKvMetadata, *,
                    qo_indptr: Any = ..., causal: bool = ..., sm_scale: float | None = ...,
                    logits_soft_cap: float | None = ..., k_scale: float = ..., v_scale: float = ...,
                    return_lse: bool = ..., custom_mask: Any = ...) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    ...
def paged_attention(q: torch.Tensor, k_layer: torch.Tensor, v_layer: torch.Tensor, meta: FlashInferKvMetadata, *,
                    qo_indptr: Any = None, causal: bool = True, sm_scale: float | None = None,
                    logits_soft_cap: float | None = None, k_scale: float = 1.0, v_scale: float = 1.0,
                    return_lse: bool = False, custom_mask: Any = None) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Attention of ``q`` ``[total_q, Hq, D]`` over one layer's paged K/V (``[num_pages, page_size, Hkv, D]`` or
    ``[num_slots, Hkv, D]``) as listed by ``meta``. Decode when ``qo_indptr`` is None (one query per row);
    otherwise ``qo_indptr`` (int ``[B+1]``, any device) gives each row's queries, masked causally or by
    ``custom_mask`` (see ``plan_attention``). Returns ``[total_q, Hq, D]`` in q's dtype, or ``(out, lse)`` with
    ``lse`` ``float32[total_q, Hq]`` base 2. ValueError on malformed input."""
    if not isinstance(meta, FlashInferKvMetadata):
        raise ValueError(f"meta must be a FlashInferKvMetadata, got {type(meta).__name__}")
    q, k, v = _check_tensors(q, k_layer, v_layer, meta.page_size)
    plan = plan_attention(meta, num_qo_heads=q.shape[1], num_kv_heads=k.shape[2], head_dim=q.shape[2],
                          qo_indptr=qo_indptr, causal=causal, sm_scale=sm_scale, logits_soft_cap=logits_soft_cap,
                          num_pages=k.shape[0], custom_mask=custom_mask)
    return run_attention(plan, q, k, v, k_scale=k_scale, v_scale=v_scale, return_lse=return_lse)


class ReferenceBackend:
    """The attention backend protocol over ``paged_attention``: ``plan`` once per forward (every layer shares the
    CSR), ``run`` once per layer. ``plan`` builds the gather indices and masks, so ``run`` only gathers and computes.
    Not thread-safe: one driver thread owns a backend."""

    name = "reference"

    def __init__(self) -> None:
        self._plan: AttentionPlan | None = None
        self._dtypes: tuple[torch.dtype, torch.dtype] = (torch.float32, torch.float32)

    def plan(self, meta: FlashInferKvMetadata, *, num_qo_heads: int, num_kv_heads: int, head_dim: int,
             qo_indptr: torch.Tensor | None = None, causal: bool = True, sm_scale: float | None = None,
             logits_soft_cap: float | None = None, q_dtype: torch.dtype = torch.float32,
             kv_dtype: torch.dtype = torch.float32, custom_mask: torch.Tensor | None = None) -> None:
        """Validate ``meta`` and the shapes and precompute the forward's gather; ValueError on bad input (the
        previous plan is then dropped). ``custom_mask``: see ``plan_attention``."""
        self._plan = None
        self._plan = plan_attention(meta, num_qo_heads=num_qo_heads, num_kv_heads=num_kv_heads, head_dim=head_dim,
                                    qo_indptr=qo_indptr, causal=causal, sm_scale=sm_scale,
                                    logits_soft_cap=logits_soft_cap, custom_mask=custom_mask)
        self._dtypes = (q_dtype, kv_dtype)

    @overload
    def run(self, q: torch.Tensor, k_layer: torch.Tensor, v_layer: torch.Tensor, *, k_scale: float = ...,
            v_scale: float = ..., return_lse: Literal[False] = ...) -> torch.Tensor: ...
    @overload
    def run(self, q: torch.Tensor, k_layer: torch.Tensor, v_layer: torch.Tensor, *, k_scale: float = ...,
            v_scale: float = ..., return_lse: Literal[True]) -> tuple[torch.Tensor, torch.Tensor]: ...
    @overload
    def run(self, q: torch.Tensor, k_layer: torch.Tensor, v_layer: torch.Tensor, *, k_scale: float = ...,
            v_scale: float = ..., return_lse: bool = ...) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]: ...
    def run(self, q: torch.Tensor, k_layer: torch.Tensor, v_layer: torch.Tensor, *, k_scale: float = 1.0,
            v_scale: float = 1.0, return_lse: bool = False) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """``paged_attention`` of one layer under the current plan. RuntimeError before ``plan``; ValueError if
        the tensors do not match what was planned (shapes, ``q_dtype``/``kv_dtype``, device, page range)."""
        plan = self._plan
        if plan is None:
            raise RuntimeError("ReferenceBackend.run called before plan(); plan once per forward, then run per layer")
        # Every layer of a forward passes tensors of the same shapes, dtypes, strides and device: check the first
        # call in full and later calls by that signature only (what the checks read, nothing else).
        signature = (q.shape, q.dtype, q.device, k_layer.shape, k_layer.dtype, k_layer.stride(), k_layer.device,
                     v_layer.shape, v_layer.dtype, v_layer.stride(), k_scale, v_scale)
        if signature != plan.checked:
            q, k, v = _check_tensors(q, k_layer, v_layer, plan.page_size)
            q_dtype, kv_dtype = self._dtypes
            if q.dtype != q_dtype or k.dtype != kv_dtype:
                raise ValueError(f"planned q_dtype={q_dtype}, kv_dtype={kv_dtype} but got q {q.dtype}, K/V "
                                 f"{k.dtype}; pass the real dtypes to plan()")
            _check_run(plan, q, k, v, k_scale, v_scale)
            plan.checked = signature
        else:
            k, v = k_layer, v_layer
            if k.dim() == 3:
                k, v = k.unflatten(0, (-1, plan.page_size)), v.unflatten(0, (-1, plan.page_size))
        return _run_checked(plan, q, k, v, float(k_scale), float(v_scale), return_lse)


# ---------------------------------------------------------------------------------------------------- planning
def plan_attention(meta: FlashInferKvMetadata, *, num_qo_heads: int, num_kv_heads: int, head_dim: int,
                   qo_indptr: Any = None, causal: bool = True, sm_scale: float | None = None,
                   logits_soft_cap: float | None = None, num_pages: int | None = None,
                   custom_mask: Any = None) -> AttentionPlan:
    """The gather indices and masks of one forward. ``meta.validate(num_pages)`` plus the checks FlashInfer skips
    (head counts, ``qo_indptr``); ValueError on any of them. ``custom_mask`` (needs ``qo_indptr``; FlashInfer's
    format): bool, each row's ``[qo_len, kv_len]`` block row-major, concatenated; True where query i sees key j.
    It replaces the causal mask (a token-tree verify window attends to its ancestors only)."""
    if not isinstance(meta, FlashInferKvMetadata):
        raise ValueError(f"meta must be a FlashInferKvMetadata, got {type(meta).__name__}")
    for name, n in (("num_qo_heads", num_qo_heads), ("num_kv_heads", num_kv_heads), ("head_dim", head_dim)):
        if not isinstance(n, (int, np.integer)) or n < 1:
            raise ValueError(f"{name} must be a positive int, got {n!r}")
    if num_qo_heads % num_kv_heads:
        raise ValueError(f"num_qo_heads={num_qo_heads} is not a multiple of num_kv_heads={num_kv_heads} (GQA maps "
                         f"query head h to KV head h // (Hq / Hkv))")
    indptr, last_len, used = meta.checked_host(num_pages)  # int64 [B+1], [B], [indptr[-1]]
    ps = meta.page_size
    num_row_pages = np.diff(indptr)  # [B]
    kv_lens = np.where(num_row_pages > 0, (num_row_pages - 1) * ps + last_len, 0)  # int64[B]
    batch = len(kv_lens)
    q_lens = np.ones(batch, dtype=np.int64) if qo_indptr is None else _qo_lens(qo_indptr, batch)
    total_q, max_q = int(q_lens.sum()), int(q_lens.max(initial=0))
    device = meta.indptr.device
    scale = 1.0 / math.sqrt(head_dim) if sm_scale is None else _real(sm_scale, "sm_scale")
    cap = None if logits_soft_cap is None else _real(logits_soft_cap, "logits_soft_cap")
    if cap is not None and cap < 0:
        raise ValueError(f"logits_soft_cap must be positive (or None / 0 for no cap), got {cap}")

    visible = None if custom_mask is None else _custom_visibility(custom_mask, q_lens, kv_lens, qo_indptr)
    if visible is not None:
        causal = False  # the mask decides what each query sees
    max_pages = int(num_row_pages.max(initial=0))
    split = causal and qo_indptr is not None and cap is None and CPU_FLASH_LSE and device.type == "cpu" and \
        max_q >= CAUSAL_SPLIT_MIN and bool((q_lens <= kv_lens).all())
    if batch == 1 and not split and 0 < max_q <= kv_lens[0] and \
            _pages_per_chunk(1, ps, num_kv_heads, head_dim, num_qo_heads * max_q, max_pages) >= max_pages:
        return _plan_one_row(used, int(kv_lens[0]), max_q, ps, num_qo_heads, num_kv_heads, head_dim,
                             causal and qo_indptr is not None, scale, cap, device,
                             None if visible is None else visible[0])
    table = np.zeros((batch, max_pages), dtype=np.int64)  # [B, Pmax]; pads read page 0 and are masked
    table[np.arange(max_pages) < num_row_pages[:, None]] = used  # row-major, so CSR order
    shared_pages = _shared_pages(table, num_row_pages, kv_lens - q_lens, ps) if cap is None and visible is None \
        else 0
    if split and not shared_pages:
        windows = _causal_windows(table, kv_lens, q_lens, ps, num_qo_heads, num_kv_heads, head_dim, device)
        return AttentionPlan(batch, num_qo_heads, num_kv_heads, head_dim, ps, total_q, max_q,
                             int(used.max(initial=-1)), scale, None, device, None, None, [], windows=windows)

    # Last kv position each padded query may see (query i of row b): bottom-right causal, or the whole row.
    qi = np.arange(max_q)
    limit = np.broadcast_to((kv_lens - 1)[:, None], (batch, max_q)).copy()  # [B, Qmax]
    if causal and qo_indptr is not None:
        aligned = qi[None, :] + (kv_lens - q_lens)[:, None]
        limit = np.where(qi[None, :] < q_lens[:, None], aligned, limit)  # padded queries: the whole row (dropped)

    shared = None
    if shared_pages:
        slots0 = (table[0, :shared_pages, None] * ps + np.arange(ps)).reshape(-1)  # [P]
        rows0 = (slots0[None, :] * num_kv_heads + np.arange(num_kv_heads)[:, None]).reshape(-1)  # [Hkv * P]
        shared = _Chunk(torch.from_numpy(rows0).to(device), shared_pages * ps, None, None)
    pages_per_chunk = _pages_per_chunk(batch, ps, num_kv_heads, head_dim, num_qo_heads * max_q,
                                       max_pages - shared_pages)
    limit_t = torch.from_numpy(limit)
    chunks = []
    longest = int(kv_lens.max(initial=0))
    for first in range(shared_pages, max_pages, pages_per_chunk):
        last = min(first + pages_per_chunk, max_pages)
        end = min(last * ps, longest)  # nobody reads past the longest row: uniform rows need no mask at all
        pos = torch.arange(first * ps, end)  # [Lc]
        hidden = past_end = zero_rows = None
        lc = end - first * ps
        if visible is not None:
            hidden = torch.from_numpy(~visible[:, :, first * ps : end]).view(batch, 1, 1, max_q, -1).to(device)
        elif max_q and int(limit.min()) < end - 1:
            hidden = (pos > limit_t[:, :, None]).view(batch, 1, 1, max_q, -1).to(device)
        if batch and int(kv_lens.min()) < end:
            past = pos.numpy() >= kv_lens[:, None]  # [B, Lc]
            past_end = torch.from_numpy(past).view(batch, 1, -1, 1).to(device)
            b_idx, l_idx = np.nonzero(past)  # rows (b, h, l) of the gathered chunk, for every head h
            flat = (b_idx[:, None] * num_kv_heads + np.arange(num_kv_heads)) * lc + l_idx[:, None]
            zero_rows = torch.from_numpy(flat.reshape(-1)).to(device)
        slots = (table[:, first:last, None] * ps + np.arange(ps)).reshape(batch, 1, -1)[:, :, :lc]
        rows = (slots * num_kv_heads + np.arange(num_kv_heads)[:, None]).reshape(-1)  # [B * Hkv * Lc]
        chunks.append(_Chunk(torch.from_numpy(rows).to(device), lc, hidden, past_end, zero_rows))

    q_rows = out_rows = None
    if total_q != batch * max_q:  # ragged windows: pad every row to Qmax queries
        starts = np.concatenate([[0], np.cumsum(q_lens)[:-1]]) if batch else np.zeros(0, dtype=np.int64)
        valid = qi[None, :] < q_lens[:, None]  # [B, Qmax]
        q_rows = torch.from_numpy(np.where(valid, starts[:, None] + qi[None, :], 0).reshape(-1)).to(device)
        out_rows = torch.from_numpy(np.flatnonzero(valid.reshape(-1))).to(device)
    return AttentionPlan(batch, num_qo_heads, num_kv_heads, head_dim, ps, total_q, max_q,
                         int(used.max(initial=-1)), scale, cap or None, device, q_rows, out_rows, chunks, shared)


def _plan_one_row(pages: np.ndarray, kv_len: int, q_len: int, ps: int, hq: int, hkv: int, d: int, causal: bool,
                  scale: float, cap: float | None, device: torch.device,
                  visible: np.ndarray | None = None) -> AttentionPlan:
    """``plan_attention`` of the commonest forward, one row whose ``q_len <= kv_len`` queries and keys fit one
    chunk (single-stream decode, verify and prefill): what the general path builds, without its padding.
    ``visible``: the row's custom mask ``[q_len, >= kv_len]`` (True: seen), instead of ``causal``."""
    slots = (pages[:, None] * ps + np.arange(ps)).reshape(-1)[:kv_len]
    rows = (slots[None, :] * hkv + np.arange(hkv)[:, None]).reshape(-1)  # [Hkv * L], head-major
    hidden = None
    if visible is not None:
        hidden = torch.from_numpy(~visible[:, :kv_len]).view(1, 1, 1, q_len, kv_len).to(device)
    elif causal and q_len > 1:  # query i sees keys up to i + kv_len - q_len
        limit = torch.arange(kv_len - q_len, kv_len)
        hidden = (torch.arange(kv_len) > limit[:, None]).view(1, 1, 1, q_len, kv_len).to(device)
    chunk = _Chunk(torch.from_numpy(rows).to(device), kv_len, hidden, None, spans=_spans(slots))
    return AttentionPlan(1, hq, hkv, d, ps, q_len, q_len, int(pages.max()), scale, cap or None, device, None, None,
                         [chunk])


def _spans(slots: np.ndarray) -> tuple[tuple[int, int], ...] | None:
    """``slots`` (one row's, in position order) as runs of consecutive slots ``(first, length)``; None when there
    are none or so many that they average fewer than ``SPAN_MIN_TOKENS`` slots (one gather then costs less than a
    kernel call per run). Pages handed out by a FIFO free list mostly come in one or two runs."""
    n = len(slots)
    starts = np.flatnonzero(np.diff(slots) != 1) + 1
    if n == 0 or (len(starts) and (len(starts) + 1) * SPAN_MIN_TOKENS > n):
        return None
    bounds = [0, *starts.tolist(), n]
    return tuple((int(slots[a]), b - a) for a, b in zip(bounds[:-1], bounds[1:]))


def _custom_visibility(custom_mask: Any, q_lens: np.ndarray, kv_lens: np.ndarray, qo_indptr: Any) -> np.ndarray:
    """A FlashInfer ``custom_mask`` (each row's ``[qo_len, kv_len]`` block, row-major, concatenated) as a padded
    host array ``bool[B, Qmax, Lmax]`` (padding: not seen). ValueError without ``qo_indptr`` or for a wrong
    length."""
    if qo_indptr is None:
        raise ValueError("custom_mask needs qo_indptr (a prefill or verify window)")
    flat = (custom_mask.detach().cpu().numpy() if isinstance(custom_mask, torch.Tensor)
            else np.asarray(custom_mask)).astype(bool).reshape(-1)
    sizes = q_lens * kv_lens
    if len(flat) != int(sizes.sum()):
        raise ValueError(f"custom_mask must hold sum(qo_len * kv_len) = {int(sizes.sum())} entries (each row's "
                         f"[qo_len, kv_len] block, row-major), got {len(flat)}")
    visible = np.zeros((len(q_lens), int(q_lens.max(initial=0)), int(kv_lens.max(initial=0))), dtype=bool)
    at = 0
    for b, (q, k) in enumerate(zip(q_lens, kv_lens)):
        visible[b, :q, :k] = flat[at : at + q * k].reshape(q, k)
        at += q * k
    return visible


def _causal_windows(table: np.ndarray, kv_lens: np.ndarray, q_lens: np.ndarray, ps: int, hq: int, hkv: int, d: int,
                    device: torch.device) -> list[_CausalWindow]:
    """The ``_CausalWindow`` of every row with queries (``q_lens <= kv_lens``); the keys before a window come in
    pieces whose fp32 K and V take at most ``CHUNK_BYTES``."""
    piece = max(1, CHUNK_BYTES // (2 * 4 * hkv * d))  # positions per piece
    heads, kv_head_of = np.arange(hkv)[:, None], (np.arange(hq) // (hq // hkv))[:, None]
    windows = []
    q_first = 0
    for b in range(len(kv_lens)):
        kv_len, q_len = int(kv_lens[b]), int(q_lens[b])
        if q_len:
            slots = (table[b, : -(-kv_len // ps), None] * ps + np.arange(ps)).reshape(-1)[:kv_len]
            before = kv_len - q_len
            prefix = [torch.from_numpy((slots[None, at : min(at + piece, before)] * hkv + heads).reshape(-1)).to(device)
                      for at in range(0, before, piece)]
            block = (slots[None, before:] * hkv + kv_head_of).reshape(-1)
            windows.append(_CausalWindow(q_first, q_len, prefix, torch.from_numpy(block).to(device)))
        q_first += q_len
    return windows


def _shared_pages(table: np.ndarray, num_row_pages: np.ndarray, before_queries: np.ndarray, ps: int) -> int:
    """How many leading pages every row of ``table`` lists alike, counting only whole pages that lie before every
    row's first query (so every query sees all of them); 0 for one row or fewer than CASCADE_MIN_TOKENS."""
    batch = table.shape[0]
    if batch < 2:
        return 0
    fit = min(int(num_row_pages.min()), int(before_queries.min()) // ps)
    if fit * ps < CASCADE_MIN_TOKENS:
        return 0
    differs = (table[:, :fit] != table[:1, :fit]).any(0)  # [fit]
    pages = int(np.argmax(differs)) if differs.any() else fit
    return pages if pages * ps >= CASCADE_MIN_TOKENS else 0


def _qo_lens(qo_indptr: Any, batch: int) -> np.ndarray:
    """``qo_len`` of every row (int64[B]) from a ``[B+1]`` integer indptr; ValueError unless consistent."""
    arr = qo_indptr.detach().cpu().numpy() if isinstance(qo_indptr, torch.Tensor) else np.asarray(qo_indptr)
    if arr.ndim != 1 or not (np.issubdtype(arr.dtype, np.integer) or arr.size == 0):
        raise ValueError(f"qo_indptr must be a 1-D integer tensor [B+1], got {arr.dtype} {tuple(arr.shape)}")
    arr = arr.astype(np.int64)
    if len(arr) != batch + 1:
        raise ValueError(f"qo_indptr has {len(arr)} entries for {batch} KV rows; it needs B + 1 = {batch + 1}")
    if arr[0] != 0 or (np.diff(arr) < 0).any():
        raise ValueError(f"qo_indptr must start at 0 and never decrease, got {arr.tolist()}")
    return np.diff(arr)


def _real(x: Any, name: str) -> float:
    try:
        value = float(x)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a real number, got {x!r}") from None
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value}")
    return value


def _pages_per_chunk(batch: int, ps: int, hkv: int, d: int, q_rows: int, max_pages: int) -> int:
    per_page = max(1, batch * ps * 4 * (2 * hkv * d + q_rows))  # fp32 K and V of a page, and its scores
    return max(1, min(max_pages, CHUNK_BYTES // per_page))


# ---------------------------------------------------------------------------------------------------- running
def _check_tensors(q: Any, k: Any, v: Any, page_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
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
        raise ValueError(f"q, k_layer and v_layer must share a device, got {q.device}, {k.device}, {v.device}")
    if k.dim() == 3:
        if page_size < 1 or k.shape[0] % page_size:
            raise ValueError(f"a [num_slots, Hkv, D] cache needs num_slots a multiple of page_size={page_size}, "
                             f"got {tuple(k.shape)}")
        k, v = k.unflatten(0, (-1, page_size)), v.unflatten(0, (-1, page_size))
    elif k.dim() != 4 or k.shape[1] != page_size:
        raise ValueError(f"k_layer/v_layer must be [num_pages, page_size={page_size}, Hkv, D] (NHD) or "
                         f"[num_slots, Hkv, D], got {tuple(k.shape)}")
    if k.shape[3] != q.shape[2]:
        raise ValueError(f"head dims differ: q has D={q.shape[2]}, K/V have D={k.shape[3]}")
    if k.shape[2] < 1 or q.shape[1] % k.shape[2]:
        raise ValueError(f"Hq={q.shape[1]} is not a multiple of Hkv={k.shape[2]}")
    return q, k, v


def run_attention(plan: AttentionPlan, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, k_scale: float = 1.0,
                  v_scale: float = 1.0, return_lse: bool = False) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """One layer under ``plan``; ``k``/``v`` 4-D NHD pages (see ``_check_tensors``). ValueError when they do not
    match the plan."""
    _check_run(plan, q, k, v, k_scale, v_scale)
    return _run_checked(plan, q, k, v, float(k_scale), float(v_scale), return_lse)


def _check_run(plan: AttentionPlan, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_scale: Any,
               v_scale: Any) -> None:
    """ValueError unless ``q`` and the 4-D ``k``/``v`` fit ``plan`` and the scales are finite reals."""
    hq, hkv, d = plan.num_qo_heads, plan.num_kv_heads, plan.head_dim
    if q.shape[0] != plan.total_q:
        raise ValueError(f"q has {q.shape[0]} query rows but the plan has {plan.total_q} (qo_indptr[-1], or B for "
                         f"decode: one query per row; pass qo_indptr otherwise)")
    if tuple(q.shape[1:]) != (hq, d) or tuple(k.shape[2:]) != (hkv, d):
        raise ValueError(f"planned q heads [{hq}, {d}] and K/V heads [{hkv}, {d}], got q {tuple(q.shape)} and "
                         f"K/V {tuple(k.shape)}")
    if plan.max_page >= k.shape[0]:
        raise ValueError(f"meta lists page {plan.max_page}, outside the cache's {k.shape[0]} pages")
    if k.device != plan.device:
        raise ValueError(f"K/V on {k.device} but meta on {plan.device}; keep them on one device")
    _real(k_scale, "k_scale")
    _real(v_scale, "v_scale")


def _run_checked(plan: AttentionPlan, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_scale: float,
                 v_scale: float, return_lse: bool) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """``run_attention`` after ``_check_run`` passed for these shapes."""
    if plan.windows is not None:
        return _run_windows(plan, q, k, v, k_scale, v_scale, return_lse)
    b, hq, hkv, d, qmax = plan.batch, plan.num_qo_heads, plan.num_kv_heads, plan.head_dim, plan.max_q
    g = hq // hkv
    cap = plan.soft_cap
    scale = plan.sm_scale * k_scale / (cap if cap else 1.0)
    qp = q if plan.q_rows is None else q.index_select(0, plan.q_rows)  # [B*Qmax, Hq, D]
    qh = torch.empty(b, hkv, g, qmax, d, device=plan.device)  # fp32, pre-scaled, queries grouped by KV head
    torch.mul(qp.reshape(b, qmax, hkv, g, d).permute(0, 2, 3, 1, 4), scale, out=qh)
    qh = qh.view(b, hkv, g * qmax, d)

    if len(plan.chunks) == 1 and not cap and return_lse and plan.shared is None and CPU_FLASH_LSE and \
            qh.device.type == "cpu" and plan.chunks[0].num_tokens and plan.total_q:  # (the kernel needs both)
        return _one_chunk_flash(plan, qh, k, v, v_scale, q.dtype)
    one_chunk = None  # a fused path for a forward whose own keys fit one chunk, without soft cap or LSE
    if len(plan.chunks) == 1 and not cap and not return_lse:
        fused_lse = CPU_FLASH_LSE and qh.device.type == "cpu"  # torch's CPU kernel that returns the LSE
        if plan.shared is not None:
            one_chunk = _one_chunk_cascade if fused_lse else None  # else: the online softmax below
        else:
            one_chunk = _one_chunk_sdpa
    if one_chunk is not None:
        out = one_chunk(plan, qh, k, v, v_scale)  # [B * Qmax, Hq, D] fp32
        if plan.out_rows is not None:
            out = out.index_select(0, plan.out_rows)
        return out.to(q.dtype)

    k_rows, v_rows = _rows_view(k), _rows_view(v)
    if plan.shared is not None:
        m, den, acc = _shared_level(plan, qh, k, v, k_rows, v_rows)
    else:
        m = torch.full((b, hkv, g * qmax, 1), -math.inf, device=plan.device)  # running max of the logits
        den = torch.zeros_like(m)  # running sum of exp(logit - max)
        acc = torch.zeros(b, hkv, g * qmax, d, device=plan.device)  # running sum of exp(logit - max) * v
    k_buf, v_buf = _workspace(plan, k.dtype, 0), _workspace(plan, v.dtype, 1)
    for c in plan.chunks:
        lc = c.num_tokens
        kc = _gather(k, k_rows, c.rows, k_buf).view(b, hkv, lc, d)  # fp32
        vc = _gather(v, v_rows, c.rows, v_buf).view(b, hkv, lc, d)
        _zero_past_end(vc, c)  # unwritten slots may hold NaN; p = 0 there must stay 0
        s = torch.matmul(qh, kc.transpose(-1, -2))  # [B, Hkv, G*Qmax, Lc]
        if cap:
            s.tanh_().mul_(cap)
        if c.hidden is not None:
            s.view(b, hkv, g, qmax, lc).masked_fill_(c.hidden, -math.inf)
        m_new = torch.maximum(m, s.amax(-1, keepdim=True))
        shift = m_new.masked_fill(m_new == -math.inf, 0.0)  # rows that saw nothing yet stay at p = 0
        s.sub_(shift).exp_()
        alpha = (m - shift).exp_()
        den.mul_(alpha).add_(s.sum(-1, keepdim=True))
        acc.mul_(alpha).add_(torch.matmul(s, vc))
        m = m_new

    blind = den == 0  # queries that saw no key: output 0, LSE -inf (NaN from NaN data still propagates)
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


def _shared_level(plan: AttentionPlan, qh: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                  k_rows: torch.Tensor | None,
                  v_rows: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The online softmax's state ``(max, denominator, accumulator)`` after the shared prefix: its K/V gathered once
    and every row's queries (``qh`` ``[B, Hkv, G * Qmax, D]``, scaled) stacked into one attention call. Every query
    sees every shared key, so no mask is needed. Returns ``m = lse`` ``[B, Hkv, G * Qmax, 1]``, ``den = 1`` and
    ``acc`` = the normalised output ``[B, Hkv, G * Qmax, D]``."""
    shared = plan.shared
    assert shared is not None
    b, hkv, gq, d = qh.shape
    p = shared.num_tokens
    n = hkv * p * d
    k0 = _gather(k, k_rows, shared.rows, _workspace(plan, k.dtype, 2, n)).view(1, hkv, p, d)
    v0 = _gather(v, v_rows, shared.rows, _workspace(plan, v.dtype, 3, n)).view(1, hkv, p, d)
    q0 = qh.transpose(0, 1).reshape(1, hkv, b * gq, d)  # all rows' queries, per KV head
    if CPU_FLASH_LSE and q0.device.type == "cpu":  # the fused kernel, which also returns the log-sum-exp
        out0, lse0 = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q0, k0, v0, scale=1.0)
    else:
        s = torch.matmul(q0, k0.transpose(-1, -2))  # [1, Hkv, B * GQ, P]
        lse0 = torch.logsumexp(s, dim=-1)
        out0 = torch.matmul(torch.softmax(s, dim=-1), v0)
    acc = out0.view(hkv, b, gq, d).transpose(0, 1).contiguous()
    m = lse0.view(hkv, b, gq, 1).transpose(0, 1).contiguous()
    return m, torch.ones_like(m), acc


def _one_chunk_cascade(plan: AttentionPlan, qh: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                       v_scale: float) -> torch.Tensor:
    """A CPU forward with a shared prefix and one chunk of the rows' own positions, without soft cap or LSE: the
    shared level (``_shared_level``), the rows' own keys in one fused call that also returns the log-sum-exp (an
    additive mask, built once per forward, hides what a query must not see), and a log-sum-exp merge of the two.
    Every real query sees its own position, so the own level is never empty for it. Returns ``[B * Qmax, Hq, D]``."""
    lse0, _, out0 = _shared_level(plan, qh, k, v, _rows_view(k), _rows_view(v))  # [B, Hkv, GQ, 1] and [.., D]
    kc, vc = _gather_chunk(plan, k, v)
    additive, _ = _additive_mask(plan, qh.device)
    out1, lse1 = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(qh, kc, vc, attn_mask=additive,
                                                                            scale=1.0)
    return _query_rows(plan, merge_by_lse(out0, lse0, out1, lse1.unsqueeze(-1)), v_scale)


def _additive_mask(plan: AttentionPlan, device: torch.device) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """The one-chunk paths' mask, built by the first layer and kept on the plan for the rest of the forward: an
    additive fp32 mask ``[B, 1, G * Qmax or 1, Lc]`` (0 where a query may see a key, -inf where not; None when it
    sees all) and the bool ``[B, 1, G * Qmax, 1]`` rows that see no key at all (None when there are none)."""
    if plan.sdpa_mask is None:
        b, hkv, qmax = plan.batch, plan.num_kv_heads, plan.max_q
        g = plan.num_qo_heads // hkv
        c = plan.chunks[0]
        seen = None  # True where a key may be seen
        if c.past_end is not None:
            seen = ~c.past_end.transpose(-1, -2)
        if c.hidden is not None:  # [B, 1, 1, Qmax, Lc] -> one row per (g, query), like qh
            visible = ~c.hidden.expand(b, 1, g, qmax, c.num_tokens).reshape(b, 1, g * qmax, c.num_tokens)
            seen = visible if seen is None else visible & seen
        additive = blind = None
        if seen is not None:
            additive = torch.zeros(seen.shape, device=device).masked_fill_(~seen, -math.inf)
            if not bool(seen.any(-1).all()):
                blind = ~seen.any(-1, keepdim=True)
        plan.sdpa_mask = (additive, blind)
    return plan.sdpa_mask


def _run_windows(plan: AttentionPlan, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_scale: float,
                 v_scale: float, return_lse: bool) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """``run_attention`` of a plan of causal windows (``plan.windows``, which cover every query), one row at a
    time (``_window``)."""
    assert plan.windows is not None
    k_rows, v_rows = _rows_view(k), _rows_view(v)
    parts = []
    for w in plan.windows:
        o, row_lse = _window(plan, w, q, k, v, k_rows, v_rows, k_scale)  # [1, Hq, S, D], [1, Hq, S, 1]
        if v_scale != 1.0:
            o.mul_(v_scale)
        parts.append((w, o[0].transpose(0, 1), row_lse[0, :, :, 0].T))  # [S, Hq, D], [S, Hq]
    if len(parts) == 1:  # a lone window without keys before it comes out laid [S, Hq, D] (see _window): no copy
        out, lse = parts[0][1].contiguous().to(q.dtype), parts[0][2]
    else:
        out = torch.empty(plan.total_q, plan.num_qo_heads, plan.head_dim, dtype=q.dtype, device=q.device)
        lse = torch.empty(plan.total_q, plan.num_qo_heads, device=q.device)
        for w, o, row_lse in parts:
            out[w.q_first : w.q_first + w.q_len] = o
            lse[w.q_first : w.q_first + w.q_len] = row_lse
    return (out, (lse * LOG2E).contiguous()) if return_lse else out


def _window(plan: AttentionPlan, w: _CausalWindow, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
            k_rows: torch.Tensor | None, v_rows: torch.Tensor | None,
            k_scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """One row's causal window without its masked half: the window's own square causal block in one ``is_causal``
    fused call, then each piece of the keys before it in one unmasked fused call (queries grouped by KV head, so K/V
    are not repeated), merged by log-sum-exp. Returns the fp32 output ``[1, Hq, S, D]`` (before ``v_scale``) and the
    natural-log LSE ``[1, Hq, S, 1]``."""
    hq, hkv, d, s = plan.num_qo_heads, plan.num_kv_heads, plan.head_dim, w.q_len
    flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    n = hq * s * d
    buf, qs, scale = _workspace(plan, torch.float32, 4, n)[1][:n], q[w.q_first : w.q_first + s], plan.sm_scale * k_scale
    if w.prefix:  # head-major, so that the queries group by KV head for the keys before the window
        qh = buf.view(1, hq, s, d)
        torch.mul(qs.transpose(0, 1), scale, out=qh[0])
    else:  # token-major, so that the output (laid out like q) is [S, Hq, D] memory
        qh = buf.view(1, s, hq, d).transpose(1, 2)
        torch.mul(qs, scale, out=buf.view(s, hq, d))
    kb = _gather(k, k_rows, w.block, _workspace(plan, k.dtype, 0, n)).view(1, hq, s, d)
    vb = _gather(v, v_rows, w.block, _workspace(plan, v.dtype, 1, n)).view(1, hq, s, d)
    out, lse = flash(qh, kb, vb, is_causal=True, scale=1.0)  # [1, Hq, S, D], [1, Hq, S]
    lse = lse.unsqueeze(-1)
    grouped = qh.view(1, hkv, hq // hkv * s, d) if w.prefix else qh
    for rows in w.prefix:
        n = rows.shape[0] * d
        kp = _gather(k, k_rows, rows, _workspace(plan, k.dtype, 2, n)).view(1, hkv, -1, d)
        vp = _gather(v, v_rows, rows, _workspace(plan, v.dtype, 3, n)).view(1, hkv, -1, d)
        out0, lse0 = flash(grouped, kp, vp, scale=1.0)  # [1, Hkv, G * S, D], [1, Hkv, G * S]
        lse0 = lse0.reshape(1, hq, s, 1)
        merged = torch.logaddexp(lse, lse0)
        out = out.mul_((lse - merged).exp_()).add_(out0.reshape(1, hq, s, d).mul_((lse0 - merged).exp_()))
        lse = merged
    return out, lse


def _one_chunk_sdpa(plan: AttentionPlan, qh: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    v_scale: float) -> torch.Tensor:
    """A forward whose whole KV fits one chunk, without soft cap or LSE (decode, verify windows, short prefill):
    one fused SDPA instead of the online softmax. ``qh`` is ``[B, Hkv, G * Qmax, D]`` fp32, already scaled.
    Slots past a row's end are zeroed in K and V (NaN-safe) and masked with the causal limits; a query with no key
    gives 0, like the general path. Returns ``[B * Qmax, Hq, D]``."""
    by_span = _span_attention(plan, qh, k, v)
    if by_span is not None:
        return _query_rows(plan, by_span[0], v_scale)
    kc, vc = _gather_chunk(plan, k, v)
    additive, blind = _additive_mask(plan, qh.device)
    out = torch.nn.functional.scaled_dot_product_attention(qh, kc, vc, attn_mask=additive, scale=1.0)
    if blind is not None:
        out = out.masked_fill(blind, 0.0)  # queries that see no key at all (SDPA gives NaN there)
    return _query_rows(plan, out, v_scale)


def _one_chunk_flash(plan: AttentionPlan, qh: torch.Tensor, k: torch.Tensor, v: torch.Tensor, v_scale: float,
                     dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """``_one_chunk_sdpa`` with the log-sum-exp, through torch's fused CPU kernel that returns it (a decode over the
    part of the keys a caller merges with another part, e.g. a draft chain's history). Returns the output
    ``[total_q, Hq, D]`` in ``dtype`` and the base-2 LSE ``[total_q, Hq]`` (-inf for a query that sees no key)."""
    by_span = _span_attention(plan, qh, k, v)
    if by_span is not None:
        out, lse = by_span
    else:
        kc, vc = _gather_chunk(plan, k, v)
        additive, blind = _additive_mask(plan, qh.device)
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(qh, kc, vc, attn_mask=additive,
                                                                              scale=1.0)
        lse = lse.unsqueeze(-1)  # [B, Hkv, G * Qmax, 1]
        if blind is not None:
            out, lse = out.masked_fill(blind, 0.0), lse.masked_fill(blind, -math.inf)
    b, hkv, qmax = plan.batch, plan.num_kv_heads, plan.max_q
    lse = (lse * LOG2E).view(b, hkv, plan.num_qo_heads // hkv, qmax).permute(0, 3, 1, 2).reshape(b * qmax, -1)
    out = _query_rows(plan, out, v_scale)
    if plan.out_rows is not None:
        out, lse = out.index_select(0, plan.out_rows), lse.index_select(0, plan.out_rows)
    return out.to(dtype), lse.contiguous()


def _span_attention(plan: AttentionPlan, qh: torch.Tensor, k: torch.Tensor,
                    v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The one-chunk attention of a one-row plan whose slots form several runs (``_Chunk.spans``) over an fp32
    cache, without a gather: each run's K/V are a strided view of the cache, attended in one fused CPU call that
    also returns the log-sum-exp, and the runs are merged by log-sum-exp (``merge_states``). ``qh`` is
    ``[1, Hkv, G * Qmax, D]`` fp32, already scaled. Returns the normalised output ``[1, Hkv, G * Qmax, D]`` and the
    natural-log LSE ``[1, Hkv, G * Qmax, 1]`` (a query that sees no key: 0 and -inf), or None when the plan or the
    cache does not allow it (fewer than two runs, a cache of another dtype or device or without a slot view); the
    caller then gathers. Equal to the gathered computation up to float rounding."""
    c = plan.chunks[0]
    if c.spans is None or len(c.spans) < 2 or k.dtype != torch.float32 or qh.device.type != "cpu":
        return None
    views = [(_slot_range(k, first, n), _slot_range(v, first, n)) for first, n in c.spans]
    if any(kr is None or vr is None for kr, vr in views):
        return None
    masks, any_blind = _span_masks(plan, qh.device)
    flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    out = lse = None
    for (kr, vr), (mask, blind) in zip(views, masks):
        o, part = flash(qh, kr, vr, attn_mask=mask, scale=1.0)  # [1, Hkv, GQ, D], [1, Hkv, GQ]
        part = part.unsqueeze(-1)
        if blind is not None:  # the kernel gives output 0 and LSE 0 to a query that sees no key of the run
            part = part.masked_fill(blind, -math.inf)
        out, lse = (o, part) if out is None or lse is None else merge_states(out, lse, o, part)
    assert out is not None and lse is not None
    if any_blind:  # a query blind in two merged runs got NaN weights (-inf - -inf); it sees no key: output 0
        out = out.masked_fill(lse == -math.inf, 0.0)
    return out, lse


def _span_masks(plan: AttentionPlan,
                device: torch.device) -> tuple[list[tuple[torch.Tensor | None, torch.Tensor | None]], bool]:
    """Each span's columns of the one-chunk additive mask (``_additive_mask``; a view) and the bool
    ``[1, 1, G * Qmax, 1]`` query rows that see no key of that span (None when every query sees one), built by the
    first layer and kept on the plan; ``(None, None)`` for every span of an unmasked plan (decode). The flag: some
    span has blind rows."""
    if plan.span_masks is None:
        spans = plan.chunks[0].spans
        assert spans is not None
        additive, _ = _additive_mask(plan, device)
        masks: list[tuple[torch.Tensor | None, torch.Tensor | None]] = []
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


def _gather_chunk(plan: AttentionPlan, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V of the plan's one chunk as fp32 ``[B, Hkv, Lc, D]`` in the workspace, slots past each row's end
    zeroed (they may hold NaN, and 0 * NaN is NaN). A one-row plan over consecutive slots of an fp32 cache gets
    views of the cache instead (no copy; such a plan has no slot past its row's end)."""
    c = plan.chunks[0]
    if c.first_slot is not None and k.dtype == torch.float32:
        in_place = _slot_range(k, c.first_slot, c.num_tokens), _slot_range(v, c.first_slot, c.num_tokens)
        if in_place[0] is not None and in_place[1] is not None:
            return in_place[0], in_place[1]
    shape = (plan.batch, plan.num_kv_heads, c.num_tokens, plan.head_dim)
    kc = _gather(k, _rows_view(k), c.rows, _workspace(plan, k.dtype, 0)).view(shape)
    vc = _gather(v, _rows_view(v), c.rows, _workspace(plan, v.dtype, 1)).view(shape)
    _zero_past_end(kc, c)
    _zero_past_end(vc, c)
    return kc, vc


def _query_rows(plan: AttentionPlan, out: torch.Tensor, v_scale: float) -> torch.Tensor:
    """``out`` ``[B, Hkv, G * Qmax, D]`` times ``v_scale`` as ``[B * Qmax, Hq, D]``: head h = kv_head * G + g, as the
    GQA mapping requires."""
    if v_scale != 1.0:
        out = out * v_scale
    b, hkv, d, qmax = plan.batch, plan.num_kv_heads, plan.head_dim, plan.max_q
    g = plan.num_qo_heads // hkv
    return out.view(b, hkv, g, qmax, d).permute(0, 3, 1, 2, 4).reshape(b * qmax, plan.num_qo_heads, d)


def _zero_past_end(gathered: torch.Tensor, c: _Chunk) -> None:
    """Zero the slots past each row's end in a gathered chunk ``[B, Hkv, Lc, D]`` (contiguous): one ``index_fill_``
    of the planned rows, not a masked fill over the whole chunk."""
    if c.zero_rows is not None:
        gathered.view(-1, gathered.shape[-1]).index_fill_(0, c.zero_rows, 0.0)


def _slot_range(cache: torch.Tensor, first: int, n: int) -> torch.Tensor | None:
    """Slots ``[first, first + n)`` of the NHD ``cache`` as a ``[1, Hkv, n, D]`` view, or None if its strides allow
    no such view."""
    try:
        slots = cache.view(-1, cache.shape[2], cache.shape[3])
    except RuntimeError:
        return None
    return slots[first : first + n].transpose(0, 1).unsqueeze(0)


def _rows_view(cache: torch.Tensor) -> torch.Tensor | None:
    """The NHD cache as ``[num_slots * Hkv, D]`` rows, or None if its strides allow no such view."""
    try:
        return cache.view(-1, cache.shape[-1])
    except RuntimeError:
        return None


def _workspace(plan: AttentionPlan, dtype: torch.dtype, which: int,
               n: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Flat ``(raw, fp32)`` gather buffers of at least ``n`` elements (default: the largest per-row chunk), kept on
    the plan across layers under ``which``: 0/1 for a chunk's (or a causal window's block's) K/V, 2/3 for the shared
    prefix's (or the keys before a causal window), 4 for a causal window's queries. A request for more than the
    kept size replaces them."""
    ws = plan.workspace.get((dtype, which))
    if ws is None or (n is not None and ws[1].shape[0] < n):
        if n is None:
            n = plan.batch * max((c.num_tokens for c in plan.chunks), default=0) * plan.num_kv_heads * plan.head_dim
        raw = torch.empty(n if dtype != torch.float32 else 0, dtype=dtype, device=plan.device)
        ws = raw, torch.empty(n, dtype=torch.float32, device=plan.device)
        plan.workspace[(dtype, which)] = ws
    return ws


def _gather(cache: torch.Tensor, cache_rows: torch.Tensor | None, rows: torch.Tensor,
            buf: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """Rows ``rows`` (slot * Hkv + head) of the NHD ``cache`` as fp32 ``[len(rows), D]`` in the workspace: one
    ``index_select`` (plus a cast unless fp32); an advanced index when the cache's strides allow no row view."""
    raw, f32 = buf
    d = cache.shape[3]
    n = rows.shape[0] * d
    out = f32[:n].view(-1, d)
    if cache_rows is None:
        slot, head = rows.div(cache.shape[2], rounding_mode="floor"), rows.remainder(cache.shape[2])
        return out.copy_(cache[slot.div(cache.shape[1], rounding_mode="floor"), slot.remainder(cache.shape[1]), head])
    if cache_rows.dtype == torch.float32:
        return torch.index_select(cache_rows, 0, rows, out=out)
    return out.copy_(torch.index_select(cache_rows, 0, rows, out=raw[:n].view(-1, d)))
