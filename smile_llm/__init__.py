"""smile-llm: the LLM serving core of Smile in Python.

The facade: the paged KV-cache pool with its radix prefix cache, and the errors callers handle.
"""

from .cache import (
    KvCacheCorruptionError,
    KvCacheExhaustedError,
    KvCacheLayout,
    KvCachePool,
    RadixCache,
)

__version__ = "0.1.0"

__all__ = ["KvCacheCorruptionError", "KvCacheExhaustedError", "KvCacheLayout", "KvCachePool", "RadixCache"]
