"""The storage of one side (K or V) of one KV layer: ``DenseSide`` (one element per value, written
token by token) and ``PackedSide`` (low-bit pages, ``cache.codecs``, with raw tails for the pages
still being written).

Both answer the same questions: write raw values at slots, read them back in the compute dtype,
give whole pages in the compute dtype (``gather_pages``), fill fresh pages, copy pages out to the
host and back (offload), and the bytes of one page. Neither knows about requests; the store
(``kv_store.KvStore``) composes one pair per layer and owns the tail table.
"""

from __future__ import annotations

import torch

from .codecs import codec_for
from .kv_dtype import KvFormat

FILL_BYTES = {"zero": 0, "poison": 0xFF}


class DenseSide:
    """``buffer`` ``[num_slots, Hkv, D]`` in a float or FP8 dtype (a view into the store's shared
    buffer when every layer is stored alike). FP8 stores ``x / scale`` saturated to the format's
    finite range; reads return ``stored * scale`` in ``compute_dtype``. Index writes into FP8 go
    through a ``uint8`` view (CPU torch has no float8 ``index_copy_``)."""

    packed = False

    def __init__(self, fmt: KvFormat, buffer: torch.Tensor, page_size: int,
                 compute_dtype: torch.dtype, scale: float) -> None:
        self.format, self.buffer, self.page_size = fmt, buffer, page_size
        self.dtype = buffer.dtype
        self.compute_dtype = compute_dtype
        self.scale = float(scale)
        self.fp8 = fmt.fp8
        self.raw = buffer.view(torch.uint8) if self.fp8 else buffer
        self._fp8_max = float(torch.finfo(self.dtype).max) if self.fp8 else 0.0
        num_slots = buffer.shape[0]
        # [num_pages, page_size, Hkv, D] in the storage dtype: FlashInfer's NHD layout
        self.pages = buffer.view(num_slots // page_size, page_size, *buffer.shape[1:])
        self.page_bytes = page_size * buffer[0].numel() * buffer.element_size()

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        if not self.fp8:
            return x if x.dtype == self.dtype else x.to(self.dtype)
        y = x.to(torch.float32)
        y = y / self.scale if self.scale != 1.0 else y
        # out of place: x is the caller's
        return y.clamp(-self._fp8_max, self._fp8_max).to(self.dtype).view(torch.uint8)

    def decode(self, raw: torch.Tensor) -> torch.Tensor:
        if not self.fp8:
            return raw if raw.dtype == self.compute_dtype else raw.to(self.compute_dtype)
        y = raw.view(self.dtype).to(self.compute_dtype)
        return y * self.scale if self.scale != 1.0 else y

    def write(self, slot_idx: torch.Tensor, x: torch.Tensor) -> None:
        self.raw.index_copy_(0, slot_idx, self.encode(x.detach()))

    def read(self, slot_idx: torch.Tensor) -> torch.Tensor:
        return self.decode(self.raw.index_select(0, slot_idx))

    def gather_pages(self, pages: torch.Tensor) -> torch.Tensor:
        """``[n, page_size, Hkv, D]`` of ``pages`` (int64) in the compute dtype."""
        raw = self.raw.view(self.pages.shape[0], self.page_size, *self.raw.shape[1:])
        return self.decode(raw.index_select(0, pages))

    def fill_slots(self, slots: torch.Tensor, mode: str) -> None:
        if mode == "zero":
            self.raw.index_fill_(0, slots, 0)
        elif self.fp8:
            self.raw.index_fill_(0, slots, 0xFF)  # a NaN pattern in both FP8 formats
        else:
            self.raw.index_fill_(0, slots, float("nan"))

    def zero_slots(self, slots: torch.Tensor) -> None:
        self.raw.index_fill_(0, slots, 0)  # all-zero bytes are 0.0 in every dense dtype

    def copy_slots(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        self.raw.index_copy_(0, dst, self.raw.index_select(0, src))

    def slots_out(self, slots: torch.Tensor) -> torch.Tensor:
        return self.raw.index_select(0, slots).cpu()

    def slots_in(self, slots: torch.Tensor, saved: torch.Tensor) -> None:
        self.raw.index_copy_(0, slots, saved.to(self.raw.device))

    def page_data(self, page: int) -> bytes:
        ps = self.page_size
        data = self.buffer[page * ps : (page + 1) * ps].contiguous().cpu().view(torch.uint8)
        return bytes(data.numpy().tobytes())

    def set_page_data(self, page: int, data: torch.Tensor) -> None:
        ps = self.page_size
        view = self.buffer[page * ps : (page + 1) * ps]
        view.copy_(data.to(self.buffer.device).view(self.dtype).view(view.shape))


class PackedSide:
    """One side of one layer in a low-bit format: ``parts`` (the codec's storage, dim 0 = page),
    and ``tails`` ``[num_tails * page_size, Hkv, D]`` in the compute dtype holding the raw values of
    pages with a tail (the store's ``TailTable`` says which). A page's values are its tail's when it
    has one, else the decoded parts."""

    packed = True

    def __init__(self, fmt: KvFormat, side: str, num_pages: int, num_tails: int, page_size: int,
                 num_kv_heads: int, head_dim: int, device: torch.device,
                 compute_dtype: torch.dtype) -> None:
        self.format, self.page_size, self.compute_dtype = fmt, page_size, compute_dtype
        self.codec = codec_for(fmt.name, side, page_size, num_kv_heads, head_dim)
        with torch.inference_mode(False):
            self.parts = self.codec.allocate(num_pages, device)
            self.tails = torch.zeros(num_tails * page_size, num_kv_heads, head_dim,
                                     dtype=compute_dtype, device=device)
        self.page_bytes = self.codec.page_bytes
        self.tail_bytes = page_size * num_kv_heads * head_dim * self.tails.element_size()

    def encode_pages(self, pages: torch.Tensor, raw: torch.Tensor) -> None:
        """Quantize ``raw`` ``[n, page_size, Hkv, D]`` into ``pages`` (int64 ``[n]``)."""
        for name, part in self.codec.encode(raw).items():
            self.parts[name].index_copy_(0, pages, part)

    def gather_pages(self, pages: torch.Tensor) -> torch.Tensor:
        """``[n, page_size, Hkv, D]`` of the packed ``pages`` in the compute dtype (decoded; tails
        are not consulted)."""
        parts = {name: t.index_select(0, pages) for name, t in self.parts.items()}
        return self.codec.decode(parts, self.compute_dtype)

    def fill_pages(self, pages: torch.Tensor, mode: str) -> None:
        for part in self.parts.values():
            part.view(torch.uint8).view(part.shape[0], -1).index_fill_(0, pages, FILL_BYTES[mode])

    def pages_out(self, pages: torch.Tensor) -> dict[str, torch.Tensor]:
        return {name: t.index_select(0, pages).cpu() for name, t in self.parts.items()}

    def pages_in(self, pages: torch.Tensor, saved: dict[str, torch.Tensor]) -> None:
        for name, t in self.parts.items():
            t.index_copy_(0, pages, saved[name].to(t.device))

    def page_data(self, page: int) -> bytes:
        return b"".join(bytes(t[page].contiguous().cpu().view(torch.uint8).numpy().tobytes())
                        for t in self.parts.values())

    def set_page_data(self, page: int, data: torch.Tensor) -> None:
        at = 0
        for t in self.parts.values():
            n = t[page].numel() * t.element_size()
            t[page].view(torch.uint8).view(-1).copy_(data[at : at + n].to(t.device))
            at += n


def side_page_bytes(fmt: KvFormat, side: str, page_size: int, num_kv_heads: int,
                    head_dim: int) -> int:
    """Bytes one page of one side of one layer takes in ``fmt``. ValueError when a packed format
    does not fit the geometry."""
    if fmt.packed:
        return codec_for(fmt.name, side, page_size, num_kv_heads, head_dim).page_bytes
    assert fmt.dtype is not None
    return page_size * num_kv_heads * head_dim * torch.empty((), dtype=fmt.dtype).element_size()
