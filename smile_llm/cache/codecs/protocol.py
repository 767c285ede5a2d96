"""The page codec protocol: how one side (keys or values) of one layer's pages is stored in a
low-bit format, as pure functions over whole pages.

A page is ``page_size`` consecutive token positions of one layer, ``[page_size, num_kv_heads,
head_dim]``. A codec turns ``n`` raw pages into a dict of named parts (each a tensor whose dim 0
is the page index) and back. The pool owns the storage: it calls ``allocate`` once, ``encode``s a
page when all its slots are written and ``index_copy_``s each part into the storage, and on read
gathers parts by page (``{k: t.index_select(0, page_ids)}``) and ``decode``s them. A codec knows
nothing of pools or requests; it holds no state beyond its geometry.

Call order: ``allocate`` (once) -> ``encode`` (per completed page) -> ``decode`` (per read). Zeroed
storage (``allocate``) decodes to zeros.
"""

from __future__ import annotations

from typing import Protocol

import torch

SIDES = ("k", "v")


class PageCodec(Protocol):
    """One storage format for one side of a layer's pages (see the module docstring)."""

    @property
    def name(self) -> str:
        """The format's name as ``kv_dtype`` spells it: "nvfp4", "int4", "int3", "int2"."""
        ...

    @property
    def side(self) -> str:
        """"k" (keys) or "v" (values)."""
        ...

    @property
    def bits(self) -> int:
        """Bits per stored element code (scales not counted)."""
        ...

    @property
    def page_bytes(self) -> int:
        """Bytes one page of one layer of this side takes: codes and scales, the true cost."""
        ...

    def allocate(self, num_pages: int, device: torch.device) -> dict[str, torch.Tensor]:
        """Zeroed storage for ``num_pages`` pages: each tensor's dim 0 is the page index."""
        ...

    def encode(self, raw: torch.Tensor) -> dict[str, torch.Tensor]:
        """raw: ``[n, page_size, num_kv_heads, head_dim]`` of any float dtype, on any device ->
        the n pages' parts: the same keys, dtypes and trailing shapes as ``allocate``'s, dim 0 = n,
        on raw's device. Deterministic. ValueError on another shape or a non-float dtype."""
        ...

    def decode(self, parts: dict[str, torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
        """parts as ``encode`` returns them (or gathered from storage by page) ->
        ``[n, page_size, num_kv_heads, head_dim]`` in ``dtype``, on the parts' device. ValueError
        when a part is missing or has the wrong trailing shape or dtype."""
        ...


def check_raw(raw: torch.Tensor, page_shape: tuple[int, int, int]) -> None:
    """ValueError unless ``raw`` is a float tensor of shape ``[n, *page_shape]``."""
    if not torch.is_floating_point(raw):
        raise ValueError(f"pages to encode must be a float tensor, got {raw.dtype}")
    if raw.dim() != 4 or tuple(raw.shape[1:]) != page_shape:
        raise ValueError(f"pages to encode must be [n, page_size, num_kv_heads, head_dim] = "
                         f"[n, {', '.join(map(str, page_shape))}], got {list(raw.shape)}")


PartSpecs = dict[str, tuple[torch.dtype, tuple[int, ...]]]  # part -> (dtype, shape of one page)


def allocate_parts(specs: PartSpecs, num_pages: int,
                   device: torch.device) -> dict[str, torch.Tensor]:
    """Zeroed ``[num_pages, *shape]`` tensors, one per part. ValueError if ``num_pages < 0``."""
    if num_pages < 0:
        raise ValueError(f"num_pages must be >= 0, got {num_pages}")
    return {key: torch.zeros((num_pages, *shape), dtype=dtype, device=device)
            for key, (dtype, shape) in specs.items()}


def spec_bytes(specs: PartSpecs) -> int:
    """Bytes of one page of every part together."""
    total = 0
    for dtype, shape in specs.values():
        count = 1
        for size in shape:
            count *= size
        total += count * torch.empty((), dtype=dtype).element_size()
    return total


def check_parts(parts: dict[str, torch.Tensor], specs: PartSpecs) -> int:
    """ValueError unless ``parts`` has exactly the keys of ``specs``, each with its dtype and
    ``[n, *shape]``, and one ``n`` for all. Returns ``n``."""
    if sorted(parts) != sorted(specs):
        raise ValueError(f"parts must be {sorted(specs)}, got {sorted(parts)}")
    for key, (dtype, shape) in specs.items():
        got = parts[key]
        if got.dtype != dtype or got.dim() != len(shape) + 1 or tuple(got.shape[1:]) != shape:
            raise ValueError(f"part {key!r} must be {dtype} [n, {', '.join(map(str, shape))}], "
                             f"got {got.dtype} {list(got.shape)}")
    counts = sorted({t.shape[0] for t in parts.values()})
    if len(counts) != 1:
        raise ValueError(f"parts disagree on the page count: {counts}")
    return counts[0]
