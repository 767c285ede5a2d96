"""Constrained decoding is lossless: under every constraint kind, speculative decoding (MTP, n-gram and draft-model
drafters, token trees, adaptive k) and jump-forward give exactly the tokens of plain token-by-token constrained
decoding, greedy and seeded; constrained and free rows batched together, and ``n`` samples, equal their single-row
runs. On a model with a real BPE vocabulary, greedy constrained output equals an independent decoder: Hugging Face's
logits masked by llguidance directly."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from smile_llm import LanguageModel, SamplingParams
from smile_llm.sampling.constraint import constraint_of

from .conftest import CI, SCHEMAS
from .test_validity import CHOICES, GRAMMAR, REGEX

KINDS: dict[str, dict[str, Any]] = {
    "json_schema": {"json_schema": SCHEMAS["nested"]},
    "json_object": {"json_object": True},
    "regex": {"regex": REGEX},
    "grammar": {"grammar": GRAMMAR},
    "choice": {"choice": CHOICES},
}
SAMPLING = {"greedy": {}, "seeded": {"temperature": 0.8, "seed": 5}}
NEW = 32


def run(model: LanguageModel, prompt: str, jump: bool, new: int = NEW, **kw: Any) -> Any:
    model.jump_forward = jump
    try:
        return model.generate(prompt, new, **kw)
    finally:
        model.jump_forward = True


def plain(model: LanguageModel, prompt: str, **kw: Any) -> list[int]:
    """Token-by-token constrained decoding: no drafts, no jump-forward."""
    return run(model, prompt, False, speculative_tokens=0, **kw).tokens


# every kind with the MTP head; the other drafters on the kinds that differ most (CI: two kinds each)
CASES = [("byte_model", k) for k in KINDS] + [(d, k) for d in ("ngram_model", "draft_model")
                                             for k in (("json_schema", "regex") if CI else KINDS)]


@pytest.mark.parametrize("sampling", list(SAMPLING))
@pytest.mark.parametrize("drafter, kind", CASES)
def test_speculation_and_jump_forward_equal_plain(request: pytest.FixtureRequest, drafter: str, kind: str,
                                                  sampling: str) -> None:
    model = request.getfixturevalue(drafter)
    kw = KINDS[kind] | SAMPLING[sampling]
    prompt = f"{kind} please: "
    expected = plain(model, prompt, **kw)
    jumped = run(model, prompt, True, speculative_tokens=0, **kw)
    speculated = run(model, prompt, False, speculative_tokens=3, **kw)
    both = run(model, prompt, True, speculative_tokens=3, **kw)
    assert jumped.tokens == expected and speculated.tokens == expected and both.tokens == expected
    assert jumped.stats["forwards"] + jumped.stats["forced_tokens"] >= len(expected)


@pytest.mark.parametrize("kw", [{"json_schema": SCHEMAS["person"]}, {"regex": "[a-z ]{10,40}"},
                                {"grammar": GRAMMAR}], ids=["json_schema", "regex", "grammar"])
def test_every_verified_draft_is_one_the_grammar_admits(byte_model: LanguageModel, kw: dict) -> None:
    """A draft the grammar forbids ends the proposal: the drafts a round verifies are all admissible."""
    records: list = []
    prompt = byte_model.encode("the drafts: ")
    c = byte_model.submit(prompt, SamplingParams(max_new_tokens=NEW, speculative_tokens=4, **kw),
                          on_round=records.append).result(60)
    assert records and c.tokens == plain(byte_model, "the drafts: ", **kw)
    grammar = byte_model.grammars.compile(constraint_of(**kw))
    for r in records:
        state = grammar.start()
        for t in c.tokens[: r.position - len(prompt) + 1]:
            state.advance(t)
        assert 1 <= len(r.drafts) <= 4 and state.valid_prefix(list(r.drafts)) == len(r.drafts)


@pytest.mark.parametrize("kind", ["json_schema", "regex", "grammar"])
def test_trees_and_adaptive_k_equal_plain(byte_model: LanguageModel, kind: str) -> None:
    for sampling in SAMPLING.values():
        kw = KINDS[kind] | sampling
        expected = plain(byte_model, "tree: ", **kw)
        assert run(byte_model, "tree: ", True, draft_tree=(2, 2, 1), **kw).tokens == expected
        assert run(byte_model, "tree: ", False, draft_tree=(3, 1), **kw).tokens == expected
        assert run(byte_model, "tree: ", True, speculative_tokens="auto", **kw).tokens == expected


def test_jump_forward_saves_forwards_on_json(byte_model: LanguageModel) -> None:
    kw = {"json_schema": SCHEMAS["nested"]}
    slow = run(byte_model, "record: ", False, 100, speculative_tokens=0, **kw)
    fast = run(byte_model, "record: ", True, 100, speculative_tokens=0, **kw)
    assert fast.tokens == slow.tokens and fast.finish_reason == slow.finish_reason == "stop"
    assert slow.stats["forced_tokens"] == 0 and slow.stats["forwards"] == len(slow.tokens)
    # every key, the punctuation and most of the enum value are forced
    assert fast.stats["forced_tokens"] >= len(b'{"id": , "owner": {"role": "", "active": }}')
    # a forward appends its forced tokens and one sampled (a window that ends the grammar has none)
    assert len(fast.tokens) <= fast.stats["forwards"] + fast.stats["forced_tokens"] <= len(fast.tokens) + 1
    assert fast.stats["forwards"] * 3 < slow.stats["forwards"]
    assert fast.stats["target_forwards_per_token"] < 0.6


def test_mixed_batch_equals_single_rows(byte_model: LanguageModel) -> None:
    rows = [("a: ", SamplingParams(max_new_tokens=NEW, json_schema=SCHEMAS["person"], speculative_tokens=0)),
            ("b: ", SamplingParams(max_new_tokens=NEW, temperature=0.9, seed=3)),
            ("c: ", SamplingParams(max_new_tokens=NEW, regex=REGEX, temperature=1.0, seed=4)),
            ("d: ", SamplingParams(max_new_tokens=NEW, choice=CHOICES, speculative_tokens=2)),
            ("e: ", SamplingParams(max_new_tokens=NEW, speculative_tokens=0)),
            ("f: ", SamplingParams(max_new_tokens=NEW, json_schema=SCHEMAS["array"], temperature=1.0, seed=6,
                                   speculative_tokens=3))]
    alone = [byte_model.submit(p, params).result(60).tokens for p, params in rows]
    handles = [byte_model.submit(p, params) for p, params in rows]
    assert [h.result(120).tokens for h in handles] == alone


def test_n_samples_equal_their_single_runs(byte_model: LanguageModel) -> None:
    params = SamplingParams(max_new_tokens=NEW, n=4, temperature=1.0, seed=21, json_schema=SCHEMAS["any_of"])
    together = byte_model.generate("n: ", NEW, n=4, temperature=1.0, seed=21, json_schema=SCHEMAS["any_of"])
    for i, c in enumerate(together):
        single = byte_model.generate("n: ", NEW, temperature=1.0, seed=params.sample(i).seed,
                                     json_schema=SCHEMAS["any_of"])
        assert c.tokens == single.tokens


def hf_constrained_greedy(hf: Any, grammar: Any, prompt: list[int], new: int, eos: int) -> list[int]:
    """Greedy decoding by Hugging Face's full forward at every step, masked by llguidance directly."""
    from llguidance.numpy import allocate_token_bitmask, fill_next_token_bitmask

    state = grammar.start()
    matcher = state.matcher
    vocab = hf.config.vocab_size
    mask = allocate_token_bitmask(1, vocab)
    ids, out = list(prompt), []
    with torch.no_grad():
        for _ in range(new):
            logits = hf(torch.tensor([ids])).logits[0, -1].double()
            fill_next_token_bitmask(matcher, mask)
            bits = np.unpackbits(mask.view(np.uint8), bitorder="little")[:vocab].astype(bool)
            logits[torch.from_numpy(~bits)] = float("-inf")
            token = int(logits.argmax())
            if token == eos:
                break
            assert matcher.consume_token(token)
            out.append(token)
            ids.append(token)
            if matcher.is_stopped():
                break
    return out


@pytest.mark.parametrize("kind", ["json_schema", "regex", "choice"])
def test_bpe_model_equals_hf_masked_by_llguidance(bpe_model: LanguageModel, bpe_checkpoint: Any,
                                                  kind: str) -> None:
    _, hf = bpe_checkpoint
    kw = {"json_schema": {"json_schema": SCHEMAS["person"]}, "regex": {"regex": REGEX},
          "choice": {"choice": CHOICES}}[kind]
    prompt = bpe_model.encode('{"name": "Ada", "age": 3} ')
    grammar = bpe_model.grammars.compile(constraint_of(**kw))  # type: ignore[arg-type]
    expected = hf_constrained_greedy(hf, grammar, prompt, 30, 0)
    ours = run(bpe_model, prompt, True, speculative_tokens=3, **kw)  # type: ignore[arg-type]
    assert ours.tokens == expected
    assert run(bpe_model, prompt, False, speculative_tokens=0, **kw).tokens == expected  # type: ignore[arg-type]
    if kind == "json_schema":
        assert ours.stats["forced_tokens"] > 0  # multi-byte tokens are forced too ('{"', 'name', '":')


def test_forced_windows_of_different_widths_share_a_forward(byte_model: LanguageModel) -> None:
    """Rows whose grammars force different numbers of tokens go through one right-padded verify forward, and so may a
    row that samples (a window of its last token alone); each row keeps exactly its own tokens."""
    schemas = [SCHEMAS["nested"], SCHEMAS["person"], SCHEMAS["array"], {"enum": ["a-very-long-constant", "b"]}]
    params = [SamplingParams(max_new_tokens=80, json_schema=s, speculative_tokens=0) for s in schemas]
    params.append(SamplingParams(max_new_tokens=40, temperature=1.0, seed=9, speculative_tokens=0))  # free
    alone = [byte_model.submit(f"{i}: ", p).result(60).tokens for i, p in enumerate(params)]
    calls = []
    forward = byte_model.runner._verify

    def counting(seqs: Any, n: int, *args: Any, **kw: Any) -> Any:
        calls.append((len(seqs), n, kw.get("widths")))
        return forward(seqs, n, *args, **kw)

    byte_model.runner._verify = counting  # type: ignore[method-assign]
    try:
        handles = [byte_model.submit(f"{i}: ", p) for i, p in enumerate(params)]
        assert [h.result(60).tokens for h in handles] == alone
    finally:
        del byte_model.runner._verify
    ragged = [c for c in calls if c[2] is not None and len(set(c[2])) > 1]
    assert ragged and all(max(w) == n for _, n, w in ragged)
    assert any(0 in w for _, _, w in ragged)  # the free row shared a jump-forward forward


def test_forced_groups_bound_padding_and_capacity() -> None:
    from smile_llm.serving.model_runner import ModelRunner

    class Row:
        def __init__(self, last_pos: int, capacity: int) -> None:
            self.last_pos, self.capacity = last_pos, capacity

    rows = [(Row(10, 100), [1] * w) for w in (1, 2, 16, 3)] + [(Row(10, 14), [1] * 3)]
    groups = ModelRunner._forced_groups(rows)  # type: ignore[arg-type]
    widths = [[len(t) for _, t in g] for g in groups]
    assert sorted(w for g in widths for w in g) == [1, 2, 3, 3, 16]
    for g in groups:
        width = max(len(t) for _, t in g)
        assert all(s.last_pos + 1 + width <= s.capacity for s, _ in g)
        real = sum(len(t) + 1 for _, t in g)
        assert len(g) == 1 or len(g) * (width + 1) <= 1.25 * real + 64
    assert widths[0] == [1, 2, 3, 3]  # the short windows share one forward


def test_hybrid_model_constrained_equals_plain() -> None:
    """On the hybrid model (Gated DeltaNet layers: verify forwards keep and rewind recurrent state), jump-forward,
    MTP speculation and a mixed batch give the tokens of token-by-token constrained decoding."""
    model = LanguageModel.default("hybrid")
    try:
        rows = [("h1: ", {"json_schema": SCHEMAS["nested"]}), ("h2: ", {"regex": REGEX, "temperature": 1.0, "seed": 3}),
                ("h3: ", {"temperature": 0.7, "seed": 4})]
        alone = [plain(model, p, **kw) for p, kw in rows]
        for jump, k in ((True, 0), (False, 3), (True, 3)):
            assert [run(model, p, jump, speculative_tokens=k, **kw).tokens for p, kw in rows] == alone
        handles = [model.submit(p, SamplingParams(max_new_tokens=NEW, speculative_tokens=2, **kw)) for p, kw in rows]
        assert [h.result(120).tokens for h in handles] == alone
    finally:
        model.close()
