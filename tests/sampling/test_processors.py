"""The sampling surface beyond temperature and top-p: each processor and warper equals Hugging Face's on the same
logits, greedy and seeded speculative decoding stay equal to plain decoding with them on (the default model's real
MTP drafts), ``min_new_tokens`` holds EOS back, and bad values are refused by name with nothing bound."""

from __future__ import annotations

import pytest
import torch

from smile_llm import LanguageModel
from smile_llm.sampling.processors import LogitsProcessing
from smile_llm.serving.request import SamplingParams
from smile_llm.sampling.sampler import GREEDY_TEMPERATURE, probabilities

from tests.hf_zoo import assert_clean

V = 50
PROMPT = [3, 7, 7, 11, 2]
GENERATED = [[], [4], [4, 9, 4], [7, 7, 7, 1]]


@pytest.fixture(scope="module")
def logits() -> torch.Tensor:
    return torch.randn(len(GENERATED), V, generator=torch.Generator().manual_seed(3)) * 3


@pytest.fixture(scope="module")
def hf():
    return pytest.importorskip("transformers")


def hf_ids(row: int) -> torch.Tensor:
    return torch.tensor([PROMPT + GENERATED[row]])


@pytest.mark.parametrize("penalty", [0.7, 1.3])
def test_repetition_penalty_equals_transformers(logits, hf, penalty) -> None:
    got = LogitsProcessing(repetition_penalty=penalty).apply(logits, PROMPT, GENERATED)
    proc = hf.RepetitionPenaltyLogitsProcessor(penalty)
    for row in range(len(GENERATED)):
        assert torch.equal(got[row], proc(hf_ids(row), logits[row : row + 1].clone())[0])


def test_min_new_tokens_and_logit_bias_equal_transformers(logits, hf) -> None:
    got = LogitsProcessing(min_new_tokens=3, eos_ids=(1, 5), logit_bias=((4, 2.5), (9, -1.0))).apply(
        logits, PROMPT, GENERATED)
    min_new = hf.MinNewTokensLengthLogitsProcessor(len(PROMPT), 3, [1, 5])
    bias = hf.SequenceBiasLogitsProcessor({(4,): 2.5, (9,): -1.0})
    for row in range(len(GENERATED)):
        want = bias(hf_ids(row), min_new(hf_ids(row), logits[row : row + 1].clone()))
        assert torch.equal(got[row], want[0])


def test_presence_and_frequency_penalties_follow_openai(logits) -> None:
    got = LogitsProcessing(presence_penalty=0.5, frequency_penalty=0.25).apply(logits, PROMPT, GENERATED)
    for row, gen in enumerate(GENERATED):
        want = logits[row].clone()
        for token in set(gen):
            want[token] -= 0.5 + 0.25 * gen.count(token)  # output tokens only: the prompt's repeats cost nothing
        assert torch.allclose(got[row], want, atol=1e-6)


@pytest.mark.parametrize("temperature, top_k, top_p, min_p", [(0.7, 5, 1.0, 0.0), (1.3, 0, 0.8, 0.0),
                                                              (1.0, 0, 1.0, 0.2), (0.9, 8, 0.9, 0.05)])
def test_warpers_equal_transformers(logits, hf, temperature, top_k, top_p, min_p) -> None:
    warpers = [hf.TemperatureLogitsWarper(temperature)]
    warpers += [hf.TopKLogitsWarper(top_k)] if top_k else []
    warpers += [hf.TopPLogitsWarper(top_p)] if top_p < 1 else []
    warpers += [hf.MinPLogitsWarper(min_p)] if min_p else []
    for row in range(len(GENERATED)):
        scores = logits[row : row + 1].clone()
        for w in warpers:
            scores = w(hf_ids(row), scores)
        want = torch.softmax(scores, dim=-1)[0]
        got = probabilities(logits[row], temperature, top_p, top_k, min_p)
        got = got / got.sum()
        assert torch.equal(got > 0, want > 0), row
        assert torch.allclose(got, want, atol=1e-6)


@pytest.fixture(scope="module")
def lm() -> LanguageModel:
    return LanguageModel.default(max_seq_len=512)


OPTIONS = [{"repetition_penalty": 1.3}, {"presence_penalty": 0.8, "frequency_penalty": 0.4},
           {"logit_bias": {ord("e"): 3.0, ord(" "): -2.0}, "min_new_tokens": 30}]


@pytest.mark.parametrize("options", OPTIONS)
def test_speculation_stays_lossless_with_processors(lm, options) -> None:
    plain = lm.generate("def main(argv):\n", 40, speculative_tokens=0, **options)
    spec = lm.generate("def main(argv):\n", 40, speculative_tokens=3, **options)
    assert spec.tokens == plain.tokens and spec.stats["speculative_rounds"] > 0
    assert plain.tokens != lm.generate("def main(argv):\n", 40, speculative_tokens=0).tokens  # they do something


def test_seeded_sampling_with_warpers_is_the_same_plain_or_speculative(lm) -> None:
    kwargs = {"temperature": 0.9, "seed": 11, "top_k": 20, "min_p": 0.05, "repetition_penalty": 1.1}
    plain = lm.generate("import os\n", 40, speculative_tokens=0, **kwargs)
    spec = lm.generate("import os\n", 40, speculative_tokens=3, **kwargs)
    assert spec.tokens == plain.tokens and spec.stats["speculative_rounds"] > 0


def test_min_new_tokens_holds_eos_back(lm) -> None:
    eos = lm.config.eos_token_ids[0]
    forced = lm.generate("import os\n", 20, logit_bias={eos: 100.0})
    assert forced.tokens == [] and forced.finish_reason == "stop"
    held = lm.generate("import os\n", 20, logit_bias={eos: 100.0}, min_new_tokens=6)
    assert len(held.tokens) == 6 and held.finish_reason == "stop"


@pytest.mark.parametrize("options, match", [
    ({"top_k": -1}, "top_k must be >= 0"), ({"top_k": 2.5}, "top_k must be an int"),
    ({"min_p": 1.5}, r"min_p must be in \[0.0, 1.0\]"), ({"repetition_penalty": 0.0}, "repetition_penalty must be > 0"),
    ({"presence_penalty": 3.0}, r"presence_penalty must be in \[-2.0, 2.0\]"),
    ({"frequency_penalty": float("nan")}, "frequency_penalty"), ({"min_new_tokens": -1}, "min_new_tokens must be >= 0"),
    ({"logit_bias": {-1: 1.0}}, "logit_bias keys"), ({"logit_bias": {3: 500.0}}, r"logit_bias\[3\]"),
    ({"logit_bias": {10_000: 1.0}}, "outside the vocabulary"), ({"logit_bias": [1]}, "logit_bias must be a dict"),
    ({"top_q": 1}, "unexpected keyword argument 'top_q'"),
])
def test_bad_values_are_refused_by_name(lm, options, match) -> None:
    with pytest.raises((ValueError, TypeError), match=match):
        lm.generate("import os\n", 4, **options)
    assert lm.pool.bound_request_count == 0


MIXED = [{}, {"temperature": 0.9, "seed": 5, "top_k": 30}, {"repetition_penalty": 1.3, "logit_bias": {101: 2.0}},
         {"temperature": 0.7, "seed": 9, "min_p": 0.1, "presence_penalty": 0.6, "frequency_penalty": 0.4},
         {"temperature": 0.9, "seed": 6, "top_k": 30, "min_new_tokens": 12, "logprobs": 3}]


def test_a_batch_of_rows_with_different_settings_chooses_as_each_row_alone(lm) -> None:
    """The choice is batched across rows (one pass per processor, one softmax per warper group): each row of a
    mixed batch draws exactly what it draws alone."""
    prompts = ["import os\n", "def main(argv):\n", "class Parser:\n", "for line in f:\n", "return self.\n"]
    steps = lm.serving_loop.steps
    handles = [lm.submit(p, SamplingParams(24, speculative_tokens=0, **o)) for p, o in zip(prompts, MIXED)]
    together = [h.result() for h in handles]
    assert lm.serving_loop.steps - steps <= 26  # every row in the same steps: one prefill step, then one per token
    for p, o, got in zip(prompts, MIXED, together):
        alone = lm.generate(p, 24, speculative_tokens=0, **o)
        assert got.tokens == alone.tokens
        if got.logprobs is not None:
            assert got.top_logprobs is not None and [list(t) for t in got.top_logprobs] == \
                [list(t) for t in alone.top_logprobs]
    assert_clean(lm.pool)


def test_draw_follows_the_distribution_and_never_draws_a_zero_mass_token() -> None:
    """``draw`` (inverse transform with positional uniforms) against the distribution it samples: a chi-square
    statistic over 20,000 draws (3 degrees of freedom: 16.27 is the 0.1% critical value); masked tokens never come."""
    from smile_llm.sampling.sampler import PositionalRng, draw

    rng = PositionalRng(1234, torch.device("cpu"))
    probs = torch.tensor([[0.0, 0.4, 0.3, 0.0, 0.2, 0.1]]) * 3.0  # unnormalised, two tokens of zero mass
    n = 20_000
    tokens = draw(probs.expand(n, -1), [rng.uniform(p) for p in range(n)])
    counts = torch.bincount(tokens, minlength=6).double()
    assert counts[0] == 0 and counts[3] == 0
    expected = torch.tensor([0.4, 0.3, 0.2, 0.1], dtype=torch.float64) * n
    chi2 = float(((counts[[1, 2, 4, 5]] - expected) ** 2 / expected).sum())
    assert chi2 < 16.27
    u = torch.tensor([rng.uniform(p, stream) for p in range(2000) for stream in (0, 1)])
    assert 0.0 <= float(u.min()) and float(u.max()) < 1.0 and abs(float(u.mean()) - 0.5) < 0.02
    assert rng.uniform(5) == PositionalRng(1234, torch.device("cpu")).uniform(5) != rng.uniform(6)
    edge = draw(torch.tensor([[0.0, 1.0, 0.0], [0.5, 0.0, 0.5]]), [0.0, 1.0 - 2.0**-53])
    assert edge.tolist() == [1, 2]  # u = 0 skips leading zero mass; u -> 1 stays on the last token with mass


@pytest.mark.parametrize("temperature", [1e-300, 5e-324, 1e-6, GREEDY_TEMPERATURE / 2])
def test_a_temperature_below_the_greedy_threshold_is_greedy(lm, temperature) -> None:
    """Below ``GREEDY_TEMPERATURE`` (1e-5, vLLM's threshold) a request decodes greedily: dividing the logits by
    1e-300 (0 in float32) gave NaN probabilities and an empty completion."""
    assert SamplingParams(temperature=temperature).temperature == 0.0
    assert SamplingParams(temperature=GREEDY_TEMPERATURE).temperature == GREEDY_TEMPERATURE  # sampled from here
    greedy = lm.generate("def main(argv):\n", 24, speculative_tokens=0)
    for spec, drafts in ((0, "greedy"), (3, "greedy"), (3, "sample")):
        got = lm.generate("def main(argv):\n", 24, temperature=temperature, seed=5, speculative_tokens=spec,
                          draft_sampling=drafts)
        assert got.tokens == greedy.tokens and greedy.tokens  # never empty (NaN probabilities drew EOS)
    assert_clean(lm.pool)


def test_sampling_functions_treat_a_tiny_temperature_as_greedy(logits) -> None:
    from smile_llm.sampling.sampler import sample

    want = logits.argmax(dim=-1)
    for temperature in (1e-300, 0.0, GREEDY_TEMPERATURE / 2):
        probs = probabilities(logits, temperature, 1.0)
        assert torch.isfinite(probs).all()
        assert probs.argmax(dim=-1).tolist() == want.tolist() and probs.sum(dim=-1).tolist() == [1.0] * len(want)
        assert sample(logits, temperature, 0.9, [0.999] * len(want)).tolist() == want.tolist()
    assert torch.isfinite(probabilities(logits, GREEDY_TEMPERATURE, 1.0)).all()
