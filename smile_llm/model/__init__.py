"""Models on the KV pool: config, decoder, tokenizers, sampling, and ``LanguageModel.generate``."""

from .config import ModelConfig
from .language_model import DEFAULT_DRAFT_DIR, Completion, GenerationCancelled, LanguageModel
from .listener import GenerationListener
from .transformer import Transformer

__all__ = ["DEFAULT_DRAFT_DIR", "Completion", "GenerationCancelled", "GenerationListener", "LanguageModel",
           "ModelConfig", "Transformer"]
