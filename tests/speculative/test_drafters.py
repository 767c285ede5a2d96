"""Drafters behind one protocol: n-gram prompt lookup and a drafter written outside the package.

- ``find_ngram_match`` and the drafts it gives against a brute-force oracle (a table and hypothesis);
- the n-gram drafter is lossless: greedy output equals plain greedy decoding on the default model and on a tiny
  random HF model without an MTP head, through ``generate`` and ``generate_batch``; seeded sampling draws plain
  sampling's tokens;
- its rounds are exactly what a simulation of prompt lookup over the plain output predicts (``on_round`` records:
  position, k, drafts, accepted length, tokens), and a repetitive prompt accepts long runs;
- a drafter defined here, registered with ``LanguageModel(..., drafter=...)``, sees the hooks in the documented
  order (hidden rows reported contiguously up to ``last_pos``, bind/release paired, ``max_batch`` honoured) and is
  lossless; bad ``drafter`` arguments and bad proposals raise ``ValueError``.
"""

from __future__ import annotations

import os
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from smile_llm.serving.completion import Completion
from smile_llm.language_model import LanguageModel
from smile_llm.models.checkpoint.config import MAX_SPECULATIVE_TOKENS
from smile_llm.speculative.draft_tree import TreeWalk
from smile_llm.speculative.drafters import Drafter, MtpHistoryDrafter, NgramDrafter, find_ngram_match
from smile_llm.serving.request_row import RequestRow
from smile_llm.speculative.acceptance import RoundRecord

from tests.hf_zoo import assert_clean

CI = os.environ.get("SMILE_TEST_SCALE", "full") == "ci"
NEW = 48 if CI else 96
PROMPTS = [
    "import os\nimport sys\n\n\ndef main(",
    "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n\n\ndef mul(a, b):\n",
    "    for i in range(len(items)):\n        if items[i] ",
]
REPETITIVE = "red green blue, " * 6


# ---------------------------------------------------------------------------------------------- oracles
def brute_match(tokens: list[int], min_n: int, max_n: int) -> tuple[int, int] | None:
    """Longest suffix (``max_n`` down to ``min_n``) that occurred earlier, its most recent occurrence first:
    (start of its continuation, tokens from there to the end)."""
    size = len(tokens)
    for n in range(min(max_n, size - 1), min_n - 1, -1):
        for i in range(size - n - 1, -1, -1):
            if tokens[i : i + n] == tokens[size - n :]:
                return i + n, size - i - n
    return None


def copy_drafts(tokens: list[int], start: int, n: int) -> list[int]:
    """``n`` tokens copied from ``start`` on, the copy running over what it has already copied."""
    ext = list(tokens)
    for t in range(n):
        ext.append(ext[start + t])
    return ext[len(tokens) :]


def simulate_rounds(prompt: list[int], out: list[int], k: int, min_n: int, max_n: int) -> list[RoundRecord]:
    """The rounds an ``NgramDrafter(min_n, max_n)`` request with ``k`` drafts per round runs when its plain greedy
    output is ``out`` (ended by its length): token 0 from the prefill; then a round of ``min(k, remaining - 1)``
    copied drafts where a suffix matches, a plain step where none does."""
    records, i = [], 1
    while i < len(out):
        ctx = prompt + out[:i]
        n = min(k, len(out) - i - 1)
        match = brute_match(ctx, min_n, max_n)
        if n < 1 or match is None:
            i += 1
            continue
        drafts = copy_drafts(ctx, match[0], n)
        r = 0
        while r < n and drafts[r] == out[i + r]:
            r += 1
        records.append(RoundRecord(len(ctx) - 1, n, tuple(drafts), r, tuple(out[i : i + r + 1])))
        i += r + 1
    return records


MATCH_TABLE = [  # tokens, min_n, max_n, expected (start, period)
    ([5, 6, 7, 9, 5, 6], 1, 3, (2, 4)),
    ([5, 6, 7, 9, 5, 6], 3, 3, None),
    ([1, 2, 1, 3, 1], 1, 1, (3, 2)),  # the most recent "1"
    ([3, 1, 2, 7, 1, 2, 9, 3, 1, 2], 1, 3, (3, 7)),  # "3 1 2" beats the more recent "1 2"
    ([1, 1, 1], 1, 3, (2, 1)),  # overlapping occurrence: period 1
    ([4], 1, 3, None),
    ([1, 2, 3], 1, 5, None),
    ([7, 8, 7, 8, 7, 8], 2, 5, (4, 2)),  # "7 8 7 8" ended at 3: drafts 7 8 7 8 ... (period 2)
]


@pytest.mark.parametrize("tokens, min_n, max_n, want", MATCH_TABLE)
def test_find_ngram_match_table(tokens, min_n, max_n, want):
    assert brute_match(tokens, min_n, max_n) == want
    assert find_ngram_match(np.array(tokens, dtype=np.int64), min_n, max_n) == want


@settings(max_examples=150 if CI else 600, deadline=None, database=None)
@given(tokens=st.lists(st.integers(0, 3), max_size=40), min_n=st.integers(1, 4), extra=st.integers(0, 3),
       n=st.integers(1, MAX_SPECULATIVE_TOKENS))
def test_find_ngram_match_equals_brute_force(tokens, min_n, extra, n):
    want = brute_match(tokens, min_n, min_n + extra)
    got = find_ngram_match(np.array(tokens, dtype=np.int64), min_n, min_n + extra)
    assert got == want
    if got is not None:
        start, period = got
        drafts = np.array(tokens)[start + np.arange(n) % period].tolist()
        assert drafts == copy_drafts(tokens, start, n)


def test_ngram_drafter_arguments():
    d = NgramDrafter()
    assert (d.min_n, d.max_n, d.num_speculative_tokens) == (5, 5, 3)  # vLLM's prompt_lookup defaults
    assert isinstance(d, Drafter)
    for kw in ({"min_n": 0}, {"min_n": 3, "max_n": 2}, {"max_n": 1.5}, {"num_speculative_tokens": 0},
               {"num_speculative_tokens": MAX_SPECULATIVE_TOKENS + 1}, {"min_n": True}):
        with pytest.raises(ValueError):
            NgramDrafter(**kw)


# ---------------------------------------------------------------------------------------------- default model
@pytest.fixture(scope="module")
def plain_lm():
    lm = LanguageModel.default(max_seq_len=512, drafter=None)
    lm.pool.prefix_reuse_enabled = False
    assert lm.drafter is None and lm.serving_context.speculative_tokens_for(None) == 0
    yield lm
    lm.close()


@pytest.fixture(scope="module")
def plain(plain_lm):
    """Plain greedy decoding of ``NEW`` tokens on the default model (no drafter), cached per prompt."""
    cache: dict[str, Completion] = {}

    def run(prompt: str) -> Completion:
        if prompt not in cache:
            cache[prompt] = plain_lm.generate(prompt, NEW, speculative_tokens=0)
        return cache[prompt]

    return run


def assert_lm_clean(lm: LanguageModel) -> None:
    assert_clean(lm.pool)
    if isinstance(lm.drafter, MtpHistoryDrafter):
        assert_clean(lm.drafter.pool)


@pytest.mark.parametrize("min_n, max_n", [(5, 5), (1, 3)])
def test_ngram_rounds_are_the_simulated_rounds(plain, min_n, max_n):
    """Every round (position, k, drafts, accepted length, tokens) is what prompt lookup over the plain output
    predicts, the stats agree with them, and the output is plain greedy decoding's."""
    lm = LanguageModel.default(max_seq_len=512, drafter=NgramDrafter(min_n, max_n))
    assert lm.transformer.mtp is not None and isinstance(lm.drafter, NgramDrafter)
    for prompt in [PROMPTS[1], REPETITIVE] if CI else PROMPTS + [REPETITIVE]:
        for k in (1, 3) if CI else (1, 2, 3, 5):
            want = plain(prompt)
            assert want.finish_reason == "length"
            records: list[RoundRecord] = []
            c = lm.generate(prompt, NEW, speculative_tokens=k, on_round=records.append)
            assert c.tokens == want.tokens and c.text == want.text
            assert records == simulate_rounds(lm.encode(prompt), want.tokens, k, min_n, max_n)
            s = c.stats
            assert s["speculative_rounds"] == len(records)
            assert s["proposed_drafts"] == sum(r.k for r in records)
            assert s["accepted_drafts"] == sum(r.num_accepted for r in records)
            plain_steps = len(c.tokens) - 1 - sum(len(r.tokens) for r in records)
            assert s["forwards"] == s["speculative_rounds"] + plain_steps + 1  # one prefill chunk
            assert_lm_clean(lm)
    lm.close()


def test_ngram_accepts_long_runs_on_a_repetitive_prompt(plain):
    lm = LanguageModel.default(max_seq_len=512, drafter="ngram")
    c = lm.generate(REPETITIVE, NEW)  # the drafter's default: 3 drafts per round
    want = plain(REPETITIVE)
    assert c.tokens == want.tokens
    sim = simulate_rounds(lm.encode(REPETITIVE), want.tokens, 3, 5, 5)
    produced = sum(len(r.tokens) for r in sim)
    assert c.stats["mean_accepted_length"] == pytest.approx(produced / len(sim))
    assert c.stats["mean_accepted_length"] > 3.0  # the continuation repeats the prompt: nearly every draft kept
    forwards = len(sim) + len(c.tokens) - 1 - produced  # rounds and plain steps after the prefill's token
    assert c.stats["target_forwards_per_token"] == pytest.approx(forwards / (len(c.tokens) - 1))
    assert c.stats["target_forwards_per_token"] < 0.5
    lm.close()


def test_ngram_generate_batch_is_lossless(plain):
    """Batches with the drafter's default and with 4 drafts per round (every row then from a prefix hit), and a
    plain one."""
    lm = LanguageModel.default(max_seq_len=512, max_batch_size=4, drafter="ngram")
    prompts = PROMPTS + [REPETITIVE]
    want = [plain(p).tokens for p in prompts]
    for spec in (None, 4) if CI else (None, 4, 0):
        got = lm.generate_batch(prompts, NEW, speculative_tokens=spec)
        assert [c.tokens for c in got] == want
        assert (sum(c.stats["speculative_rounds"] for c in got) > 0) == (spec != 0)
        assert all(c.stats["cached_tokens"] > 0 for c in got) == (spec is not None)
        assert_lm_clean(lm)
    lm.close()


def test_ngram_seeded_sampling_equals_plain_sampling(plain_lm):
    """Greedy drafts keep the target's samples: with a seed, the very tokens plain sampling draws."""
    lm = LanguageModel.default(max_seq_len=512, drafter="ngram")
    for prompt in (PROMPTS[1], REPETITIVE):
        want = plain_lm.generate(prompt, NEW, temperature=0.7, seed=3, speculative_tokens=0)
        c = lm.generate(prompt, NEW, temperature=0.7, seed=3, draft_sampling="sample")
        assert c.tokens == want.tokens
    assert c.stats["speculative_rounds"] > 0
    lm.close()


# ---------------------------------------------------------------------------------------------- no MTP head
def test_ngram_on_a_random_hf_model_without_mtp(zoo):
    hf = zoo("llama")
    plain = hf.load(drafter=None)
    assert plain.transformer.mtp is None and plain.drafter is None
    assert hf.load().drafter is None  # "mtp" (the default) without a head: plain decoding
    lm = hf.load(drafter="ngram")
    assert lm.serving_context.speculative_tokens_for(None) == 3 and lm.serving_context.speculative_tokens_for(5) == 5
    assert lm.serving_context.speculative_tokens_for(99) == MAX_SPECULATIVE_TOKENS and lm.serving_context.speculative_tokens_for(0) == 0
    lm = hf.load(drafter=NgramDrafter(1, 3))
    prompts = [[(7 * i + 3) % 97 for i in range(22)], [(11 * i + 5) % 97 for i in range(27)], [4, 8, 15, 4, 8]]
    rounds = 0
    for prompt in prompts:
        want = plain.generate(prompt, 40, speculative_tokens=0)
        for k in (1, 3, 7):
            records: list[RoundRecord] = []
            c = lm.generate(prompt, 40, speculative_tokens=k, on_round=records.append)
            assert c.tokens == want.tokens and c.finish_reason == want.finish_reason
            if want.finish_reason == "length":
                assert records == simulate_rounds(prompt, want.tokens, k, 1, 3)
            rounds += len(records)
            assert_lm_clean(lm)
    batch = lm.generate_batch(prompts, 40, speculative_tokens=3)
    assert [c.tokens for c in batch] == [plain.generate(p, 40, speculative_tokens=0).tokens for p in prompts]
    assert rounds > 0
    assert_lm_clean(lm)


# ---------------------------------------------------------------------------------------------- your own drafter
class ScriptedDrafter:
    """A drafter written outside the package: it knows each prompt's plain greedy answer and proposes it, every
    third round with its last draft spoiled. It checks the hook contract as it goes: hidden rows arrive
    contiguously from the matched length and reach ``last_pos`` whenever it is asked to draft."""

    num_speculative_tokens = 2

    def __init__(self, answers: dict[tuple[int, ...], list[int]], vocab: int) -> None:
        self.answers, self.vocab = answers, vocab
        self.covered: dict[int, int] = {}  # request id -> end of the positions reported so far
        self.bound = self.released = self.rounds = 0
        self.batches: list[int] = []

    def bind(self, seq: RequestRow, final_len: int) -> bool:
        assert final_len == len(seq.prompt) + seq.max_new_tokens
        self.covered[seq.request_id] = seq.matched
        seq.history = self
        self.bound += 1
        return True

    def release(self, seq: RequestRow) -> None:
        if seq.history is self:
            del self.covered[seq.request_id]
            seq.history = None
            self.released += 1

    def ready(self, seq: RequestRow) -> bool:
        if seq.history is not self:
            return False
        assert self.covered[seq.request_id] == seq.last_pos
        return True

    def max_batch(self, n: int) -> int:
        return 2

    def propose(self, seqs: list[RequestRow], n: int) -> tuple[torch.Tensor, None]:
        self.batches.append(len(seqs))
        rows = []
        for seq in seqs:
            done = len(seq.tokens)
            row = self.answers[tuple(seq.prompt)][done : done + n]
            self.rounds += 1
            if self.rounds % 3 == 0:
                row[-1] = (row[-1] + 1) % self.vocab
            rows.append(row)
        return torch.tensor(rows, dtype=torch.int64), None

    def _report(self, seq: RequestRow, start: int, rows: int) -> None:
        if seq.history is self:
            assert start == self.covered[seq.request_id]
            self.covered[seq.request_id] = start + rows

    def extend(self, seq: RequestRow, hidden: torch.Tensor, start: int) -> None:
        self._report(seq, start, hidden.shape[0])

    def absorb(self, seqs: list[RequestRow]) -> None:
        pass

    def commit(self, seq: RequestRow, hidden: torch.Tensor) -> None:
        self._report(seq, seq.last_pos, hidden.shape[0])

    def close(self) -> None:
        pass


def test_a_drafter_of_your_own_is_lossless(plain_lm, plain):
    prompts = PROMPTS
    answers = {tuple(plain_lm.encode(p)): plain(p).tokens for p in prompts}
    drafter = ScriptedDrafter(answers, plain_lm.config.vocab_size)
    lm = LanguageModel(plain_lm.config, plain_lm.transformer, plain_lm.tokenizer, plain_lm.pool, plain_lm.backend,
                       plain_lm.max_seq_len, drafter=drafter)
    assert lm.drafter is drafter and lm.serving_context.speculative_tokens_for(None) == 2
    records: list[RoundRecord] = []
    c = lm.generate(prompts[0], NEW, on_round=records.append)
    assert c.tokens == answers[tuple(lm.encode(prompts[0]))]
    assert all(r.num_accepted == (r.k - 1 if i % 3 == 2 else r.k) for i, r in enumerate(records))
    assert c.stats["accepted_drafts"] == sum(r.num_accepted for r in records) > 0
    batch = lm.generate_batch(prompts, NEW)
    assert [x.tokens for x in batch] == [answers[tuple(lm.encode(p))] for p in prompts]
    assert max(drafter.batches) == 2  # three rows drafting: chunks of max_batch
    assert drafter.bound == drafter.released == 4 and not drafter.covered
    assert_clean(lm.pool)


class WrongShape(ScriptedDrafter):
    def propose(self, seqs: list[RequestRow], n: int) -> tuple[torch.Tensor, None]:
        return torch.zeros(len(seqs), n + 1, dtype=torch.int64), None


def test_bad_drafters_raise_value_error(plain_lm):
    lm = plain_lm
    for bad in ("eagle", "MTP", 3, object()):
        with pytest.raises(ValueError, match="drafter"):
            LanguageModel(lm.config, lm.transformer, lm.tokenizer, lm.pool, lm.backend, lm.max_seq_len, drafter=bad)
    scripted = ScriptedDrafter({}, lm.config.vocab_size)
    scripted.num_speculative_tokens = 0
    with pytest.raises(ValueError, match="num_speculative_tokens"):
        LanguageModel(lm.config, lm.transformer, lm.tokenizer, lm.pool, lm.backend, lm.max_seq_len, drafter=scripted)
    prompt = lm.encode(PROMPTS[0])
    wrong = WrongShape({tuple(prompt): [0] * NEW}, lm.config.vocab_size)
    spec = LanguageModel(lm.config, lm.transformer, lm.tokenizer, lm.pool, lm.backend, lm.max_seq_len,
                         drafter=wrong)
    with pytest.warns(RuntimeWarning, match="int64"):  # the round fails alone; the row decodes plainly
        out = spec.generate(prompt, 8)
    assert out.tokens == lm.generate(prompt, 8, speculative_tokens=0).tokens
    assert out.stats["draft_errors"] >= 1 and out.stats["speculative_rounds"] == 0
    assert wrong.bound == wrong.released == 1
    assert_clean(lm.pool)


class Raising(ScriptedDrafter):
    def propose(self, seqs: list[RequestRow], n: int) -> tuple[torch.Tensor, None]:
        if self.calls % 2 == 0:
            self.calls += 1
            raise RuntimeError("lookup service down")
        self.calls += 1
        return torch.full((len(seqs), n), 10_000, dtype=torch.int64), None  # outside the vocabulary


def test_a_drafter_that_raises_or_proposes_outside_the_vocabulary_fails_only_its_round(plain_lm):
    lm = plain_lm
    prompts = [lm.encode(p) for p in PROMPTS[:2]]
    bad = Raising({}, lm.config.vocab_size)
    bad.calls = 0
    spec = LanguageModel(lm.config, lm.transformer, lm.tokenizer, lm.pool, lm.backend, lm.max_seq_len, drafter=bad)
    with pytest.warns(RuntimeWarning) as caught:
        outs = spec.generate_batch(prompts, 8)
    messages = " ".join(str(w.message) for w in caught)
    assert "lookup service down" in messages and "outside the vocabulary" in messages
    assert [o.tokens for o in outs] == [o.tokens for o in lm.generate_batch(prompts, 8, speculative_tokens=0)]
    assert all(o.stats["draft_errors"] >= 2 for o in outs)
    assert_clean(lm.pool)


class FailingHook(ScriptedDrafter):
    """Raises in one hook (``bind``, ``commit`` on its second call, or ``release``)."""

    def __init__(self, answers, vocab, hook: str) -> None:
        super().__init__(answers, vocab)
        self.hook, self.commits = hook, 0

    def bind(self, seq, final_len):
        if self.hook == "bind":
            raise RuntimeError("bind broke")
        return super().bind(seq, final_len)

    def commit(self, seq, hidden):
        self.commits += 1
        if self.hook == "commit" and self.commits == 2:
            raise RuntimeError("commit broke")
        super().commit(seq, hidden)

    def release(self, seq):
        super().release(seq)
        if self.hook == "release" and not getattr(self, "broke", False):
            self.broke = True  # once: the next request releases cleanly
            raise RuntimeError("release broke")


@pytest.mark.parametrize("hook", ["bind", "commit", "release"])
def test_a_drafter_hook_that_raises_leaves_the_rows_decoding_plainly(plain_lm, hook):
    lm = plain_lm
    prompt = lm.encode(PROMPTS[0])
    want = lm.generate(prompt, NEW, speculative_tokens=0)
    drafter = FailingHook({tuple(prompt): want.tokens}, lm.config.vocab_size, hook)
    spec = LanguageModel(lm.config, lm.transformer, lm.tokenizer, lm.pool, lm.backend, lm.max_seq_len,
                         drafter=drafter)
    with pytest.warns(RuntimeWarning, match=f"{hook} broke"):
        out = spec.generate(prompt, NEW)
    assert out.tokens == want.tokens
    if hook == "commit":
        assert out.stats["speculative_rounds"] == 2 and out.stats["draft_errors"] == 1  # no round after it
    assert_clean(lm.pool)
    assert spec.generate(prompt, 4, speculative_tokens=0).tokens == want.tokens[:4]  # the model goes on


# ---------------------------------------------------------------------------------------------- n-gram trees
def ngram_row(tokens: list[int]) -> SimpleNamespace:
    return SimpleNamespace(prompt=tokens, tokens=[], history=None)


def test_ngram_tree_is_the_trie_of_every_occurrence() -> None:
    """Context ``a b X c a b Y d a b`` (a=1 b=2 X=3 c=4 Y=5 d=6), suffix ``a b``: the most recent occurrence's
    continuation ``Y d a`` is the chain (slots 1..3, the linear draft); the older one's ``X c a`` branches at the
    root. Depth caps cut continuations; a row with a single occurrence is the chain alone, padded in a batch with
    copies of its first node."""
    drafter = NgramDrafter(2, 2)
    varied, single = ngram_row([1, 2, 3, 4, 1, 2, 5, 6, 1, 2]), ngram_row([7, 1, 2, 8, 9, 1, 2])
    for seq in (varied, single):
        drafter.bind(seq, 32)
        assert drafter.ready(seq)
    linear, _ = drafter.propose([varied], 3)
    tree = drafter.propose_tree([varied], (2, 2, 2))
    assert tree.tokens.tolist() == [[5, 6, 1, 3, 4, 1]] and tree.parents.tolist() == [[0, 1, 2, 0, 4, 5]]
    assert tree.tokens[0, :3].tolist() == linear[0].tolist()
    # what a draft policy hears of a walk through the older branch: the root offered 2 children, X was the second
    assert tree.walk(0, (4, 5)) == TreeWalk((1, 0), (2, 1, 1), 6)
    capped = drafter.propose_tree([varied], (2, 1, 1))  # depth 2 is full after the chain: X alone
    assert capped.tokens.tolist() == [[5, 6, 1, 3]] and capped.parents.tolist() == [[0, 1, 2, 0]]
    batch = drafter.propose_tree([single, varied], (2, 2, 2))
    assert batch.tokens.tolist() == [[8, 9, 1, 8, 8, 8], [5, 6, 1, 3, 4, 1]]
    assert batch.parents.tolist() == [[0, 1, 2, 0, 0, 0], [0, 1, 2, 0, 4, 5]]
    assert batch.children(0)[0] == {8: 1}  # the padding is never a child acceptance can reach
    assert batch.sizes.tolist() == [3, 6] and batch.row_size(0) == 3


VARIED = "self.alpha = alpha\nself.beta = beta\nself.gamma = gamma\nself.delta = delta\nself."


def test_ngram_trees_are_lossless(plain, plain_lm):
    """Greedy and seeded-sampled decoding with n-gram token trees equal plain decoding; tree rounds hold the chain's 4
    nodes and at most the shape's 8, and the varied prompt's trees branch."""
    lm = LanguageModel.default(max_seq_len=512, drafter=NgramDrafter(2, 4))
    for prompt in (VARIED, REPETITIVE, PROMPTS[1]):
        records: list[RoundRecord] = []
        got = lm.generate(prompt, NEW, draft_tree=(3, 2, 2, 1), on_round=records.append)
        assert got.tokens == plain(prompt).tokens
        trees = [r for r in records if r.parents is not None]  # (near the limit a round drafts a chain)
        assert trees and all(4 <= r.k == len(r.drafts) == len(r.parents) <= 8 for r in trees)
        if prompt == VARIED:
            assert any(r.k > 4 for r in trees), "the variations never branched"
        assert_lm_clean(lm)
    want = plain_lm.generate(VARIED, NEW, temperature=0.7, seed=3, speculative_tokens=0)
    assert lm.generate(VARIED, NEW, temperature=0.7, seed=3, draft_tree=(3, 2, 2, 1)).tokens == want.tokens
    lm.close()
