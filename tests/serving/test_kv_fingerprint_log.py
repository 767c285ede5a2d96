"""``SMILE_KV_FINGERPRINT=1``: every request's end logs its per-layer region fingerprints and layer 0's per-page rows
as JSON lines on ``smile_llm.kv_fingerprint``, taken before its pages are released; off, the scheduler has no hook
and nothing is logged."""

from __future__ import annotations

import json
import logging

import pytest

from smile_llm import LanguageModel
from smile_llm.serving.kv_fingerprint_log import LOGGER, log_fingerprints
from smile_llm.serving.request import SamplingParams
from smile_llm.serving.serving_loop import ServingLoop

PREFIX_TEXT = "import os\nimport sys\n\n\ndef main(argv):\n    "
PROMPT = PREFIX_TEXT + "print(argv)\n"


@pytest.fixture(scope="module")
def lm():
    model = LanguageModel.default(max_batch_size=2, max_seq_len=256)
    yield model
    model.close()


def run(loop: ServingLoop, prompt: str, new: int = 3) -> int:
    ctx = loop.scheduler.context
    handle = loop.submit(ctx.request(prompt, SamplingParams(max_new_tokens=new, speculative_tokens=0)))
    handle.result()
    return handle.request_number


def lines(caplog: pytest.LogCaptureFixture) -> list[dict]:
    return [json.loads(r.getMessage()) for r in caplog.records if r.name == LOGGER.name]


def test_the_switch_logs_json_lines_at_every_request_end(lm: LanguageModel, monkeypatch, caplog) -> None:
    monkeypatch.setenv("SMILE_KV_FINGERPRINT", "1")
    caplog.set_level(logging.INFO, logger=LOGGER.name)
    loop = ServingLoop(lm.serving_context)  # the switch is read when a serving loop is created
    assert loop.scheduler.kv_end_hook is log_fingerprints
    pool = lm.pool
    pool.evict(pool.radix.total_size())
    first = run(loop, PREFIX_TEXT)
    second = run(loop, PROMPT)
    records = lines(caplog)
    layers = pool.num_layers
    assert len(records) == 2 * (layers + 1)
    by_request = {n: [r for r in records if r["request"] == n] for n in (first, second)}
    for number, matched in ((first, 0), (second, 32)):
        rows = by_request[number]
        regions = [r for r in rows if r["event"] == "kv_regions"]
        pages = [r for r in rows if r["event"] == "kv_pages"]
        assert [r["layer"] for r in regions] == list(range(layers)) and len(pages) == 1
        kv_len = regions[0]["kv_len"]
        prompt_len = regions[0]["prompt_len"]
        assert kv_len == prompt_len + 2  # 3 new tokens: the last one's KV is never written
        for r in regions:
            assert r["boundary"] == matched and r["storage_dtype"] == "float32"
            assert (r["prefix"]["start"], r["prefix"]["end"], r["suffix"]["end"]) == (0, matched, kv_len)
            assert set(r["prefix"]["k"]) == {"sum", "sum_sq", "sum_abs", "num_values"}
            assert r["suffix"]["v"]["sum_sq"] > 0
        assert pages[0]["layer"] == 0
        assert [p["logical_page"] for p in pages[0]["pages"]] == list(range(-(-kv_len // 16)))
        assert [p["region"] for p in pages[0]["pages"]][: matched // 16] == ["prefix"] * (matched // 16)
    # the reused prefix's pages are the first request's cached ones: the same physical pages, the same sums
    p1 = by_request[first][-1]["pages"]
    p2 = by_request[second][-1]["pages"]
    assert [(p["physical_page"], p["k_sum_sq"]) for p in p2[:2]] == [(p["physical_page"], p["k_sum_sq"])
                                                                     for p in p1[:2]]
    assert pool.bound_request_count == 0  # released after the hook ran
    pool.check_invariants()


def test_off_the_scheduler_has_no_hook_and_nothing_is_logged(lm: LanguageModel, monkeypatch, caplog) -> None:
    monkeypatch.delenv("SMILE_KV_FINGERPRINT", raising=False)
    caplog.set_level(logging.DEBUG, logger=LOGGER.name)
    loop = ServingLoop(lm.serving_context)
    assert loop.scheduler.kv_end_hook is None
    run(loop, PROMPT)
    monkeypatch.setenv("SMILE_KV_FINGERPRINT", "0")
    assert ServingLoop(lm.serving_context).scheduler.kv_end_hook is None
    assert lines(caplog) == []


def test_a_failing_fingerprint_is_logged_and_the_request_still_ends(lm: LanguageModel, monkeypatch,
                                                                    caplog) -> None:
    monkeypatch.setenv("SMILE_KV_FINGERPRINT", "1")
    caplog.set_level(logging.INFO, logger=LOGGER.name)
    loop = ServingLoop(lm.serving_context)

    def broken(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(type(lm.pool), "kv_fingerprint", broken)
    run(loop, PROMPT)
    assert lm.pool.bound_request_count == 0
    failures = [r for r in caplog.records if r.name == LOGGER.name and r.levelno == logging.ERROR]
    assert len(failures) == 1 and "boom" in (failures[0].exc_text or "")


def test_a_raising_end_hook_leaves_the_request_released_and_the_loop_serving(lm: LanguageModel, caplog) -> None:
    """The scheduler calls its KV end hook as an observer: a hook that raises is logged, the request still ends with
    its completion and its pages released, and the next request is served."""
    loop = ServingLoop(lm.serving_context)

    def raising(pool, seq):
        raise RuntimeError("hook broke")

    loop.scheduler.kv_end_hook = raising
    with caplog.at_level(logging.ERROR, logger="smile_llm.serving.scheduler"):
        ctx = loop.scheduler.context
        handle = loop.submit(ctx.request(PROMPT, SamplingParams(max_new_tokens=3, speculative_tokens=0)))
        assert len(handle.result(timeout=60).tokens) == 3
    assert lm.pool.bound_request_count == 0
    assert any("hook broke" in (r.exc_text or "") for r in caplog.records)
    loop.scheduler.kv_end_hook = None
    second = loop.submit(ctx.request(PROMPT, SamplingParams(max_new_tokens=3, speculative_tokens=0)))
    assert second.result(timeout=60).tokens == handle.result(0).tokens
