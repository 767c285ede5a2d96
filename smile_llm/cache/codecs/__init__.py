"""Low-bit storage formats of KV pages ("codecs"): pure torch functions over whole pages, with no
knowledge of pools or requests. Formats, by the name ``kv_dtype`` gives:

- ``"nvfp4"``: 4-bit E2M1 codes, an FP8 e4m3 scale per 16 elements and a float32 power-of-two
  scale per (page, head) (``nvfp4``); 0.5625 bytes an element plus 4 bytes per (page, head). Keys
  and values alike are grouped along the head dimension (16 consecutive channels of one token of
  one head), the layout that measured best for keys on the shipped model.
- ``"int4"``, ``"int3"``, ``"int2"``: asymmetric integers with a float16 step and zero point per
  group, its range clipped to the least squared error (``integer``). Following KIVI, keys are
  quantized per channel (one group per channel of one head over the page's tokens) and values per
  token (groups of 32 consecutive channels of one token of one head).

Every codec follows ``PageCodec`` (``protocol``). The pool should quantize a page once, when all
its slots are written (an integer key group spans the whole page), keep the not yet complete page
in a raw dtype, and decode gathered pages on read.

>>> import torch
>>> codec = codec_for("nvfp4", "k", page_size=8, num_kv_heads=1, head_dim=16)
>>> raw = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0] * 2).expand(1, 8, 1, 16)
>>> torch.equal(codec.decode(codec.encode(raw), torch.float32), raw)   # exactly representable
True
>>> codec_for("nvfp4", "v", page_size=16, num_kv_heads=1, head_dim=24)
Traceback (most recent call last):
    ...
ValueError: nvfp4 quantizes in groups of 16 channels of a token: head_dim must be ... got 24
"""

from __future__ import annotations

from .integer import DEFAULT_VALUE_GROUP, INT_BITS, IntCodec
from .nvfp4 import Nvfp4Codec
from .protocol import SIDES, PageCodec

CODEC_NAMES = ("nvfp4", "int4", "int3", "int2")

__all__ = ["CODEC_NAMES", "DEFAULT_VALUE_GROUP", "IntCodec", "Nvfp4Codec", "PageCodec",
           "codec_for"]


def codec_for(name: str, side: str, page_size: int, num_kv_heads: int, head_dim: int, *,
              value_group: int | None = None) -> PageCodec:
    """The codec storing ``side`` ("k" or "v") of a layer's pages of this geometry in format
    ``name`` (one of ``CODEC_NAMES``). ``value_group`` (integer formats only) overrides the
    channels per value group (default 32, or head_dim when smaller). ValueError naming what does
    not fit: an unknown name or side, a page_size or head_dim that is not a multiple of the
    format's group or packing run, a value_group given to nvfp4."""
    if side not in SIDES:
        raise ValueError(f"side must be 'k' or 'v', got {side!r}")
    if name == "nvfp4":
        if value_group is not None:
            raise ValueError("value_group applies to the integer formats only; nvfp4's groups "
                             "are 16 elements")
        return Nvfp4Codec(side, page_size, num_kv_heads, head_dim)
    if name in INT_BITS:
        return IntCodec(INT_BITS[name], side, page_size, num_kv_heads, head_dim, value_group)
    raise ValueError(f"unknown KV codec {name!r}: expected one of {', '.join(CODEC_NAMES)}")
