"""ActiveStep: the batch of rows that step verbs act on, and its K/V reads and writes.

Built by ``activate_step`` from the rows' bindings: their page tables stacked into one
``[B, max_pages]`` array so slot ids for a whole batch come from one vectorised gather, plus per-row
capacity and matched-prefix arrays. Page tables never change while a row is active (offloading
deactivates it), so the view and its cached index tensors stay valid until the step is cleared.
Every check here is O(B) and runs before anything is written.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from .bindings import Binding
from .checks import as_int, as_positions, same_device
from .errors import KvCacheExhaustedError, NoActiveStepError
from .kv_store import KvStore
from .metadata import FlashInferKvMetadata, StepCsr, csr_arrays

INDEX_CACHE_ENTRIES = 4  # a step's write window, its read, and a padded read fit


def _capturing(device: torch.device) -> bool:
    """Whether a CUDA-graph capture is recording on the current stream of ``device`` (host checks
    that would synchronise are skipped then)."""
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


_ARANGE = np.arange(0, dtype=np.int64)


def _arange(n: int) -> np.ndarray:
    """A read-only ``arange(n)`` view of one shared, growing array (no allocation per step)."""
    global _ARANGE
    if len(_ARANGE) < n:
        _ARANGE = np.arange(max(n, 2 * len(_ARANGE)), dtype=np.int64)
        _ARANGE.setflags(write=False)
    return _ARANGE[:n]


class ActiveStep:
    """The batch of rows that step verbs act on (built by ``KvCachePool.activate_step``): the rows'
    page tables stacked into one ``[B, max_pages]`` array, per-row capacity and matched prefix, the
    step CSR and cached slot indices. Valid until the step is cleared; page tables never change
    meanwhile."""

    def __init__(self, bindings: list[Binding], page_size: int, device: torch.device) -> None:
        self.bindings = tuple(bindings)
        self.ids = tuple(b.request_id for b in bindings)
        self.batch = len(bindings)
        self.page_size = page_size
        self.device = device
        # int64[B] each: rows into BindingTable.kv_len, capacities, matched prefixes
        self.rows = np.array([b.row for b in bindings], dtype=np.int64)
        self.capacity = np.array([b.capacity for b in bindings], dtype=np.int64)
        self.matched = np.array([b.matched_len for b in bindings], dtype=np.int64)
        self.min_capacity = int(self.capacity.min())
        self.max_capacity = int(self.capacity.max())
        self.max_matched = int(self.matched.max())
        self.row0 = int(self.rows[0])
        table = np.zeros((self.batch, self.max_capacity // page_size), dtype=np.int64)
        for i, b in enumerate(bindings):
            table[i, : len(b.page_ids)] = b.page_ids
        self.page_table = table  # int64[B, max_pages], host
        # the same as CSR builders copy it (FlashInfer's int32)
        self.page_table32 = table.astype(np.int32)
        self._page_offsets = np.arange(page_size, dtype=np.int64)
        last_pages = table[np.arange(self.batch), self.capacity // page_size - 1]
        self._last_slot = last_pages * page_size + page_size - 1  # int64[B], each row's last slot
        # (start, length, clamp) -> slot index, oldest first; start as an int or int64[B] bytes
        self._index_cache: dict[tuple[int | bytes, int, bool], torch.Tensor] = {}
        # the last window advance_kv_len recorded
        self._last_window: tuple[int | bytes, int] | None = None
        self.csr = StepCsr(page_size, device)  # the CSR every layer of this step's forward shares

    # ------------------------------------------------------------------ slot ids
    def slots(self, start: np.ndarray | int, length: int, clamp: bool = False) -> np.ndarray:
        """Physical slots of positions ``[start_b, start_b + length)`` of every row, row-major
        ``int64[B*length]``; ``start`` is one int for all rows or ``int64[B]``. With ``clamp``,
        positions past a row's capacity repeat its last slot. Work is O(B * length) numpy over whole
        pages; positions must be in range (clamped or not)."""
        ps = self.page_size
        if isinstance(start, (int, np.integer)) or (start == start[0]).all():
            s0 = int(start if isinstance(start, (int, np.integer)) else start[0])
            first, end = s0 // ps, -(-(s0 + length) // ps)
            # [B, n_pages]; rows shorter than ``end`` read page 0 here
            pages = self.page_table[:, first:end]
            slots = (pages[:, :, None] * ps + self._page_offsets).reshape(self.batch, -1)
            slots = slots[:, s0 - first * ps : s0 - first * ps + length]
            if clamp and self.min_capacity < s0 + length:
                pos = s0 + _arange(length)
                slots = np.where(pos >= self.capacity[:, None], self._last_slot[:, None], slots)
            return np.ascontiguousarray(slots).reshape(-1)
        pos = start[:, None] + _arange(length)
        if clamp:
            pos = np.minimum(pos, (self.capacity - 1)[:, None])
        flat = (np.arange(self.batch) * self.page_table.shape[1])[:, None] + pos // ps
        return (self.page_table.reshape(-1)[flat] * ps + pos % ps).reshape(-1)

    def index(self, start: np.ndarray | int, length: int, clamp: bool = False) -> torch.Tensor:
        """``slots(...)`` as an int64 tensor on the pool's device. The last few are cached, so the
        layers of one step reuse both the write window's index and the read's."""
        key = (start if isinstance(start, int) else start.tobytes(), length, clamp)
        idx = self._index_cache.get(key)
        if idx is None:
            idx = torch.from_numpy(self.slots(start, length, clamp))
            if self.device.type != "cpu":
                idx = idx.to(self.device, non_blocking=True)
            if len(self._index_cache) >= INDEX_CACHE_ENTRIES:
                del self._index_cache[next(iter(self._index_cache))]
            self._index_cache[key] = idx
        return idx

    def window(self, start_pos: Any, seqlen: int, what: str) -> np.ndarray:
        """Per-row starts of a write window ``[start, start + seqlen)``; KvCacheExhaustedError past
        a capacity."""
        start = as_positions(start_pos, "start_pos", self.batch)
        end = start + seqlen
        over = end > self.capacity
        if over.any():
            b = int(np.argmax(over))
            raise KvCacheExhaustedError(
                f"{what} row {b}: need end_pos={int(end[b])}, bound "
                f"capacity={int(self.capacity[b])} (pool does not grow); stop at request_capacity")
        return start

    def lengths(self, value: Any, name: str) -> np.ndarray:
        """An int (every row) or one int per row, as ``int64[B]``, each in ``[0, capacity_b]``;
        ValueError else."""
        arr = as_positions(value, name, self.batch)
        over = arr > self.capacity
        if over.any():
            b = int(np.argmax(over))
            raise ValueError(f"{name} {int(arr[b])} of row {b} exceeds its bound capacity "
                             f"{int(self.capacity[b])}")
        return arr

    def range_slots(self, start: np.ndarray, end: np.ndarray) -> np.ndarray:
        """Slots of the ragged ranges ``[start_b, end_b)`` of every row, concatenated (O(B * longest
        range))."""
        width = int((end - start).max()) if self.batch else 0
        pos = start[:, None] + _arange(width)
        keep = pos < end[:, None]
        ps = self.page_size
        row_starts = (np.arange(self.batch) * self.page_table.shape[1])[:, None]
        flat = row_starts + np.where(keep, pos, 0) // ps
        return (self.page_table.reshape(-1)[flat] * ps + pos % ps)[keep]

    def lower_kv_len(self, kv_len: np.ndarray, limit: np.ndarray) -> None:
        """``kv_len = min(kv_len, limit)`` for every row, never below the matched prefix (tree KV is
        written)."""
        rows = self.rows
        kv_len[rows] = np.minimum(kv_len[rows], np.maximum(limit, self.matched))
        self._last_window = None

    def check_describes(self, meta: FlashInferKvMetadata, lengths: np.ndarray,
                        num_pages: int) -> None:
        """ValueError unless ``meta`` is a well-formed CSR on this device listing exactly this
        step's rows at ``lengths`` (O(B + pages): it is compared with a fresh build)."""
        if meta.page_size != self.page_size or not same_device(meta.indptr.device, self.device):
            raise ValueError(f"the CSR has page_size {meta.page_size} on {meta.indptr.device}; the "
                             f"pool uses {self.page_size} on {self.device}")
        meta.validate(num_pages)
        indptr, indices, last = csr_arrays(self.page_table32, lengths, self.page_size)
        n = int(indptr[-1])
        if not (np.array_equal(meta.indptr.cpu().numpy(), indptr)
                and np.array_equal(meta.indices[:n].cpu().numpy(), indices)
                and np.array_equal(meta.last_page_len.cpu().numpy(), last)):
            raise ValueError(f"the CSR does not describe the active rows at lengths "
                             f"{lengths.tolist()} (another cohort's, or another length's)")

    def check_not_below_prefix(self, start: np.ndarray, end: np.ndarray, what: str) -> None:
        """ValueError if a non-empty range ``[start_b, end_b)`` reaches into row b's tree-owned
        prefix."""
        below = (end > start) & (start < self.matched)
        if below.any():
            b = int(np.argmax(below))
            raise ValueError(f"{what} of row {b} from {int(start[b])} reaches below its matched "
                             f"prefix ({int(self.matched[b])} tokens, owned by the prefix tree)")

    def window_lengths(self, cache_len: Any, start_pos: Any, window: int,
                       what: str) -> tuple[np.ndarray, np.ndarray]:
        """Validated ``(cache_lens, starts)`` of a write window of ``window`` tokens per row ending
        at ``cache_len`` (``cache_len == start + window`` for every row; ValueError else)."""
        starts = self.window(start_pos, window, what)
        lengths = self.lengths(cache_len, "cache_len")
        if not np.array_equal(lengths, starts + window):
            raise ValueError(f"{what}: cache_len {lengths.tolist()} must equal start positions "
                             f"{starts.tolist()} + window {window} for every row")
        self.check_not_below_prefix(starts, starts + window, what)
        return lengths, starts

    # Regions of a row after a verify window wrote [start, written_end) and the drafts were judged:
    #   [0, matched_len)           tree-owned prefix: never written, never zeroed
    #   [matched_len, sealed_len)  accepted KV, the row's own; attention sees [0, sealed_len)
    #   [sealed_len, written_end)  rejected drafts' KV: nobody's; invisible, zeroed only with
    #                              zero_rejected_kv, overwritten by the next window; kv_len never
    #                              covers it, so never inserted
    def seal(self, kv: KvStore, kv_len: np.ndarray, sealed: np.ndarray) -> bool:
        """Lower kv_len to ``sealed``; keep or bump the step CSR in place when every row keeps its
        page count (True), else rebuild it for ``sealed`` (False; none at all when every row is
        sealed at 0). A packed pool: ValueError, changing nothing, when a row's new last page is
        quantized without raw values; its pages from there on will be written again."""
        self.unseal(kv, sealed, "sealing")
        self.lower_kv_len(kv_len, sealed)
        if not sealed.any():
            self.csr.clear()
            return False
        return self.csr.get(self.page_table32, sealed)[1] != "rebuild"

    def unseal(self, kv: KvStore, length: np.ndarray, what: str) -> None:
        """A packed pool: each row's pages from ``length``'s page on will be written again (their
        quantized values are stale); ValueError first, changing nothing, when a row's page at
        ``length`` is cut inside and keeps no raw values."""
        if not kv.packed:
            return
        length = np.maximum(length, self.matched)  # the prefix tree's pages are never rewritten
        ps = self.page_size
        inside = length % ps != 0
        kv.check_rewritable(self._slots_at(length[inside], np.flatnonzero(inside)), what)
        pages = [self.page_table[b, n // ps : self.capacity[b] // ps]
                 for b, n in enumerate(length.tolist())]
        kv.unseal(np.concatenate(pages) if pages else np.zeros(0, dtype=np.int64))

    def _slots_at(self, pos: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """The slots of position ``pos[i]`` of row ``rows[i]``."""
        ps = self.page_size
        return self.page_table[rows, pos // ps] * ps + pos % ps

    def truncate(self, kv: KvStore, kv_len: np.ndarray, sealed_len: Any, written_end: Any,
                 zero: bool) -> bool:
        """``truncate_to`` on the active rows: with ``zero`` clear the KV of
        ``[sealed_len, written_end)`` first, then ``seal``. ValueError if
        ``written_end < sealed_len``, a length exceeds a row's capacity, or zeroing would reach
        below a row's matched prefix. Returns what ``seal`` returns."""
        sealed = self.lengths(sealed_len, "sealed_len")
        written = self.lengths(written_end, "written_end")
        if (written < sealed).any():
            raise ValueError(f"writtenEnd must be >= sealedLen: written_end {written.tolist()}, "
                             f"sealed_len {sealed.tolist()}")
        if zero:
            self.check_not_below_prefix(sealed, written, "truncate_to zeroing")
        self.unseal(kv, sealed, "truncate_to")  # (checked before anything is zeroed)
        if zero:
            kv.zero_slots(self.range_slots(sealed, written))
        return self.seal(kv, kv_len, sealed)

    def move(self, kv: KvStore, kv_len: np.ndarray, src: Any, dst: Any) -> None:
        """Copy the KV of positions ``src[b, j]`` to ``dst[b, j]`` of every active row b on every
        layer (``int64[B, L]`` each). ValueError unless every source was written (below ``kv_len``)
        and every destination lies in ``[matched, kv_len)`` of its row (the prefix tree's pages are
        never written); ``kv_len`` is unchanged."""
        src_a, dst_a = _positions(src, "src", self.batch), _positions(dst, "dst", self.batch)
        if src_a.shape != dst_a.shape:
            raise ValueError(f"move_kv needs src and dst of the same shape, got {src_a.shape} and "
                             f"{dst_a.shape}")
        written = kv_len[self.rows][:, None]
        if (src_a < 0).any() or (src_a >= written).any():
            raise ValueError(f"move_kv sources must be written positions (below kv_len "
                             f"{written[:, 0].tolist()}), got {src_a.tolist()}")
        if (dst_a < self.matched[:, None]).any() or (dst_a >= written).any():
            raise ValueError(f"move_kv destinations must lie in [matched, kv_len) of their row "
                             f"(matched {self.matched.tolist()}, kv_len {written[:, 0].tolist()}), "
                             f"got {dst_a.tolist()}")
        moving = (src_a != dst_a).reshape(-1)
        src_s, dst_s = self.position_slots(src_a)[moving], self.position_slots(dst_a)[moving]
        kv.check_raw(np.concatenate([src_s, dst_s]), "move_kv")
        kv.copy_slots(src_s, dst_s)
        kv.unseal(np.unique(dst_s // self.page_size))

    def position_slots(self, pos: np.ndarray) -> np.ndarray:
        """Slots of positions ``pos`` ``int64[B, L]`` (each within its row's capacity), row-major
        ``int64[B*L]``."""
        ps = self.page_size
        flat = (np.arange(self.batch) * self.page_table.shape[1])[:, None] + pos // ps
        return (self.page_table.reshape(-1)[flat] * ps + pos % ps).reshape(-1)

    def invalidate(self, kv: KvStore, kv_len: np.ndarray, from_pos: Any, end_pos: Any) -> None:
        """Zero K and V of ``[from_pos, end_pos)`` of every active row on every layer and lower
        those rows' ``kv_len`` to at most ``from_pos``. ValueError for a reversed range, one past a
        capacity, or one below a matched prefix."""
        start = self.lengths(from_pos, "from_pos")
        end = self.lengths(end_pos, "end_pos")
        if (end < start).any():
            raise ValueError(f"invalidate_range needs from_pos <= end_pos, got {start.tolist()} "
                             f"and {end.tolist()}")
        self.check_not_below_prefix(start, end, "invalidate_range")
        self.unseal(kv, np.where(end > start, start, self.capacity), "invalidate_range")
        kv.zero_slots(self.range_slots(start, end))
        self.lower_kv_len(kv_len, np.where(end > start, start, kv_len[self.rows]))

    def read_length(self, length: int, padded: bool) -> int:
        """``length`` checked for a read: at most the smallest active capacity, or the largest one
        when ``padded``. ValueError beyond (or for a negative length)."""
        length = as_int(length, "length", minimum=0)
        limit = self.max_capacity if padded else self.min_capacity
        if length > limit:
            hint = "the largest active capacity" if padded else "bound request capacity"
            advice = "" if padded else "; use get_padded for rows of different capacity"
            raise ValueError(f"KV read of length {length} exceeds {hint} {limit}{advice}")
        return length

    def check_index(self, idx: Any, start: np.ndarray | int, length: int, name: str,
                    clamp: bool = False) -> torch.Tensor:
        """``idx`` checked as a caller's precomputed slot index of positions
        ``[start_b, start_b + length)``: an int64 tensor ``[B*length]`` on the pool's device equal
        to this step's own ``index(start, length, clamp)``, so it reaches only the rows' own slots.
        ValueError otherwise. The value comparison is skipped only inside a CUDA-graph capture (it
        would synchronise)."""
        n = self.batch * length
        if not isinstance(idx, torch.Tensor) or idx.dtype != torch.int64 or idx.shape != (n,):
            got = f"{getattr(idx, 'dtype', type(idx).__name__)} {tuple(getattr(idx, 'shape', ()))}"
            raise ValueError(f"{name} must be an int64 tensor of shape [{n}], got {got}")
        if not self.on_device(idx):
            raise ValueError(f"{name} must be on the pool's device {self.device}, got {idx.device}")
        if not _capturing(self.device) and not torch.equal(idx, self.index(start, length, clamp)):
            raise ValueError(f"{name} is not the slot index of this window of the active step; "
                             f"compute it from the pool (window_slot_indices) for this step, start "
                             f"and length")
        return idx

    # ------------------------------------------------------------------ K/V verbs
    def on_device(self, t: torch.Tensor) -> bool:
        """Whether tensor ``t`` lives on the pool's device."""
        if self.device.type == "cpu":
            return t.is_cpu
        return same_device(t.device, self.device)

    def check_kv(self, kv: KvStore, k: Any, v: Any) -> int:
        """The window length S of ``k``/``v`` for a put, after checking both: tensors
        ``[B, S, Hkv, D]`` of one shape, floating point, on the pool's device, sharing no memory
        with the pool's buffers (an index write from them would read what it writes). ValueError
        otherwise."""
        if not (isinstance(k, torch.Tensor) and isinstance(v, torch.Tensor)):
            raise ValueError(f"k and v must be torch.Tensor [B, S, Hkv, D], got "
                             f"{type(k).__name__}, {type(v).__name__}")
        shape = k.shape
        head_shape = kv.head_shape
        if len(shape) != 4 or shape != v.shape or shape[0] != self.batch or shape[2:] != head_shape:
            raise ValueError(f"k and v must both be [B={self.batch}, S, Hkv, "
                             f"D]={tuple(head_shape)} heads, got {tuple(shape)} and "
                             f"{tuple(v.shape)}")
        if not (k.dtype.is_floating_point and v.dtype.is_floating_point):
            raise ValueError(f"k and v must be floating point, got {k.dtype} and {v.dtype}")
        if not (self.on_device(k) and self.on_device(v)):
            raise ValueError(f"k and v must be on the pool's device {self.device}, got {k.device} "
                             f"and {v.device}")
        if kv.aliases(k) or kv.aliases(v):
            raise ValueError("k and v must not share memory with the pool's K/V buffers (views of "
                             "key_layer, value_layer, key_cache or value_cache); pass a copy "
                             "(.clone())")
        return int(shape[1])

    def write_window(self, start_pos: Any, seqlen: int, what: str) -> np.ndarray | int:
        """The starts of a write window ``[start, start + seqlen)``: KvCacheExhaustedError past a
        row's capacity, ValueError below its matched prefix (tree-owned KV is never written). An int
        ``start_pos`` that passes every check on scalars comes back as that int (one row's test, not
        B); anything else as ``int64[B]``."""
        if type(start_pos) is int and 0 <= start_pos and start_pos + seqlen <= self.min_capacity \
                and start_pos >= self.max_matched:
            return start_pos
        start = self.window(start_pos, seqlen, what)
        below = start < self.matched
        if below.any():
            b = int(np.argmax(below))
            raise ValueError(f"{what} row {b} at start_pos={int(start[b])} is below its matched "
                             f"prefix ({int(self.matched[b])} tokens, owned by the prefix tree); "
                             f"write from the matched length on")
        return start

    def start_of(self, start_pos: Any) -> np.ndarray:
        """``start_pos`` (int or per row) as ``int64[B]``; ValueError for a negative or malformed
        one."""
        return as_positions(start_pos, "start_pos", self.batch)

    def advance_kv_len(self, kv_len: np.ndarray, start: np.ndarray | int, seqlen: int) -> None:
        """Record a write of ``[start, start + seqlen)``: a row with ``start <= kv_len`` gets
        ``kv_len = max(kv_len, start + seqlen)``; a write past ``kv_len`` leaves a gap and moves
        nothing."""
        # Advancing kv_len is idempotent for a repeated window, so repeated puts of one window skip
        # it.
        window = (start, seqlen) if isinstance(start, int) else (start.tobytes(), seqlen)
        if window == self._last_window:
            return
        self._last_window = window
        if self.batch == 1 and isinstance(start, int):
            row = self.row0
            if start <= kv_len[row] < start + seqlen:
                kv_len[row] = start + seqlen
        else:
            old = kv_len[self.rows]
            kv_len[self.rows] = np.where(start <= old, np.maximum(old, start + seqlen), old)

    def read(self, kv: KvStore, layer: int, length: int, padded: bool = False,
             idx: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``get`` / ``get_padded`` for this step: ``[B, length, Hkv, D]`` in the compute dtype. A
        caller's ``idx`` must be the read's own slot index (``check_index``); ValueError otherwise,
        before anything is read."""
        length = self.read_length(length, padded)
        if idx is None:
            idx = self.index(0, length, clamp=padded)
        else:
            idx = self.check_index(idx, 0, length, "idx", clamp=padded)
        k, v = kv.read(layer, idx)
        shape = (self.batch, length, *kv.head_shape)
        return k.view(shape), v.view(shape)


class StepSlot:
    """The pool's active step, shared by the pool's parts: ``step`` is the batch the K/V and graph
    verbs act on, or None (before the first bind, and after the step was dropped). Only the request
    verbs (``RequestVerbs``) set it."""

    def __init__(self) -> None:
        self.step: ActiveStep | None = None

    def require(self) -> ActiveStep:
        """The active step; NoActiveStepError without one."""
        if self.step is None:
            raise NoActiveStepError("No request bound; call bind_request/activate_step or "
                                    "bind_with_prefix first")
        return self.step

    def holds(self, request_id: int) -> bool:
        """Whether ``request_id`` is a row of the active step."""
        return self.step is not None and request_id in self.step.ids


def _positions(value: Any, name: str, batch: int) -> np.ndarray:
    """``value`` as ``int64[batch, L]`` positions; ValueError naming ``name`` for another shape or
    non-integers."""
    arr = np.asarray(value)
    if arr.dtype.kind not in "iu" or arr.ndim != 2 or arr.shape[0] != batch:
        raise ValueError(f"{name} must be integer positions of shape [{batch}, L] (one row per "
                         f"active request), got {arr.dtype} {list(arr.shape)}")
    return arr.astype(np.int64)
