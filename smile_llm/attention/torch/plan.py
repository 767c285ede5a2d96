"""The torch backend's plan (``backend``): what ``run`` needs besides q, K and V, built once
per forward from the CSR (every layer shares it), and the choice of how ``run`` computes.

The general path runs over chunks of kv pages with an online softmax (``run``): the plan lists
each chunk's cache rows (one per slot and KV head, head-major), so ``run`` gathers a chunk with one
``index_select`` (no loop per token or page), casts it to fp32 and multiplies it in one batched
matmul. The chunk is sized to stay in cache; scores held at once are
``O(B * Hq * max_qo_len * chunk)``.

The other paths hand the work to torch's fused kernels (``fused``):

- One row in one chunk (single-stream decode, verify, short prefill; no soft cap) on the CPU: an
  fp32 cache is read in place, without a gather. The row's slots are cut into runs of consecutive
  slots (``KvChunk.spans``; a FIFO free list hands out one or two); each run is a strided view of
  the cache, attended in one fused call, and two or more runs are merged by their log-sum-exps. Rows
  whose runs average fewer than ``SPAN_MIN_TOKENS`` slots are gathered.
- Shared prefix (cascade): when every row of a forward starts with the same pages (requests sharing
  a cached system prompt) and every query comes after them, the plan splits those ``P`` positions
  off as one shared level. ``run`` gathers their K/V once (not once per row) and attends all rows'
  queries to them in one call, then continues over each row's own pages. The result equals the
  per-row computation up to float rounding.
- Causal windows (prefill, whole or chunked; CPU, no soft cap): when a forward has a window of at
  least ``CAUSAL_SPLIT_MIN`` queries and no shared prefix, every row's keys split into the keys
  before its window, which all its queries see (one unmasked fused call per piece of at most
  ``CHUNK_BYTES`` of K/V), and the window's own square causal block (one fused ``is_causal`` call,
  whose masked tiles the kernel skips); the parts are merged by their log-sum-exps. Nothing masked
  is computed, and no scores are held (the fused kernel tiles them).

The constants below are the backend's tuning knobs; tests and benchmarks patch them here.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Union

import numpy as np
import torch

from ...cache.metadata import FlashInferKvMetadata

# per kv chunk: its fp32 K and V plus its scores (measured best on a 2-core CPU)
CHUNK_BYTES = 32 << 20
# a shared prefix shorter than this is attended per row (the split costs more than it saves)
CASCADE_MIN_TOKENS = 128
# the CPU uses torch's fused kernel that returns the LSE (off: plain matmuls, as elsewhere)
CPU_FLASH_LSE = True
CAUSAL_SPLIT_MIN = 64  # a causal window this long skips its masked half (see CausalWindow)
# a one-row chunk is read in place, run by run, while its runs average at least this many slots
SPAN_MIN_TOKENS = 128

IndptrLike = Union[torch.Tensor, np.ndarray, Sequence[int]]  # qo_indptr: int [B+1], any device
# a FlashInfer custom_mask: bool, each row's [qo_len, kv_len] block row-major, concatenated
MaskLike = Union[torch.Tensor, np.ndarray]
SdpaMask = tuple[torch.Tensor | None, torch.Tensor | None]  # (additive mask, blind query rows)


@dataclass(frozen=True)
class KvChunk:
    """Positions ``[first, first + num_tokens)`` (whole pages) of every row."""

    # int64[B * Hkv * Lc] rows of the cache viewed [num_slots * Hkv, D], head-major per batch row
    rows: torch.Tensor
    num_tokens: int  # Lc; positions past a row's pages read page 0's slots (masked)
    # bool[B, 1, 1, Qmax, Lc]: a query must not see this key; None if all visible
    hidden: torch.Tensor | None
    # bool[B, 1, Lc, 1]: slot past the row's kv_len (its V is zeroed); None if none
    past_end: torch.Tensor | None
    # int64: those slots' rows in the gathered [B * Hkv * Lc, D] chunk
    zero_rows: torch.Tensor | None = None
    # one row's slots as runs of consecutive slots (first slot, length), in position order: fp32
    # K/V read in place
    spans: tuple[tuple[int, int], ...] | None = None

    @property
    def first_slot(self) -> int | None:
        """The first slot of a one-row chunk whose slots are all consecutive (one span), else
        None."""
        return self.spans[0][0] if self.spans is not None and len(self.spans) == 1 else None


@dataclass(frozen=True)
class CausalWindow:
    """One row's causal window: queries ``[q_first, q_first + q_len)`` of q
    (``1 <= q_len <= kv_len``), the last ``q_len`` of the row's ``kv_len`` positions. Every query
    sees all keys before the window; query i of the window sees its keys ``0..i`` (bottom-right
    causal)."""

    q_first: int
    q_len: int
    # int64[Hkv * Lp] cache rows of each piece of the keys before the window, head-major
    prefix: list[torch.Tensor]
    # int64[Hq * q_len] cache rows of the window's own keys, one run per query head (GQA)
    block: torch.Tensor


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
    # int64[B * Qmax] row of q for each padded query; None when the identity
    q_rows: torch.Tensor | None
    # int64[total_q] padded query of each output row; None when the identity
    out_rows: torch.Tensor | None
    chunks: list[KvChunk]  # every row's own positions (after the shared prefix, if any)
    # the shared prefix: rows int64[Hkv * P] of its slots, read once for every row
    shared: KvChunk | None = None
    # gather buffers (raw, fp32) by (dtype, use), kept across layers (``gather.buffers``)
    workspace: dict[tuple[torch.dtype, int], tuple[torch.Tensor, torch.Tensor]] = field(
        default_factory=dict)
    # the one-chunk paths' additive mask and blind query rows (``fused``), built by the
    # first layer
    sdpa_mask: SdpaMask | None = None
    # each span's columns of that mask and its blind query rows, and whether any has some
    # (``fused``)
    span_masks: tuple[list[SdpaMask], bool] | None = None
    # the signature of the tensors a TorchBackend.run last checked
    checked: tuple[object, ...] | None = None
    # causal windows split into prefix and diagonal; chunks unused
    windows: list[CausalWindow] | None = None
    # whether run may call torch's fused CPU kernel that returns the LSE (CPU_FLASH_LSE, on a
    # CPU plan)
    fused_lse: bool = field(init=False)

    def __post_init__(self) -> None:
        self.fused_lse = CPU_FLASH_LSE and self.device.type == "cpu"

    @property
    def causal_window(self) -> bool:
        """Whether ``run`` takes the causal-window split (``CausalWindow``)."""
        return self.windows is not None


def plan_attention(meta: FlashInferKvMetadata, *, num_qo_heads: int, num_kv_heads: int,
                   head_dim: int, qo_indptr: IndptrLike | None = None, causal: bool = True,
                   sm_scale: float | None = None, logits_soft_cap: float | None = None,
                   num_pages: int | None = None,
                   custom_mask: MaskLike | None = None) -> AttentionPlan:
    """The gather indices and masks of one forward. ``meta.validate(num_pages)`` plus the checks
    FlashInfer skips (head counts, ``qo_indptr``); ValueError on any of them. ``custom_mask`` (needs
    ``qo_indptr``; FlashInfer's format): bool, each row's ``[qo_len, kv_len]`` block row-major,
    concatenated; True where query i sees key j. It replaces the causal mask (a token-tree verify
    window attends to its ancestors only)."""
    if not isinstance(meta, FlashInferKvMetadata):
        raise ValueError(f"meta must be a FlashInferKvMetadata, got {type(meta).__name__}")
    heads = (("num_qo_heads", num_qo_heads), ("num_kv_heads", num_kv_heads), ("head_dim", head_dim))
    for name, n in heads:
        if not isinstance(n, (int, np.integer)) or n < 1:
            raise ValueError(f"{name} must be a positive int, got {n!r}")
    if num_qo_heads % num_kv_heads:
        raise ValueError(f"num_qo_heads={num_qo_heads} is not a multiple of "
                         f"num_kv_heads={num_kv_heads} (GQA maps query head h to KV head "
                         f"h // (Hq / Hkv))")
    indptr, last_len, used = meta.checked_host(num_pages)  # int64 [B+1], [B], [indptr[-1]]
    ps = meta.page_size
    num_row_pages = np.diff(indptr)  # [B]
    kv_lens = np.where(num_row_pages > 0, (num_row_pages - 1) * ps + last_len, 0)  # int64[B]
    batch = len(kv_lens)
    q_lens = np.ones(batch, dtype=np.int64) if qo_indptr is None else _qo_lens(qo_indptr, batch)
    total_q, max_q = int(q_lens.sum()), int(q_lens.max(initial=0))
    device = meta.indptr.device
    scale = 1.0 / math.sqrt(head_dim) if sm_scale is None else check_real(sm_scale, "sm_scale")
    cap = None if logits_soft_cap is None else check_real(logits_soft_cap, "logits_soft_cap")
    if cap is not None and cap < 0:
        raise ValueError(f"logits_soft_cap must be positive (or None / 0 for no cap), got {cap}")

    visible = None
    if custom_mask is not None:
        visible = _custom_visibility(custom_mask, q_lens, kv_lens, qo_indptr)
    if visible is not None:
        causal = False  # the mask decides what each query sees
    max_pages = int(num_row_pages.max(initial=0))
    split = causal and qo_indptr is not None and cap is None and CPU_FLASH_LSE and \
        device.type == "cpu" and max_q >= CAUSAL_SPLIT_MIN and bool((q_lens <= kv_lens).all())
    if batch == 1 and not split and 0 < max_q <= kv_lens[0] and _pages_per_chunk(
            1, ps, num_kv_heads, head_dim, num_qo_heads * max_q, max_pages) >= max_pages:
        return _plan_one_row(used, int(kv_lens[0]), max_q, ps, num_qo_heads, num_kv_heads,
                             head_dim, causal and qo_indptr is not None, scale, cap, device,
                             None if visible is None else visible[0])
    # [B, Pmax]; pads read page 0 and are masked
    table = np.zeros((batch, max_pages), dtype=np.int64)
    table[np.arange(max_pages) < num_row_pages[:, None]] = used  # row-major, so CSR order
    shared_pages = 0
    if cap is None and visible is None:
        shared_pages = _shared_pages(table, num_row_pages, kv_lens - q_lens, ps)
    if split and not shared_pages:
        windows = _causal_windows(table, kv_lens, q_lens, ps, num_qo_heads, num_kv_heads,
                                  head_dim, device)
        return AttentionPlan(batch, num_qo_heads, num_kv_heads, head_dim, ps, total_q, max_q,
                             int(used.max(initial=-1)), scale, None, device, None, None, [],
                             windows=windows)

    # Last kv position each padded query may see (query i of row b): bottom-right causal, or the
    # whole row.
    qi = np.arange(max_q)
    limit = np.broadcast_to((kv_lens - 1)[:, None], (batch, max_q)).copy()  # [B, Qmax]
    if causal and qo_indptr is not None:
        aligned = qi[None, :] + (kv_lens - q_lens)[:, None]
        # padded queries: the whole row (dropped)
        limit = np.where(qi[None, :] < q_lens[:, None], aligned, limit)

    shared = None
    if shared_pages:
        slots0 = (table[0, :shared_pages, None] * ps + np.arange(ps)).reshape(-1)  # [P]
        heads0 = np.arange(num_kv_heads)[:, None]
        rows0 = (slots0[None, :] * num_kv_heads + heads0).reshape(-1)  # [Hkv * P]
        shared = KvChunk(torch.from_numpy(rows0).to(device), shared_pages * ps, None, None)
    pages_per_chunk = _pages_per_chunk(batch, ps, num_kv_heads, head_dim, num_qo_heads * max_q,
                                       max_pages - shared_pages)
    limit_t = torch.from_numpy(limit)
    chunks = []
    longest = int(kv_lens.max(initial=0))
    for first in range(shared_pages, max_pages, pages_per_chunk):
        last = min(first + pages_per_chunk, max_pages)
        # nobody reads past the longest row: uniform rows need no mask at all
        end = min(last * ps, longest)
        pos = torch.arange(first * ps, end)  # [Lc]
        hidden = past_end = zero_rows = None
        lc = end - first * ps
        if visible is not None:
            hidden = torch.from_numpy(~visible[:, :, first * ps : end])
            hidden = hidden.view(batch, 1, 1, max_q, -1).to(device)
        elif max_q and int(limit.min()) < end - 1:
            hidden = (pos > limit_t[:, :, None]).view(batch, 1, 1, max_q, -1).to(device)
        if batch and int(kv_lens.min()) < end:
            past = pos.numpy() >= kv_lens[:, None]  # [B, Lc]
            past_end = torch.from_numpy(past).view(batch, 1, -1, 1).to(device)
            b_idx, l_idx = np.nonzero(past)  # rows (b, h, l) of the gathered chunk, every head h
            flat = (b_idx[:, None] * num_kv_heads + np.arange(num_kv_heads)) * lc + l_idx[:, None]
            zero_rows = torch.from_numpy(flat.reshape(-1)).to(device)
        slots = (table[:, first:last, None] * ps + np.arange(ps)).reshape(batch, 1, -1)[:, :, :lc]
        # [B * Hkv * Lc]
        rows = (slots * num_kv_heads + np.arange(num_kv_heads)[:, None]).reshape(-1)
        chunks.append(KvChunk(torch.from_numpy(rows).to(device), lc, hidden, past_end, zero_rows))

    q_rows = out_rows = None
    if total_q != batch * max_q:  # ragged windows: pad every row to Qmax queries
        if batch:
            starts = np.concatenate([[0], np.cumsum(q_lens)[:-1]])
        else:
            starts = np.zeros(0, dtype=np.int64)
        valid = qi[None, :] < q_lens[:, None]  # [B, Qmax]
        q_rows = torch.from_numpy(np.where(valid, starts[:, None] + qi[None, :], 0).reshape(-1))
        q_rows = q_rows.to(device)
        out_rows = torch.from_numpy(np.flatnonzero(valid.reshape(-1))).to(device)
    return AttentionPlan(batch, num_qo_heads, num_kv_heads, head_dim, ps, total_q, max_q,
                         int(used.max(initial=-1)), scale, cap or None, device, q_rows, out_rows,
                         chunks, shared)


def _plan_one_row(pages: np.ndarray, kv_len: int, q_len: int, ps: int, hq: int, hkv: int, d: int,
                  causal: bool, scale: float, cap: float | None, device: torch.device,
                  visible: np.ndarray | None = None) -> AttentionPlan:
    """``plan_attention`` of the commonest forward, one row whose ``q_len <= kv_len`` queries and
    keys fit one chunk (single-stream decode, verify and prefill): what the general path builds,
    without its padding. ``visible``: the row's custom mask ``[q_len, >= kv_len]`` (True: seen),
    instead of ``causal``."""
    slots = (pages[:, None] * ps + np.arange(ps)).reshape(-1)[:kv_len]
    rows = (slots[None, :] * hkv + np.arange(hkv)[:, None]).reshape(-1)  # [Hkv * L], head-major
    hidden = None
    if visible is not None:
        hidden = torch.from_numpy(~visible[:, :kv_len]).view(1, 1, 1, q_len, kv_len).to(device)
    elif causal and q_len > 1:  # query i sees keys up to i + kv_len - q_len
        limit = torch.arange(kv_len - q_len, kv_len)
        hidden = (torch.arange(kv_len) > limit[:, None]).view(1, 1, 1, q_len, kv_len).to(device)
    chunk = KvChunk(torch.from_numpy(rows).to(device), kv_len, hidden, None, spans=_spans(slots))
    return AttentionPlan(1, hq, hkv, d, ps, q_len, q_len, int(pages.max()), scale, cap or None,
                         device, None, None, [chunk])


def _spans(slots: np.ndarray) -> tuple[tuple[int, int], ...] | None:
    """``slots`` (one row's, in position order) as runs of consecutive slots ``(first, length)``;
    None when there are none or so many that they average fewer than ``SPAN_MIN_TOKENS`` slots (one
    gather then costs less than a kernel call per run). Pages handed out by a FIFO free list mostly
    come in one or two runs."""
    n = len(slots)
    starts = np.flatnonzero(np.diff(slots) != 1) + 1
    if n == 0 or (len(starts) and (len(starts) + 1) * SPAN_MIN_TOKENS > n):
        return None
    bounds = [0, *starts.tolist(), n]
    return tuple((int(slots[a]), b - a) for a, b in zip(bounds[:-1], bounds[1:]))


def _custom_visibility(custom_mask: MaskLike, q_lens: np.ndarray, kv_lens: np.ndarray,
                       qo_indptr: IndptrLike | None) -> np.ndarray:
    """A FlashInfer ``custom_mask`` (each row's ``[qo_len, kv_len]`` block, row-major, concatenated)
    as a padded host array ``bool[B, Qmax, Lmax]`` (padding: not seen). ValueError without
    ``qo_indptr`` or for a wrong length."""
    if qo_indptr is None:
        raise ValueError("custom_mask needs qo_indptr (a prefill or verify window)")
    flat = (custom_mask.detach().cpu().numpy() if isinstance(custom_mask, torch.Tensor)
            else np.asarray(custom_mask)).astype(bool).reshape(-1)
    sizes = q_lens * kv_lens
    if len(flat) != int(sizes.sum()):
        raise ValueError(f"custom_mask must hold sum(qo_len * kv_len) = {int(sizes.sum())} entries "
                         f"(each row's [qo_len, kv_len] block, row-major), got {len(flat)}")
    shape = (len(q_lens), int(q_lens.max(initial=0)), int(kv_lens.max(initial=0)))
    visible = np.zeros(shape, dtype=bool)
    at = 0
    for b, (q, k) in enumerate(zip(q_lens, kv_lens)):
        visible[b, :q, :k] = flat[at : at + q * k].reshape(q, k)
        at += q * k
    return visible


def _causal_windows(table: np.ndarray, kv_lens: np.ndarray, q_lens: np.ndarray, ps: int, hq: int,
                    hkv: int, d: int, device: torch.device) -> list[CausalWindow]:
    """The ``CausalWindow`` of every row with queries (``q_lens <= kv_lens``); the keys before a
    window come in pieces whose fp32 K and V take at most ``CHUNK_BYTES``."""
    piece = max(1, CHUNK_BYTES // (2 * 4 * hkv * d))  # positions per piece
    heads, kv_head_of = np.arange(hkv)[:, None], (np.arange(hq) // (hq // hkv))[:, None]
    windows = []
    q_first = 0
    for b in range(len(kv_lens)):
        kv_len, q_len = int(kv_lens[b]), int(q_lens[b])
        if q_len:
            slots = (table[b, : -(-kv_len // ps), None] * ps + np.arange(ps)).reshape(-1)[:kv_len]
            before = kv_len - q_len
            pieces = [slots[None, at : min(at + piece, before)] for at in range(0, before, piece)]
            prefix = [torch.from_numpy((s * hkv + heads).reshape(-1)).to(device) for s in pieces]
            block = (slots[None, before:] * hkv + kv_head_of).reshape(-1)
            windows.append(CausalWindow(q_first, q_len, prefix, torch.from_numpy(block).to(device)))
        q_first += q_len
    return windows


def _shared_pages(table: np.ndarray, num_row_pages: np.ndarray, before_queries: np.ndarray,
                  ps: int) -> int:
    """How many leading pages every row of ``table`` lists alike, counting only whole pages that lie
    before every row's first query (so every query sees all of them); 0 for one row or fewer than
    CASCADE_MIN_TOKENS."""
    batch = table.shape[0]
    if batch < 2:
        return 0
    fit = min(int(num_row_pages.min()), int(before_queries.min()) // ps)
    if fit * ps < CASCADE_MIN_TOKENS:
        return 0
    differs = (table[:, :fit] != table[:1, :fit]).any(0)  # [fit]
    pages = int(np.argmax(differs)) if differs.any() else fit
    return pages if pages * ps >= CASCADE_MIN_TOKENS else 0


def _qo_lens(qo_indptr: IndptrLike, batch: int) -> np.ndarray:
    """``qo_len`` of every row (int64[B]) from a ``[B+1]`` integer indptr; ValueError unless
    consistent."""
    if isinstance(qo_indptr, torch.Tensor):
        arr = qo_indptr.detach().cpu().numpy()
    else:
        arr = np.asarray(qo_indptr)
    if arr.ndim != 1 or not (np.issubdtype(arr.dtype, np.integer) or arr.size == 0):
        raise ValueError(f"qo_indptr must be a 1-D integer tensor [B+1], got {arr.dtype} "
                         f"{tuple(arr.shape)}")
    arr = arr.astype(np.int64)
    if len(arr) != batch + 1:
        raise ValueError(f"qo_indptr has {len(arr)} entries for {batch} KV rows; it needs "
                         f"B + 1 = {batch + 1}")
    if arr[0] != 0 or (np.diff(arr) < 0).any():
        raise ValueError(f"qo_indptr must start at 0 and never decrease, got {arr.tolist()}")
    return np.diff(arr)


def check_real(x: float, name: str) -> float:
    """``x`` as a finite float; ValueError naming ``name`` otherwise (callers pass what users
    gave)."""
    try:
        value = float(x)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a real number, got {x!r}") from None
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value}")
    return value


def _pages_per_chunk(batch: int, ps: int, hkv: int, d: int, q_rows: int, max_pages: int) -> int:
    """Pages per chunk (at least 1, at most ``max_pages``) so that a chunk's fp32 K/V and scores fit
    CHUNK_BYTES."""
    # fp32 K and V of a page, and its scores
    per_page = max(1, batch * ps * 4 * (2 * hkv * d + q_rows))
    return max(1, min(max_pages, CHUNK_BYTES // per_page))
