"""``n`` samples of one prompt (sharing its KV), ``logprobs=k`` alternatives and ``prompt_logprobs``.

Logprobs are checked against transformers' logits of the same tiny random checkpoint, and plain against speculative
decoding on the shipped model; samples against separate requests with the same seeds.
"""

from __future__ import annotations

import pytest
import torch

from smile_llm.engine import InferenceEngine
from smile_llm.language_model import LanguageModel
from smile_llm.serving import model_runner as decoder
from smile_llm import GenerationCancelled, SamplingParams
from smile_llm.serving.sample_group import SampleGroup

from tests.hf_zoo import LONG_PROMPT, PROMPT, assert_clean

K = 5


def hf_logp(hf, ids: list[int]) -> torch.Tensor:
    return torch.log_softmax(hf.logits(ids), dim=-1)


def test_top_logprobs_equal_transformers(zoo) -> None:
    hf = zoo("qwen3")
    lm = hf.load()
    out = lm.generate(PROMPT, 8, logprobs=K)
    logp = hf_logp(hf, PROMPT + out.tokens)
    assert out.top_logprobs is not None and len(out.top_logprobs) == len(out.tokens) == len(out.logprobs) == 8
    for i, (token, chosen, top) in enumerate(zip(out.tokens, out.logprobs, out.top_logprobs)):
        row = logp[len(PROMPT) - 1 + i]
        values, ids = row.topk(K)
        assert list(top) == ids.tolist()  # most likely first
        torch.testing.assert_close(torch.tensor(list(top.values())), values, atol=2e-5, rtol=0)
        assert chosen == pytest.approx(float(row[token]), abs=2e-5)
        assert token == ids[0]  # greedy: the chosen token is the most likely one
    plain = lm.generate(PROMPT, 8, logprobs=True)
    assert plain.top_logprobs is None and plain.logprobs == pytest.approx(out.logprobs, abs=1e-5)
    assert_clean(lm.pool)


@pytest.mark.parametrize("chunk", [None, 6])
def test_prompt_logprobs_equal_transformers_without_prefix_reuse(zoo, monkeypatch, chunk) -> None:
    hf = zoo("qwen3")
    if chunk is not None:
        monkeypatch.setattr(decoder, "PREFILL_CHUNK", chunk)  # several prefill forwards
    lm = hf.load()
    logp = hf_logp(hf, LONG_PROMPT)
    lm.generate(LONG_PROMPT, 2)  # the prompt is now cached: a request for prompt logprobs must still compute it
    out = lm.generate(LONG_PROMPT, 2, prompt_logprobs=3)
    assert out.stats["cached_tokens"] == 0
    entries = out.prompt_logprobs
    assert entries is not None and len(entries) == len(LONG_PROMPT) and entries[0] is None
    for pos in range(1, len(LONG_PROMPT)):
        entry, row = entries[pos], logp[pos - 1]
        assert entry is not None
        want = [LONG_PROMPT[pos]] + [t for t in row.topk(3).indices.tolist() if t != LONG_PROMPT[pos]]
        assert list(entry) == want  # the prompt token first, then the alternatives (once each)
        for token, value in entry.items():
            assert value == pytest.approx(float(row[token]), abs=2e-5)
    again = lm.generate(LONG_PROMPT, 2, prompt_logprobs=0)  # k = 0: each prompt token's own logprob only
    assert [list(e) for e in again.prompt_logprobs[1:]] == [[t] for t in LONG_PROMPT[1:]]
    assert again.tokens == out.tokens
    assert lm.generate(LONG_PROMPT, 2).stats["cached_tokens"] > 0  # prefix reuse is back for the others
    assert_clean(lm.pool)


@pytest.fixture(scope="module")
def lm() -> LanguageModel:
    return LanguageModel.default(max_seq_len=512)


PROSE = "The function reads the file, splits each line on commas and returns the rows as a list of tuples. " * 2


def test_logprobs_are_the_same_plain_or_speculative(lm) -> None:
    plain = lm.generate("def main(argv):\n", 30, speculative_tokens=0, logprobs=4)
    spec = lm.generate("def main(argv):\n", 30, speculative_tokens=3, logprobs=4)
    assert spec.tokens == plain.tokens and spec.stats["speculative_rounds"] > 0
    assert spec.logprobs == pytest.approx(plain.logprobs, abs=1e-4)
    assert [list(t) for t in spec.top_logprobs] == [list(t) for t in plain.top_logprobs]


def test_n_samples_share_the_prompt_kv_and_equal_separate_seeded_requests(lm) -> None:
    prompt = lm.encode(PROSE)
    page = lm.pool.page_size
    samples = lm.generate(PROSE, 12, n=4, temperature=1.0, seed=5, speculative_tokens=0)  # PROSE is not cached yet
    assert isinstance(samples, list) and len(samples) == 4
    cached = [s.stats["cached_tokens"] for s in samples]
    assert cached[0] == 0 and all(c == (len(prompt) - 1) // page * page for c in cached[1:])
    # sample i is the request with SamplingParams.sample(i)'s seed; sample 0 is the n=1 request itself
    params = SamplingParams(12, 1.0, seed=5, speculative_tokens=0, n=4)
    for i, s in enumerate(samples):
        alone = lm.generate(PROSE, 12, temperature=1.0, seed=params.sample(i).seed, speculative_tokens=0)
        assert s.tokens == alone.tokens
    assert len({tuple(s.tokens) for s in samples}) > 1  # distinct seeds draw differently
    assert [s.tokens for s in lm.generate(PROSE, 12, n=4, temperature=1.0, seed=5)] == [s.tokens for s in samples]
    greedy = lm.generate(PROSE, 12, n=3)
    assert all(g.tokens == lm.generate(PROSE, 12).tokens for g in greedy)
    assert_clean(lm.pool)


def test_n_with_prompt_logprobs_and_batches(lm) -> None:
    samples = lm.generate(PROSE, 4, n=3, temperature=0.7, seed=3, prompt_logprobs=1)
    first = samples[0].prompt_logprobs
    assert first is not None and len(first) == len(lm.encode(PROSE))
    assert all(s.prompt_logprobs == first for s in samples)
    rows = lm.generate_batch(["import os\n", PROSE], 5, n=2, temperature=0.9, seed=8)
    assert [r.prompt_tokens for r in rows] == [lm.encode("import os\n")] * 2 + [lm.encode(PROSE)] * 2
    chats = lm.generate_batch(["import os\n", PROSE], 5)
    assert [r.tokens for r in lm.generate_batch(["import os\n", PROSE], 5, n=2)] == \
        [chats[0].tokens] * 2 + [chats[1].tokens] * 2
    assert_clean(lm.pool)


def test_engine_samples_and_cancelling_a_group(lm) -> None:
    with InferenceEngine(lm, max_batch_size=4) as engine:
        group = engine.submit(PROSE, SamplingParams(6, temperature=0.8, seed=2, n=3))
        assert isinstance(group, SampleGroup)
        done = []
        group.add_done_callback(done.append)
        out = group.result(60)
        assert len(out) == 3 and done == [group] and group.done()
        long = engine.submit(PROSE, SamplingParams(400, temperature=0.8, n=2))
        assert long.cancel()
        with pytest.raises(GenerationCancelled):
            long.result(60)
    assert_clean(lm.pool)


@pytest.mark.parametrize("options, match", [
    ({"n": 0}, r"n must be in \[1, 128\]"), ({"n": 129}, r"n must be in \[1, 128\]"), ({"n": 2.0}, "n must be an int"),
    ({"logprobs": 21}, r"logprobs must be a bool or an int in \[0, 20\]"), ({"logprobs": -1}, "logprobs"),
    ({"logprobs": "3"}, "logprobs"), ({"prompt_logprobs": 21}, r"prompt_logprobs must be None or an int"),
    ({"prompt_logprobs": True}, "prompt_logprobs"), ({"n": 2, "listener": object()}, "listener"),
])
def test_bad_values_are_refused_by_name(lm, options, match) -> None:
    with pytest.raises((ValueError, TypeError), match=match):
        lm.generate("import os\n", 4, **options)
    with pytest.raises(ValueError, match="n must be 1 to stream"):
        lm.stream("import os\n", 4, n=2)
    assert_clean(lm.pool)
