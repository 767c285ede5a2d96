"""Public names that load on first use (PEP 562): a package's ``__getattr__`` imports a name's
module only when the name is asked for, so importing the package (``smile-llm --version``, the
server's flags) does not import torch or FastAPI."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def lazy_getattr(package: str, namespace: dict[str, Any], sources: dict[str, str]
                 ) -> Callable[[str], Any]:
    """The ``__getattr__`` of ``package`` (its ``globals()`` are ``namespace``): a name of
    ``sources`` (name -> module, relative to the package) is imported from its module on first use
    and kept in the namespace; any other name is an AttributeError."""

    def __getattr__(name: str) -> Any:
        source = sources.get(name)
        if source is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(source, package), name)
        namespace[name] = value
        return value

    return __getattr__
