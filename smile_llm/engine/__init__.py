"""The public serving API: ``InferenceEngine`` (continuous batching with a serving thread) over the
model's one scheduler, and what callers submit and hold (``SamplingParams``, ``RequestHandle``)."""

from ..errors import EngineShutdownError
from ..serving.request import RequestHandle, SamplingParams
from .engine import InferenceEngine

__all__ = ["EngineShutdownError", "InferenceEngine", "RequestHandle", "SamplingParams"]
