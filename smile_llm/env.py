"""The environment switches the project honours (Smile's documented ones), read in this one place."""

from __future__ import annotations

import os


def zero_rejected_kv() -> bool:
    """``SMILE_MTP_ZERO_REJECTED_KV=1``: ``truncate_to`` zeroes the rejected tail of a verify window."""
    return os.environ.get("SMILE_MTP_ZERO_REJECTED_KV") == "1"


def cuda_graphs_enabled() -> bool:
    """``SMILE_CUDA_GRAPHS=0`` turns CUDA-graph replay of decode and verify forwards off (on by default)."""
    return os.environ.get("SMILE_CUDA_GRAPHS", "1") != "0"


def tp_check() -> bool:
    """``SMILE_TP_CHECK=1``: tensor-parallel followers compare their pools' digests with rank 0's before every
    forward (a debug check; off by default)."""
    return os.environ.get("SMILE_TP_CHECK") == "1"
