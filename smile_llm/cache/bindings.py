"""The binding table: one record per bound request, the only per-request state the pool keeps.

A binding owns a page table (logical page -> physical page) whose first ``matched_len / page_size``
pages are the matched prefix (owned by the tree, locked through ``locked_node``) and whose remaining
pages are private to it. ``kv_len`` (the end of the contiguous written prefix) lives in one int64
array indexed by the binding's ``row`` so step verbs update it for a whole batch at once.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from .offload import OffloadedKv
from .radix import TreeNode


@dataclass(eq=False)
class Binding:
    """One request's claim on the pool: a page-aligned capacity, a matched prefix of tree-owned
    pages (locked through ``locked_node``), private pages for the rest, and its row in
    ``BindingTable.kv_len``. Mutated only by the pool under its lock."""

    request_id: int
    row: int  # index into BindingTable.kv_len
    page_ids: np.ndarray  # int64[capacity / page_size]; only the prefix pages while offloaded
    capacity: int  # tokens, a multiple of page_size
    matched_len: int  # tokens of the tree-owned prefix, a multiple of page_size
    prefix_tokens: np.ndarray  # int64[matched_len], the tokens the prefix pages hold
    locked_node: TreeNode | None  # None when nothing was matched
    exclusive: bool  # made by bind_with_prefix / bind_requests (released by the next bind_request)
    offload: OffloadedKv | None = field(default=None)

    def num_prefix_pages(self, page_size: int) -> int:
        """Pages of the tree-owned matched prefix (``matched_len // page_size``)."""
        return self.matched_len // page_size

    def private_pages(self, page_size: int) -> np.ndarray:
        """The binding's own page ids (a view): every page after the matched prefix."""
        return self.page_ids[self.matched_len // page_size :]


class BindingTable:
    """Bindings by request id (insertion order) plus the shared ``kv_len`` array. Ids are positive,
    monotone and never reused. Not locked: the pool serialises calls."""

    def __init__(self) -> None:
        self._by_id: dict[int, Binding] = {}
        self.kv_len = np.zeros(8, dtype=np.int64)
        self._free_rows: list[int] = list(range(7, -1, -1))
        self._next_id = 1

    def __len__(self) -> int:
        return len(self._by_id)

    def __iter__(self) -> Iterator[Binding]:
        return iter(list(self._by_id.values()))

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._by_id

    @property
    def next_id(self) -> int:
        """The id the next ``add`` will assign."""
        return self._next_id

    def get(self, request_id: int) -> Binding | None:
        """The binding of ``request_id``, or None when it is not bound."""
        return self._by_id.get(request_id)

    def add(self, page_ids: np.ndarray, capacity: int, matched_len: int, prefix_tokens: np.ndarray,
            locked_node: TreeNode | None, exclusive: bool) -> Binding:
        """Register a new binding under the next id (positive, never reused) with ``kv_len``
        starting at ``matched_len``; grows the ``kv_len`` array when every row is taken. Returns the
        binding."""
        if not self._free_rows:
            old = len(self.kv_len)
            self.kv_len = np.concatenate([self.kv_len, np.zeros(old, dtype=np.int64)])
            self._free_rows = list(range(2 * old - 1, old - 1, -1))
        row = self._free_rows.pop()
        binding = Binding(self._next_id, row, page_ids, capacity, matched_len, prefix_tokens,
                          locked_node, exclusive)
        self._next_id += 1
        self.kv_len[row] = matched_len
        self._by_id[binding.request_id] = binding
        return binding

    def remove(self, binding: Binding) -> None:
        """Drop ``binding`` from the table and free its ``kv_len`` row (KeyError if it is not
        registered)."""
        del self._by_id[binding.request_id]
        self.kv_len[binding.row] = 0
        self._free_rows.append(binding.row)

    def kv_len_of(self, binding: Binding) -> int:
        """The written-prefix length (``kv_len``) of ``binding``."""
        return int(self.kv_len[binding.row])
