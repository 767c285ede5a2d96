"""WindowPlan: how one forward's write window moves through a pool that is not stored uniformly
(packed low-bit pages, or layers and sides in different formats), and what attention reads.

Semantics of a packed page (KIVI's residual window, at page granularity): a page is quantized once
all its positions are written; until then its raw values stay in a tail. A query at position ``q``
reads every page before its own page quantized (they are complete) and its own page raw. So what a
query reads depends only on the positions written, never on how the forward was cut: a prefill, a
decode step, a verify window and a prefix hit read the same values, and a quantized page is never
re-quantized by decode.

A forward's window ``[s_b, s_b + S)`` of row b may cover several pages, and then queries of one row
read different versions of the same page (raw for its own queries, quantized for later ones). The
plan therefore cuts each row's queries at page boundaries into **sub-rows**, each with its own page
list over a compact **view**: ``q_pages`` (physical pages read quantized, each once) followed by
``r_sources`` (one raw page per sub-row, assembled from the tail, the window's own K/V and zeros
past the last written position). The attention CSR (``indptr``, ``indices``, ``last_page_len``)
and ``qo_indptr`` describe the sub-rows over view ids, so any backend serves it unchanged. A store
without packed layers (only dense layers in different formats) reads every page as stored; the
plan then maps view ids to physical pages and cuts nothing.

Tails kept (``TAIL_WINDOW_PAGES``): a window over at most that many pages keeps every page it
touches raw, so a verify that takes drafts back (``truncate_to``) lands in a page whose raw values
are all there; a longer window (a prefill chunk) keeps only its first and last page raw. Built on
the host, once per forward (every layer shares it), under the pool's lock.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .kv_tails import NO_TAIL, TailTable

TAIL_WINDOW_PAGES = 2  # windows over at most this many pages keep all of them raw (verify rounds)
ZERO = -1  # a raw source position past what was written


@dataclass(eq=False)
class RawPages:
    """Where the raw values of ``n`` pages come from, position by position (``[n * page_size]``
    each): ``window`` (an index into the window's tokens, else -1) and ``tail`` (an index into the
    tails, else -1); neither: zero."""

    pages: np.ndarray  # int64[n] physical pages
    window: np.ndarray  # int64[n * page_size]
    tail: np.ndarray  # int64[n * page_size]

    def device_indices(self, device: torch.device) -> tuple[torch.Tensor, ...]:
        """(pages, window mask and index, tail mask and index) on ``device`` for the gathers."""
        w, t = self.window >= 0, self.tail >= 0
        return tuple(torch.from_numpy(a).to(device) for a in
                     (self.pages, np.flatnonzero(w), self.window[w], np.flatnonzero(t),
                      self.tail[t]))


@dataclass(eq=False)
class WindowPlan:
    """One forward's plan (see the module docstring): ``tail_index`` ``int64[B*S]`` (each window
    token's tail position, or -1), the pages the window completes (``complete``, with their raw
    sources), and the attention view: ``q_pages`` then ``raw`` pages, and the sub-rows' CSR over
    view ids."""

    tail_index: np.ndarray
    complete: RawPages
    q_pages: np.ndarray  # int64[nq] physical pages read as stored (quantized when packed)
    raw: RawPages  # the sub-rows' own pages, raw
    indptr: np.ndarray  # int32[R+1] over view ids
    indices: np.ndarray  # int32[...]
    last_page_len: np.ndarray  # int32[R]
    qo_indptr: np.ndarray  # int32[R+1]
    split: bool  # sub-rows cut at page boundaries (a packed layer is present)

    @property
    def num_view_pages(self) -> int:
        return len(self.q_pages) + len(self.raw.pages)


def tails_needed(page_table: np.ndarray, start: np.ndarray, seqlen: int,
                 page_size: int) -> np.ndarray:
    """The physical pages (unique) whose raw values the window ``[start_b, start_b + seqlen)`` keeps
    in a tail (see ``TAIL_WINDOW_PAGES``)."""
    ps = page_size
    out: list[int] = []
    for b, s in enumerate(start.tolist()):
        first, last = s // ps, (s + seqlen - 1) // ps
        keep: list[int]
        if last - first + 1 <= TAIL_WINDOW_PAGES:
            keep = list(range(first, last + 1))
        else:
            keep = [j for j in (first, last) if (j == first and s % ps) or
                    (j == last and (s + seqlen) % ps)]
        out.extend(int(page_table[b, j]) for j in keep)
    return np.unique(np.array(out, dtype=np.int64))


def plan_window(page_table: np.ndarray, start: np.ndarray, seqlen: int, page_size: int,
                tails: TailTable, split: bool) -> WindowPlan:
    """The plan of a window whose tails are in place (``tails_needed`` all hold one). ``split``:
    cut sub-rows at page boundaries and read earlier pages quantized (a packed layer is present);
    else one sub-row per row reading every page as stored."""
    ps, batch = page_size, len(start)
    tail_index = np.full(batch * seqlen, NO_TAIL, dtype=np.int64)
    complete_pages: list[int] = []
    complete_win: list[np.ndarray] = []
    complete_tail: list[np.ndarray] = []
    raw_pages: list[int] = []
    raw_win: list[np.ndarray] = []
    raw_tail: list[np.ndarray] = []
    q_of: dict[int, int] = {}
    sub_pages: list[list[int]] = []  # per sub-row: ("q", page) ids as ints, raw as -(i + 1)
    last_len: list[int] = []
    qo: list[int] = [0]
    offsets = np.arange(ps, dtype=np.int64)
    for b, s in enumerate(start.tolist()):
        e = s + seqlen
        first, last = s // ps, (e - 1) // ps
        for j in range(first, last + 1):
            page = int(page_table[b, j])
            pos = j * ps + offsets  # the page's positions
            win = np.where((pos >= s) & (pos < e), b * seqlen + pos - s, -1)
            tail = tails.tail_of[page]
            tail_src = np.where((win < 0) & (pos < s) & (tail != NO_TAIL), tail * ps + offsets, -1)
            if tail != NO_TAIL:
                inside = win >= 0
                tail_index[win[inside]] = tail * ps + offsets[inside]
            if e >= (j + 1) * ps:  # the window completes the page
                complete_pages.append(page)
                complete_win.append(win)
                complete_tail.append(tail_src)
            if not split:
                continue
            lo, hi = max(s, j * ps), min(e, (j + 1) * ps)
            ids = [q_of.setdefault(int(p), len(q_of)) for p in page_table[b, :j].tolist()]
            sub_pages.append(ids + [-(len(raw_pages) + 1)])
            raw_pages.append(page)
            raw_win.append(np.where(pos < hi, win, -1))
            raw_tail.append(tail_src)
            last_len.append(hi - 1 - j * ps + 1)
            qo.append(qo[-1] + hi - lo)
        if not split:
            ids = [q_of.setdefault(int(p), len(q_of)) for p in page_table[b, : last + 1].tolist()]
            sub_pages.append(ids)
            last_len.append((e - 1) % ps + 1)
            qo.append(qo[-1] + seqlen)
    nq = len(q_of)
    q_pages = np.empty(nq, dtype=np.int64)
    for page, i in q_of.items():
        q_pages[i] = page
    indptr = np.zeros(len(sub_pages) + 1, dtype=np.int32)
    np.cumsum([len(p) for p in sub_pages], out=indptr[1:])
    indices = np.array([i if i >= 0 else nq - i - 1 for p in sub_pages for i in p], dtype=np.int32)
    return WindowPlan(tail_index, _raw(complete_pages, complete_win, complete_tail, ps), q_pages,
                      _raw(raw_pages, raw_win, raw_tail, ps), indptr, indices,
                      np.array(last_len, dtype=np.int32), np.array(qo, dtype=np.int32), split)


def _raw(pages: list[int], win: list[np.ndarray], tail: list[np.ndarray], ps: int) -> RawPages:
    if not pages:
        empty = np.zeros(0, dtype=np.int64)
        return RawPages(empty, empty, empty)
    return RawPages(np.array(pages, dtype=np.int64), np.concatenate(win), np.concatenate(tail))
