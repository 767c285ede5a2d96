"""Token-tree speculative decoding: the tree's shapes and walk, its verify forward against transformers' logits of
every path, lossless output (greedy and seeded sampling, single, batched, engine, prefix hits) on the shipped model,
the KV compaction (never a rejected branch in the prefix tree), the tree rule's distribution (chi-square), and bad
values refused by name."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch

from smile_llm.engine import InferenceEngine
from smile_llm.language_model import LanguageModel
from smile_llm.speculative.draft_tree import DraftTree, accept_tree, window_mask
from smile_llm.speculative.drafters import NgramDrafter
from smile_llm.serving.request import SamplingParams

from tests.hf_zoo import PROMPT, assert_clean
from .test_speculative import TEMP_NEW, TEMP_PROMPT, TEMP_RUNS, _exact_joint, assert_fits, assert_pools_clean, load

TREES = [(2,), (3, 2, 2), (2, 2, 2, 1, 1, 1)]
CODE = "def main(argv):\n    parser = argparse.ArgumentParser()\n"


# ------------------------------------------------------------------------------------------------ the tree itself
def test_chain_with_alternatives_layout_and_walk() -> None:
    chain = torch.tensor([[5, 6, 7]])
    logits = torch.zeros(1, 3, 10)
    logits[0, 0, [5, 1, 2]] = torch.tensor([9.0, 8.0, 7.0])  # depth 1: chain 5, then 1, 2
    logits[0, 2, [7, 3]] = torch.tensor([9.0, 8.0])
    t = DraftTree.chain_with_alternatives(chain, logits, (3, 1, 2))
    assert t.tokens.tolist() == [[5, 1, 2, 6, 7, 3]]
    assert t.parents.tolist() == [[0, 0, 0, 1, 4, 4]]  # chain 5 -> 6 -> 7; 1, 2 beside 5; 3 beside 7
    assert t.depths().tolist() == [[0, 1, 1, 1, 2, 3, 3]]
    assert t.paths(0)[6] == [5, 6, 3] and t.paths(0)[2] == [1]
    kids = t.children(0)
    assert kids[0] == {5: 1, 1: 2, 2: 3} and kids[4] == {7: 5, 3: 6}
    # the target follows 5, 6, then prefers 3 (an alternative), then 9 (no child): 3 accepted, bonus 9
    targets = {0: 5, 1: 6, 4: 3, 6: 9}
    res = accept_tree(kids, lambda s: targets[s])
    assert res.slots == (1, 4, 6) and res.tokens == (5, 6, 3, 9) and res.num_accepted == 3
    first_alt = accept_tree(kids, lambda s: {0: 2, 3: 4}[s])
    assert first_alt.slots == (3,) and first_alt.tokens == (2, 4)
    with pytest.raises(ValueError, match="parents"):
        DraftTree(torch.zeros(1, 2, dtype=torch.int64), np.array([[0, 2]]))


# ------------------------------------------------------------------------------------------------ the forward
def test_tree_verify_logits_equal_transformers_on_every_path(zoo) -> None:
    """One verify forward over a bushy tree scores every node exactly as transformers scores its path."""
    hf = zoo("qwen3")
    lm = hf.load(page_size=4)
    pool = lm.pool
    rid = pool.bind_request(PROMPT, 64)
    pool.activate_step(rid)
    start = np.array([len(PROMPT) - 1])
    lm.transformer(torch.tensor([PROMPT[:-1]]), np.array([0]), pool, lm.backend)
    parents = np.array([[0, 0, 1, 1, 2, 0, 4, 7]])
    tokens = torch.tensor([[11, 12, 13, 14, 15, 16, 17, 18]])
    tree = DraftTree(tokens, parents)
    out = lm.transformer(torch.cat([torch.tensor([[PROMPT[-1]]]), tokens], dim=1), start, pool, lm.backend,
                         offsets=tree.depths(), mask=window_mask(tree, start))
    for slot, path in enumerate(tree.paths(0)):
        want = hf.logits(PROMPT + path)[-1]
        assert float((out.logits[0, slot] - want).abs().max()) < 2e-5, f"slot {slot}, path {path}"
    pool.unbind_request(rid)
    assert_clean(pool)


@pytest.fixture(scope="module")
def lm() -> LanguageModel:
    return LanguageModel.default(max_seq_len=512)


@pytest.fixture(scope="module")
def plain(lm):
    cache: dict[tuple[str, int], list[int]] = {}

    def tokens(prompt: str, n: int) -> list[int]:
        if (prompt, n) not in cache:
            cache[(prompt, n)] = lm.generate(prompt, n, speculative_tokens=0).tokens
        return cache[(prompt, n)]

    return tokens


@pytest.mark.parametrize("shape", TREES)
def test_greedy_tree_decoding_equals_plain(lm, plain, shape) -> None:
    out = lm.generate(CODE, 80, draft_tree=shape)
    assert out.tokens == plain(CODE, 80)
    assert out.stats["speculative_rounds"] > 0 and out.stats["mean_accepted_length"] > 1.5
    again = lm.generate(CODE, 80, draft_tree=shape)  # a prefix hit on the tree-decoded KV
    assert again.stats["cached_tokens"] > 0 and again.tokens == out.tokens
    lm.pool.check_invariants()
    assert_clean(lm.pool)


def test_trees_beat_their_chain_and_record_rounds(lm) -> None:
    rounds = []
    tree = lm.generate(CODE, 80, draft_tree=(3, 2, 2), on_round=rounds.append)
    chain = lm.generate(CODE, 80, speculative_tokens=3)
    assert tree.stats["mean_accepted_length"] > chain.stats["mean_accepted_length"]
    trees = [r for r in rounds if r.parents is not None]  # near the limit a round drafts the chain that fits
    assert len(trees) >= len(rounds) - 3 and all(len(r.parents) == r.k == 7 for r in trees)
    assert len(tree.tokens) - 3 <= sum(len(r.tokens) for r in rounds) < len(tree.tokens)  # + the first (prefill)


def test_batched_engine_and_sampled_tree_decoding_equal_plain(lm, plain) -> None:
    prompts = [CODE, "import os\n", "class Parser:\n    def __init__(self, text):\n"]
    rows = lm.generate_batch(prompts, 40, draft_tree=(3, 2, 1))
    assert [r.tokens for r in rows] == [plain(p, 40) for p in prompts]
    with InferenceEngine(lm, max_batch_size=3) as engine:
        handles = [engine.submit(p, SamplingParams(40, draft_tree=(2, 2))) for p in prompts]
        assert [h.result(120).tokens for h in handles] == [plain(p, 40) for p in prompts]
    for seed in (3, 4):
        kwargs = {"temperature": 0.9, "seed": seed, "top_k": 50, "repetition_penalty": 1.1}
        sampled = lm.generate(CODE, 40, draft_tree=(3, 2, 2), **kwargs)
        assert sampled.tokens == lm.generate(CODE, 40, speculative_tokens=0, **kwargs).tokens
    assert_clean(lm.pool)


def test_the_prefix_tree_never_holds_a_rejected_branch(lm) -> None:
    """After tree decoding, a prompt extending the output reuses its cached KV; its logprobs equal a recompute
    with prefix reuse off (a rejected branch's KV left in place would change them)."""
    out = lm.generate(CODE + "    # tree\n", 60, draft_tree=(3, 3, 2, 2))
    assert out.stats["speculative_rounds"] > 0
    follow = out.prompt_tokens + out.tokens[:-1]
    hit = lm.generate(follow, 8, speculative_tokens=0, logprobs=True)
    assert hit.stats["cached_tokens"] >= len(follow) - 2 * lm.pool.page_size
    lm.pool.prefix_reuse_enabled = False
    try:
        fresh = lm.generate(follow, 8, speculative_tokens=0, logprobs=True)
    finally:
        lm.pool.prefix_reuse_enabled = True
    assert fresh.stats["cached_tokens"] == 0 and hit.tokens == fresh.tokens
    assert hit.logprobs == pytest.approx(fresh.logprobs, abs=2e-4)


@pytest.mark.parametrize("options, match", [
    ({"draft_tree": (0,)}, "draft_tree must have"), ({"draft_tree": (9,)}, "draft_tree must have"),
    ({"draft_tree": (1,) * 8}, "draft_tree must have"), ({"draft_tree": (8, 8, 8, 8, 8)}, "at most 32"),
    ({"draft_tree": "2,2"}, "draft_tree must be None or a non-empty tuple"), ({"draft_tree": ()}, "non-empty"),
    ({"draft_tree": (2, 2), "speculative_tokens": 3}, "depth of draft_tree"),
])
def test_bad_trees_are_refused_by_name(lm, options, match) -> None:
    with pytest.raises((ValueError, TypeError), match=match):
        lm.generate("import os\n", 4, **options)
    assert_clean(lm.pool)


class LinearOnly:
    """A drafter of one's own without ``propose_tree``: the n-gram drafter's linear drafts."""

    def __init__(self) -> None:
        self.inner = NgramDrafter()
        self.num_speculative_tokens = self.inner.num_speculative_tokens

    def bind(self, seq, final_len):
        return self.inner.bind(seq, final_len)

    def release(self, seq):
        self.inner.release(seq)

    def close(self):
        self.inner.close()

    def max_batch(self, n):
        return self.inner.max_batch(n)

    def ready(self, seq):
        return self.inner.ready(seq)

    def propose(self, seqs, n):
        return self.inner.propose(seqs, n)

    def extend(self, seq, hidden, start):
        self.inner.extend(seq, hidden, start)

    def absorb(self, seqs):
        self.inner.absorb(seqs)

    def commit(self, seq, hidden):
        self.inner.commit(seq, hidden)


def test_a_drafter_without_trees_refuses_them() -> None:
    lm = LanguageModel.default(max_seq_len=256, drafter=LinearOnly())
    try:
        assert not lm.tree_rounds  # and so no draft policy may choose a tree for its rows
        with pytest.raises(ValueError, match="draft_tree: this model's drafter \\(LinearOnly\\)"):
            lm.generate("import os\n", 4, draft_tree=(2,))
        assert_clean(lm.pool)
    finally:
        lm.close()


def test_move_kv_refuses_unwritten_sources_and_the_matched_prefix(lm) -> None:
    pool = lm.pool
    rid = pool.bind_request(list(range(40)), 64)
    pool.activate_step(rid)
    try:
        with pytest.raises(ValueError, match="written positions"):
            pool.move_kv([[3]], [[1]])  # nothing written yet
        with pytest.raises(ValueError, match="shape"):
            pool.move_kv([[1, 2]], [[1]])
    finally:
        pool.unbind_request(rid)
    assert_clean(pool)


def test_the_tree_rule_keeps_the_target_distribution(tmp_path_factory) -> None:
    """Seeded runs of 4 new tokens with a (3, 2) tree on a 6-token vocabulary: the empirical joints of neighbouring
    tokens fit the exact target distribution (chi-square, alpha 1e-3, rare cells pooled)."""
    from tests.models.mtp_models import build_mtp_model

    lm = load(build_mtp_model(tmp_path_factory.mktemp("tree6"), "llama", seed=3, vocab=6, hidden=16),
              page_size=16, max_seq_len=16)
    joint = _exact_joint(lm, 1.0, 1.0)
    seqs: Counter = Counter()
    rounds = accepted = 0
    for seed in range(1, TEMP_RUNS + 1):
        c = lm.generate(TEMP_PROMPT, TEMP_NEW, temperature=1.0, seed=seed, draft_tree=(3, 2))
        assert len(c.tokens) == TEMP_NEW
        seqs[tuple(c.tokens)] += 1
        rounds += c.stats["speculative_rounds"]
        accepted += c.stats["accepted_drafts"]
    assert rounds > 0 and accepted > 0
    assert_pools_clean(lm)
    for idx in [(0, 1), (1, 2), (2, 3)]:
        proj: Counter = Counter()
        for seq, cnt in seqs.items():
            proj[tuple(seq[i] for i in idx)] += cnt
        marginal: Counter = Counter()
        for seq, pr in joint.items():
            marginal[tuple(seq[i] for i in idx)] += pr
        assert_fits(proj, dict(marginal), f"tokens {idx}, tree (3, 2)")
