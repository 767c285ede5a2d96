"""The storage format of a pool's K/V, layer by layer and side by side, as ``from_pretrained``'s
``kv_dtype`` names it.

A format is dense (``"float32"``, ``"bfloat16"``, ``"float16"``, FP8 ``"fp8_e4m3"`` and
``"fp8_e5m2"``: one element per value, written token by token) or packed (``"nvfp4"``, ``"int4"``,
``"int3"``, ``"int2"``: a page is quantized once it is complete, ``cache.codecs``). ``kv_dtype`` is
one of those names (or a torch dtype of a dense one) for every layer and side, a list with one per
KV layer, a mapping ``{"k": ..., "v": ...}`` whose values are either, or a list of such mappings:

>>> [str(f) for f in kv_formats(["bfloat16", "int4"], 2, torch.float32)]
['bfloat16', 'int4']
>>> kv_formats({"k": "fp8_e4m3", "v": "nvfp4"}, 1, torch.float32)[0]
LayerFormats(k=KvFormat(name='fp8_e4m3'), v=KvFormat(name='nvfp4'))
>>> kv_formats(["int4"], 2, torch.float32)  # doctest: +ELLIPSIS
Traceback (most recent call last):
    ...
ValueError: kv_dtype lists 1 formats; the model has 2 KV layers (give one per KV layer, ...
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from .codecs import CODEC_NAMES

KV_DTYPES = {"fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2,
             "bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32,
             "float64": torch.float64}
FP8_NAMES = ("fp8_e4m3", "fp8_e5m2")
PACKED_NAMES = CODEC_NAMES
FORMAT_NAMES = (*KV_DTYPES, *PACKED_NAMES)


@dataclass(frozen=True)
class KvFormat:
    """How one side (K or V) of one layer is stored: ``name`` is one of ``FORMAT_NAMES``."""

    name: str

    @property
    def packed(self) -> bool:
        """Whether pages are quantized once complete (a low-bit codec)."""
        return self.name in PACKED_NAMES

    @property
    def dtype(self) -> torch.dtype | None:
        """The element dtype of a dense format (None for a packed one)."""
        return KV_DTYPES.get(self.name)

    @property
    def fp8(self) -> bool:
        return self.name in FP8_NAMES

    def __str__(self) -> str:
        return self.name

    @staticmethod
    def of(value: Any) -> KvFormat:
        """``value`` (a format name or a dense torch dtype) as a format; ValueError naming the
        allowed ones otherwise."""
        if isinstance(value, KvFormat):
            return value
        if isinstance(value, torch.dtype):
            for name, dtype in KV_DTYPES.items():
                if dtype == value:
                    return KvFormat(name)
        elif isinstance(value, str) and value in FORMAT_NAMES:
            return KvFormat(value)
        raise ValueError(f"kv_dtype must be one of {list(FORMAT_NAMES)} (or the torch dtype of a "
                         f"dense one), got {value!r}")


@dataclass(frozen=True)
class LayerFormats:
    """The formats of one KV layer's K and V."""

    k: KvFormat
    v: KvFormat

    @property
    def uniform(self) -> bool:
        """K and V stored alike."""
        return self.k == self.v

    def __str__(self) -> str:
        return str(self.k) if self.uniform else f"k={self.k}, v={self.v}"


def dense_formats(dtype: torch.dtype, num_layers: int) -> tuple[LayerFormats, ...]:
    """Every layer and side stored in the dense ``dtype``."""
    f = KvFormat.of(dtype)
    return tuple(LayerFormats(f, f) for _ in range(num_layers))


def kv_formats(kv_dtype: Any, num_layers: int,
               model_dtype: torch.dtype) -> tuple[LayerFormats, ...]:
    """One ``LayerFormats`` per KV layer from ``kv_dtype`` (see the module docstring; None: the
    model's dtype everywhere). ValueError naming what is wrong: an unknown name, a list of the
    wrong length, a mapping with keys other than ``"k"`` and ``"v"``."""
    if kv_dtype is None:
        kv_dtype = model_dtype
    if isinstance(kv_dtype, Mapping):
        if set(kv_dtype) != {"k", "v"}:
            raise ValueError(f"a kv_dtype mapping needs exactly the keys 'k' and 'v', got "
                             f"{sorted(map(str, kv_dtype))}")
        ks = _per_layer(kv_dtype["k"], num_layers)
        vs = _per_layer(kv_dtype["v"], num_layers)
        return tuple(LayerFormats(k, v) for k, v in zip(ks, vs))
    if _is_list(kv_dtype):
        if len(kv_dtype) != num_layers:
            raise ValueError(f"kv_dtype lists {len(kv_dtype)} formats; the model has {num_layers} "
                             f"KV layers (give one per KV layer, or one name for all)")
        out = []
        for item in kv_dtype:
            if isinstance(item, Mapping):
                out.append(kv_formats(item, 1, model_dtype)[0])
            else:
                f = KvFormat.of(item)
                out.append(LayerFormats(f, f))
        return tuple(out)
    f = KvFormat.of(kv_dtype)
    return tuple(LayerFormats(f, f) for _ in range(num_layers))


def _is_list(value: Any) -> bool:
    return isinstance(value, Sequence) and not isinstance(value, (str, bytes))


def _per_layer(value: Any, num_layers: int) -> list[KvFormat]:
    if _is_list(value):
        if len(value) != num_layers:
            raise ValueError(f"kv_dtype lists {len(value)} formats; the model has {num_layers} "
                             f"KV layers (give one per KV layer, or one name for all)")
        return [KvFormat.of(v) for v in value]
    return [KvFormat.of(value)] * num_layers


def kv_storage_dtype(kv_dtype: str | torch.dtype | None, model_dtype: torch.dtype) -> torch.dtype:
    """The dense storage dtype ``kv_dtype`` names (None: the model's dtype). ValueError naming the
    allowed names otherwise (packed formats have no element dtype: see ``kv_formats``)."""
    if kv_dtype is None:
        return model_dtype
    dtype = KvFormat.of(kv_dtype).dtype
    if dtype is None:
        raise ValueError(f"{kv_dtype!r} is a packed format, stored page by page; it has no "
                         f"element dtype")
    return dtype
