"""smile-llm: the LLM serving core of Smile in Python.

The facade: what callers use. The language model (``generate``, ``chat``, ``stream``), the engine
and the requests it takes and returns, the paged KV-cache pool with its radix prefix cache, and
every error a caller may handle. Everything else is internal and may move.

The names load on first use (PEP 562), so that ``import smile_llm`` and ``smile-llm --version``
do not import torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .lazy import lazy_getattr

if TYPE_CHECKING:
    from .cache import (
        KvCacheCorruptionError,
        KvCacheExhaustedError,
        KvCacheLayout,
        KvCachePool,
        LayerNotHeldError,
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
    from .models.checkpoint.config import ModelConfig
    from .errors import (
        ChatTemplateError,
        CheckpointError,
        ConfigError,
        ConstraintError,
        GrammarError,
        GrammarLimitError,
        ModelFileError,
        EngineShutdownError,
        RenderBudgetError,
        RequestError,
        PromptTooLongError,
        RequestTypeError,
        SegmentError,
        SegmentUnsupportedError,
        TokenizerError,
    )
    from .serving.request import AUTO, RequestHandle, SamplingParams
    from .serving.sample_group import SampleGroup
    from .serving.segments import Segment
    from .serving.streaming import StreamChunk, TokenStream

__version__ = "0.1.0"

# each public name and the module that defines it
_SOURCES = {
    "AUTO": ".serving.request",
    "ChatTemplateError": ".errors",
    "CheckpointError": ".errors",
    "Completion": ".serving.completion",
    "ConfigError": ".errors",
    "ConstraintError": ".errors",
    "DEFAULT_DRAFT_DIR": ".models.shipped",
    "EngineShutdownError": ".errors",
    "GenerationCancelled": ".errors",
    "GenerationListener": ".serving.listener",
    "GrammarError": ".errors",
    "GrammarLimitError": ".errors",
    "InferenceEngine": ".engine",
    "KvCacheCorruptionError": ".cache",
    "KvCacheExhaustedError": ".cache",
    "KvCacheLayout": ".cache",
    "KvCachePool": ".cache",
    "LayerNotHeldError": ".cache",
    "LanguageModel": ".language_model",
    "LockstepError": ".distributed.lockstep",
    "ModelConfig": ".models.checkpoint.config",
    "ModelFileError": ".errors",
    "NoActiveStepError": ".cache",
    "PoolClosedError": ".cache",
    "RadixCache": ".cache",
    "RenderBudgetError": ".errors",
    "RequestHandle": ".serving.request",
    "RequestOffloadedError": ".cache",
    "RequestError": ".errors",
    "PromptTooLongError": ".errors",
    "RequestTypeError": ".errors",
    "SampleGroup": ".serving.sample_group",
    "SamplingParams": ".serving.request",
    "Segment": ".serving.segments",
    "SegmentError": ".errors",
    "SegmentUnsupportedError": ".errors",
    "StreamChunk": ".serving.streaming",
    "TokenStream": ".serving.streaming",
    "TokenizerError": ".errors",
}

__all__ = sorted(_SOURCES)


__getattr__ = lazy_getattr(__name__, globals(), _SOURCES)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_SOURCES))
