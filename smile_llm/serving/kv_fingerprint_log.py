"""The KV fingerprints of a request at its end: what the scheduler runs just before it releases a
request's pages (``Scheduler.kv_end_hook``).

With ``SMILE_KV_FINGERPRINT=1`` (``env.kv_fingerprint``, read when the serving loop is created) the
hook is ``log_fingerprints``: JSON lines on the ``smile_llm.kv_fingerprint`` logger at INFO, one
per KV layer with its region fingerprints (``KvCachePool.kv_fingerprint``, split at the prompt
positions the request matched in the prefix cache when it was bound) and one with layer 0's
per-page rows (``KvCachePool.kv_block_fingerprints``). Off, the hook is None and the scheduler
does nothing (docs/kv_fingerprints.md).

A hook never raises into the scheduler (a request must still be released): a failure is logged.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Callable
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from .. import env
from ..cache import KvCachePool
from ..cache.kv_fingerprint import KvFingerprint, LayerFingerprint, PageFingerprint

if TYPE_CHECKING:
    from .request_row import RequestRow

LOGGER = logging.getLogger("smile_llm.kv_fingerprint")
PAGE_ROWS_LAYER = 0  # the layer whose per-page rows are logged (every layer's could be large)

KvEndHook = Callable[[KvCachePool, "RequestRow"], None]
"""``hook(pool, seq)``: called with a resident request's KV still bound, before its release."""


def region_records(seq_number: int, fp: KvFingerprint,
                   prompt_len: int) -> list[dict[str, Any]]:
    """The per-layer ``kv_regions`` records of ``fp`` (one dict per KV layer, JSON-ready)."""

    def layer_record(lf: LayerFingerprint) -> dict[str, Any]:
        return {"event": "kv_regions", "request": seq_number, "request_id": fp.request_id,
                "prompt_len": prompt_len, "kv_len": fp.kv_len, "boundary": fp.boundary,
                "layer": lf.layer, "storage_dtype": lf.storage_dtype,
                "prefix": asdict(lf.prefix), "suffix": asdict(lf.suffix)}

    return [layer_record(lf) for lf in fp.layers]


def page_record(seq_number: int, request_id: int, layer: int,
                pages: tuple[PageFingerprint, ...]) -> dict[str, Any]:
    """The ``kv_pages`` record of one layer's per-page rows (JSON-ready)."""
    return {"event": "kv_pages", "request": seq_number, "request_id": request_id, "layer": layer,
            "pages": [asdict(p) for p in pages]}


def _ensure_output() -> None:
    """The switch asks for output: the logger passes INFO unless its level was set, and writes bare
    lines to stderr when no handler would receive them (nothing configured logging)."""
    if LOGGER.level == logging.NOTSET:
        LOGGER.setLevel(logging.INFO)
    if not LOGGER.hasHandlers():
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        LOGGER.addHandler(handler)


def log_fingerprints(pool: KvCachePool, seq: RequestRow) -> None:
    """Log ``seq``'s fingerprints (see the module docstring): JSON lines (Python's ``json``; a NaN
    from poisoned pages is written ``NaN``). Read-only on the pool; never raises."""
    try:
        number = seq.handle.request_number
        fp = pool.kv_fingerprint(seq.request_id, boundary=min(seq.matched,
                                                              pool.kv_len(seq.request_id)))
        records = region_records(number, fp, len(seq.prompt))
        if PAGE_ROWS_LAYER < len(fp.layers):
            rows = pool.kv_block_fingerprints(seq.request_id, PAGE_ROWS_LAYER, fp.boundary)
            records.append(page_record(number, seq.request_id, PAGE_ROWS_LAYER, rows))
        for record in records:
            LOGGER.info(json.dumps(record))
    except Exception:  # noqa: BLE001 - a debug hook must not keep a request bound
        LOGGER.exception("kv fingerprint of request %s failed", seq.request_id)


def hook_from_env() -> KvEndHook | None:
    """``log_fingerprints`` with ``SMILE_KV_FINGERPRINT=1`` (making sure its lines are written
    somewhere), else None."""
    if not env.kv_fingerprint():
        return None
    _ensure_output()
    return log_fingerprints
