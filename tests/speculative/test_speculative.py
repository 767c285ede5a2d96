"""Speculative decoding with the MTP head (docs/speculative.md; docs/contract.md for the pool's seal and truncate).

- the acceptance rules: ``accept_greedy``'s table and errors, ``accept_rejection``'s output distribution;
- losslessness at temperature 0: the default model and random tiny MTP models (Qwen3 tied, Qwen2, Llama, and one
  whose copied draft head agrees), ``generate`` and ``generate_batch``, k = 1..7, history and per-round draft KV,
  prefix hits, stops inside a round, length and capacity cuts, chunked prefill through ``ModelRunner``, poisoned
  pages; the stats agree with the rounds that ran (recorded by wrapping ``ModelRunner._verify``);
- the target distribution when sampling (greedy and sampled drafts, temperature and top-p): chi-square against the
  exact distribution of a vocabulary-6 model;
- the MTP history: chunking independence, drafts equal to a from-scratch computation over the verified context;
- the radix tree and KV after speculation (also after a cancel), logprobs, bad input, errors inside a round;
- seeded sampling reproduces whatever the prefix cache held and equals plain sampling with the same seed (the draw
  for a position depends on (seed, position) only); per-round drafting serves batches larger than its pool.

``SMILE_TEST_SCALE=ci`` shrinks the token counts, sample sizes and parameter grids (2 slow cores).
"""

from __future__ import annotations

import itertools
import math
import os
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from statistics import NormalDist
from typing import Any

import numpy as np
import pytest
import torch

from smile_llm.attention.backend import select_backend
from smile_llm.cache import KvCacheLayout, KvCachePool
from smile_llm.cache.layout import floor_page
from smile_llm.serving.completion import Completion
from smile_llm.errors import GenerationCancelled
from smile_llm.language_model import LanguageModel
from smile_llm.models.transformer import Transformer
from smile_llm.speculative.drafters import MtpHistoryDrafter, MtpPerRoundDrafter
from smile_llm.serving.request import RequestHandle, SamplingParams
from smile_llm.speculative.acceptance import AcceptResult, accept_greedy, accept_rejection

from tests.hf_zoo import assert_clean
from tests.models.mtp_models import build_mtp_model, exact_logits, load

SCALE = os.environ.get("SMILE_TEST_SCALE", "full")
CI = SCALE == "ci"

ALPHA = 1e-3

DEFAULT_PROMPTS = [
    "import os\nimport sys\n\n\ndef main(",
    "class Parser:\n    def parse(self, text):\n        ",
    "    for i in range(len(items)):\n        if items[i] ",
    '"""Utilities for reading and writing configuration files."""\n\nimport re\n',
]
SPEC_PROMPTS = DEFAULT_PROMPTS[:2] if CI else DEFAULT_PROMPTS
SPEC_TOKENS = 48 if CI else 120
MIN_ROUNDS_PER_K = 12 if CI else 50  # k = 1..4 together: >= 48 rounds at ci scale, >= 200 at full scale
DRAFTER_CLASS = {"history": MtpHistoryDrafter, "per_round": MtpPerRoundDrafter}
SHARED_HEADER = ("# Licensed to the Python Software Foundation under one or more agreements.\n"
                 "\"\"\"Helpers for the command line interface of the archive tools.\"\"\"\n\n"
                 "import os\nimport sys\n\n")


# ---------------------------------------------------------------------------------------------- helpers
def chi2_threshold(df: int, alpha: float = ALPHA) -> float:
    """The chi-square quantile ``1 - alpha`` with ``df`` degrees of freedom (Wilson-Hilferty)."""
    z = NormalDist().inv_cdf(1.0 - alpha)
    a = 2.0 / (9.0 * df)
    return df * (1.0 - a + z * math.sqrt(a)) ** 3


def chi2_test(counts: Counter, probs: dict[Any, float]) -> tuple[float, int, float]:
    """Chi-square goodness of fit of ``counts`` against ``probs`` with cells of expected count < 5 pooled:
    (statistic, degrees of freedom, threshold at ALPHA). Observations outside the support fail outright."""
    n = sum(counts.values())
    outside = [c for c in counts if probs.get(c, 0.0) <= 0.0]
    assert not outside, f"observed cells of probability 0: {outside[:5]}"
    cells = sorted(probs, key=lambda c: probs[c])
    groups: list[tuple[float, int]] = []  # (expected, observed)
    pool_e, pool_o = 0.0, 0
    for c in cells:
        e = n * probs[c]
        if e < 5.0:
            pool_e, pool_o = pool_e + e, pool_o + counts.get(c, 0)
        else:
            groups.append((e, counts.get(c, 0)))
    if pool_e > 0:
        if pool_e < 5.0 and groups:  # too small on its own: merge with the smallest regular cell
            e, o = groups.pop(0)
            pool_e, pool_o = pool_e + e, pool_o + o
        groups.append((pool_e, pool_o))
    df = len(groups) - 1
    assert df >= 1, "too few cells for a chi-square test"
    stat = sum((o - e) ** 2 / e for e, o in groups)
    return stat, df, chi2_threshold(df)


def test_chi2_threshold_is_close_to_the_exact_quantiles():
    exact = {1: 10.828, 3: 16.266, 10: 29.588, 30: 59.703}  # chi-square quantiles at 1 - 1e-3
    for df, q in exact.items():
        assert abs(chi2_threshold(df) - q) / q < (0.035 if df == 1 else 0.02)  # Wilson-Hilferty is coarse at df 1
    counts, probs = Counter({"a": 60, "b": 40}), {"a": 0.5, "b": 0.5}
    assert chi2_test(counts, probs)[:2] == (pytest.approx(4.0), 1)


def assert_fits(counts: Counter, probs: dict[Any, float], what: str) -> None:
    stat, df, threshold = chi2_test(counts, probs)
    assert stat < threshold, f"{what}: chi2 {stat:.1f} >= {threshold:.1f} (df {df}); counts {dict(counts)}"


def assert_pools_clean(lm: LanguageModel) -> None:
    assert_clean(lm.pool)
    if lm.drafter is not None:
        lm.drafter.pool.check_invariants()
        assert lm.drafter.pool.bound_request_count == 0


@dataclass
class Round:
    prompt: tuple[int, ...]
    n: int  # drafts proposed
    remaining: int  # the row's remaining budget before the round
    start: int  # the row's generated-token count before the round
    result: AcceptResult


class RoundSpy:
    """Wraps the decoder's verify of a linear round (``ModelRunner._verify``, after the drafter proposed) to record every
    round of every row."""

    def __init__(self, lm: LanguageModel, monkeypatch: pytest.MonkeyPatch) -> None:
        self.rounds: list[Round] = []
        real = lm.runner._verify

        def spy(seqs, n, drafts, probs):  # type: ignore[no-untyped-def]
            before = [(tuple(s.prompt), s.remaining, len(s.tokens)) for s in seqs]
            results = real(seqs, n, drafts, probs)
            assert len(results) == len(seqs)
            for (prompt, remaining, start), res in zip(before, results):
                self.rounds.append(Round(prompt, n, remaining, start, res))
            return results

        monkeypatch.setattr(lm.runner, "_verify", spy)

    def take(self, prompt: list[int] | None = None) -> list[Round]:
        """The recorded rounds (of ``prompt`` only, when given), removed from the log."""
        mine = [r for r in self.rounds if prompt is None or r.prompt == tuple(prompt)]
        self.rounds = [r for r in self.rounds if r not in mine]
        return mine


def check_rounds(c: Completion, rounds: list[Round], k: int, *, stopped: bool = False) -> None:
    """The stats agree with the rounds that ran, every round drafted ``min(k, remaining - 1)`` tokens, the round
    tokens are the completion's tokens, and the history never fell back to plain steps (at most the one plain
    step a remaining budget of 1 forces)."""
    s = c.stats
    assert s["speculative_rounds"] == len(rounds)
    assert s["proposed_drafts"] == sum(r.n for r in rounds)
    assert s["accepted_drafts"] == sum(r.result.num_accepted for r in rounds)
    assert s["accept_length_histogram"] == dict(sorted(Counter(r.result.num_tokens for r in rounds).items()))
    produced = sum(r.result.num_tokens for r in rounds)
    if rounds:
        assert s["mean_accepted_length"] == pytest.approx(produced / len(rounds))
        assert 1.0 <= s["mean_accepted_length"] <= k + 1
    for r in rounds:
        assert 1 <= r.n == min(k, r.remaining - 1)
        assert 0 <= r.result.num_accepted <= r.n and r.result.num_tokens == r.result.num_accepted + 1
        if not stopped:
            assert c.tokens[r.start : r.start + r.result.num_tokens] == list(r.result.tokens)
    if stopped or not c.tokens:
        return
    plain_steps = len(c.tokens) - 1 - produced  # the first token comes from the prefill
    assert plain_steps in (0, 1), f"{plain_steps} plain steps: the MTP history was lost"
    decode_forwards = len(rounds) + plain_steps
    assert s["forwards"] - decode_forwards >= 1  # the prefill chunk(s)
    if len(c.tokens) > 1:
        assert s["target_forwards_per_token"] == pytest.approx(decode_forwards / (len(c.tokens) - 1))


def same_completion(a: Completion, b: Completion) -> None:
    assert a.tokens == b.tokens
    assert a.finish_reason == b.finish_reason
    assert a.text == b.text


class Recorder:
    """A listener counting generated tokens and collecting text chunks."""

    def __init__(self) -> None:
        self.generated = 0
        self.chunks: list[str] = []

    def on_generated_tokens(self, n: int) -> None:
        self.generated += n

    def on_text(self, chunk: str) -> None:
        self.chunks.append(chunk)


@pytest.fixture(scope="module")
def plain_default():
    """Plain greedy decoding on the default model with prefix reuse off (an independent reference), cached."""
    lm = LanguageModel.default(max_seq_len=512)
    lm.pool.prefix_reuse_enabled = False
    cache: dict[str, Completion] = {}

    def run(prompt: Any, n: int, **kw: Any) -> Completion:
        key = repr((prompt, n, sorted(kw.items())))
        if key not in cache:
            cache[key] = lm.generate(prompt, n, speculative_tokens=0, **kw)
            assert cache[key].stats["speculative_rounds"] == 0
        return cache[key]

    return run


@pytest.fixture
def default_lm() -> LanguageModel:
    return LanguageModel.default(max_seq_len=512)


# ---------------------------------------------------------------------------------------------- 1. accept_greedy
@pytest.mark.parametrize("drafts, targets, accepted, tokens", [
    ([10, 20, 30], [10, 20, 30, 99], 3, (10, 20, 30, 99)),
    ([10, 20, 30], [11, 20, 30, 99], 0, (11,)),
    ([10, 20, 30], [10, 21, 30, 99], 1, (10, 21)),
    ([10, 20, 30], [10, 20, 31, 99], 2, (10, 20, 31)),
    ([1, 2, 3], [1, 2, 9, 99], 2, (1, 2, 9)),
    ([5], [5, 6], 1, (5, 6)),
    ([5], [7, 5], 0, (7,)),
    ((4, 4), np.array([4, 3, 4]), 1, (4, 3)),
    (np.array([0, 0]), torch.tensor([0, 0, 0]), 2, (0, 0, 0)),
])
def test_accept_greedy_table(drafts, targets, accepted, tokens):
    r = accept_greedy(drafts, targets)
    assert isinstance(r, AcceptResult)
    assert r.num_accepted == accepted
    assert r.tokens == tokens and all(type(t) is int for t in r.tokens)
    assert r.num_tokens == len(tokens) == accepted + 1
    assert r.bonus_token == tokens[-1]


def test_accept_greedy_reference_example_fields():
    r = accept_greedy([10, 20, 30], [10, 20, 30, 99])
    assert (r.num_accepted, r.tokens, r.bonus_token, r.num_tokens) == (3, (10, 20, 30, 99), 99, 4)
    r = accept_greedy([10, 20, 30], [11, 20, 30, 99])
    assert (r.num_accepted, r.tokens, r.bonus_token, r.num_tokens) == (0, (11,), 11, 1)


@pytest.mark.parametrize("drafts, targets", [
    ([1], [1]),  # one target short
    ([], [1]),  # no drafts
    (None, [1]),
    ([1, 2], None),
    ([1, 2], [1, 2, 3, 4]),  # one target too many
    ([1, 2], [1]),
    ([1, -2], [1, 2, 3]),  # not a token id
])
def test_accept_greedy_errors(drafts, targets):
    with pytest.raises(ValueError):
        accept_greedy(drafts, targets)


# ---------------------------------------------------------------------------------------------- 2. accept_rejection
P_ROWS = torch.tensor([[0.1, 0.2, 0.3, 0.4], [0.4, 0.3, 0.2, 0.1], [0.25, 0.25, 0.25, 0.25]], dtype=torch.float64)
Q_CASES = {
    "skewed": torch.tensor([[0.4, 0.3, 0.2, 0.1], [0.1, 0.6, 0.2, 0.1]], dtype=torch.float64),
    "q lacks tokens": torch.tensor([[0.5, 0.5, 0.0, 0.0], [0.0, 0.0, 0.3, 0.7]], dtype=torch.float64),
    "unnormalised": torch.tensor([[2.0, 2.0, 4.0, 0.0], [1.0, 1.0, 1.0, 5.0]], dtype=torch.float64),
}
REJECTION_DRAWS = 2000 if CI else 6000


@pytest.mark.parametrize("k", [1, 2])
@pytest.mark.parametrize("case", list(Q_CASES))
def test_accept_rejection_keeps_the_target_distribution(k, case):
    """Drafts sampled from q, rejection against p: tokens[0] ~ p[0]; given i kept drafts, tokens[i] ~ p[i]; a
    draft is kept with probability sum(min(p, q)) (after normalising q)."""
    q = Q_CASES[case][:k]
    p = P_ROWS[: k + 1]
    qn = q / q.sum(-1, keepdim=True)
    seed = 10 * k + list(Q_CASES).index(case)
    gen = torch.Generator().manual_seed(2024 + seed)
    draw = torch.Generator().manual_seed(7 + seed)
    first: Counter = Counter()
    later: list[Counter] = [Counter() for _ in range(k + 1)]
    kept0: Counter = Counter()
    for _ in range(REJECTION_DRAWS):
        drafts = [int(torch.multinomial(qn[i], 1, generator=draw)) for i in range(k)]
        r = accept_rejection(drafts, q.float(), p.float(), gen)
        assert 0 <= r.num_accepted <= k and r.num_tokens == r.num_accepted + 1
        assert list(r.tokens[:-1]) == drafts[: r.num_accepted]
        first[r.tokens[0]] += 1
        kept0[r.num_accepted >= 1] += 1
        for i in range(1, r.num_tokens):
            later[i][r.tokens[i]] += 1
    assert_fits(first, {t: float(p[0, t]) for t in range(4)}, f"tokens[0], k={k}, {case}")
    accept0 = float(torch.minimum(p[0], qn[0]).sum())
    assert_fits(kept0, {True: accept0, False: 1.0 - accept0}, "first draft kept")
    for i in range(1, k + 1):
        if sum(later[i].values()) >= 200:
            assert_fits(later[i], {t: float(p[i, t]) for t in range(4)}, f"tokens[{i}] given {i} kept")


@pytest.mark.parametrize("k", [1, 2, 3])
def test_accept_rejection_with_p_equal_q_accepts_everything(k):
    gen = torch.Generator().manual_seed(5)
    p = torch.softmax(torch.randn(k + 1, 7, generator=torch.Generator().manual_seed(k)), -1)
    bonus: Counter = Counter()
    for i in range(500):
        drafts = [(i * 3 + j) % 7 for j in range(k)]
        for q in (p[:k], 3.0 * p[:k]):  # normalised inside: a scaled q is the same distribution
            r = accept_rejection(drafts, q, p, gen)
            assert r.num_accepted == k and r.tokens[:k] == tuple(drafts) and r.num_tokens == k + 1
            bonus[r.bonus_token] += 1
    assert_fits(bonus, {t: float(p[k, t]) for t in range(7)}, "bonus after a full accept ~ p[k]")


def test_accept_rejection_shape_errors():
    gen = torch.Generator().manual_seed(0)
    p3, q2 = torch.full((3, 4), 0.25), torch.full((2, 4), 0.25)
    for drafts, q, p in [
        ([1, 2], q2, torch.full((2, 4), 0.25)),  # target rows != k + 1
        ([1, 2], torch.full((3, 4), 0.25), p3),  # draft rows != k
        ([1, 2], torch.full((2, 5), 0.2), p3),  # vocabularies differ
        ([1], q2, p3),  # k = 1 but two draft rows
        ([], torch.zeros(0, 4), torch.full((1, 4), 0.25)),  # no drafts
    ]:
        with pytest.raises(ValueError):
            accept_rejection(drafts, q, p, gen)


# ---------------------------------------------------------------------------------------------- 3. default model
def test_default_model_speculates_by_default(default_lm, plain_default, monkeypatch):
    spy = RoundSpy(default_lm, monkeypatch)
    prompt = DEFAULT_PROMPTS[0]
    c = default_lm.generate(prompt, 40)  # speculative_tokens=None: the model's default of 3
    rounds = spy.take()
    assert default_lm.config.num_speculative_tokens == 3
    assert rounds and max(r.n for r in rounds) == 3
    check_rounds(c, rounds, 3)
    same_completion(c, plain_default(prompt, 40))
    plain = default_lm.generate(prompt, 40, speculative_tokens=0)
    assert not spy.take() and plain.stats["speculative_rounds"] == 0 and plain.stats["proposed_drafts"] == 0
    assert plain.stats["target_forwards_per_token"] == 1.0
    sampled = default_lm.generate(prompt, 40, draft_sampling="sample")  # temperature 0: drafts are greedy
    same_completion(sampled, plain)
    check_rounds(sampled, spy.take(), 3)
    assert_pools_clean(default_lm)


def test_listener_error_inside_a_round_releases_both_pools(default_lm):
    """A listener raising while a round pushes its tokens: the error reaches the caller, both pools are clean, the
    tree holds only KV of tokens the request really has (whole, so it may be cached) and later calls that match it
    give the plain output."""
    class Boom:
        count = 0

        def on_generated_tokens(self, n: int) -> None:
            Boom.count += n
            if Boom.count == 5:  # token 5: inside a round (token 1 comes from the prefill)
                raise RuntimeError("listener failed")

    with pytest.raises(RuntimeError, match="listener failed"):
        default_lm.generate(DEFAULT_PROMPTS[1], 40, speculative_tokens=4, listener=Boom())
    assert_pools_clean(default_lm)
    assert Boom.count == 5  # no event after the failure
    plain = default_lm.generate(DEFAULT_PROMPTS[1], 40, speculative_tokens=0)
    assert plain.stats["cached_tokens"] > 0
    default_lm.pool.prefix_reuse_enabled = False
    try:
        assert default_lm.generate(DEFAULT_PROMPTS[1], 40, speculative_tokens=0).tokens == plain.tokens
    finally:
        default_lm.pool.prefix_reuse_enabled = True


@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_lossless_greedy_generate(default_lm, plain_default, monkeypatch, k):
    spy = RoundSpy(default_lm, monkeypatch)
    total_rounds = 0
    for prompt in SPEC_PROMPTS:
        c = default_lm.generate(prompt, SPEC_TOKENS, speculative_tokens=k)
        same_completion(c, plain_default(prompt, SPEC_TOKENS))
        rounds = spy.take()
        check_rounds(c, rounds, k)
        s = c.stats
        assert s["speculative_rounds"] > 0 and s["mean_accepted_length"] >= 1
        if k >= 2 and len(c.tokens) > 10:
            assert s["target_forwards_per_token"] < 1
        total_rounds += s["speculative_rounds"]
        assert_pools_clean(default_lm)
    assert total_rounds >= MIN_ROUNDS_PER_K


@pytest.mark.parametrize("k", [1, 4] if CI else [1, 2, 3, 4])
def test_lossless_greedy_with_prefix_hits(default_lm, plain_default, monkeypatch, k):
    """Prompts sharing a long header: the second and later calls match a prefix, so the MTP history starts at the
    matched length; a continuation of a completion reuses generated tokens too."""
    spy = RoundSpy(default_lm, monkeypatch)
    n = 40 if CI else 80
    prompts = [SHARED_HEADER + "def main(", SHARED_HEADER + "class Archive:\n    def ", SHARED_HEADER + "def main("]
    for i, prompt in enumerate(prompts):
        c = default_lm.generate(prompt, n, speculative_tokens=k)
        same_completion(c, plain_default(prompt, n))
        check_rounds(c, spy.take(), k)
        if i == 0:
            assert c.stats["cached_tokens"] == 0
        else:
            assert c.stats["cached_tokens"] >= floor_page(len(SHARED_HEADER), 16) > 0
        assert_pools_clean(default_lm)
    follow = default_lm.encode(prompts[0]) + c.tokens[:30] + default_lm.encode("\n\n# ")
    again = default_lm.generate(follow, n, speculative_tokens=k)
    assert again.stats["cached_tokens"] > len(default_lm.encode(prompts[0]))
    same_completion(again, plain_default(follow, n))
    check_rounds(again, spy.take(), k)
    assert_pools_clean(default_lm)


@pytest.mark.parametrize("k", [1, 3] if CI else [1, 2, 3, 4])
def test_lossless_greedy_generate_batch(plain_default, monkeypatch, k):
    """Three prompts of different lengths and (through max_seq_len) different limits, batched; then a second
    batch whose prompts extend the first's, so every row starts from a prefix hit."""
    n = 40 if CI else 80
    prompts = [DEFAULT_PROMPTS[2][:20], DEFAULT_PROMPTS[1], SHARED_HEADER + "def read_archive("]
    max_seq_len = len(prompts[2].encode()) + n // 2
    lm = LanguageModel.default(max_seq_len=max_seq_len, max_batch_size=4)
    spy = RoundSpy(lm, monkeypatch)
    limits = [min(n, max_seq_len - len(lm.encode(p))) for p in prompts]
    assert limits == [n, n, n // 2]  # the long prompt is clamped by max_seq_len
    batch = lm.generate_batch(prompts, n, speculative_tokens=k)
    assert_pools_clean(lm)
    for prompt, limit, c in zip(prompts, limits, batch):
        same_completion(c, plain_default(prompt, limit))
        check_rounds(c, spy.take(lm.encode(prompt)), k)
        assert c.stats["speculative_rounds"] > 0
    assert not spy.rounds
    second = [prompts[0] + "x", prompts[1] + "return", prompts[2] + "path"]
    batch2 = lm.generate_batch(second, 24, speculative_tokens=k)
    assert_pools_clean(lm)
    for prompt, c in zip(second, batch2):
        assert c.stats["cached_tokens"] > 0
        same_completion(c, plain_default(prompt, min(24, max_seq_len - len(lm.encode(prompt)))))
        check_rounds(c, spy.take(lm.encode(prompt)), k)


@pytest.mark.parametrize("k", [1, 3])
def test_lossless_greedy_with_per_round_draft_kv(plain_default, monkeypatch, k):
    """The context-free per-round draft KV mode: same tokens as plain greedy; its pool is empty between calls."""
    lm = LanguageModel.default(max_seq_len=256, draft_kv="per_round")
    spy = RoundSpy(lm, monkeypatch)
    n = 30 if CI else 80
    for prompt in DEFAULT_PROMPTS[:2] + [DEFAULT_PROMPTS[0]]:  # the repeat starts from a prefix hit
        c = lm.generate(prompt, n, speculative_tokens=k)
        same_completion(c, plain_default(prompt, n))
        check_rounds(c, spy.take(), k)
        assert_pools_clean(lm)
    assert c.stats["cached_tokens"] > 0
    batch = lm.generate_batch(DEFAULT_PROMPTS[1:4], n, speculative_tokens=k)
    assert_pools_clean(lm)
    for prompt, c in zip(DEFAULT_PROMPTS[1:4], batch):
        same_completion(c, plain_default(prompt, n))
        check_rounds(c, spy.take(lm.encode(prompt)), k)
    with pytest.raises(ValueError):
        LanguageModel.default(max_seq_len=64, draft_kv="sometimes")


def _with_pools(lm: LanguageModel, **pool_kwargs: Any) -> LanguageModel:
    """The same weights on new main and history pools of the same geometry (e.g. poisoned fresh pages)."""
    assert lm.drafter is not None
    p, h = lm.pool, lm.drafter.pool
    pool = KvCachePool(p.num_layers, p.num_slots, p.num_kv_heads, p.head_dim, p.page_size, p.device, p.dtype,
                       **pool_kwargs)
    out = LanguageModel(lm.config, lm.transformer, lm.tokenizer, pool, lm.backend, lm.max_seq_len)
    history = KvCachePool(h.num_layers, h.num_slots, h.num_kv_heads, h.head_dim, h.page_size, h.device, h.dtype,
                          **pool_kwargs)
    history.prefix_reuse_enabled = False
    assert out.drafter is not None
    out.drafter.pool = history
    return out


@pytest.mark.parametrize("pool_kwargs", [{"fresh_page_fill": "poison"}, {"zero_rejected_kv": True}],
                         ids=["poisoned-pages", "zeroed-rejected-kv"])
def test_speculation_reads_only_written_kv(plain_default, monkeypatch, pool_kwargs):
    """NaN-filled fresh pages in both pools (any read of a never-written slot poisons the logits), or rejected
    window tails zeroed: output and logprobs are still those of plain decoding, with and without prefix hits."""
    lm = _with_pools(LanguageModel.default(max_seq_len=256), **pool_kwargs)
    for pool in (lm.pool, lm.drafter.pool):
        assert pool.fresh_page_fill == pool_kwargs.get("fresh_page_fill", "none")
        assert pool.zero_rejected_kv == pool_kwargs.get("zero_rejected_kv", pool.zero_rejected_kv)
    spy = RoundSpy(lm, monkeypatch)
    n = 24 if CI else 60
    prompts = [SHARED_HEADER + "def main(", SHARED_HEADER + "class Archive:\n    def ", DEFAULT_PROMPTS[1]]
    for prompt in prompts:
        c = lm.generate(prompt, n, speculative_tokens=3, logprobs=True)
        want = plain_default(prompt, n, logprobs=True)
        same_completion(c, want)
        assert all(math.isfinite(x) for x in c.logprobs)
        np.testing.assert_allclose(c.logprobs, want.logprobs, atol=1e-4)
        check_rounds(c, spy.take(), 3)
        assert_pools_clean(lm)
    batch = lm.generate_batch([p + "\n" for p in prompts], n, speculative_tokens=2)
    for prompt, c in zip(prompts, batch):
        assert c.stats["cached_tokens"] > 0
        same_completion(c, plain_default(prompt + "\n", n))
        check_rounds(c, spy.take(lm.encode(prompt + "\n")), 2)
    assert_pools_clean(lm)


# ---------------------------------------------------------------------------------------------- 4. random MTP models
RANDOM_PROMPTS = [[(7 * i + 3) % 97 for i in range(22)], [(11 * i + 5) % 97 for i in range(27)], [4, 8, 15]]
RANDOM_SPECS = {  # name -> (family, build kwargs)
    "qwen3_tied": ("qwen3", {}),
    "llama": ("llama", {}),
    "qwen2_bias": ("qwen2", {}),
    "good_drafts": ("llama", {"good_drafts": True}),  # one layer, the MTP head a copy of it (mtp_models.py)
}


@pytest.fixture(scope="module")
def random_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return {name: build_mtp_model(tmp_path_factory.mktemp(name), fam, seed=100 + i, **kw)
            for i, (name, (fam, kw)) in enumerate(RANDOM_SPECS.items())}


RANDOM_POOLS = [(1, "history"), (16, "per_round")] if CI else [(1, "history"), (16, "history"), (16, "per_round")]


@pytest.mark.parametrize("page_size, draft_kv", RANDOM_POOLS)
@pytest.mark.parametrize("name", [n for n in RANDOM_SPECS if not (CI and n == "qwen2_bias")])
def test_lossless_greedy_on_random_mtp_models(random_models, monkeypatch, name, page_size, draft_kv):
    lm = load(random_models[name], page_size=page_size, max_seq_len=96, draft_kv=draft_kv)
    assert lm.drafter is not None and lm.drafter.pool.page_size == page_size and isinstance(lm.drafter, DRAFTER_CLASS[draft_kv])
    if draft_kv == "history":
        assert not lm.drafter.pool.prefix_reuse_enabled
    ref = load(random_models[name], page_size=page_size, max_seq_len=96)
    ref.pool.prefix_reuse_enabled = False
    spy = RoundSpy(lm, monkeypatch)
    n = 24 if CI else 40
    plain = {tuple(p): ref.generate(p, n, speculative_tokens=0) for p in RANDOM_PROMPTS}
    accepted = proposed = 0
    for k in ([2] if CI else [1, 2, 3, 4]):
        for p in RANDOM_PROMPTS:
            c = lm.generate(p, n, speculative_tokens=k)
            same_completion(c, plain[tuple(p)])
            rounds = spy.take()
            check_rounds(c, rounds, k)
            accepted += c.stats["accepted_drafts"]
            proposed += c.stats["proposed_drafts"]
            assert_pools_clean(lm)
        batch = lm.generate_batch(RANDOM_PROMPTS, n, speculative_tokens=k)
        assert_pools_clean(lm)
        for p, c in zip(RANDOM_PROMPTS, batch):
            same_completion(c, plain[tuple(p)])
            assert c.stats["cached_tokens"] > 0 or len(p) <= page_size  # the generate calls above cached them
            check_rounds(c, spy.take(p), k)
    rate = accepted / proposed
    if name == "good_drafts" and draft_kv == "history":  # long accepted runs ran (prefix hits shorten the
        assert rate > 0.15  # history's context, so not always)
    elif name != "good_drafts":
        assert rate < 0.2  # random drafts are mostly rejected: the rejection path is what ran


def test_history_drafts_see_the_whole_context(random_models):
    """On the model whose MTP head copies its one layer, history-mode drafts see the whole verified context
    (except token 0) and nearly always agree with the target; per-round drafts see one position and mostly do
    not. A history that lost positions or misplaced them would fall towards the per-round rate."""
    rates = {}
    for draft_kv in ("history", "per_round"):
        lm = load(random_models["good_drafts"], draft_kv=draft_kv)
        lm.pool.prefix_reuse_enabled = False
        stats = [lm.generate(p, 40, speculative_tokens=3).stats for p in RANDOM_PROMPTS[:2]]
        rates[draft_kv] = sum(s["accepted_drafts"] for s in stats) / sum(s["proposed_drafts"] for s in stats)
        assert_pools_clean(lm)
    assert rates["history"] > 0.8 and rates["per_round"] < 0.5, rates


def test_model_without_mtp_head_decodes_plainly(tmp_path, monkeypatch):
    folder = build_mtp_model(tmp_path / "no_mtp", "llama", seed=9, mtp_num_hidden_layers=0,
                             speculative_config=None)
    lm = load(folder)
    assert lm.transformer.mtp is None and lm.drafter is None
    assert lm.serving_context.speculative_tokens_for(3) == 0 and lm.serving_context.speculative_tokens_for(None) == 0
    a = lm.generate(RANDOM_PROMPTS[0], 12, speculative_tokens=0)
    b = lm.generate(RANDOM_PROMPTS[0], 12, speculative_tokens=3, draft_sampling="sample")
    same_completion(a, b)
    assert b.stats["speculative_rounds"] == 0 and b.stats["target_forwards_per_token"] == 1.0
    with pytest.raises(ValueError):
        lm.generate(RANDOM_PROMPTS[0], 4, speculative_tokens=-1)
    with pytest.raises(RuntimeError, match="no MTP head"):
        lm.transformer.draft(torch.zeros(1, 1, dtype=torch.int64), torch.zeros(1, 1, lm.config.hidden_size),
                             np.array([0]), lm.pool, lm.backend)
    with pytest.raises(ValueError):
        MtpHistoryDrafter(lm.transformer, lm.pool, lm.backend)
    with pytest.raises(ValueError):
        MtpPerRoundDrafter(lm.transformer, lm.pool, lm.backend)
    assert_clean(lm.pool)


# ---------------------------------------------------------------------------------------------- 5. temperature 1
TEMP_RUNS = 300 if CI else 1500
TEMP_PROMPT = [1, 4, 2, 5, 0, 3]
TEMP_NEW = 4  # t1 from the prefill, then a round of 2 drafts covers t2..t4


@pytest.fixture(scope="module")
def tiny_vocab_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_mtp_model(tmp_path_factory.mktemp("vocab6"), "llama", seed=3, vocab=6, hidden=16)


def _target_probs(logits: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    """softmax(logits / T) restricted to the smallest most-likely set reaching top_p, renormalised (float64)."""
    probs = torch.softmax(logits.double() / temperature, -1)
    if top_p < 1.0:
        sorted_p, order = probs.sort(-1, descending=True)
        keep = (sorted_p.cumsum(-1) - sorted_p) < top_p
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_p * keep)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def _exact_joint(lm: LanguageModel, temperature: float, top_p: float) -> dict[tuple[int, ...], float]:
    """P(t1..t4 | prompt) from full forwards over every 3-token continuation."""
    v = lm.config.vocab_size
    joint: dict[tuple[int, ...], float] = {}
    p0 = len(TEMP_PROMPT) - 1
    for head in itertools.product(range(v), repeat=TEMP_NEW - 1):
        probs = _target_probs(exact_logits(lm, TEMP_PROMPT + list(head)), temperature, top_p)
        pre = float(probs[p0, head[0]] * probs[p0 + 1, head[1]] * probs[p0 + 2, head[2]])
        for t4 in range(v):
            joint[head + (t4,)] = pre * float(probs[p0 + 3, t4])
    assert abs(sum(joint.values()) - 1.0) < 1e-9
    return joint


def _project(joint: dict[tuple[int, ...], float], idx: tuple[int, ...]) -> dict[tuple[int, ...], float]:
    out: dict[tuple[int, ...], float] = Counter()  # type: ignore[assignment]
    for seq, pr in joint.items():
        out[tuple(seq[i] for i in idx)] += pr
    return dict(out)


SAMPLING_MODES = {  # id -> (speculative_tokens, draft_sampling, temperature, top_p); plain is the reference check
    "plain": (0, "greedy", 1.0, 1.0),
    "greedy-drafts": (2, "greedy", 1.0, 1.0),
    "sampled-drafts": (2, "sample", 1.0, 1.0),
    "sampled-drafts-T0.7-top_p0.9": (2, "sample", 0.7, 0.9),
    "greedy-drafts-T0.7-top_p0.9": (2, "greedy", 0.7, 0.9),
}
if CI:  # the plain run only checks the reference computation; the others overlap
    for _mode in ("plain", "greedy-drafts", "sampled-drafts-T0.7-top_p0.9"):
        del SAMPLING_MODES[_mode]


@pytest.mark.parametrize("mode", list(SAMPLING_MODES))
def test_sampled_output_has_the_target_distribution(tiny_vocab_model, monkeypatch, mode):
    """N seeded runs of 4 new tokens (t1 from the prefill, then a round of 2 drafts): the empirical joint of
    neighbouring tokens fits the exact target distribution (chi-square, alpha 1e-3, rare cells pooled)."""
    k, draft_sampling, temperature, top_p = SAMPLING_MODES[mode]
    lm = load(tiny_vocab_model, page_size=16, max_seq_len=16)
    assert lm.config.vocab_size == 6
    joint = _exact_joint(lm, temperature, top_p)
    spy = RoundSpy(lm, monkeypatch)
    seqs: Counter = Counter()
    proposed = accepted = 0
    for seed in range(1, TEMP_RUNS + 1):
        c = lm.generate(TEMP_PROMPT, TEMP_NEW, temperature=temperature, top_p=top_p, seed=seed,
                        speculative_tokens=k, draft_sampling=draft_sampling)
        assert len(c.tokens) == TEMP_NEW and c.finish_reason == "length"
        seqs[tuple(c.tokens)] += 1
        rounds = spy.take()
        if k:
            check_rounds(c, rounds, k)
            assert rounds[0].n == 2  # after t1: the round drafts t2 and t3 (t4 is its bonus)
        else:
            assert not rounds
        proposed += c.stats["proposed_drafts"]
        accepted += c.stats["accepted_drafts"]
    assert_pools_clean(lm)
    if k:
        assert 0 < accepted < proposed  # both paths of the acceptance rule ran
    for idx in [(0, 1), (1, 2), (2, 3), (1, 3)]:
        proj: Counter = Counter()
        for seq, cnt in seqs.items():
            proj[tuple(seq[i] for i in idx)] += cnt
        assert_fits(proj, _project(joint, idx), f"tokens {idx}, {mode}")


@pytest.mark.parametrize("draft_sampling", ["greedy", "sample"])
def test_sampled_speculative_logprobs_are_the_raw_model_logprobs(tiny_vocab_model, draft_sampling):
    """With sampling and speculation, each logprob is log softmax(logits) of the chosen token at its position
    (before temperature and top-p), one per token."""
    lm = load(tiny_vocab_model, page_size=16, max_seq_len=16)
    p0 = len(TEMP_PROMPT) - 1
    for seed in range(1, 21):
        c = lm.generate(TEMP_PROMPT, TEMP_NEW, temperature=0.7, top_p=0.9, seed=seed, speculative_tokens=2,
                        draft_sampling=draft_sampling, logprobs=True)
        assert c.logprobs is not None and len(c.logprobs) == len(c.tokens) == TEMP_NEW
        logp = torch.log_softmax(exact_logits(lm, TEMP_PROMPT + c.tokens[:-1]), -1)[p0:]
        want = logp.gather(-1, torch.tensor(c.tokens)[:, None])[:, 0]
        np.testing.assert_allclose(c.logprobs, want.numpy(), atol=1e-4)
    assert_pools_clean(lm)


# ---------------------------------------------------------------------------------------------- 6. MTP history
@pytest.mark.parametrize("page_size", [1, 4])
def test_mtp_history_chunking_does_not_change_the_draft(random_models, page_size):
    """Transformer.draft over 12 MTP positions one-shot vs in chunks [0,5) [5,6) [6,7) [7,12) on another pool:
    the logits and head outputs at every chunk end agree, and so does the K/V the history holds."""
    lm = load(random_models["qwen3_tied"])
    tr: Transformer = lm.transformer
    c = lm.config
    g = torch.Generator().manual_seed(11)
    tokens = torch.randint(0, c.vocab_size, (1, 12), generator=g)
    hidden = torch.randn(1, 12, c.hidden_size, generator=g)
    backend = select_backend(torch.device("cpu"))

    def mtp_pool() -> tuple[KvCachePool, int]:
        pool = KvCachePool(c.mtp_num_hidden_layers, 16, c.num_key_value_heads, c.head_dim, page_size)
        pool.prefix_reuse_enabled = False
        return pool, pool.bind_request([], 12)

    one, one_id = mtp_pool()
    chunked, chunked_id = mtp_pool()
    full_rows = {}
    for end in (5, 6, 7, 12):
        one.activate_step(one_id)
        full_rows[end] = tr.draft(tokens, hidden, np.array([0]), one, backend, cols=np.array([end - 1]))
    for start, end in ((0, 5), (5, 6), (6, 7), (7, 12)):
        chunked.activate_step(chunked_id)
        out = tr.draft(tokens[:, start:end], hidden[:, start:end], np.array([start]), chunked, backend)
        assert (out.logits - full_rows[end].logits).abs().max().item() < 1e-5, (start, end)
        assert (out.hidden - full_rows[end].hidden).abs().max().item() < 1e-5, (start, end)
    one.activate_step(one_id)
    chunked.activate_step(chunked_id)
    for layer in range(c.mtp_num_hidden_layers):
        k1, v1 = one.get(layer, 12)
        k2, v2 = chunked.get(layer, 12)
        assert (k1 - k2).abs().max().item() < 1e-5 and (v1 - v2).abs().max().item() < 1e-5
    assert one.kv_len(one_id) == chunked.kv_len(chunked_id) == 12


def _reference_drafts(lm: LanguageModel, ids: list[int], offset: int, n: int) -> list[torch.Tensor]:
    """What history-mode drafting must compute for a sequence whose last token is ``ids[-1]``: the target's true
    pre-norm hidden rows h_i (one full forward), MTP positions ``[offset, last)`` fed (token i+1, h_i) on a fresh MTP
    pool, then chained greedy steps fed the head's own output. Returns the logits of each draft step."""
    c = lm.config
    last = len(ids) - 1
    backend = select_backend(torch.device("cpu"))
    main = KvCachePool.for_testing(KvCacheLayout(c.num_hidden_layers, c.num_key_value_heads, c.head_dim, 1, last))
    main.activate_step(main.bind_request([], last))
    hidden = lm.transformer(torch.tensor([ids[:last]]), np.array([0]), main, backend).hidden  # [1, last, D]
    mtp = KvCachePool.for_testing(KvCacheLayout(c.mtp_num_hidden_layers, c.num_key_value_heads, c.head_dim, 1,
                                                last - offset + n))
    mtp.activate_step(mtp.bind_request([], last - offset + n))
    out = lm.transformer.draft(torch.tensor([ids[offset + 1 : last + 1]]), hidden[:, offset:last], np.array([0]),
                               mtp, backend)
    logits = [out.logits[0]]
    for d in range(1, n):
        token = torch.tensor([[int(logits[-1].argmax())]])
        out = lm.transformer.draft(token, out.hidden[:, None], np.array([last - offset + d - 1]), mtp, backend)
        logits.append(out.logits[0])
    return logits


@pytest.mark.parametrize("draft_kv", ["history", "per_round"])
@pytest.mark.parametrize("batched", [False, True], ids=["generate", "generate_batch"])
def test_drafts_equal_a_from_scratch_mtp_computation(monkeypatch, batched, draft_kv):
    """Every greedy draft is the argmax of the MTP head over the verified context only (true hidden states, no
    draft's guess, the history starting at the matched prefix), chained on the head's own output. Per-round
    drafting sees only the last true position (as a history that starts at ``last_pos - 1``)."""
    lm = LanguageModel.default(max_seq_len=256, draft_kv=draft_kv)
    assert isinstance(lm.drafter, DRAFTER_CLASS[draft_kv])
    records: list[tuple[list[int], int, int, list[int]]] = []
    real = lm.drafter.propose

    def spy(seqs, n):  # type: ignore[no-untyped-def]
        before = [(list(s.prompt) + list(s.tokens),
                   s.history.offset if draft_kv == "history" else s.last_pos - 1) for s in seqs]
        drafts, probs = real(seqs, n)
        for (ids, offset), row in zip(before, drafts.tolist()):
            records.append((ids, offset, n, row))
        return drafts, probs

    monkeypatch.setattr(lm.drafter, "propose", spy)
    rounds = 10 if CI else 25
    n = 20 if CI else 30
    # three prompts: in a batch the last two are prefilled (and their histories absorbed) in one padded forward
    prompts = [SHARED_HEADER + "def main(", SHARED_HEADER + "class Archive:\n    def ", SHARED_HEADER + "x = ("]
    for i in range(2):  # the second pass matches prefixes: the history starts at the matched length
        if batched:
            out = lm.generate_batch(prompts, n, speculative_tokens=3)
        else:
            out = [lm.generate(p, n, speculative_tokens=3) for p in prompts]
        assert all((c.stats["cached_tokens"] > 0) == (i == 1 or j >= 1) for j, c in
                   enumerate(out))
    assert_pools_clean(lm)
    assert len({offset for _, offset, _, _ in records}) > 2
    checked = 0
    for ids, offset, n, row in records[:: max(1, len(records) // rounds)]:
        ref = _reference_drafts(lm, ids, offset, n)
        for d, (logits, draft) in enumerate(zip(ref, row)):
            # the draft is the reference argmax (up to float noise between near-equal logits)
            assert float(logits.max() - logits[draft]) < 1e-4, (len(ids), offset, d, row)
            if d < n - 1 and int(logits.argmax()) != draft:
                break  # the chains diverged at a near-tie; later steps are not comparable
        checked += 1
    assert checked >= rounds


CHUNKED_ROUNDS = 25 if CI else 40


@pytest.mark.parametrize("chunks", [(7, 6, 7), (1, 1, 18)] if CI else [(7, 6, 7), (20,), (1, 1, 18)])
def test_chunked_prefill_then_speculative_steps_match_plain(plain_default, chunks):
    """Reference 8.7 (2): a 20-token prompt prefilled in chunks through ModelRunner.prefill, then ModelRunner.step with 2
    drafts: the history reaches the last token before every step (no plain fallback) and 40 rounds produce plain
    greedy decoding's tokens."""
    lm = LanguageModel.default(max_seq_len=256)
    ids = lm.encode(DEFAULT_PROMPTS[2])[:20]
    limit = 150
    rid = lm.pool.bind_request(ids, len(ids) + limit)
    request = lm.request(ids, SamplingParams(limit, speculative_tokens=2))
    handle = RequestHandle(1, request, lm.serving_loop)
    seq = lm.serving_context.row(handle, rid, lm.pool.matched_prefix_len(rid), len(ids) + limit)
    try:
        assert lm.drafter.bind(seq, len(ids) + limit)
        for i, size in enumerate(chunks):
            assert lm.runner.prefill(seq, size) == (i == len(chunks) - 1)
        seq.take_next()
        while seq.rounds < CHUNKED_ROUNDS:
            assert lm.drafter.ready(seq) and seq.draft_budget() == 2
            lm.runner.step([seq])
        assert seq.forwards == len(chunks) + CHUNKED_ROUNDS
    finally:
        lm.drafter.release(seq)
        lm.pool.finish_request(rid, ids + seq.tokens)
    assert_pools_clean(lm)
    want = plain_default(ids, limit).tokens
    assert len(seq.tokens) >= CHUNKED_ROUNDS + 1 and seq.tokens == want[: len(seq.tokens)]


# ---------------------------------------------------------------------------------------------- 7. radix tree
def _reference_kv(lm: LanguageModel, ids: list[int]) -> torch.Tensor:
    """K of every layer for ``ids`` from one plain full forward on a private pool: ``[L, len, Hkv, D]``."""
    c = lm.config
    pool = KvCachePool.for_testing(KvCacheLayout(c.num_hidden_layers, c.num_key_value_heads, c.head_dim, 1,
                                                 len(ids)))
    rid = pool.bind_request([], len(ids))
    pool.activate_step(rid)
    lm.transformer(torch.tensor([ids]), np.array([0]), pool, lm.backend)
    return torch.stack([pool.get(layer, len(ids))[0][0] for layer in range(c.num_hidden_layers)])


def _tree_paths(pool: KvCachePool) -> list[list[int]]:
    """The token sequence from the root to every node."""
    paths = []
    for node in pool.radix.nodes():
        keys, n = [], node
        while n.parent is not None:
            keys.append(n.key.tolist())
            n = n.parent
        paths.append([t for key in reversed(keys) for t in key])
    return paths


def check_tree_holds_only(lm: LanguageModel, seq: list[int], expected_len: int) -> None:
    """The tree holds exactly ``seq[:expected_len]``: no path leaves ``seq``, matching ``seq`` returns that
    length, and the cached K equal a plain forward's (no rejected draft's KV)."""
    for path in _tree_paths(lm.pool):
        assert path == seq[: len(path)], "a tree path diverges from prompt + tokens"
    assert lm.pool.radix.total_size() == expected_len
    m = lm.pool.radix.match_prefix(seq)
    assert m.length == expected_len
    if expected_len:
        cached = lm.pool.key_cache[:, torch.from_numpy(m.indices)]
        want = _reference_kv(lm, seq[:expected_len])
        assert (cached - want).abs().max().item() < 1e-4
    lm.pool.check_invariants()


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("k", [1, 4])
def test_rejected_drafts_never_reach_the_radix_tree(page_size, k, plain_default):
    prompt = DEFAULT_PROMPTS[3]
    rejected = 0
    for n in (30, 16 * 7 - len(prompt.encode())):  # the second ends exactly on a page boundary
        lm = LanguageModel.default(max_seq_len=256, page_size=page_size)
        c = lm.generate(prompt, n, speculative_tokens=k)
        same_completion(c, plain_default(prompt, n))
        assert c.stats["speculative_rounds"] > 0
        rejected += c.stats["proposed_drafts"] - c.stats["accepted_drafts"]
        seq = c.prompt_tokens + c.tokens
        # the last token's KV is never written, so the tree ends at floor_page(len - 1), as in plain decoding
        check_tree_holds_only(lm, seq, floor_page(len(seq) - 1, page_size))
        assert_pools_clean(lm)
    assert rejected > 0  # some window positions held rejected drafts


@pytest.mark.parametrize("page_size", [1, 16])
def test_cancel_after_a_partly_rejected_round_caches_only_verified_kv(plain_default, monkeypatch, page_size):
    """Cancelled between rounds, generate() inserts what was written: after a round that rejected drafts that is
    the prompt and tokens up to the last one (sealed), never the window's rejected tail (the last token's slot
    held a rejected draft's K/V)."""
    prompt = DEFAULT_PROMPTS[1]
    full = plain_default(prompt, 60)
    after_rejection = 0
    for polls in range(2, 8 if CI else 18):
        lm = LanguageModel.default(max_seq_len=256, page_size=page_size)
        spy = RoundSpy(lm, monkeypatch)
        count = [0]

        def cancel(count: list[int] = count, polls: int = polls) -> bool:
            count[0] += 1
            return count[0] > polls

        with pytest.raises(GenerationCancelled):
            lm.generate(prompt, 60, speculative_tokens=3, cancel=cancel)
        assert_pools_clean(lm)
        rounds = spy.take()
        assert len(rounds) == polls - 1  # poll 1: the prefill and token 1; every later poll: one round
        generated = 1 + sum(r.result.num_tokens for r in rounds)
        for r in rounds:
            assert list(r.result.tokens) == full.tokens[r.start : r.start + r.result.num_tokens]
        seq = lm.encode(prompt) + full.tokens[:generated]
        check_tree_holds_only(lm, seq, floor_page(len(seq) - 1, page_size))
        after_rejection += rounds[-1].result.num_accepted < rounds[-1].n
    assert after_rejection > 0


# ---------------------------------------------------------------------------------------------- 8. logprobs
@pytest.mark.parametrize("k", [1, 3])
def test_speculative_logprobs_equal_plain(default_lm, plain_default, k):
    n = 40 if CI else 80
    for prompt in DEFAULT_PROMPTS[:2]:
        want = plain_default(prompt, n, logprobs=True)
        c = default_lm.generate(prompt, n, speculative_tokens=k, logprobs=True)
        same_completion(c, want)
        assert c.logprobs is not None and len(c.logprobs) == len(c.tokens)
        assert all(math.isfinite(x) and x <= 0 for x in c.logprobs)
        np.testing.assert_allclose(c.logprobs, want.logprobs, atol=1e-4)
        assert default_lm.generate(prompt, 8, speculative_tokens=k).logprobs is None
    batch = default_lm.generate_batch(DEFAULT_PROMPTS[:2], n, speculative_tokens=k, logprobs=True)
    for prompt, c in zip(DEFAULT_PROMPTS[:2], batch):
        assert len(c.logprobs) == len(c.tokens)
        np.testing.assert_allclose(c.logprobs, plain_default(prompt, n, logprobs=True).logprobs, atol=1e-4)
    assert_pools_clean(default_lm)


# ---------------------------------------------------------------------------------------------- 9. bad input
BAD_SPEC = [{"speculative_tokens": -1}, {"speculative_tokens": True}, {"speculative_tokens": 1.5},
            {"speculative_tokens": "2"}, {"draft_sampling": "beam"}, {"draft_sampling": None},
            {"draft_sampling": "Greedy"}]


@pytest.mark.parametrize("kw", BAD_SPEC, ids=[repr(kw) for kw in BAD_SPEC])
def test_bad_speculative_arguments(default_lm, kw):
    default_lm.generate("def f(x):\n    return ", 6)  # something in the tree first
    before = default_lm.pool.stats()
    for call in (lambda: default_lm.generate("def f(x):\n    return ", 4, **kw),
                 lambda: default_lm.generate_batch(["def f(x):\n", "import "], 4, **kw)):
        with pytest.raises(ValueError):
            call()
        assert_pools_clean(default_lm)
        assert default_lm.pool.stats() == before
    assert default_lm.generate("def f(x):\n    return ", 4).stats["cached_tokens"] > 0  # still usable


def test_speculative_tokens_above_the_cap_use_seven(default_lm, plain_default, monkeypatch):
    spy = RoundSpy(default_lm, monkeypatch)
    c = default_lm.generate(DEFAULT_PROMPTS[0], 60, speculative_tokens=99)
    rounds = spy.take()
    assert max(r.n for r in rounds) == 7
    check_rounds(c, rounds, 7)
    same_completion(c, plain_default(DEFAULT_PROMPTS[0], 60))


# ---------------------------------------------------------------------------------------------- 10. stops
def _inside_round_positions(rounds: list[Round], tokens: list[int]) -> list[int]:
    """Indices of tokens that a round produced as an accepted draft (not its last token), first occurrences."""
    out = []
    for r in rounds:
        for j in range(r.result.num_tokens - 1):
            i = r.start + j
            if i >= 2 and tokens[i] not in tokens[:i]:
                out.append(i)
    return out


@pytest.mark.parametrize("k", [2, 4])
def test_stop_token_inside_a_round_ends_like_plain(plain_default, monkeypatch, k):
    lm = LanguageModel.default(max_seq_len=256)
    spy = RoundSpy(lm, monkeypatch)
    prompt = DEFAULT_PROMPTS[1]
    full = lm.generate(prompt, 60, speculative_tokens=k)
    positions = _inside_round_positions(spy.take(), full.tokens)
    assert positions, "no round accepted a draft that is a first occurrence"
    for i in positions[:3]:
        stop = full.tokens[i]
        want = plain_default(prompt, 60, stop=stop, logprobs=True)
        assert want.tokens == full.tokens[:i] and want.finish_reason == "stop"
        fresh = LanguageModel.default(max_seq_len=256)
        rec = Recorder()
        c = fresh.generate(prompt, 60, speculative_tokens=k, stop=stop, logprobs=True, listener=rec)
        same_completion(c, want)
        assert rec.generated == i and "".join(rec.chunks) == c.text
        assert len(c.logprobs) == i
        np.testing.assert_allclose(c.logprobs, want.logprobs, atol=1e-4)
        assert_pools_clean(fresh)
        # plain decoding forwarded the last kept token before sampling the stop id: floor_page(len) is cached
        seq = c.prompt_tokens + c.tokens
        check_tree_holds_only(fresh, seq, floor_page(len(seq), 16))
    assert_pools_clean(lm)


@pytest.mark.parametrize("k", [2, 4])
def test_stop_string_inside_a_round_ends_like_plain(plain_default, monkeypatch, k):
    lm = LanguageModel.default(max_seq_len=256)
    spy = RoundSpy(lm, monkeypatch)
    prompt = DEFAULT_PROMPTS[0]
    full = lm.generate(prompt, 60, speculative_tokens=k)
    rounds = spy.take()
    # stop strings that start inside a round, of 1 to 3 characters (byte tokens: text index == token index)
    assert full.text == lm.tokenizer.decode(full.tokens) and len(full.text) == len(full.tokens)
    starts = [r.start + j for r in rounds for j in range(r.result.num_tokens - 1)][:4]
    assert starts
    for start, length in zip(starts, itertools.cycle((1, 2, 3))):
        s = full.text[start : start + length]
        want = plain_default(prompt, 60, stop=[s])
        assert want.finish_reason == "stop"
        fresh = LanguageModel.default(max_seq_len=256)
        rec = Recorder()
        c = fresh.generate(prompt, 60, speculative_tokens=k, stop=[s], listener=rec)
        same_completion(c, want)
        assert s not in c.text and c.text == full.text[: full.text.find(s)]
        assert rec.generated == len(c.tokens) and "".join(rec.chunks) == c.text and all(rec.chunks)
        assert_pools_clean(fresh)
        seq = c.prompt_tokens + c.tokens
        for path in _tree_paths(fresh.pool):
            assert path == seq[: len(path)]
    batch = LanguageModel.default(max_seq_len=256).generate_batch([prompt, DEFAULT_PROMPTS[2]], 60,
                                                                  speculative_tokens=k, stop=[full.text[starts[0]]])
    for p, c in zip([prompt, DEFAULT_PROMPTS[2]], batch):
        same_completion(c, plain_default(p, 60, stop=[full.text[starts[0]]]))


# ---------------------------------------------------------------------------------------------- 11. length cuts
@pytest.mark.parametrize("n", [0, 1, 2, 3, 5, 6, 11])
def test_max_new_tokens_cuts_rounds_short(default_lm, plain_default, monkeypatch, n):
    spy = RoundSpy(default_lm, monkeypatch)
    prompt = DEFAULT_PROMPTS[2]
    c = default_lm.generate(prompt, n, speculative_tokens=4)
    assert len(c.tokens) == n and c.finish_reason == "length" and c.stats["generated_tokens"] == n
    same_completion(c, plain_default(prompt, n))
    rounds = spy.take()
    check_rounds(c, rounds, 4)
    if n <= 2:
        assert not rounds  # after the prefill's token a budget of 1 leaves no room for a draft
    else:
        assert rounds[0].n == min(4, n - 2)
    assert_pools_clean(default_lm)
    batch = default_lm.generate_batch([prompt, DEFAULT_PROMPTS[0]], n, speculative_tokens=4)
    assert [len(b.tokens) for b in batch] == [n, n]
    assert batch[0].tokens == c.tokens
    assert batch[1].tokens == plain_default(DEFAULT_PROMPTS[0], n).tokens
    assert_pools_clean(default_lm)


@pytest.mark.parametrize("k", [4, 7])
def test_max_seq_len_cuts_rounds_short(plain_default, monkeypatch, k):
    """The pool's per-request capacity ends generation at max_seq_len, inside what a round would draft."""
    lm = LanguageModel.default(max_seq_len=64)
    spy = RoundSpy(lm, monkeypatch)
    prompt = (SHARED_HEADER * 2)[:49]
    c = lm.generate(prompt, 100, speculative_tokens=k)
    assert len(c.tokens) == 64 - 49 and c.finish_reason == "length"
    same_completion(c, plain_default(prompt, 64 - 49))
    check_rounds(c, spy.take(), k)
    assert_pools_clean(lm)


# ---------------------------------------------------------------------------------------------- sampling settings
@pytest.mark.parametrize("draft_sampling", ["greedy", "sample"])
def test_tiny_top_p_speculation_is_greedy(default_lm, plain_default, draft_sampling):
    """top_p ~ 0 keeps only the most likely token of target and draft: the output is plain greedy decoding."""
    for prompt in DEFAULT_PROMPTS[:2]:
        c = default_lm.generate(prompt, 40, temperature=1.0, top_p=1e-6, seed=3, speculative_tokens=3,
                                draft_sampling=draft_sampling)
        same_completion(c, plain_default(prompt, 40))
        assert c.stats["accepted_drafts"] > 0
    assert_pools_clean(default_lm)


@pytest.mark.parametrize("draft_sampling", ["greedy", "sample"])
def test_seeded_speculative_sampling_reproduces_on_the_same_cache_state(default_lm, draft_sampling):
    kw = {"temperature": 0.8, "top_p": 0.95, "speculative_tokens": 3, "draft_sampling": draft_sampling}
    n = 24 if CI else 40
    default_lm.generate(DEFAULT_PROMPTS[0], n, seed=11, **kw)  # the prompt's pages are cached from now on
    a = default_lm.generate(DEFAULT_PROMPTS[0], n, seed=11, **kw)
    b = default_lm.generate(DEFAULT_PROMPTS[0], n, seed=11, **kw)
    c = default_lm.generate(DEFAULT_PROMPTS[0], n, seed=12, **kw)
    assert a.stats["cached_tokens"] == b.stats["cached_tokens"] > 0
    assert a.tokens == b.tokens and a.text == b.text and a.tokens != c.tokens
    assert a.stats["speculative_rounds"] > 0
    default_lm.generate_batch(DEFAULT_PROMPTS[:2], n, seed=5, **kw)
    batch = [default_lm.generate_batch(DEFAULT_PROMPTS[:2], n, seed=5, **kw) for _ in range(2)]
    assert [x.tokens for x in batch[0]] == [x.tokens for x in batch[1]]
    assert_pools_clean(default_lm)


def test_seeded_sampling_does_not_depend_on_the_cache_state():
    """generate() promises that a nonzero seed makes the output reproducible: a cold call and a prefix hit (which
    shortens the MTP history, so the drafts and rounds differ) give the same tokens, and with greedy drafts they
    are the very tokens plain sampling draws with that seed."""
    lm = LanguageModel.default(max_seq_len=256)
    plain = {}
    for prompt in DEFAULT_PROMPTS[:2]:
        runs = [lm.generate(prompt, 40, temperature=0.8, seed=1, speculative_tokens=0) for _ in range(2)]
        assert runs[0].tokens == runs[1].tokens  # plain decoding reproduces, cold or warm
        plain[prompt] = runs[0].tokens
    lm = LanguageModel.default(max_seq_len=256)
    for prompt in DEFAULT_PROMPTS[:2]:
        cold = lm.generate(prompt, 40, temperature=0.8, seed=1)  # defaults: 3 greedy drafts per round
        warm = lm.generate(prompt, 40, temperature=0.8, seed=1)
        assert cold.stats["cached_tokens"] == 0 < warm.stats["cached_tokens"]
        assert cold.stats["speculative_rounds"] > 0
        assert cold.tokens == warm.tokens == plain[prompt]


# ---------------------------------------------------------------------------------------------- errors
@pytest.mark.parametrize("draft_kv", ["history", "per_round"])
@pytest.mark.parametrize("where, fail_on_call", [("mtp", 3), ("main", 4)], ids=["in-a-draft", "in-a-verify"])
def test_error_inside_a_round_releases_both_pools(random_models, monkeypatch, draft_kv, where, fail_on_call):
    """An exception in a verify forward: generate and generate_batch raise it. One in a draft step fails only that
    round (a RuntimeWarning names it; the rows decode plainly, with the same tokens). Either way both pools are
    left clean, and the model still decodes losslessly afterwards."""
    lm = load(random_models["llama"], draft_kv=draft_kv)
    want = {tuple(p): lm.generate(p, 16, speculative_tokens=0) for p in RANDOM_PROMPTS}
    want_extra = {tuple(p + [9]): lm.generate(p + [9], 16, speculative_tokens=0) for p in RANDOM_PROMPTS[1:3]}
    layer = lm.transformer.mtp.layers[0] if where == "mtp" else lm.transformer.model.layers[-1]
    real = layer.forward
    for call in (lambda: lm.generate(RANDOM_PROMPTS[1] + [9], 16, speculative_tokens=3),
                 lambda: lm.generate_batch([RANDOM_PROMPTS[1] + [9], RANDOM_PROMPTS[2] + [9]], 16,
                                           speculative_tokens=3)):
        calls = []

        def flaky(*args, _calls=calls, **kwargs):  # type: ignore[no-untyped-def]
            _calls.append(1)
            if len(_calls) == fail_on_call:
                raise RuntimeError("injected failure")
            return real(*args, **kwargs)

        monkeypatch.setattr(layer, "forward", flaky)
        if where == "main":
            with pytest.raises(RuntimeError, match="injected"):
                call()
        else:
            with pytest.warns(RuntimeWarning, match="injected failure"):
                out = call()
            outs = out if isinstance(out, list) else [out]
            assert [o.tokens for o in outs] == [want_extra[tuple(o.prompt_tokens)].tokens for o in outs]
            assert sum(o.stats["draft_errors"] for o in outs) >= 1
        monkeypatch.setattr(layer, "forward", real)
        assert_pools_clean(lm)
    for p in RANDOM_PROMPTS:
        same_completion(lm.generate(p, 16, speculative_tokens=3), want[tuple(p)])
    assert_pools_clean(lm)


# ---------------------------------------------------------------------------------------------- large batches
@pytest.mark.parametrize("page_size, rows, max_batch_size", [(16, 257, 65)] if CI else [(1, 330, 64), (16, 257, 65)])
def test_per_round_drafting_with_a_batch_larger_than_its_pool(random_models, page_size, rows, max_batch_size):
    """The per-round pool holds max(256, rows) x ceil_page(9) slots; the history pool as many as the main pool.
    History mode serves such a batch (rows it cannot hold decode plainly); per-round mode drafts it in several
    rounds of at most what its pool holds, never raising."""
    prompts = [[(3 * i) % 97, (7 * i + 1) % 97] for i in range(rows)]
    lm = load(random_models["qwen3_tied"], page_size=page_size, max_seq_len=64, max_batch_size=max_batch_size,
              draft_kv="per_round")
    want = [c.tokens for c in lm.generate_batch(prompts, 10, speculative_tokens=0)]
    assert_pools_clean(lm)
    try:
        got = lm.generate_batch(prompts, 10, speculative_tokens=7)
    finally:
        assert_pools_clean(lm)
    assert [c.tokens for c in got] == want
