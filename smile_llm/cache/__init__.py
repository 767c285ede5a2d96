"""Paged KV cache: layout and sizing, the radix prefix tree, the pool that owns pages and K/V
buffers, and the per-request state pools bound beside it."""

from .errors import (
    KvCacheCorruptionError,
    KvCacheExhaustedError,
    LayerNotHeldError,
    NoActiveStepError,
    PoolClosedError,
    RequestOffloadedError,
)
from .kv_step import KvStep
from .layout import (
    KvCacheLayout,
    SlotCount,
    StaticKvBudget,
    compute_static_kv_budget,
    slots_from_budget,
)
from .offload import OffloadedKv
from .pool import KvCachePool
from .radix import InsertResult, MatchResult, RadixCache, TreeNode
from .state_pool import StatePool
from .state_spec import StateSpec

__all__ = [
    "InsertResult",
    "KvCacheCorruptionError",
    "KvCacheExhaustedError",
    "KvCacheLayout",
    "KvCachePool",
    "KvStep",
    "LayerNotHeldError",
    "MatchResult",
    "NoActiveStepError",
    "OffloadedKv",
    "PoolClosedError",
    "RadixCache",
    "RequestOffloadedError",
    "SlotCount",
    "StatePool",
    "StateSpec",
    "StaticKvBudget",
    "TreeNode",
    "compute_static_kv_budget",
    "slots_from_budget",
]
