"""Typed, range-checked reading of ``config.json`` fields, and the size limits a config may ask for.

``Fields`` wraps one JSON object (the config, or a nested one such as ``rope_scaling``) and reads
each field as exactly one type: an integer is a JSON integer (not a bool, not 2.0), a number is a
finite int or float (not a bool), a bool is ``true``/``false`` (not ``"false"``, not 0), a string is
a string. A field that is absent or ``null`` takes its default; a required field without one is an
error. Every failure is a ``ConfigError`` whose message names the field by its dotted path
(``rope_scaling.factor``).

The limits bound what a config can make the loader allocate or iterate before the checkpoint is
compared with it; each is far above any released model of the supported families.
"""

from __future__ import annotations

import math
import reprlib
from collections.abc import Mapping, Sequence
from typing import Any

from ...errors import ConfigError

MAX_LAYERS = 1024  # num_hidden_layers, mtp_num_hidden_layers (released models: at most ~128)
MAX_HIDDEN_SIZE = 1 << 16  # hidden_size
MAX_INTERMEDIATE_SIZE = 1 << 20  # intermediate_size and the experts' inner sizes
MAX_VOCAB_SIZE = 1 << 24  # vocab_size
MAX_HEADS = 1024  # attention, KV and DeltaNet head counts
MAX_HEAD_DIM = 1024  # head_dim and the DeltaNet head dims
# max_position_embeddings: positions are int32 in the attention kernels
MAX_POSITIONS = (1 << 31) - 1
MAX_EXPERTS = 1024  # num_experts (Qwen3-Next: 512)
MAX_CONV_KERNEL = 64  # linear_conv_kernel_dim (released: 4)

_MISSING: Any = object()
_SHOWN = reprlib.Repr()
_SHOWN.maxlevel, _SHOWN.maxstring, _SHOWN.maxother, _SHOWN.maxlong = 3, 80, 80, 40


def shown(value: Any) -> str:
    """``repr(value)`` for an error message, cut short: long strings, numbers and lists elided,
    nesting past three levels shown as ``[...]`` (a config value may be megabytes long or nested
    thousands deep)."""
    return _SHOWN.repr(value)


class Fields:
    """Typed access to one JSON object of a config; ``prefix`` is its dotted path (``""`` for the
    top level, ``"rope_scaling."`` for a nested object), used to name fields in errors."""

    def __init__(self, raw: Mapping[str, Any], prefix: str = "") -> None:
        self.raw, self.prefix = raw, prefix

    def name(self, key: str) -> str:
        """The field's dotted path, as errors name it."""
        return f"{self.prefix}{key}"

    def has(self, key: str) -> bool:
        """True when ``key`` is present and not null."""
        return self.raw.get(key) is not None

    def error(self, key: str, message: str) -> ConfigError:
        """A ``ConfigError`` about field ``key`` (``message`` should name it, e.g. via ``name``)."""
        return ConfigError(message, field=self.name(key))

    def _get(self, key: str, default: Any) -> Any:
        value = self.raw.get(key)
        if value is None:
            if default is _MISSING:
                raise self.error(key, f"config.json lacks {self.name(key)!r}")
            return default
        return value

    def integer(self, key: str, default: Any = _MISSING, *, low: int = 0, high: int) -> int:
        """An integer in ``[low, high]`` (``default`` when absent; required without one)."""
        value = self._get(key, default)
        return self.check_integer(key, value, low=low, high=high)

    def check_integer(self, key: str, value: Any, *, low: int = 0, high: int) -> int:
        """``value`` (read from field ``key``) as an integer in ``[low, high]``."""
        name = self.name(key)
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.error(key,
                             f"{name} must be an integer, got {shown(value)} "
                             f"({type(value).__name__})")
        if value < low:
            bound = "must be positive" if low == 1 else f"must be at least {low}"
            raise self.error(key, f"{name} {value} {bound}")
        if value > high:
            raise self.error(key, f"{name} {value} exceeds the limit {high}")
        return value

    def optional_integer(self, key: str, *, low: int = 0, high: int) -> int | None:
        """An integer in ``[low, high]``, or None when absent or null."""
        return self.integer(key, None, low=low, high=high) if self.has(key) else None

    def number(self, key: str, default: Any = _MISSING, *, above: float | None = None,
               at_most: float | None = None) -> float:
        """A finite number (int or float, not bool) ``> above`` and ``<= at_most`` (either bound
        optional), as a float."""
        value = self._get(key, default)
        name = self.name(key)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.error(key,
                             f"{name} must be a number, got {shown(value)} "
                             f"({type(value).__name__})")
        try:
            out = float(value)
        except OverflowError:
            out = math.inf
        if not math.isfinite(out):
            raise self.error(key, f"{name} must be finite, got {shown(value)}")
        if above is not None and not out > above:
            raise self.error(key, f"{name} {shown(value)} must be greater than {above:g}")
        if at_most is not None and out > at_most:
            raise self.error(key, f"{name} {shown(value)} must be at most {at_most:g}")
        return out

    def flag(self, key: str, default: bool) -> bool:
        """A JSON ``true``/``false`` (``default`` when absent or null); anything else, ``"false"``
        included, is an error."""
        value = self._get(key, default)
        if not isinstance(value, bool):
            raise self.error(key, f"{self.name(key)} must be true or false, got {shown(value)} "
                                  f"({type(value).__name__})")
        return value

    def string(self, key: str, default: Any = _MISSING,
               choices: Sequence[str] | None = None) -> str:
        """A string (one of ``choices`` when given)."""
        value = self._get(key, default)
        name = self.name(key)
        if not isinstance(value, str):
            raise self.error(key,
                             f"{name} must be a string, got {shown(value)} "
                             f"({type(value).__name__})")
        if choices is not None and value not in choices:
            raise self.error(key, f"{name} {shown(value)} is not supported; use one of "
                                  f"{tuple(choices)}")
        return value

    def int_list(self, key: str, *, low: int = 0, high: int,
                 max_len: int) -> tuple[int, ...] | None:
        """A list of at most ``max_len`` integers in ``[low, high]``, or None when absent or
        null."""
        if not self.has(key):
            return None
        value = self.raw[key]
        name = self.name(key)
        if not isinstance(value, list):
            raise self.error(key, f"{name} must be a list of integers, got {shown(value)} "
                                  f"({type(value).__name__})")
        if len(value) > max_len:
            raise self.error(key, f"{name} has {len(value)} entries; at most {max_len} are allowed")
        return tuple(self.check_integer(f"{key}[{i}]", v, low=low, high=high)
                     for i, v in enumerate(value))

    def str_list(self, key: str, *, max_len: int) -> tuple[str, ...] | None:
        """A list of at most ``max_len`` strings, or None when absent or null."""
        if not self.has(key):
            return None
        value = self.raw[key]
        name = self.name(key)
        if not isinstance(value, list):
            raise self.error(key, f"{name} must be a list of strings, got {shown(value)} "
                                  f"({type(value).__name__})")
        if len(value) > max_len:
            raise self.error(key, f"{name} has {len(value)} entries; at most {max_len} are allowed")
        for i, v in enumerate(value):
            if not isinstance(v, str):
                raise self.error(key,
                                 f"{name}[{i}] must be a string, got {shown(v)} "
                                 f"({type(v).__name__})")
        return tuple(value)

    def mapping(self, key: str) -> Fields | None:
        """The nested JSON object ``key`` as ``Fields`` (prefix ``"<key>."``), or None
        when absent or null."""
        if not self.has(key):
            return None
        value = self.raw[key]
        if not isinstance(value, Mapping):
            raise self.error(key, f"{self.name(key)} must be an object, got {shown(value)} "
                                  f"({type(value).__name__})")
        return Fields(value, f"{self.name(key)}.")

    def token_ids(self, key: str, vocab_size: int) -> tuple[int, ...]:
        """A token id or a list of them (``eos_token_id``), each in ``[0, vocab_size)``; ()
        when absent or null."""
        if not self.has(key):
            return ()
        value = self.raw[key]
        items = value if isinstance(value, list) else [value]
        if len(items) > vocab_size:
            raise self.error(key, f"{self.name(key)} lists {len(items)} ids but vocab_size is "
                                  f"{vocab_size}")
        keys = [f"{key}[{i}]" for i in range(len(items))] if isinstance(value, list) else [key]
        return tuple(self.check_integer(k, v, high=vocab_size - 1) for k, v in zip(keys, items))
