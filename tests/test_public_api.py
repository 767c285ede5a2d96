"""The facade: ``smile_llm`` exports what callers use (the model, the engine and its requests, the pool, every error
a caller may handle), each the very object the package uses internally."""

from __future__ import annotations

import smile_llm
from smile_llm.cache import errors as cache_errors
from smile_llm.engine import engine
from smile_llm import errors as model_errors
from smile_llm.serving import request


def test_every_public_name_resolves_to_the_objects_the_package_uses() -> None:
    assert sorted(smile_llm.__all__) == sorted(set(smile_llm.__all__))
    for name in smile_llm.__all__:
        assert getattr(smile_llm, name) is not None, name
    assert smile_llm.InferenceEngine is engine.InferenceEngine
    assert smile_llm.SamplingParams is request.SamplingParams
    assert smile_llm.RequestHandle is request.RequestHandle
    assert smile_llm.AUTO == "auto"


def test_every_error_a_caller_handles_is_exported() -> None:
    modules = (cache_errors, model_errors)
    defined = {name for m in modules for name, obj in vars(m).items()
               if isinstance(obj, type) and issubclass(obj, Exception) and obj.__module__ == m.__name__}
    defined |= {"LockstepError"}
    assert defined <= set(smile_llm.__all__), defined - set(smile_llm.__all__)
    assert issubclass(smile_llm.RequestTypeError, TypeError) and issubclass(smile_llm.RequestTypeError, ValueError)
    assert issubclass(smile_llm.ConfigError, ValueError)
