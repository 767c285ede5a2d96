"""FlashInfer CSR metadata: the record, its builder, and the step-shared CSR (reused, bumped in
place or rebuilt).

Row b of a CSR lists the physical page of each of its ``ceil(len_b / page_size)`` logical pages in
order::

    indices[indptr[b] : indptr[b + 1]]   pages of row b (int32, on the pool's device)
    last_page_len[b]                     tokens in its last page: in [1, page_size], or 0 for an
                                         empty row

FlashInfer does not check ``last_page_len <= page_size`` (its issue 320);
``FlashInferKvMetadata.validate`` does. Building is O(B + pages) numpy over the step's page table,
never a loop per token or page.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass(eq=False)
class FlashInferKvMetadata:
    """Paged-KV CSR in FlashInfer's layout. ``indices`` may be over-provisioned: only its leading
    ``indptr[-1]`` entries are meaningful (the fixed verify CSR keeps room for page growth)."""

    indptr: torch.Tensor  # int32[B+1]
    indices: torch.Tensor  # int32[>= indptr[-1]]
    last_page_len: torch.Tensor  # int32[B]
    page_size: int

    @property
    def batch_size(self) -> int:
        """Rows described (the length of ``last_page_len``)."""
        return int(self.last_page_len.shape[0])

    def kv_lens(self) -> np.ndarray:
        """Host ``int64[B]`` token count of every row: ``(pages - 1) * page_size + last_page_len``
        (0 if empty)."""
        indptr = self.indptr.cpu().numpy().astype(np.int64)
        last = self.last_page_len.cpu().numpy().astype(np.int64)
        pages = np.diff(indptr)
        return np.where(pages > 0, (pages - 1) * self.page_size + last, 0)

    def validate(self, num_pages: int | None = None) -> None:
        """Raise ValueError unless the CSR is well formed: int32 tensors of matching sizes,
        ``indptr`` starting at 0 and non-decreasing, ``last_page_len`` in ``[1, page_size]`` for
        non-empty rows and 0 for empty ones, and (given ``num_pages``) every listed page in
        ``[0, num_pages)``."""
        self.checked_host(num_pages)

    def check_types(self) -> None:
        """ValueError unless ``indptr``, ``indices`` and ``last_page_len`` are 1-D int32 tensors."""
        for name in ("indptr", "indices", "last_page_len"):
            t = getattr(self, name)
            if not isinstance(t, torch.Tensor) or t.dtype != torch.int32 or t.dim() != 1:
                got = f"{getattr(t, 'dtype', type(t).__name__)} {tuple(getattr(t, 'shape', ()))}"
                raise ValueError(f"FlashInferKvMetadata.{name} must be a 1-D int32 tensor, got "
                                 f"{got}")

    def check_rows(self, indptr: np.ndarray, last: np.ndarray) -> np.ndarray:
        """The pages of every row (``int64[B]``), after checking host int64 copies of ``indptr`` and
        ``last_page_len``: B + 1 offsets starting at 0, never decreasing, within ``indices``;
        ``last_page_len`` in ``[1, page_size]`` for a non-empty row and 0 for an empty one
        (FlashInfer checks none of it). ValueError naming the first rule broken."""
        if len(indptr) != len(last) + 1:
            raise ValueError(f"indptr has {len(indptr)} entries for {len(last)} rows; it needs "
                             f"B + 1")
        pages = np.diff(indptr)
        if indptr[0] != 0 or (pages < 0).any():
            raise ValueError(f"indptr must start at 0 and never decrease, got {indptr.tolist()}")
        if indptr[-1] > self.indices.shape[0]:
            raise ValueError(f"indptr[-1] = {indptr[-1]} but indices holds only "
                             f"{self.indices.shape[0]} pages")
        bad = np.flatnonzero(np.where(pages > 0, (last < 1) | (last > self.page_size), last != 0))
        if len(bad):
            b = int(bad[0])
            raise ValueError(f"row {b}: last_page_len {int(last[b])} with {int(pages[b])} pages; "
                             f"it must be in [1, page_size={self.page_size}] for a non-empty row "
                             f"and 0 for an empty one")
        return pages

    def checked_host(self, num_pages: int | None = None
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``validate``, then the host copies it read: int64 ``indptr`` ``[B+1]``, ``last_page_len``
        ``[B]`` and the ``indptr[-1]`` listed pages (so a planner converts each tensor once)."""
        self.check_types()
        indptr = self.indptr.cpu().numpy().astype(np.int64)
        last = self.last_page_len.cpu().numpy().astype(np.int64)
        self.check_rows(indptr, last)
        used = self.indices[: int(indptr[-1])].cpu().numpy().astype(np.int64)
        if num_pages is not None and len(used):
            lo, hi = int(used.min()), int(used.max())
            if lo < 0 or hi >= num_pages:
                raise ValueError(f"indices list page {lo if lo < 0 else hi}, outside the pool's "
                                 f"{num_pages} pages")
        return indptr, last, used


def csr_arrays(page_table: np.ndarray, lengths: np.ndarray,
               page_size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Host ``(indptr, indices, last_page_len)`` (int32) of rows ``page_table[b]`` at token
    ``lengths[b]``.

    ``page_table`` is ``[B, max_pages]``; int32 avoids a conversion per call. The indices are one
    strided copy when every row has the same page count, else one slice copy per row (memcpy speed:
    O(B + pages))."""
    lengths = np.asarray(lengths, dtype=np.int64)
    if len(lengths) != len(page_table) or (lengths < 0).any():
        raise ValueError(f"lengths {lengths.tolist()} must be {len(page_table)} non-negative token "
                         f"counts")
    num_pages = -(-lengths // page_size)  # int64[B]
    width = int(num_pages.max()) if len(num_pages) else 0
    if width > page_table.shape[1]:
        raise ValueError(f"length {int(lengths.max())} needs {width} pages; the rows have "
                         f"{page_table.shape[1]}")
    indptr = np.zeros(len(lengths) + 1, dtype=np.int32)
    np.cumsum(num_pages, out=indptr[1:])
    if len(num_pages) and (num_pages == width).all():
        indices = np.ascontiguousarray(page_table[:, :width], dtype=np.int32).reshape(-1)
    else:
        indices = np.empty(int(indptr[-1]), dtype=np.int32)
        for b, n in enumerate(num_pages.tolist()):
            indices[indptr[b] : indptr[b] + n] = page_table[b, :n]
    last = np.where(lengths > 0, (lengths - 1) % page_size + 1, 0).astype(np.int32)
    return indptr, indices, last


@torch.inference_mode(False)
def build_csr(page_table: np.ndarray, lengths: np.ndarray, page_size: int,
              device: torch.device) -> FlashInferKvMetadata:
    """A caller-owned CSR on ``device`` for rows ``page_table[b]`` at token ``lengths[b]``. Built
    outside inference mode even when called from a forward, so later in-place bumps work in and out
    of it."""
    indptr, indices, last = csr_arrays(page_table, lengths, page_size)
    return FlashInferKvMetadata(torch.from_numpy(indptr).to(device),
                                torch.from_numpy(indices).to(device),
                                torch.from_numpy(last).to(device), page_size)


class StepCsr:
    """The step-scoped CSR every layer of one forward shares. ``get(lengths)`` returns it:

    - reused as is when the lengths are unchanged;
    - bumped in place (same tensors; only ``last_page_len`` rewritten) when every row keeps its page
      count, which covers decode growth inside a page and the grow / reject-shrink / grow of
      speculative rounds;
    - rebuilt otherwise (a page boundary crossed, or no CSR yet).

    ``how`` of the last ``get`` is ``"reuse"``, ``"bump"`` or ``"rebuild"``; callers holding a graph
    keyed to the old tensors drop it on a rebuild."""

    def __init__(self, page_size: int, device: torch.device) -> None:
        self.page_size = page_size
        self.device = device
        self.meta: FlashInferKvMetadata | None = None
        self.lengths: np.ndarray | None = None  # int64[B] the CSR describes

    def clear(self) -> None:
        """Forget the step CSR; the next ``get`` rebuilds it."""
        self.meta = None
        self.lengths = None

    def install(self, meta: FlashInferKvMetadata, lengths: np.ndarray) -> None:
        """Make ``meta`` (describing ``lengths``, copied) the step CSR, e.g. a prefetched one."""
        self.meta, self.lengths = meta, lengths.copy()

    def try_bump(self, lengths: np.ndarray) -> bool:
        """Point the cached CSR at ``lengths`` in place if it has them already or every row keeps
        its page count (only ``last_page_len`` is rewritten); False, changing nothing, otherwise."""
        meta, old = self.meta, self.lengths
        ps = self.page_size
        if meta is None or old is None or len(old) != len(lengths):
            return False
        if np.array_equal(old, lengths):
            return True
        if not np.array_equal(-(-old // ps), -(-lengths // ps)):
            return False
        last = np.where(lengths > 0, (lengths - 1) % ps + 1, 0)
        if (last == last[0]).all():
            meta.last_page_len.fill_(int(last[0]))
        else:
            meta.last_page_len.copy_(torch.from_numpy(last.astype(np.int32)))
        self.lengths = lengths.copy()
        return True

    def get(self, page_table: np.ndarray,
            lengths: np.ndarray) -> tuple[FlashInferKvMetadata, str]:
        """The step CSR for ``lengths`` and how it was obtained: ``"reuse"`` (unchanged), ``"bump"``
        (same tensors, ``last_page_len`` rewritten) or ``"rebuild"`` (new tensors from
        ``page_table``). ValueError from the builder if a length needs more pages than a row has."""
        if self.meta is not None and self.lengths is not None \
                and np.array_equal(self.lengths, lengths):
            return self.meta, "reuse"
        if self.try_bump(lengths):
            assert self.meta is not None
            return self.meta, "bump"
        self.meta = build_csr(page_table, lengths, self.page_size, self.device)
        self.lengths = lengths.copy()
        return self.meta, "rebuild"
