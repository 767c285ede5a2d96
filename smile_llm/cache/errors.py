"""Typed errors of the cache package.

Bad arguments raise ``ValueError``; calls made in the wrong state raise a ``RuntimeError`` subclass
from this module. Every message says what was asked, what was available and what to do.
"""

from __future__ import annotations


class KvCacheExhaustedError(RuntimeError):
    """The static pool cannot satisfy a request (it never grows): the caller keeps the job queued or
    stops at ``request_capacity``. Java:
    ``KvCacheExhaustedException extends IllegalStateException``."""


class KvCacheCorruptionError(RuntimeError):
    """``check_invariants()`` found a broken ownership, size or lock invariant; the message names
    the first broken page or node."""


class PoolClosedError(RuntimeError):
    """The pool was closed; every call after ``close()`` raises this."""


class NoActiveStepError(RuntimeError):
    """A step verb (``put``, ``get``, metadata, seal) was called with no active rows."""


class RequestOffloadedError(RuntimeError):
    """The request's private KV lives in host memory; ``restore_request`` it before activating
    it."""


class LayerNotHeldError(IndexError):
    """A layer index the pool does not hold: a pipeline-parallel rank's pool holds the KV of its
    own range of layers only (``KvCachePool.layer_range``). Also an IndexError, as an index out of
    range is."""
