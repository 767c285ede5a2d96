"""``kv_diff``: the same prompt run warm (its prefix reused from the radix cache) and cold (prefix
reuse off) through a model's serving loop, their KV fingerprints compared (``smile-llm kv-diff``,
docs/kv_fingerprints.md).

1. A first request sends ``prefix`` (default: the prompt itself); its end caches it in the tree.
2. The warm request sends the prompt with reuse on: it binds with ``matched_len`` positions from the
   cache (ValueError when it matches nothing) and computes the rest.
3. The cold request sends the prompt with the pool's prefix reuse off: it computes every position.

Each request's fingerprints are taken at its end, before its pages are released, through the
scheduler's ``kv_end_hook`` (chained in front of any hook already there, and put back after), split
at the warm request's match: every layer's region sums and per-page rows. ``compare_kv`` then
names the first layer, region and page where warm differs from cold beyond a tolerance (exact
equality is wrong: see ``kv_fingerprint_diff``).

Requests are greedy, without speculative drafts. Run it on an idle model: the cold request switches
the whole pool's prefix reuse off while it runs (restored afterwards), which other requests would
see. Concurrent calls take turns (``_RUNS``).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence as Seq
from dataclasses import dataclass
from typing import Protocol

from ..cache import KvCachePool
from ..cache.kv_fingerprint import KvFingerprint, LayerPages
from ..cache.kv_fingerprint_diff import KvComparison, compare_kv, relative_tolerance
from .kv_fingerprint_log import KvEndHook
from .request import Request, SamplingParams
from .request_row import RequestRow
from .serving_loop import ServingLoop


_RUNS = threading.RLock()  # kv_diff runs (and their requests), one at a time

class HasServingLoop(Protocol):
    """What ``kv_diff`` needs of a model: its serving loop (``LanguageModel.serving_loop``)."""

    @property
    def serving_loop(self) -> ServingLoop: ...


@dataclass(frozen=True)
class KvRun:
    """One request's KV at its end: its submission number, prompt length, the prompt positions it
    matched in the prefix cache when bound, the tokens it generated, its ``KvFingerprint`` and
    every layer's per-page rows."""

    request_number: int
    prompt_len: int
    matched_len: int
    tokens: tuple[int, ...]
    fingerprint: KvFingerprint
    pages: tuple[LayerPages, ...]


@dataclass(frozen=True)
class KvDiffReport:
    """``kv_diff``: the ``warm`` and ``cold`` runs and their ``comparison`` (warm against the cold
    reference)."""

    warm: KvRun
    cold: KvRun
    comparison: KvComparison

    @property
    def agree(self) -> bool:
        """Whether warm and cold agree within tolerance everywhere."""
        return self.comparison.agree

    def describe(self) -> str:
        """A few lines: what ran, then where warm and cold first differ or that they agree."""
        w, c = self.warm, self.cold
        lines = [f"prompt {w.prompt_len} tokens; warm reused {w.matched_len} from the prefix cache "
                 f"(regions split at {w.fingerprint.boundary}); {w.fingerprint.kv_len} positions "
                 f"of KV in {len(w.fingerprint.layers)} layers compared",
                 self.comparison.describe()]
        if w.tokens != c.tokens:
            lines.append(f"note: warm generated {list(w.tokens)}, cold {list(c.tokens)}")
        return "\n".join(lines)


def _loop(model: ServingLoop | HasServingLoop) -> ServingLoop:
    loop = model if isinstance(model, ServingLoop) else getattr(model, "serving_loop", None)
    if not isinstance(loop, ServingLoop):
        raise TypeError(f"model must be a LanguageModel or a ServingLoop, got "
                        f"{type(model).__name__}")
    return loop


def _capture(pool: KvCachePool, seq: RequestRow, boundary: int | None) -> KvRun:
    rid = seq.request_id
    split = min(seq.matched if boundary is None else boundary, pool.kv_len(rid))
    fp = pool.kv_fingerprint(rid, boundary=split)
    pages = tuple(LayerPages(layer, pool.kv_block_fingerprints(rid, layer, split))
                  for layer in range(len(fp.layers)))
    return KvRun(seq.handle.request_number, len(seq.prompt), seq.matched, tuple(seq.tokens), fp,
                 pages)


def fingerprint_request(model: ServingLoop | HasServingLoop, prompt: str | Seq[int], *,
                        reuse: bool, boundary: int | None = None,
                        max_new_tokens: int = 1) -> KvRun:
    """Run ``prompt`` greedily for ``max_new_tokens`` with the pool's prefix reuse set to ``reuse``
    (restored afterwards) and return its KV at its end, split at ``boundary`` (default: the
    positions it matched in the cache; clamped to its ``kv_len``). ValueError for a bad prompt;
    the request's own error if it fails."""
    loop = _loop(model)
    scheduler = loop.scheduler
    ctx = scheduler.context
    request: Request = ctx.request(prompt, SamplingParams(max_new_tokens=max_new_tokens,
                                                          speculative_tokens=0))
    pool = ctx.pool
    runs: list[KvRun] = []
    errors: list[BaseException] = []
    previous: KvEndHook | None = None

    def hook(p: KvCachePool, seq: RequestRow) -> None:
        if seq.request is request:
            try:
                runs.append(_capture(p, seq, boundary))
            except Exception as exc:  # noqa: BLE001 - raised by fingerprint_request instead
                errors.append(exc)
        if previous is not None:
            previous(p, seq)

    with _RUNS:  # one run at a time: each swaps the scheduler's hook and the pool's reuse switch
        previous = scheduler.kv_end_hook
        reuse_before = pool.prefix_reuse_enabled
        scheduler.kv_end_hook = hook
        try:
            pool.prefix_reuse_enabled = bool(reuse)
            handle = loop.submit(request)
            handle.result()
        finally:
            scheduler.kv_end_hook = previous
            pool.prefix_reuse_enabled = reuse_before
    if errors:
        raise errors[0]
    if not runs:
        raise RuntimeError("the request ended without its KV resident (preempted to host memory "
                           "at its end); run kv_diff on an idle model")
    return runs[0]


def kv_diff(model: ServingLoop | HasServingLoop, prompt: str | Seq[int],
            prefix: str | Seq[int] | None = None, *, max_new_tokens: int = 1,
            slack: float = 1.0) -> KvDiffReport:
    """Run ``prompt`` warm and cold (see the module docstring) and compare their KV: ``prefix``
    (text or token ids; default the prompt) is sent first so the warm request finds it cached;
    ``slack`` scales the tolerance. ValueError for a bad prompt or prefix, a bad ``slack``, or a
    warm request that matched nothing in the cache (the prefix must share at least one page of
    tokens with the prompt's start, short of its last token)."""
    loop = _loop(model)
    ctx = loop.scheduler.context
    relative_tolerance(ctx.pool.dtype, slack=slack)  # a bad slack raises before anything runs
    ids = ctx.encode(prompt)
    prefix_ids = ids if prefix is None else ctx.encode(prefix)
    with _RUNS:  # the prefix, warm and cold runs of one call together
        return _warm_and_cold(loop, ids, prefix_ids, max_new_tokens, slack)


def _warm_and_cold(loop: ServingLoop, ids: list[int], prefix_ids: list[int], max_new_tokens: int,
                   slack: float) -> KvDiffReport:
    ctx = loop.scheduler.context
    fingerprint_request(loop, prefix_ids, reuse=True, max_new_tokens=1)
    warm = fingerprint_request(loop, ids, reuse=True, max_new_tokens=max_new_tokens)
    if warm.matched_len == 0:
        raise ValueError(f"the warm request matched nothing in the prefix cache: the prefix "
                         f"({len(prefix_ids)} tokens) must share at least one page "
                         f"({ctx.pool.page_size} tokens) with the prompt's start, short of its "
                         f"last token")
    cold = fingerprint_request(loop, ids, reuse=False, boundary=warm.fingerprint.boundary,
                               max_new_tokens=max_new_tokens)
    if cold.fingerprint.kv_len != warm.fingerprint.kv_len:  # a stop token ended one earlier
        raise ValueError(f"warm and cold wrote {warm.fingerprint.kv_len} and "
                         f"{cold.fingerprint.kv_len} positions of KV (generated "
                         f"{list(warm.tokens)} and {list(cold.tokens)}); use max_new_tokens=1")
    comparison = compare_kv(warm.fingerprint, cold.fingerprint, warm.pages, cold.pages,
                            compute_dtype=ctx.runner.transformer.dtype, slack=slack)
    return KvDiffReport(warm, cold, comparison)
