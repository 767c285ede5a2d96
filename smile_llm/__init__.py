"""smile-llm: the LLM serving core of Smile in Python.

The facade: what callers use. The language model (``generate``, ``chat``, ``stream``), the engine
and the requests it takes and returns, the paged KV-cache pool with its radix prefix cache, and
every error a caller may handle. Everything else is internal and may move.
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
from .language_model import LanguageModel
from .models.shipped import DEFAULT_DRAFT_DIR
from .serving.completion import Completion
from .errors import GenerationCancelled
from .serving.listener import GenerationListener
from .models.config import ModelConfig
from .errors import (
    ChatTemplateError,
    CheckpointError,
    ConfigError,
    ConstraintError,
    GrammarError,
    ModelFileError,
    EngineShutdownError,
    RenderBudgetError,
    RequestTypeError,
    TokenizerError,
)
from .serving.request import AUTO, RequestHandle, SamplingParams
from .serving.sample_group import SampleGroup
from .serving.streaming import StreamChunk, TokenStream

__version__ = "0.1.0"

__all__ = [
    "AUTO",
    "ChatTemplateError",
    "CheckpointError",
    "Completion",
    "ConfigError",
    "ConstraintError",
    "DEFAULT_DRAFT_DIR",
    "EngineShutdownError",
    "GenerationCancelled",
    "GenerationListener",
    "GrammarError",
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
