"""KvStore: the K and V storage of every layer and every byte that moves in or out of it.

Each KV layer has a K side and a V side (``kv_sides``), each in its own format (``kv_dtype``):
dense (float32, bfloat16, float16, FP8 with the pool's fixed scales: ``put`` stores ``x / scale``
saturated, reads return ``stored * scale``) or packed (low-bit pages quantized once complete, with
raw tails for pages still being written: ``kv_tails``, ``kv_window``). When every layer and side
is stored alike in a dense format the store is **direct**: one ``[num_layers, num_slots, Hkv, D]``
buffer per side (``key_cache``/``value_cache``), whose per-layer ``[num_pages, page_size, Hkv, D]``
views (``k_pages``/``v_pages``, FlashInfer's NHD layout) attention reads as they are. Otherwise
attention reads a per-forward **view** in the compute dtype (``window_view``; ``kv_window`` says
what it holds). The store knows nothing of requests or pages' owners; the pool hands it slot and
page ids.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from .errors import KvCacheExhaustedError
from .kv_dtype import KvFormat, LayerFormats, dense_formats
from .kv_sides import DenseSide, PackedSide
from .kv_tails import NO_TAIL, TailTable
from .kv_window import TAIL_WINDOW_PAGES, WindowPlan, plan_window, tails_needed
from .pages import page_slots

FILL_MODES = ("none", "zero", "poison")
FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)
Side = DenseSide | PackedSide


def compute_dtype_for(formats: tuple[LayerFormats, ...], device: torch.device) -> torch.dtype:
    """The dtype reads come back in: the storage dtype when every layer and side is stored in one
    float dtype; else bfloat16 on CUDA, float32 elsewhere."""
    dtypes = {f.dtype for layer in formats for f in (layer.k, layer.v)}
    if len(dtypes) == 1:
        (only,) = dtypes
        if only is not None and only not in FP8_DTYPES:
            return only
    return torch.bfloat16 if device.type == "cuda" else torch.float32


def check_scales(formats: tuple[LayerFormats, ...], k_scale: object, v_scale: object) -> None:
    """ValueError unless both scales are finite floats > 0 and 1.0 when no layer stores that side
    in FP8 (float storage is unscaled, so a scale there would never be applied)."""
    for name, scale, side in (("k_scale", k_scale, "k"), ("v_scale", v_scale, "v")):
        if isinstance(scale, bool) or not isinstance(scale, (int, float)) \
                or not math.isfinite(scale) or scale <= 0:
            raise ValueError(f"{name} must be a finite float > 0, got {scale!r}")
        if scale != 1.0 and not any(getattr(layer, side).fp8 for layer in formats):
            raise ValueError(f"{name}={scale} on a pool that stores no {side.upper()} in FP8: only "
                             f"FP8 storage is scaled; leave scales at 1.0")


class KvStore:
    """The sides of every layer (see the module docstring). Callers pass validated int64 index
    tensors on the store's device."""

    def __init__(self, num_layers: int, num_slots: int, num_kv_heads: int, head_dim: int,
                 page_size: int, device: torch.device, dtype: torch.dtype | None, k_scale: float,
                 v_scale: float, formats: tuple[LayerFormats, ...] | None = None,
                 num_tails: int = 0, compute_dtype: torch.dtype | None = None) -> None:
        if formats is None:
            if dtype is None:
                raise ValueError("give the store a dtype or per-layer formats")
            formats = dense_formats(dtype, num_layers)
        if len(formats) != num_layers:
            raise ValueError(f"{len(formats)} layer formats for {num_layers} layers")
        self.formats = formats
        self.page_size, self.device = page_size, device
        self.num_pages = num_slots // page_size
        self.compute_dtype = compute_dtype or compute_dtype_for(formats, device)
        self.k_scale, self.v_scale = float(k_scale), float(v_scale)
        # a store of no layers (a pipeline stage without attention layers) holds no sides
        first = formats[0].k if formats else KvFormat.of(self.compute_dtype)
        self.direct = all(layer.k == first and layer.v == first for layer in formats) \
            and not first.packed
        self.packed = any(layer.k.packed or layer.v.packed for layer in formats)
        self.dtype: torch.dtype = (first.dtype if self.direct and first.dtype is not None
                                   else self.compute_dtype)
        self.is_fp8 = self.direct and first.fp8
        shape = (num_slots, num_kv_heads, head_dim)
        self.head_shape = torch.Size(shape[1:])
        self.tails = TailTable(self.num_pages, num_tails if self.packed else 0)
        # whether a packed page's stored parts hold all its values (set once it is complete)
        self.packed_valid = np.zeros(self.num_pages, dtype=bool)
        with torch.inference_mode(False):  # a pool made under inference mode stays writable
            if self.direct:
                self.key_cache = torch.zeros((num_layers, *shape), dtype=self.dtype, device=device)
                self.value_cache = torch.zeros((num_layers, *shape), dtype=self.dtype,
                                               device=device)
        self.k_sides: list[Side] = []
        self.v_sides: list[Side] = []
        for i, layer in enumerate(formats):
            for side, fmt, scale, out in (("k", layer.k, k_scale, self.k_sides),
                                          ("v", layer.v, v_scale, self.v_sides)):
                if fmt.packed:
                    out.append(PackedSide(fmt, side, self.num_pages, self.tails.num_tails,
                                          page_size, num_kv_heads, head_dim, device,
                                          self.compute_dtype))
                    continue
                if self.direct:
                    buffer = (self.key_cache if side == "k" else self.value_cache)[i]
                else:
                    assert fmt.dtype is not None
                    with torch.inference_mode(False):
                        buffer = torch.zeros(shape, dtype=fmt.dtype, device=device)
                out.append(DenseSide(fmt, buffer, page_size, self.compute_dtype, scale))
        self._buffer_ptrs = self._pointers()
        # per-layer pages attention reads directly (direct stores only: every side dense)
        dense_k = [s for s in self.k_sides if isinstance(s, DenseSide)]
        dense_v = [s for s in self.v_sides if isinstance(s, DenseSide)]
        self.k_pages = [s.pages for s in dense_k] if self.direct else []
        self.v_pages = [s.pages for s in dense_v] if self.direct else []
        self.page_bytes = self.k_sides[0].page_bytes if self.direct and self.k_sides else 0

    def _pointers(self) -> tuple[int, ...]:
        out = []
        for side in (*self.k_sides, *self.v_sides):
            if isinstance(side, DenseSide):
                out.append(side.buffer.untyped_storage().data_ptr())
            else:
                out.append(side.tails.untyped_storage().data_ptr())
        return tuple(out)

    def set_scales(self, k_scale: float, v_scale: float) -> None:
        """The FP8 scales of every FP8 side."""
        self.k_scale, self.v_scale = float(k_scale), float(v_scale)
        for sides, scale in ((self.k_sides, k_scale), (self.v_sides, v_scale)):
            for s in sides:
                if isinstance(s, DenseSide):
                    s.scale = float(scale)

    def side_bytes(self, layer: int) -> tuple[int, int]:
        """Bytes of one page of ``layer``'s K and of its V, as stored (a packed page's codes and
        scales; its tail, while it has one, is extra)."""
        return self.k_sides[layer].page_bytes, self.v_sides[layer].page_bytes

    # ------------------------------------------------------------------ token-level
    def write(self, layer: int, slot_idx: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """``k``/``v`` are ``[N, Hkv, D]``; row i goes to slot ``slot_idx[i]`` of ``layer``. Direct
        stores only (a packed layer writes through ``write_window``). Nothing is checked here:
        callers validate (a wrong shape or device raises from torch, K possibly written by then)."""
        k_side, v_side = self.k_sides[layer], self.v_sides[layer]
        assert isinstance(k_side, DenseSide) and isinstance(v_side, DenseSide)
        k_side.write(slot_idx, k)
        v_side.write(slot_idx, v)

    def aliases(self, t: torch.Tensor) -> bool:
        """Whether ``t`` shares memory with a K or V buffer (an index write from it would read what
        it writes)."""
        return t.untyped_storage().data_ptr() in self._buffer_ptrs

    def read(self, layer: int, slot_idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``[N, Hkv, D]`` gathers of K and V at ``slot_idx`` in the compute dtype (a packed page's
        values from its tail while it has one, else decoded)."""
        return self._read(self.k_sides[layer], slot_idx), self._read(self.v_sides[layer], slot_idx)

    def _read(self, side: Side, slot_idx: torch.Tensor) -> torch.Tensor:
        if isinstance(side, DenseSide):
            return side.read(slot_idx)
        ps = self.page_size
        slots = slot_idx.cpu().numpy()
        pages, where = np.unique(slots // ps, return_inverse=True)
        decoded = side.gather_pages(torch.from_numpy(pages).to(self.device))
        flat = decoded.reshape(-1, *decoded.shape[2:])
        out = flat.index_select(0, torch.from_numpy(where * ps + slots % ps).to(self.device))
        tails = self.tails.tail_of[slots // ps]
        held = np.flatnonzero(tails != NO_TAIL)
        if len(held):
            src = torch.from_numpy(tails[held] * ps + slots[held] % ps).to(self.device)
            out[torch.from_numpy(held).to(self.device)] = side.tails.index_select(0, src)
        return out

    # ------------------------------------------------------------------ windows (view stores)
    def plan_window(self, page_table: np.ndarray, start: np.ndarray, seqlen: int,
                    rows_pages: list[np.ndarray]) -> WindowPlan:
        """Make the tails of a window ``[start_b, start_b + seqlen)`` of rows with ``page_table``
        ready and plan it (``kv_window``). ``rows_pages``: each row's page ids, whose tails below
        the window's first page are given back (the row moved past them). ValueError when a window
        starts inside a packed page whose raw values are gone; KvCacheExhaustedError when tails run
        out; nothing changes then."""
        ps = self.page_size
        if self.packed:
            for b, s in enumerate(start.tolist()):
                page = int(page_table[b, s // ps])
                if s % ps and self.tails.tail_of[page] == NO_TAIL and self.packed_valid[page]:
                    raise ValueError(f"row {b}: a write at position {s} starts inside page "
                                     f"{page}, which is quantized and holds no raw values; a "
                                     f"packed pool writes each row from its last partial page on")
            need = self.tails.missing(tails_needed(page_table, start, seqlen, ps))
            below = [p[: s // ps] for p, s in zip(rows_pages, start.tolist())]
            gone = np.concatenate(below) if below else np.zeros(0, dtype=np.int64)
            freed = int(np.count_nonzero(self.tails.tail_of[gone] != NO_TAIL))
            if len(need) > self.tails.free_tails + freed:
                raise KvCacheExhaustedError(
                    f"a packed KV write needs {len(need)} more tails and only "
                    f"{self.tails.free_tails + freed} of {self.tails.num_tails} are free; bind "
                    f"fewer rows at once or make the pool with more tails")
            self._repack(gone)
            self.tails.release(gone)
            self.tails.take(need)
            self.packed_valid[need] = False
        return plan_window(page_table, start, seqlen, ps, self.tails, split=self.packed)

    def _repack(self, pages: np.ndarray) -> None:
        """Quantize the tails of ``pages`` that are complete but not quantized (a page whose
        values a ``move_kv`` or a truncate changed after it was first completed)."""
        stale = pages[(self.tails.tail_of[pages] != NO_TAIL) & ~self.packed_valid[pages]]
        if not len(stale):
            return
        ps = self.page_size
        at = torch.from_numpy(page_slots(self.tails.tail_of[stale], ps)).to(self.device)
        ids = self._pages(stale)
        for side in (*self.k_sides, *self.v_sides):
            if isinstance(side, PackedSide):
                raw = side.tails.index_select(0, at).view(len(stale), ps, *side.tails.shape[1:])
                side.encode_pages(ids, raw)
        self.packed_valid[stale] = True

    def unseal(self, pages: np.ndarray) -> None:
        """``pages`` (a row's, from its new length's page on) no longer hold all their values as
        quantized: they will be written again."""
        if self.packed and len(pages):
            self.packed_valid[pages] = False

    def write_window(self, layer: int, plan: WindowPlan, slot_idx: torch.Tensor, k: torch.Tensor,
                     v: torch.Tensor) -> None:
        """Write a window's ``k``/``v`` ``[B*S, Hkv, D]`` into ``layer`` as ``plan`` says: dense
        sides at ``slot_idx``; packed sides into their tails, and the pages the window completes
        quantized."""
        for side, x in ((self.k_sides[layer], k), (self.v_sides[layer], v)):
            if isinstance(side, DenseSide):
                side.write(slot_idx, x)
            else:
                self._write_packed(side, plan, x)
        if plan.complete.pages.size and self.packed:
            self.packed_valid[plan.complete.pages] = True

    def window_view(self, layer: int, plan: WindowPlan, k: torch.Tensor,
                    v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The attention view of ``layer`` after ``write_window`` wrote ``k``/``v`` there:
        ``[num_view_pages, page_size, Hkv, D]`` of K and of V in the compute dtype."""
        return (self._view(self.k_sides[layer], plan, k),
                self._view(self.v_sides[layer], plan, v))

    def _write_packed(self, side: PackedSide, plan: WindowPlan, x: torch.Tensor) -> None:
        held = np.flatnonzero(plan.tail_index >= 0)
        if len(held):
            dst = torch.from_numpy(plan.tail_index[held]).to(self.device)
            side.tails.index_copy_(0, dst, x.index_select(0, torch.from_numpy(held).to(
                self.device)).to(side.tails.dtype))
        if plan.complete.pages.size:
            raw = self._assemble(side, plan.complete, x)
            side.encode_pages(torch.from_numpy(plan.complete.pages).to(self.device), raw)

    def _assemble(self, side: PackedSide, raw: Any, x: torch.Tensor) -> torch.Tensor:
        """The raw pages ``raw`` (a ``RawPages``) from the window ``x`` and the tails, zeros
        elsewhere: ``[n, page_size, Hkv, D]`` in the compute dtype."""
        _, w_at, w_idx, t_at, t_idx = raw.device_indices(self.device)
        n = len(raw.pages) * self.page_size
        out = torch.zeros(n, *x.shape[1:], dtype=self.compute_dtype, device=self.device)
        if len(w_at):
            out[w_at] = x.index_select(0, w_idx).to(self.compute_dtype)
        if len(t_at):
            out[t_at] = side.tails.index_select(0, t_idx)
        return out.view(len(raw.pages), self.page_size, *x.shape[1:])

    def _view(self, side: Side, plan: WindowPlan, x: torch.Tensor) -> torch.Tensor:
        """The layer side's attention view (``kv_window``): ``q_pages`` as stored, then the raw
        pages of the sub-rows."""
        q = torch.from_numpy(plan.q_pages).to(self.device)
        parts = [side.gather_pages(q)]
        if plan.raw.pages.size:
            if isinstance(side, DenseSide):
                parts.append(side.gather_pages(torch.from_numpy(plan.raw.pages).to(self.device)))
            else:
                parts.append(self._assemble(side, plan.raw, x))
        return torch.cat(parts) if len(parts) > 1 else parts[0]

    # ------------------------------------------------------------------ page-level
    def _slots(self, page_ids: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(page_slots(page_ids, self.page_size)).to(self.device)

    def _pages(self, page_ids: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.asarray(page_ids, dtype=np.int64)).to(self.device)

    def fill_pages(self, page_ids: np.ndarray, mode: str) -> None:
        """Fill every layer's K and V of ``page_ids``: ``"zero"`` with 0, ``"poison"`` with NaN
        (all-ones bytes for FP8 and packed pages); ``"none"`` leaves them."""
        if mode == "none" or len(page_ids) == 0:
            return
        slots, pages = self._slots(page_ids), self._pages(page_ids)
        for side in (*self.k_sides, *self.v_sides):
            if isinstance(side, DenseSide):
                side.fill_slots(slots, mode)
            else:
                side.fill_pages(pages, mode)

    def forget_pages(self, page_ids: np.ndarray) -> None:
        """``page_ids`` left their holder whole (handed to the tree): quantize what their tails
        hold that is not quantized yet (a page a ``move_kv`` completed), then give the tails
        back."""
        if self.packed and len(page_ids):
            ids = np.asarray(page_ids, dtype=np.int64)
            self._repack(ids)
            self.tails.release(ids)

    def free_pages(self, page_ids: np.ndarray) -> None:
        """``page_ids`` went back to the free list."""
        if self.packed and len(page_ids):
            ids = np.asarray(page_ids, dtype=np.int64)
            self.tails.release(ids)
            self.packed_valid[ids] = False

    def zero_slots(self, slots: np.ndarray) -> None:
        """Zero K and V of ``slots`` on every layer (a packed page's tail positions; a packed page
        without a tail is left: its values are complete and nobody's to zero)."""
        if not len(slots):
            return
        idx = torch.from_numpy(slots).to(self.device)
        tails = self.tails.tail_of[slots // self.page_size] if self.packed else None
        for side in (*self.k_sides, *self.v_sides):
            if isinstance(side, DenseSide):
                side.zero_slots(idx)
            elif tails is not None:
                held = tails != NO_TAIL
                if held.any():
                    at = tails[held] * self.page_size + slots[held] % self.page_size
                    side.tails.index_fill_(0, torch.from_numpy(at).to(self.device), 0)

    def check_rewritable(self, slots: np.ndarray, what: str) -> None:
        """ValueError when a slot of ``slots`` lies in a quantized page that keeps no raw values
        (``what`` would leave it partly written, and its raw values are gone)."""
        if not self.packed or not len(slots):
            return
        pages = slots // self.page_size
        lost = pages[(self.tails.tail_of[pages] == NO_TAIL) & self.packed_valid[pages]]
        if len(lost):
            raise ValueError(f"{what} reaches into page {int(lost[0])}, which is quantized and "
                             f"holds no raw values (a packed pool keeps the raw values of the last "
                             f"{TAIL_WINDOW_PAGES} pages a row wrote only)")

    def check_raw(self, slots: np.ndarray, what: str) -> None:
        """ValueError unless every slot of ``slots`` keeps its raw values (a dense layer always
        does; a packed page only while it has a tail), so ``what`` can change it."""
        if not self.packed or not len(slots):
            return
        pages = slots // self.page_size
        lost = pages[self.tails.tail_of[pages] == NO_TAIL]
        if len(lost):
            raise ValueError(f"{what} reaches page {int(lost[0])}, which is quantized and holds no "
                             f"raw values (a packed pool keeps the raw values of a row's last "
                             f"{TAIL_WINDOW_PAGES} pages written only)")

    def copy_slots(self, src: np.ndarray, dst: np.ndarray) -> None:
        """Copy K and V of slots ``src`` to slots ``dst`` on every layer (all sources are read
        before any write, so the two may overlap). Packed layers: tail positions only
        (``check_raw`` first)."""
        if not len(src):
            return
        s, d = torch.from_numpy(src).to(self.device), torch.from_numpy(dst).to(self.device)
        for side in (*self.k_sides, *self.v_sides):
            if isinstance(side, DenseSide):
                side.copy_slots(s, d)
            else:
                ps = self.page_size
                ts = self.tails.tail_of[src // ps] * ps + src % ps
                td = self.tails.tail_of[dst // ps] * ps + dst % ps
                tail_s = torch.from_numpy(ts).to(self.device)
                tail_d = torch.from_numpy(td).to(self.device)
                side.tails.index_copy_(0, tail_d, side.tails.index_select(0, tail_s))

    def copy_pages_out(self, page_ids: np.ndarray) -> tuple[list[Any], list[Any]]:
        """The stored contents of ``page_ids`` on every layer, on the host: per layer, a dense
        side's raw slots ``[n*page_size, Hkv, D]``, a packed side's parts and the raw values of the
        pages' tails (None where a page has none)."""
        slots, pages = self._slots(page_ids), self._pages(page_ids)
        out: tuple[list[Any], list[Any]] = ([], [])
        tails = self.tails.tail_of[page_ids] if self.packed else None
        for sides, saved in ((self.k_sides, out[0]), (self.v_sides, out[1])):
            for side in sides:
                if isinstance(side, DenseSide):
                    saved.append(side.slots_out(slots))
                else:
                    assert tails is not None
                    ps = self.page_size  # (a copy: a CPU slice would still be the tail's view)
                    raw = [None if t == NO_TAIL else side.tails[t * ps : (t + 1) * ps].to(
                        "cpu", copy=True) for t in tails.tolist()]
                    saved.append((side.pages_out(pages), raw, self.packed_valid[page_ids].copy()))
        return out

    def tails_to_restore(self, k_saved: list[Any], v_saved: list[Any]) -> int:
        """Tails a restore of ``k_saved`` and ``v_saved`` (from ``copy_pages_out``) needs: a page's
        tail serves every packed side, so the first packed side of either counts them."""
        for saved in (*k_saved, *v_saved):
            if isinstance(saved, tuple):
                return sum(1 for r in saved[1] if r is not None)
        return 0

    def copy_pages_in(self, page_ids: np.ndarray, k_saved: list[Any], v_saved: list[Any]) -> None:
        """Write back what ``copy_pages_out`` saved into ``page_ids`` (byte-identical parts and
        raw tails; the pool checked there are tails enough)."""
        slots, pages = self._slots(page_ids), self._pages(page_ids)
        tails_taken = False
        for sides, saved_all in ((self.k_sides, k_saved), (self.v_sides, v_saved)):
            for side, saved in zip(sides, saved_all):
                if isinstance(side, DenseSide):
                    side.slots_in(slots, saved)
                    continue
                parts, raw, valid = saved
                side.pages_in(pages, parts)
                held = np.array([r is not None for r in raw], dtype=bool)
                if not tails_taken:
                    self.tails.take(page_ids[held])
                    self.packed_valid[page_ids] = valid
                    tails_taken = True
                for page, r in zip(page_ids[held].tolist(), [r for r in raw if r is not None]):
                    t = int(self.tails.tail_of[page])
                    side.tails[t * self.page_size : (t + 1) * self.page_size] = r.to(self.device)

    def read_page(self, layer: int, page: int) -> tuple[bytes, bytes]:
        """The stored bytes of K and V of ``page`` on ``layer``: a dense side's ``page_size * Hkv *
        D`` elements, a packed side's parts in order. ValueError for a packed page not complete yet
        (its values are in its tail, not quantized)."""
        if self.packed and not self.packed_valid[page]:
            if self.k_sides[layer].packed or self.v_sides[layer].packed:
                raise ValueError(f"page {page} is still being written (its raw values are in a "
                                 f"tail); a packed page's bytes exist once it is complete")
        return self.k_sides[layer].page_data(page), self.v_sides[layer].page_data(page)

    def write_page(self, layer: int, page: int, k_bytes: torch.Tensor,
                   v_bytes: torch.Tensor) -> None:
        """``k_bytes``/``v_bytes``: fresh uint8 tensors of exactly one page of each side
        (``as_page_bytes``). A packed page written so is complete."""
        self.k_sides[layer].set_page_data(page, k_bytes)
        self.v_sides[layer].set_page_data(page, v_bytes)
        if self.k_sides[layer].packed or self.v_sides[layer].packed:
            self.tails.release(np.array([page], dtype=np.int64))
            self.packed_valid[page] = True

    def as_page_bytes(self, data: Any, name: str, size: int | None = None) -> torch.Tensor:
        """``data`` (bytes-like or a tensor) as a flat uint8 tensor of exactly ``size`` bytes
        (default: a direct store's page); ValueError otherwise."""
        size = self.page_bytes if size is None else size
        # a tensor: a fresh copy, aligned for any dtype view, safe from later edits
        if isinstance(data, torch.Tensor):
            t = data.detach().contiguous().reshape(-1).view(torch.uint8).cpu().clone()
        else:
            try:
                t = torch.frombuffer(bytearray(memoryview(data).cast("B")), dtype=torch.uint8)
            except TypeError:
                raise ValueError(f"{name} must be bytes-like or a tensor, got "
                                 f"{type(data).__name__}") from None
        if t.numel() != size:
            raise ValueError(f"{name} has {t.numel()} bytes; one page of one layer is {size}")
        return t

    def release(self) -> None:
        """Drop the buffers (``close``)."""
        empty = torch.zeros(0, dtype=self.dtype, device=self.device)
        self.key_cache = self.value_cache = empty
        self.k_sides, self.v_sides = [], []
        self.k_pages, self.v_pages = [], []
        self._buffer_ptrs = ()
