"""TailTable: which pages of a packed pool keep their raw K/V in a tail, and the free tails.

A packed layer (``cache.codecs``) quantizes a page once the page is complete. Until then, and for
the short windows a speculative verify may take back (``truncate_to``), the raw values stay in a
**tail**: a page-sized buffer in the compute dtype, one per packed layer and side, all layers
sharing one tail index per page. This table is the host bookkeeping: ``tail_of[page]`` is the
page's tail index, or -1. Tails are taken when a write window needs them (``KvStore.plan_window``)
and given back when their page is released or handed to the prefix tree (complete pages only),
and when a row's next window starts past them. Not locked: the pool serialises calls.
"""

from __future__ import annotations

import numpy as np

from .errors import KvCacheExhaustedError

NO_TAIL = -1


def default_tails(num_pages: int) -> int:
    """Tails of a packed pool made without a count: an eighth of its pages (at least 8), enough for
    a row's last two pages each at any batch a pool of that size serves."""
    return max(8, num_pages // 8)


class TailTable:
    """``num_tails`` tails over ``num_pages`` pages (see the module docstring)."""

    def __init__(self, num_pages: int, num_tails: int) -> None:
        self.num_tails = num_tails
        self.tail_of = np.full(num_pages, NO_TAIL, dtype=np.int64)  # per page
        self.page_of = np.full(num_tails, NO_TAIL, dtype=np.int64)  # per tail
        self._free = list(range(num_tails - 1, -1, -1))  # a stack: the lowest index first

    @property
    def free_tails(self) -> int:
        return len(self._free)

    def missing(self, pages: np.ndarray) -> np.ndarray:
        """The pages among ``pages`` (unique) without a tail."""
        return pages[self.tail_of[pages] == NO_TAIL]

    def take(self, pages: np.ndarray) -> None:
        """Give each of ``pages`` (unique, none holding a tail) a tail. KvCacheExhaustedError,
        taking none, when fewer are free."""
        if len(pages) > len(self._free):
            raise KvCacheExhaustedError(
                f"a packed KV write needs {len(pages)} tails (raw pages of the pages being "
                f"written) and only {len(self._free)} of {self.num_tails} are free; bind fewer "
                f"rows at once or make the pool with more tails")
        for page in pages.tolist():
            tail = self._free.pop()
            self.tail_of[page] = tail
            self.page_of[tail] = page

    def release(self, pages: np.ndarray) -> None:
        """Give back the tails of ``pages`` (pages without one are skipped)."""
        if len(pages) == 0:
            return
        tails = self.tail_of[pages]
        held = tails[tails != NO_TAIL]
        if len(held) == 0:
            return
        self.page_of[held] = NO_TAIL
        self.tail_of[pages] = NO_TAIL
        self._free.extend(held.tolist())

    def move(self, old: np.ndarray, new: np.ndarray) -> None:
        """The tails of pages ``old`` now belong to pages ``new`` (same lengths; the new pages hold
        none)."""
        tails = self.tail_of[old]
        held = tails != NO_TAIL
        self.tail_of[old] = NO_TAIL
        self.tail_of[new[held]] = tails[held]
        self.page_of[tails[held]] = new[held]

    def check(self) -> str | None:
        """What is inconsistent between the two maps and the free list, or None."""
        pages = np.flatnonzero(self.tail_of != NO_TAIL)
        if not np.array_equal(self.page_of[self.tail_of[pages]], pages):
            return "a tail's page does not point back at it"
        used = int(np.count_nonzero(self.page_of != NO_TAIL))
        if used != len(pages) or used + len(self._free) != self.num_tails:
            return (f"{used} tails in use over {len(pages)} pages, {len(self._free)} free, "
                    f"{self.num_tails} in all")
        return None
