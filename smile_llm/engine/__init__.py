"""Continuous batching over the KV pool (``InferenceEngine``) and the CUDA-graph runners."""

from .engine import EngineShutdownError, InferenceEngine
from .request import RequestHandle, SamplingParams

__all__ = ["EngineShutdownError", "InferenceEngine", "RequestHandle", "SamplingParams"]
