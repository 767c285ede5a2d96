"""smile-llm: the LLM serving core of Smile in Python.

The facade: the paged KV-cache pool with its radix prefix cache, the language model with ``generate()``, and the
errors callers handle.
"""

from .cache import (
    KvCacheCorruptionError,
    KvCacheExhaustedError,
    KvCacheLayout,
    KvCachePool,
    RadixCache,
)
from .model import Completion, GenerationCancelled, GenerationListener, LanguageModel, ModelConfig

__version__ = "0.1.0"

__all__ = [
    "Completion",
    "GenerationCancelled",
    "GenerationListener",
    "KvCacheCorruptionError",
    "KvCacheExhaustedError",
    "KvCacheLayout",
    "KvCachePool",
    "LanguageModel",
    "ModelConfig",
    "RadixCache",
]
