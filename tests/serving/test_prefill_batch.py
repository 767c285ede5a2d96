"""Padded batched prefill (``ModelRunner.prefill_batch``): prompts left with short unmatched parts after a shared prefix
are prefilled in one forward, right-padded to the longest, and the padding is sealed off. Checked against HF per
prompt, against the pool's state after the forward, and on input it must refuse."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from smile_llm.language_model import LanguageModel
from smile_llm.serving.model_runner import PADDING_FREE, PADDING_WASTE, PREFILL_CHUNK, ModelRunner
from smile_llm.serving.request_row import RequestRow
from smile_llm.serving.request import RequestHandle, SamplingParams

from tests.hf_zoo import LONG_PROMPT, assert_clean, expected_greedy

pytest.importorskip("transformers")

HEADER = LONG_PROMPT + LONG_PROMPT[:9]  # 36 tokens: 9 pages of 4
SUFFIXES = [[3], [5, 8, 13], [21, 34], [55, 89, 1, 2, 3, 4, 5], [6, 7, 8, 9, 10]]


def spy_prefill_batch(lm: LanguageModel, monkeypatch) -> list[list[tuple[int, int, int]]]:
    """Record, after every ``prefill_batch``, each row's (prompt length, prefilled, kv_len) and check the pools."""
    calls: list[list[tuple[int, int, int]]] = []
    real = lm.runner.prefill_batch

    def spy(seqs):  # type: ignore[no-untyped-def]
        real(seqs)
        lm.pool.check_invariants()
        for s in seqs:  # the MTP history holds exactly the absorbed positions (its padding sealed off too)
            if lm.drafter is not None and s.history is not None:
                lm.drafter.pool.check_invariants()
                assert lm.drafter.pool.kv_len(s.history.request_id) == s.history.filled - s.history.offset > 0
        calls.append([(len(s.prompt), s.prefilled, lm.pool.kv_len(s.request_id)) for s in seqs])

    monkeypatch.setattr(lm.runner, "prefill_batch", spy)
    return calls


@pytest.mark.parametrize("family", ["qwen3", "llama"])
def test_shared_prefix_batch_equals_hf_per_prompt(zoo, family, monkeypatch):
    """The first prompt is computed and cached alone, the other four match its pages and are prefilled together
    (ragged starts, ragged lengths); every row's tokens are HF's and its logprobs those of a lone generate."""
    hf = zoo(family)
    lm = hf.load(page_size=4)
    calls = spy_prefill_batch(lm, monkeypatch)
    prompts = [HEADER + s for s in SUFFIXES]
    batch = lm.generate_batch(prompts, 8, logprobs=True)
    assert_clean(lm.pool)
    assert len(calls) == 1 and len(calls[0]) == 4
    assert all(prefilled == kv_len == n for n, prefilled, kv_len in calls[0])  # the padding was sealed off
    assert batch[0].stats["cached_tokens"] == 0
    assert all(c.stats["cached_tokens"] == 36 for c in batch[1:])  # every page of the header
    # one prefill forward (it gives the first token), then one plain step per further token (an EOS included)
    assert all(c.stats["forwards"] == len(c.tokens) + (c.finish_reason == "stop") for c in batch)
    solo = hf.load(page_size=4)
    for p, c in zip(prompts, batch):
        want, reason = expected_greedy(hf, p, 8)
        assert (c.tokens, c.finish_reason) == (want, reason)
        alone = solo.generate(p, 8, logprobs=True)
        assert alone.tokens == c.tokens
        np.testing.assert_allclose(c.logprobs, alone.logprobs, atol=1e-5)


def test_unrelated_short_prompts_are_prefilled_together(zoo, monkeypatch):
    hf = zoo("qwen3")
    lm = hf.load(page_size=4)
    calls = spy_prefill_batch(lm, monkeypatch)
    prompts = [LONG_PROMPT[:9], LONG_PROMPT[3:14], LONG_PROMPT[5:15]]  # no two share a first page
    batch = lm.generate_batch(prompts, 6)
    assert [len(rows) for rows in calls] == [3]
    for p, c in zip(prompts, batch):
        assert (c.tokens, c.finish_reason) == expected_greedy(hf, p, 6)
    assert_clean(lm.pool)


def test_speculative_rows_after_a_batched_prefill_stay_lossless(monkeypatch):
    """On the default model (MTP head, history drafting): the batched prefill also absorbs the rows' MTP history in
    one padded forward; speculative output equals plain output row by row."""
    lm = LanguageModel.default(max_seq_len=256)
    calls = spy_prefill_batch(lm, monkeypatch)
    header = "import os\nimport sys\n\n\ndef main(argv):\n    "
    prompts = [header + tail for tail in ("return 0\n", "print(argv)\n", "sys.exit(main(sys.argv))\n", "pass")]
    spec = lm.generate_batch(prompts, 24, speculative_tokens=3)
    assert len(calls) == 1 and len(calls[0]) == 3
    plain = LanguageModel.default(max_seq_len=256).generate_batch(prompts, 24, speculative_tokens=0)
    assert [c.tokens for c in spec] == [c.tokens for c in plain]
    assert sum(c.stats["speculative_rounds"] for c in spec) > 0
    assert_clean(lm.pool)
    assert lm.drafter is not None and lm.drafter.pool.bound_request_count == 0


def bound_sequences(lm: LanguageModel, prompts: list[list[int]], capacity_extra: int) -> list[RequestRow]:
    seqs = []
    for ids in prompts:
        rid = lm.pool.bind_request(ids, len(ids) + capacity_extra)
        request = lm.request(ids, SamplingParams(max_new_tokens=capacity_extra))
        handle = RequestHandle(1, request, lm.serving_loop)
        seqs.append(lm.serving_context.row(handle, rid, lm.pool.matched_prefix_len(rid), len(ids) + capacity_extra))
    return seqs


def test_prefill_batch_refuses_what_does_not_fit_and_changes_nothing(zoo):
    lm = zoo("qwen3").load(page_size=4)
    seqs = bound_sequences(lm, [LONG_PROMPT[:3], LONG_PROMPT[:20]], capacity_extra=2)  # padding 17 > 2
    with pytest.raises(ValueError, match="room for the padding"):
        lm.runner.prefill_batch(seqs)
    assert [lm.pool.kv_len(s.request_id) for s in seqs] == [0, 0]
    assert all(s.prefilled == 0 and s.logits is None for s in seqs)
    lm.pool.check_invariants()
    lm.runner.prefill_batch(seqs[:1])  # one row always fits
    assert lm.pool.kv_len(seqs[0].request_id) == 3 and seqs[0].logits is not None
    with pytest.raises(ValueError, match="prompt positions left"):
        lm.runner.prefill_batch(seqs[:1])  # nothing left to prefill
    lm.pool.unbind_requests()
    assert_clean(lm.pool)


def test_padded_prefill_groups_bound_the_padding():
    def seq(rem: int, room: int = 1000) -> SimpleNamespace:
        return SimpleNamespace(prompt=[0] * (10 + rem), prefilled=10, capacity=10 + rem + room, prompt_logprobs=None,
                               splices=[])

    groups = ModelRunner.padded_prefill_groups([seq(40), seq(3), seq(38), seq(4), seq(5), seq(36)])
    assert [len(g) for g in ModelRunner.padded_prefill_groups([seq(300), seq(20)])] == [1, 1]  # 580 > 400 + 64
    sizes = [[len(s.prompt) - s.prefilled for s in g] for g in groups]
    assert sizes == [[3, 4, 5], [36, 38, 40]]
    for g in sizes:
        assert len(g) * max(g) <= PADDING_WASTE * sum(g) + PADDING_FREE
    # padding that would pass a row's capacity, or a window past PREFILL_CHUNK, starts a new group
    assert [len(g) for g in ModelRunner.padded_prefill_groups([seq(3, room=0), seq(4)])] == [1, 1]
    assert [len(g) for g in ModelRunner.padded_prefill_groups([seq(3, room=0), seq(3)])] == [2]
    big = [seq(PREFILL_CHUNK), seq(PREFILL_CHUNK + 1)]
    assert [len(g) for g in ModelRunner.padded_prefill_groups(big)] == [1, 1]
