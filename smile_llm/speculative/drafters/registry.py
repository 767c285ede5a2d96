"""Drafters by name: factories registered with ``register_drafter``, and
``"package.module:callable"`` strings that name a factory importable without registering it (what a
command-line flag can carry).

A factory takes one ``DrafterContext`` (the target model's parts: transformer, KV pool, attention
backend, longest request, draft-KV mode) and returns a ``Drafter``, or None when it cannot serve
this model (it then decodes plainly, as ``"mtp"`` does for a checkpoint without a head).
``build_drafter`` (``drafters/__init__.py``) checks what comes back. The built-in names (``"mtp"``,
``"ngram"``, ``"none"``) and the ``"draft:PATH"`` form are resolved before the registry and cannot
be registered."""

from __future__ import annotations

import importlib
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import torch

from ...attention.backend import AttentionBackend
from ...cache import KvCachePool
from ...models.checkpoint.config import ModelConfig
from ...models.transformer import Transformer

if TYPE_CHECKING:
    from .base import Drafter

RESERVED_NAMES = ("mtp", "ngram", "none", "draft")  # built-in choices and the "draft:PATH" prefix
NAME_PATTERN = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]*")  # no ":" (that names a module's callable)


class LoadedModel(Protocol):
    """A loaded checkpoint as a draft model uses it (``LanguageModel`` is one): its transformer, KV
    pool and attention backend, configuration and longest request; ``close()`` releases its
    pools."""

    config: ModelConfig
    transformer: Transformer
    pool: KvCachePool
    backend: AttentionBackend
    max_seq_len: int

    def close(self) -> None: ...


class ModelLoader(Protocol):
    """How a draft checkpoint is loaded (``LanguageModel.from_pretrained``): the keywords below,
    plain decoding, compiled as the target is."""

    def __call__(self, path: str | Path, *, device: torch.device, dtype: torch.dtype,
                 page_size: int, max_batch_size: int, max_seq_len: int, mem_fraction: float | None,
                 cuda_graphs: bool, drafter: None, compile: bool) -> LoadedModel: ...


@dataclass(frozen=True)
class DrafterContext:
    """The target model's parts a drafter may build on: ``transformer`` (its ``config`` and
    ``vocab_size``), the main KV ``pool`` (its device, dtype, page size and slot count), the
    attention ``backend``, ``max_seq_len`` (the longest prompt plus completion of one request),
    ``draft_kv`` (``from_pretrained``'s MTP mode) and ``load_model`` (how another checkpoint is
    loaded as a draft model; the facade's ``from_pretrained``)."""

    transformer: Transformer
    pool: KvCachePool
    backend: AttentionBackend
    max_seq_len: int
    draft_kv: str = "history"
    # loads another checkpoint as a draft model (``"draft:PATH"``)
    load_model: ModelLoader | None = None

    @property
    def config(self) -> ModelConfig:
        """The target's normalised configuration as this rank builds it: under tensor parallelism
        its heads, inner sizes and ``vocab_size`` are this rank's shares
        (``sharding.local_config``); the whole vocabulary is ``vocab_size``."""
        return self.transformer.config

    @property
    def vocab_size(self) -> int:
        """The target's whole vocabulary (every draft must lie in ``[0, vocab_size)``)."""
        return self.transformer.vocab_size


DrafterFactory = Callable[[DrafterContext], "Drafter | None"]

_factories: dict[str, DrafterFactory] = {}
_lock = threading.Lock()


def register_drafter(name: str, factory: DrafterFactory, *, replace: bool = False) -> None:
    """Make ``drafter=name`` (``from_pretrained``, ``LanguageModel``, the command line) build
    ``factory(context)``. ``name``: letters, digits, ``_``, ``.`` and ``-``, not starting with a
    digit, not a built-in name. ValueError for a bad or reserved name, or one already registered
    unless ``replace``; TypeError when ``factory`` is not callable. Safe from any thread."""
    if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
        raise ValueError("a drafter name is letters, digits, '_', '.' and '-' (no ':'), "
                         f"got {name!r}")
    if name in RESERVED_NAMES:
        raise ValueError(f"{name!r} is a built-in drafter choice; "
                         "register yours under another name")
    if not callable(factory):
        raise TypeError("factory must be callable (DrafterContext -> Drafter | None), "
                        f"got {factory!r}")
    with _lock:
        if name in _factories and not replace:
            raise ValueError(f"a drafter named {name!r} is already registered; pass "
                             "replace=True to replace it")
        _factories[name] = factory


def unregister_drafter(name: str) -> None:
    """Forget the factory registered as ``name``; nothing for a name never registered."""
    with _lock:
        _factories.pop(name, None)


def registered_drafters() -> list[str]:
    """The names registered with ``register_drafter``, sorted."""
    with _lock:
        return sorted(_factories)


def find_factory(choice: str) -> DrafterFactory | None:
    """The factory ``choice`` names: a registered name, or ``"package.module:callable"`` (the
    callable may be a dotted attribute path, ``"pkg.mod:Class.create"``), imported now. None when
    ``choice`` is neither (an unknown name); ValueError naming the module or attribute when a
    ``"module:callable"`` string does not resolve to a callable."""
    with _lock:
        factory = _factories.get(choice)
    if factory is not None or ":" not in choice:
        return factory
    module_name, _, attr_path = choice.partition(":")
    if not module_name or not attr_path:
        raise ValueError(f'drafter {choice!r}: write "package.module:callable"')
    try:
        target: object = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"drafter {choice!r}: cannot import module "
                         f"{module_name!r} ({exc})") from exc
    for part in attr_path.split("."):
        if not hasattr(target, part):
            raise ValueError(f"drafter {choice!r}: {module_name!r} has no attribute {attr_path!r}")
        target = getattr(target, part)
    if not callable(target):
        raise ValueError(f"drafter {choice!r}: {attr_path!r} is not callable "
                         "(DrafterContext -> Drafter | None)")
    return target  # type: ignore[return-value]
