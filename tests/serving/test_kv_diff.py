"""``kv_diff`` on the shipped models: warm (prefix reused from the radix cache) and cold (reuse off) runs of the same
tokens agree within the tolerance; a corrupted cached page makes it name that page's layer, region and logical page;
bad input raises before anything runs."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from smile_llm import LanguageModel
from smile_llm.cache.kv_fingerprint import PREFIX
from smile_llm.cache.kv_fingerprint_diff import compare_kv
from smile_llm.serving.kv_diff import fingerprint_request, kv_diff

PREFIX_TEXT = "import os\nimport sys\n\n\ndef main(argv):\n    "  # 41 bytes: 2 pages of 16 are cached
PROMPT = PREFIX_TEXT + "print(argv)\n    return 0\n\n\nif __name__ == \"__main__\":\n    main(sys.argv)\n"


@pytest.fixture(scope="module")
def lm():
    model = LanguageModel.default(max_batch_size=2, max_seq_len=256)
    yield model
    model.close()


def test_warm_and_cold_agree_on_the_shipped_model(lm: LanguageModel) -> None:
    hook = lm.serving_loop.scheduler.kv_end_hook
    report = kv_diff(lm, PROMPT, PREFIX_TEXT)
    assert report.agree, report.describe()
    assert report.warm.matched_len == 32 and report.cold.matched_len == 0
    w, c = report.warm.fingerprint, report.cold.fingerprint
    assert w.boundary == c.boundary == 32 and w.kv_len == c.kv_len == len(lm.encode(PROMPT))
    assert len(w.layers) == lm.pool.num_layers and len(report.warm.pages) == lm.pool.num_layers
    assert report.warm.tokens == report.cold.tokens
    assert 0.0 <= report.comparison.worst_ratio <= 1.0
    assert "agree" in report.describe()
    # kv_diff leaves the model as it found it
    assert lm.pool.prefix_reuse_enabled and lm.serving_loop.scheduler.kv_end_hook is hook
    assert lm.pool.bound_request_count == 0
    lm.pool.check_invariants()


def test_concurrent_runs_take_turns_and_each_agrees(lm: LanguageModel) -> None:
    """Each run swaps the scheduler's hook and the pool's reuse switch: runs from two threads take turns, so each
    captures its own requests (not the other's, nor a misleading "preempted" error) and the model is left as found."""
    from concurrent.futures import ThreadPoolExecutor

    hook = lm.serving_loop.scheduler.kv_end_hook
    with ThreadPoolExecutor(max_workers=3) as pool:
        reports = [f.result(timeout=120) for f in [pool.submit(kv_diff, lm, PROMPT, PREFIX_TEXT) for _ in range(3)]]
    # (a later call's warm request also finds the earlier calls' prompts cached)
    assert all(r.agree and r.warm.matched_len >= 32 and r.cold.matched_len == 0 for r in reports), \
        [r.describe() for r in reports]
    assert lm.pool.prefix_reuse_enabled and lm.serving_loop.scheduler.kv_end_hook is hook
    assert lm.pool.bound_request_count == 0
    # without --prefix the prompt caches itself; a ServingLoop works as well as the model
    again = kv_diff(lm.serving_loop, PROMPT)
    assert again.agree and again.warm.matched_len == (len(lm.encode(PROMPT)) - 1) // 16 * 16


def test_warm_and_cold_agree_on_the_hybrid_model() -> None:
    model = LanguageModel.default(kind="hybrid", max_batch_size=2, max_seq_len=256)
    try:
        report = kv_diff(model, PROMPT, PREFIX_TEXT)  # the match ends at a DeltaNet state snapshot
    finally:
        model.close()
    assert report.agree, report.describe()
    assert report.warm.matched_len > 0 and len(report.warm.fingerprint.layers) == 3  # its attention layers


def test_a_corrupted_cached_page_is_named(lm: LanguageModel) -> None:
    pool = lm.pool
    pool.evict(pool.radix.total_size())
    ids = lm.encode(PROMPT)
    fingerprint_request(lm, PREFIX_TEXT, reuse=True)  # caches 2 pages of the prefix
    slots = pool.peek_prefix_slots(ids)
    assert len(slots) == 32
    slot, layer = int(slots[16 + 5]), 7  # logical page 1 of the reused prefix
    saved = pool.key_cache[layer, slot].clone()
    pool.key_cache[layer, slot, 1, 3] += 4.0
    try:
        warm = fingerprint_request(lm, ids, reuse=True)
        cold = fingerprint_request(lm, ids, reuse=False, boundary=warm.fingerprint.boundary)
    finally:
        pool.key_cache[layer, slot] = saved
    assert warm.matched_len == 32
    result = compare_kv(warm.fingerprint, cold.fingerprint, warm.pages, cold.pages)
    d = result.divergence
    assert d is not None, result.describe()
    assert (d.layer, d.region, d.tensor, d.logical_page, d.physical_page) == (layer, PREFIX, "k", 1,
                                                                             int(slots[16]) // 16)
    assert d.statistic in ("sum", "sum_sq", "sum_abs")  # the region sums see it too
    # the layers below it agree: the corruption is where the tool says it starts
    below = compare_kv(dataclasses.replace(warm.fingerprint, layers=warm.fingerprint.layers[:layer]),
                       dataclasses.replace(cold.fingerprint, layers=cold.fingerprint.layers[:layer]),
                       warm.pages, cold.pages)
    assert below.agree, below.describe()


@pytest.mark.parametrize("args, kwargs, exc, match", [
    (("",), {}, ValueError, "prompt is empty"),
    ((PROMPT, "ab"), {}, ValueError, "matched nothing in the prefix cache"),
    ((PROMPT,), {"slack": 0}, ValueError, "slack must be a finite number > 0"),
    ((PROMPT,), {"slack": True}, ValueError, "slack must be a finite number > 0"),
])
def test_bad_input_raises_a_typed_error(lm: LanguageModel, args, kwargs, exc, match) -> None:
    pool = lm.pool
    pool.evict(pool.radix.total_size())
    digest = pool.state_digest() if match != "matched nothing in the prefix cache" else None
    with pytest.raises(exc, match=match):
        kv_diff(lm, *args, **kwargs)
    if digest is not None:  # refused before any request ran
        assert pool.state_digest() == digest
    assert pool.prefix_reuse_enabled and pool.bound_request_count == 0


def test_a_model_without_a_serving_loop_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="LanguageModel or a ServingLoop"):
        kv_diff(object(), PROMPT)  # type: ignore[arg-type]
