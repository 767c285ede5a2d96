"""KvStore: the static K and V buffers and every byte that moves in or out of them.

Buffers are ``[num_layers, num_slots, Hkv, D]`` in the storage dtype; one layer viewed as
``[num_pages, page_size, Hkv, D]`` is FlashInfer's NHD paged layout. FP8 storage keeps fixed
per-pool scales: ``put`` stores ``x / scale`` (saturated to the format's finite range) and reads
return ``stored * scale`` in the compute dtype. Index writes into FP8 buffers go through a ``uint8``
view (CPU torch has no float8 ``index_copy_``). The store knows nothing of requests or pages'
owners; the pool hands it slot and page ids.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from .pages import page_slots

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)
FILL_MODES = ("none", "zero", "poison")


def compute_dtype_for(dtype: torch.dtype, device: torch.device) -> torch.dtype:
    """The dtype reads come back in: the storage dtype for float types; for FP8 bfloat16 on CUDA,
    float32 else."""
    if dtype in FP8_DTYPES:
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return dtype


def check_scales(dtype: torch.dtype, k_scale: object, v_scale: object) -> None:
    """ValueError unless both scales are finite floats > 0 and, on storage other than FP8, 1.0
    (float storage is unscaled, so a scale there would be reported to attention but never
    applied)."""
    for name, scale in (("k_scale", k_scale), ("v_scale", v_scale)):
        if isinstance(scale, bool) or not isinstance(scale, (int, float)) \
                or not math.isfinite(scale) or scale <= 0:
            raise ValueError(f"{name} must be a finite float > 0, got {scale!r}")
        if scale != 1.0 and dtype not in FP8_DTYPES:
            raise ValueError(f"{name}={scale} on a {dtype} pool: only FP8 storage is scaled; "
                             f"leave scales at 1.0")


class KvStore:
    """Owns ``key_cache``/``value_cache``. Callers pass validated int64 index tensors on the store's
    device."""

    def __init__(self, num_layers: int, num_slots: int, num_kv_heads: int, head_dim: int,
                 page_size: int, device: torch.device, dtype: torch.dtype, k_scale: float,
                 v_scale: float) -> None:
        if dtype not in FLOAT_DTYPES + FP8_DTYPES:
            supported = [str(d) for d in FLOAT_DTYPES + FP8_DTYPES]
            raise ValueError(f"KV dtype {dtype} is not supported; use one of {supported}")
        self.page_size = page_size
        self.dtype = dtype
        self.device = device
        self.is_fp8 = dtype in FP8_DTYPES
        self.compute_dtype = compute_dtype_for(dtype, device)
        self.k_scale = float(k_scale)
        self.v_scale = float(v_scale)
        shape = (num_layers, num_slots, num_kv_heads, head_dim)
        # a pool made under inference_mode must stay writable outside it
        with torch.inference_mode(False):
            self.key_cache = torch.zeros(shape, dtype=dtype, device=device)
            self.value_cache = torch.zeros(shape, dtype=dtype, device=device)
        # Byte views used for index writes and page copies (same storage).
        self._k_raw = self.key_cache.view(torch.uint8) if self.is_fp8 else self.key_cache
        self._v_raw = self.value_cache.view(torch.uint8) if self.is_fp8 else self.value_cache
        self._fp8_max = float(torch.finfo(dtype).max) if self.is_fp8 else 0.0
        self.head_shape = self.key_cache.shape[2:]  # torch.Size([Hkv, D])
        # the buffers' addresses (k and v passed in must not alias them)
        self._buffer_ptrs: tuple[int, ...] = (self.key_cache.data_ptr(),
                                              self.value_cache.data_ptr())
        # per-layer views, built once (put/get run per layer)
        self._k_layers = list(self._k_raw.unbind(0))
        self._v_layers = list(self._v_raw.unbind(0))
        paged = (num_layers, num_slots // page_size, page_size, num_kv_heads, head_dim)
        # Per-layer [num_pages, page_size, Hkv, D] views in the storage dtype (FlashInfer's NHD
        # layout), for attention.
        self.k_pages: list[torch.Tensor] = list(self.key_cache.view(paged).unbind(0))
        self.v_pages: list[torch.Tensor] = list(self.value_cache.view(paged).unbind(0))
        self.page_bytes = page_size * num_kv_heads * head_dim * self.key_cache.element_size()

    # ------------------------------------------------------------------ token-level
    def _encode(self, x: torch.Tensor, scale: float) -> torch.Tensor:
        if not self.is_fp8:
            return x if x.dtype == self.dtype else x.to(self.dtype)
        y = x.to(torch.float32)
        y = y / scale if scale != 1.0 else y
        # out of place: x is the caller's
        return y.clamp(-self._fp8_max, self._fp8_max).to(self.dtype).view(torch.uint8)

    def _decode(self, raw: torch.Tensor, scale: float) -> torch.Tensor:
        if not self.is_fp8:
            return raw if raw.dtype == self.compute_dtype else raw.to(self.compute_dtype)
        y = raw.view(self.dtype).to(self.compute_dtype)
        return y * scale if scale != 1.0 else y

    def write(self, layer: int, slot_idx: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """``k``/``v`` are ``[N, Hkv, D]``; row i goes to slot ``slot_idx[i]`` of ``layer``. Nothing
        is checked here: callers validate (a wrong shape or device raises from torch, K possibly
        written by then)."""
        self._k_layers[layer].index_copy_(0, slot_idx, self._encode(k.detach(), self.k_scale))
        self._v_layers[layer].index_copy_(0, slot_idx, self._encode(v.detach(), self.v_scale))

    def aliases(self, t: torch.Tensor) -> bool:
        """Whether ``t`` shares memory with the K or V buffer (an index write from it would read
        what it writes)."""
        return t.untyped_storage().data_ptr() in self._buffer_ptrs

    def read(self, layer: int, slot_idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``[N, Hkv, D]`` gathers of K and V at ``slot_idx`` in the compute dtype."""
        k = self._decode(self._k_layers[layer].index_select(0, slot_idx), self.k_scale)
        v = self._decode(self._v_layers[layer].index_select(0, slot_idx), self.v_scale)
        return k, v

    # ------------------------------------------------------------------ page-level
    def _page_slots(self, page_ids: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(page_slots(page_ids, self.page_size)).to(self.device)

    def fill_pages(self, page_ids: np.ndarray, mode: str) -> None:
        """Fill every layer's K and V of ``page_ids``: ``"zero"`` with 0, ``"poison"`` with NaN
        (all-ones bytes for FP8, a NaN pattern in both formats); ``"none"`` leaves them."""
        if mode == "none" or len(page_ids) == 0:
            return
        slots = self._page_slots(page_ids)
        if mode == "zero":
            self._k_raw.index_fill_(1, slots, 0)
            self._v_raw.index_fill_(1, slots, 0)
        elif self.is_fp8:
            self._k_raw.index_fill_(1, slots, 0xFF)
            self._v_raw.index_fill_(1, slots, 0xFF)
        else:
            self._k_raw.index_fill_(1, slots, float("nan"))
            self._v_raw.index_fill_(1, slots, float("nan"))

    def zero_slots(self, slots: np.ndarray) -> None:
        """Zero K and V of ``slots`` on every layer (all-zero bytes are 0.0 in every supported
        dtype)."""
        if len(slots):
            idx = torch.from_numpy(slots).to(self.device)
            self._k_raw.index_fill_(1, idx, 0)
            self._v_raw.index_fill_(1, idx, 0)

    def copy_slots(self, src: np.ndarray, dst: np.ndarray) -> None:
        """Copy K and V of slots ``src`` to slots ``dst`` on every layer (all sources are read
        before any write, so the two may overlap)."""
        if len(src):
            s = torch.from_numpy(src).to(self.device)
            d = torch.from_numpy(dst).to(self.device)
            self._k_raw.index_copy_(1, d, self._k_raw.index_select(1, s))
            self._v_raw.index_copy_(1, d, self._v_raw.index_select(1, s))

    def copy_pages_out(self, page_ids: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """Raw contents of ``page_ids`` on every layer, as host tensors
        ``[L, n*page_size, Hkv, D]``."""
        slots = self._page_slots(page_ids)
        return self._k_raw.index_select(1, slots).cpu(), self._v_raw.index_select(1, slots).cpu()

    def copy_pages_in(self, page_ids: np.ndarray, k_raw: torch.Tensor, v_raw: torch.Tensor) -> None:
        """Write raw contents from ``copy_pages_out`` into ``page_ids`` (byte-identical)."""
        slots = self._page_slots(page_ids)
        self._k_raw.index_copy_(1, slots, k_raw.to(self.device))
        self._v_raw.index_copy_(1, slots, v_raw.to(self.device))

    def read_page(self, layer: int, page: int) -> tuple[bytes, bytes]:
        """The raw bytes of K and V of ``page`` on ``layer`` (``page_size * Hkv * D`` elements each,
        in the storage dtype), copied to the host."""
        ps = self.page_size
        k = self.key_cache[layer, page * ps : (page + 1) * ps].contiguous().cpu().view(torch.uint8)
        v = self.value_cache[layer, page * ps : (page + 1) * ps].contiguous().cpu()
        v = v.view(torch.uint8)
        return k.numpy().tobytes(), v.numpy().tobytes()

    def write_page(self, layer: int, page: int, k_bytes: torch.Tensor,
                   v_bytes: torch.Tensor) -> None:
        """``k_bytes``/``v_bytes`` are fresh uint8 tensors of exactly ``page_bytes`` each
        (``as_page_bytes``)."""
        ps = self.page_size
        shape = self.key_cache.shape[2:]
        for cache, data in ((self.key_cache, k_bytes), (self.value_cache, v_bytes)):
            page_view = cache[layer, page * ps : (page + 1) * ps]
            page_view.copy_(data.to(self.device).view(cache.dtype).view(ps, *shape))

    def as_page_bytes(self, data: Any, name: str) -> torch.Tensor:
        """``data`` (bytes-like or a tensor) as a flat uint8 tensor of exactly ``page_bytes``;
        ValueError otherwise."""
        # a tensor: a fresh copy, aligned for any dtype view, safe from later edits
        if isinstance(data, torch.Tensor):
            t = data.detach().contiguous().reshape(-1).view(torch.uint8).cpu().clone()
        else:
            try:
                t = torch.frombuffer(bytearray(memoryview(data).cast("B")), dtype=torch.uint8)
            except TypeError:
                raise ValueError(f"{name} must be bytes-like or a tensor, got "
                                 f"{type(data).__name__}") from None
        if t.numel() != self.page_bytes:
            raise ValueError(f"{name} has {t.numel()} bytes; one page of one layer is "
                             f"{self.page_bytes}")
        return t

    def release(self) -> None:
        """Drop the buffers (``close``)."""
        empty = torch.zeros(0, dtype=self.dtype, device=self.device)
        self.key_cache = self.value_cache = empty
        self._k_raw = self._v_raw = empty
        self._k_layers, self._v_layers = [], []
        self.k_pages, self.v_pages = [], []
        self._buffer_ptrs = ()
