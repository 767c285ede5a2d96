"""Adaptive draft counts (``speculative_tokens="auto"``): the built-in policy's estimates and choices on synthetic
measurements, a policy of one's own driving real rounds, and output identical to plain decoding."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from smile_llm.language_model import LanguageModel
from smile_llm.serving.request import SamplingParams
from smile_llm.speculative.draft_policy import DraftPolicy, RunningFit, ThroughputPolicy
from smile_llm.speculative.draft_tree import MAX_TREE_NODES, DraftTree, TreeWalk

from tests.hf_zoo import assert_clean

CODE = "def main(argv):\n    parser = argparse.ArgumentParser()\n"


def row(rid: int = 1, tree_rounds: bool = False) -> SimpleNamespace:
    return SimpleNamespace(request_id=rid, tree_rounds=tree_rounds)


def test_running_fit_recovers_a_line_and_uses_the_prior_slope_until_two_points() -> None:
    fit = RunningFit()
    fit.add(2, 5.0)
    assert fit.predict(4, 0.5) == pytest.approx(6.0)  # through (2, 5) with the prior slope
    for x in (1, 3, 5, 7):
        fit.add(x, 1.0 + 2.0 * x)
    assert fit.predict(10, 0.5) == pytest.approx(21.0, abs=1e-6)


def feed(policy: ThroughputPolicy, kept: int, k: int, rounds: int = 30) -> None:
    """Rounds on a machine where a plain step takes 10 ms, a verify window 10 ms + 1 ms per position and a draft
    2 ms per token."""
    for _ in range(rounds):
        policy.observe_plain([row()], 0.010)
        policy.observe_round([row()], k, [min(kept, k)], 0.002 * k, 0.010 + 0.001 * (k + 1))
        policy.observe_round([row()], k + 1, [min(kept, k + 1)], 0.002 * (k + 1), 0.010 + 0.001 * (k + 2))


def test_throughput_policy_drafts_long_when_drafts_are_kept_and_stops_when_they_are_not() -> None:
    always = ThroughputPolicy()
    feed(always, kept=7, k=5)
    plain, rounds = always.costs()
    assert plain == pytest.approx(0.010) and rounds[2] == pytest.approx(0.010 + 0.004 + 0.006, rel=1e-6)
    assert always.acceptances(row())[0] > 0.95
    assert always.choose(row(), 7) == 7 and always.choose(row(), 3) == 3
    never = ThroughputPolicy()
    feed(never, kept=0, k=2)
    assert never.acceptances(row())[0] < 0.1
    picks = [never.choose(row(), 7) for _ in range(ThroughputPolicy.PROBE_AFTER + 1)]
    assert picks[:-1] == [0] * ThroughputPolicy.PROBE_AFTER and picks[-1] == 1  # then a probe round
    # the first draft usually kept, the second rarely: k = 1 is best
    mixed = ThroughputPolicy()
    feed(mixed, kept=1, k=3)
    a = mixed.acceptances(row())
    assert a[0] > 0.9 and a[1] < 0.1 and mixed.choose(row(), 7) == 1
    assert ThroughputPolicy.expected_tokens([0.5, 0.5], 2) == pytest.approx(1.75)
    assert ThroughputPolicy().acceptances(row())[0] == pytest.approx(0.7)  # before any round: the prior
    mixed.forget(row())
    fresh = mixed.acceptances(row(2))  # a new request starts from what every request's drafts have done
    assert mixed.acceptances(row()) == fresh and fresh[0] > 0.9 and fresh[1] < 0.1


@pytest.fixture(scope="module")
def lm() -> LanguageModel:
    return LanguageModel.default(max_seq_len=512)


def test_auto_equals_plain_decoding_and_varies_k(lm) -> None:
    plain = lm.generate(CODE, 80, speculative_tokens=0)
    rounds = []
    auto = lm.generate(CODE, 80, speculative_tokens="auto", on_round=rounds.append)
    assert auto.tokens == plain.tokens
    assert rounds and all(1 <= r.k <= 7 if r.parents is None else len(r.parents) == r.k <= MAX_TREE_NODES
                          for r in rounds)
    sampled = dict(temperature=0.8, seed=5)
    assert lm.generate(CODE, 40, speculative_tokens="auto", **sampled).tokens == \
        lm.generate(CODE, 40, speculative_tokens=0, **sampled).tokens
    assert lm.generate_batch([CODE, "import os\n"], 30, speculative_tokens="auto")[1].tokens == \
        lm.generate("import os\n", 30, speculative_tokens=0).tokens
    assert_clean(lm.pool)


class Schedule:
    """A policy of one's own: k cycles through 1, 2, 3; it records what it is told."""

    def __init__(self) -> None:
        self.turn = 0
        self.rounds: list[tuple[int, list[int]]] = []
        self.plain = 0

    def choose(self, seq, budget: int) -> int:
        self.turn += 1
        return min(budget, 1 + self.turn % 3)

    def observe_round(self, seqs, k, accepted, draft_s, verify_s) -> None:
        assert draft_s >= 0 and verify_s > 0 and len(accepted) == len(seqs)
        self.rounds.append((k, accepted))

    def observe_plain(self, seqs, seconds) -> None:
        self.plain += 1


def test_a_policy_of_ones_own_drives_the_rounds(lm) -> None:
    own = Schedule()
    assert isinstance(own, DraftPolicy)
    before = lm.draft_policy
    lm.draft_policy = own
    try:
        rounds = []
        out = lm.generate(CODE, 60, speculative_tokens="auto", on_round=rounds.append)
        assert out.tokens == lm.generate(CODE, 60, speculative_tokens=0).tokens
        assert [r.k for r in rounds] == [k for k, _ in own.rounds] and {r.k for r in rounds} == {1, 2, 3}
        assert [r.num_accepted for r in rounds] == [a[0] for _, a in own.rounds]
        fixed = lm.generate(CODE, 20, speculative_tokens=3, on_round=rounds.append)  # not "auto": no policy
        assert fixed.tokens and len(own.rounds) == len(rounds) - fixed.stats["speculative_rounds"]
    finally:
        lm.draft_policy = before
    with pytest.raises(ValueError, match="draft_policy"):
        lm.draft_policy = object()  # type: ignore[assignment]
    with pytest.raises((ValueError, TypeError), match="speculative_tokens"):
        lm.generate(CODE, 4, speculative_tokens="fast")
    assert_clean(lm.pool)


class Broken(Schedule):
    def choose(self, seq, budget: int) -> int:
        self.turn += 1
        if self.turn % 2:
            raise RuntimeError("policy broke")
        return budget + 5  # outside 0..budget


def test_a_policy_that_raises_or_chooses_badly_costs_only_its_choice(lm) -> None:
    before = lm.draft_policy
    lm.draft_policy = Broken()
    try:
        with pytest.warns(RuntimeWarning) as caught:
            out = lm.generate(CODE, 30, speculative_tokens="auto")
    finally:
        lm.draft_policy = before
    messages = " ".join(str(w.message) for w in caught)
    assert "policy broke" in messages and "need an int in 0.." in messages
    assert out.tokens == lm.generate(CODE, 30, speculative_tokens=0).tokens and out.stats["speculative_rounds"] == 0
    assert_clean(lm.pool)


# ---------------------------------------------------------------------------------------------- tree shapes
def test_a_walk_names_what_each_node_offered_and_which_child_was_taken() -> None:
    # shape (3, 2, 2): the root's children are slots 1..3, the chain node 1's are 4..5, node 4's are 6..7
    tree = DraftTree.chain_with_alternatives(torch.tensor([[5, 6, 7]]), torch.zeros(1, 3, 10), (3, 2, 2))
    assert tree.walk(0, (1, 4, 7)) == TreeWalk((0, 0, 1), (3, 2, 2), 7)  # the whole depth: nothing more offered
    assert tree.walk(0, (3,)) == TreeWalk((2,), (3,), 7)  # an alternative is a leaf
    assert tree.walk(0, (1,)) == TreeWalk((0,), (3, 2), 7)  # stopped at node 1, whose 2 children were both wrong
    assert tree.walk(0, ()) == TreeWalk((), (3,), 7)
    # a trie: the chain 1-2-3, a branch under node 1 (slot 4) and one under the root (slot 5); a padding copy of
    # node 1 (slot 6) is never a child of its own
    trie = DraftTree(torch.tensor([[1, 2, 3, 4, 5, 1]]), np.array([[0, 1, 2, 1, 0, 0]]), np.array([5]))
    assert trie.walk(0, (1, 4)) == TreeWalk((0, 1), (2, 2), 6) and trie.walk(0, (5,)) == TreeWalk((1,), (2,), 6)
    assert trie.row_size(0) == 5
    with pytest.raises(ValueError, match="sizes"):
        DraftTree(torch.tensor([[1, 2]]), np.array([[0, 1]]), np.array([3]))


def test_throughput_policy_grows_trees_where_drafts_are_rejected_and_rescued() -> None:
    """Weak chain drafts (the first kept 30% of the time) whose first alternative holds the target's token in
    every rejected round: trees pay, and the tree grows alternatives where rounds end. Strong drafts (always kept):
    a long chain. A row that cannot take tree rounds never gets a tree."""
    weak = ThroughputPolicy()
    tree_row = row(tree_rounds=True)
    for i in range(40):
        weak.observe_plain([tree_row], 0.010)
        kept_first = i % 10 < 3
        # the chain's first draft then the second's alternative, else the first's alternative
        walk = TreeWalk((0, 1), (2, 2), 4) if kept_first else TreeWalk((1,), (2,), 4)
        weak.observe_tree([tree_row], (2, 2), [walk], 0.004, 0.010 + 0.001 * 5)
    assert weak.acceptances(tree_row)[0] == pytest.approx(0.3, abs=0.1)
    assert weak.rescue(0, 1) > 0.85 and weak.rescue(1, 1) > 0.5  # (decayed counts, shrunk towards the prior)
    assert weak.rescue(0, 2) == pytest.approx(weak.prior_rescue * 0.6)  # never offered: the prior
    choice = weak.choose(tree_row, 7)
    assert isinstance(choice, tuple) and choice[0] >= 2, choice
    assert isinstance(weak.choose(row(), 7), int)  # no tree rounds for this row: a count
    strong = ThroughputPolicy()
    feed(strong, kept=7, k=5)
    assert strong.choose(row(tree_rounds=True), 7) == 7
    tokens, seconds = strong.tree_for(strong.acceptances(row()), 3, 0.010, 0.006)[1:]
    assert tokens == pytest.approx(ThroughputPolicy.expected_tokens(strong.acceptances(row()), 3))
    assert ThroughputPolicy(trees=False).choose(tree_row, 7) in range(8)


class FixedTree(Schedule):
    """A policy of one's own that chooses the tree (3, 2, 2) whenever the budget allows, 1 draft otherwise."""

    def __init__(self) -> None:
        super().__init__()
        self.trees: list[tuple[tuple[int, ...], tuple[int, ...]]] = []

    def choose(self, seq, budget: int):
        return (3, 2, 2) if budget >= 3 else min(budget, 1)

    def observe_tree(self, seqs, branching, walks, draft_s, verify_s) -> None:
        assert draft_s >= 0 and verify_s > 0 and len(walks) == len(seqs) == 1
        assert walks[0].nodes == 7 and walks[0].offered[0] == 3
        self.trees.append((branching, walks[0].ranks))


def test_a_policy_may_choose_token_trees(lm) -> None:
    """The policy's trees verify losslessly, each round is the chosen shape, and observe_tree gets the ranks of
    the round's accepted path: the token kept at each depth is the node of that rank at that depth."""
    own = FixedTree()
    before = lm.draft_policy
    lm.draft_policy = own
    try:
        rounds = []
        out = lm.generate(CODE, 60, speculative_tokens="auto", on_round=rounds.append)
    finally:
        lm.draft_policy = before
    assert out.tokens == lm.generate(CODE, 60, speculative_tokens=0).tokens
    tree_rounds = [r for r in rounds if r.parents is not None]
    assert len(tree_rounds) == len(own.trees) >= 5
    first = (0, 3, 5)  # shape (3, 2, 2): each depth's first window slot minus one
    for record, (branching, ranks) in zip(tree_rounds, own.trees):
        assert branching == (3, 2, 2) and record.parents == (0, 0, 0, 1, 1, 4, 4) and record.k == 7
        assert len(ranks) == record.num_accepted
        assert [record.drafts[first[j] + r] for j, r in enumerate(ranks)] == list(record.tokens[: len(ranks)])
    assert any(r for _, ranks in own.trees for r in ranks), "no alternative was ever taken"
    assert_clean(lm.pool)


def test_a_tree_for_a_row_that_cannot_take_one_costs_only_the_choice() -> None:
    """The hybrid model verifies no trees: the policy's tree is refused with a warning and the row steps plainly."""
    hybrid = LanguageModel.default("hybrid", max_seq_len=256)
    hybrid.draft_policy = FixedTree()
    with pytest.warns(RuntimeWarning, match="cannot take tree rounds"):
        out = hybrid.generate(CODE, 12, speculative_tokens="auto")
    assert out.tokens == hybrid.generate(CODE, 12, speculative_tokens=0).tokens
    assert out.stats["speculative_rounds"] <= 1  # only the 1-draft choices near the end
    hybrid.close()


def test_the_models_acceptance_counts_decay_once_per_round() -> None:
    """One round of two rows, one keeping its first draft and one not: the model-wide estimate a new request
    starts from is (1 kept + prior) / (2 reached + prior weight), both rows counted alike."""
    policy = ThroughputPolicy()
    policy.observe_round([row(1), row(2)], 2, [2, 0], 0.002, 0.012)
    w, prior = policy.prior_weight, policy.prior_acceptance
    assert policy.acceptances(row(3))[0] == pytest.approx((1 + w * prior) / (2 + w), abs=1e-12)


class Recording(Schedule):
    """A schedule that records every row the decoder reports to it."""

    def __init__(self) -> None:
        super().__init__()
        self.heard: list = []

    def observe_round(self, seqs, k, accepted, draft_s, verify_s) -> None:
        self.heard += seqs
        super().observe_round(seqs, k, accepted, draft_s, verify_s)

    def observe_plain(self, seqs, seconds) -> None:
        self.heard += seqs
        super().observe_plain(seqs, seconds)


def test_the_policy_hears_of_its_own_rows_only(lm) -> None:
    """An "auto" request batched with a fixed-k one: rounds of the same k verify together, but the policy is told
    only of the "auto" row; both outputs stay plain decoding's."""
    own = Recording()
    before = lm.draft_policy
    lm.draft_policy = own
    try:
        other = "import os\nimport sys\n\n\ndef main(argv):\n    "
        auto = lm.submit(CODE, SamplingParams(40, speculative_tokens="auto"))
        fixed = lm.submit(other, SamplingParams(40, speculative_tokens=2))
        got = auto.result(), fixed.result()
    finally:
        lm.draft_policy = before
    assert got[0].tokens == lm.generate(CODE, 40, speculative_tokens=0).tokens
    assert got[1].tokens == lm.generate(other, 40, speculative_tokens=0).tokens
    assert own.rounds and all(s.adaptive for s in own.heard)
    assert_clean(lm.pool)
