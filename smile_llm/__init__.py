"""smile-llm: the LLM serving core of Smile in Python.

The facade: what callers use. The language model (``generate``, ``chat``, ``stream``), the engine and the requests
it takes and returns, the paged KV-cache pool with its radix prefix cache, and every error a caller may handle.
Everything else is internal and may move.
"""

from .cache import (
    KvCacheCorruptionError,
    KvCacheExhaustedError,
    KvCacheLayout,
    KvCachePool,
    NoActiveStepError,
    PoolClosedError,
    RadixCache,
    RequestOffloadedError,
)
from .distributed.lockstep import LockstepError
from .engine import InferenceEngine
from .model import DEFAULT_DRAFT_DIR, Completion, GenerationCancelled, GenerationListener, LanguageModel, ModelConfig
from .model.errors import (
    ChatTemplateError,
    CheckpointError,
    ConfigError,
    ModelFileError,
    EngineShutdownError,
    RenderBudgetError,
    RequestTypeError,
    TokenizerError,
)
from .model.request import AUTO, RequestHandle, SamplingParams
from .model.samples import SampleGroup
from .model.streaming import StreamChunk, TokenStream

__version__ = "0.1.0"

__all__ = [
    "AUTO",
    "ChatTemplateError",
    "CheckpointError",
    "Completion",
    "ConfigError",
    "DEFAULT_DRAFT_DIR",
    "EngineShutdownError",
    "GenerationCancelled",
    "GenerationListener",
    "InferenceEngine",
    "KvCacheCorruptionError",
    "KvCacheExhaustedError",
    "KvCacheLayout",
    "KvCachePool",
    "LanguageModel",
    "LockstepError",
    "ModelConfig",
    "ModelFileError",
    "NoActiveStepError",
    "PoolClosedError",
    "RadixCache",
    "RenderBudgetError",
    "RequestHandle",
    "RequestOffloadedError",
    "RequestTypeError",
    "SampleGroup",
    "SamplingParams",
    "StreamChunk",
    "TokenStream",
    "TokenizerError",
]
