"""Page allocator: the FIFO free list and the owner of every page.

Every page is in exactly one state (``PageOwner``): free, owned by the prefix tree, private to one
binding, owned by a caller of ``alloc``, or scratch reserved by the pool. The free list is a ring
buffer of page ids: ``take`` pops from the head, ``release`` appends to the tail (first-in,
first-out reuse, as Smile). All work is vectorised over page-id arrays; nothing loops per page in
Python.

This class checks ownership (double frees, freeing someone else's page) but holds no policy: the
pool decides who gets pages and when the tree is evicted.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import IntEnum

import numpy as np

from .errors import KvCacheCorruptionError


class PageOwner(IntEnum):
    """The state of a page: FREE (on the free list), TREE (owned by the radix prefix tree), PRIVATE
    (one binding's), CALLER (handed out by ``alloc``), SCRATCH (reserved by the pool for
    decode-graph prefetch until ``close``)."""

    FREE = 0
    TREE = 1
    PRIVATE = 2
    CALLER = 3
    SCRATCH = 4


NO_HOLDER = -1  # holder of a page that is not private to a binding


def page_slots(page_ids: np.ndarray, page_size: int) -> np.ndarray:
    """int64 slot ids of ``page_ids``, page by page, in order."""
    return (page_ids[:, None] * page_size + np.arange(page_size, dtype=np.int64)).reshape(-1)


class PageAllocator:
    """Owner table plus FIFO free list over ``num_pages`` pages. Not locked: the pool serialises
    calls."""

    def __init__(self, num_pages: int) -> None:
        self.num_pages = num_pages
        # told of pages that go back to the free list, and of pages handed to another owner (the
        # store drops their raw tails: ``KvStore.free_pages``, ``KvStore.forget_pages``)
        self.on_free: Callable[[np.ndarray], None] | None = None
        self.on_transfer: Callable[[np.ndarray], None] | None = None
        self.owner = np.zeros(num_pages, dtype=np.int8)  # PageOwner per page
        self.holder = np.full(num_pages, NO_HOLDER, dtype=np.int64)  # request id for PRIVATE pages
        self._ring = np.arange(num_pages, dtype=np.int64)  # free page ids, FIFO from _head
        self._head = 0
        self._count = num_pages

    @property
    def free_pages(self) -> int:
        """Pages on the free list."""
        return self._count

    def free_list(self) -> np.ndarray:
        """The free page ids in the order ``take`` hands them out (a copy)."""
        idx = (self._head + np.arange(self._count)) % self.num_pages
        return self._ring[idx]

    def count(self, owner: PageOwner) -> int:
        """Pages whose owner is ``owner`` (O(num_pages))."""
        return int(np.count_nonzero(self.owner == owner))

    def take(self, n: int, owner: PageOwner, holder: int = NO_HOLDER) -> np.ndarray:
        """Pop ``n`` pages from the head of the free list and give them to ``owner``. The caller
        checked that ``n <= free_pages`` (an internal error otherwise)."""
        if n > self._count:
            raise KvCacheCorruptionError(f"take({n}) with only {self._count} free pages: the "
                                         f"caller skipped its check")
        idx = (self._head + np.arange(n)) % self.num_pages
        pages = self._ring[idx].copy()
        self._head = (self._head + n) % self.num_pages
        self._count -= n
        self.owner[pages] = owner
        self.holder[pages] = holder
        return pages

    def release(self, pages: np.ndarray) -> None:
        """Append ``pages`` (already checked by the caller) to the tail of the free list."""
        n = len(pages)
        if n == 0:
            return
        tail = (self._head + self._count + np.arange(n)) % self.num_pages
        self._ring[tail] = pages
        self._count += n
        self.owner[pages] = PageOwner.FREE
        self.holder[pages] = NO_HOLDER
        if self.on_free is not None:
            self.on_free(pages)

    def transfer(self, pages: np.ndarray, owner: PageOwner) -> None:
        """Hand ``pages`` to ``owner`` (not a binding) without touching the free list."""
        self.owner[pages] = owner
        self.holder[pages] = NO_HOLDER
        if self.on_transfer is not None:
            self.on_transfer(pages)

    def misowned(self, pages: np.ndarray, owner: PageOwner) -> np.ndarray:
        """The pages among ``pages`` not owned by ``owner``."""
        return pages[self.owner[pages] != owner]
