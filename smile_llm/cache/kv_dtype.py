"""The storage dtype of a pool's K/V, as ``from_pretrained``'s ``kv_dtype`` names it."""

from __future__ import annotations

import torch

KV_DTYPES = {"fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2,
             "bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def kv_storage_dtype(kv_dtype: str | torch.dtype | None, model_dtype: torch.dtype) -> torch.dtype:
    """The KV storage dtype ``from_pretrained``'s ``kv_dtype`` names (None: the model's dtype).
    ValueError naming the allowed names otherwise."""
    if kv_dtype is None:
        return model_dtype
    if isinstance(kv_dtype, torch.dtype):
        if kv_dtype in KV_DTYPES.values():
            return kv_dtype
    elif kv_dtype in KV_DTYPES:
        return KV_DTYPES[kv_dtype]
    raise ValueError(f"kv_dtype must be one of {sorted(KV_DTYPES)} (or that torch dtype), got "
                     f"{kv_dtype!r}")
