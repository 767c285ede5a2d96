"""The draft-model drafter: a smaller checkpoint of the target's vocabulary drafts, with its own KV pool.

- losslessness at temperature 0 against plain decoding, for two draft models (the target checkpoint itself, the
  target's first layer), k = 1..4, through ``generate`` (a second prompt sharing the first one's prefix hits both
  pools), ``generate_batch`` of ragged prompts, ``InferenceEngine`` and token trees (``draft_tree``), and for an
  unrelated random model too;
- the target drafting for itself keeps every draft (each round's accepted length is its k + 1); an unrelated model
  keeps fewer, and the output is the same;
- seeded sampling with greedy drafts draws plain seeded sampling's tokens; sampled drafts (rejection sampling) run
  and stay in the vocabulary;
- after every test both pools pass ``check_invariants`` and hold no binding, and every path of the draft pool's
  prefix tree is a true token sequence (a prompt plus output) whose stored KV equals a fresh draft forward over it:
  no rejected draft or padding is ever inserted;
- a draft forward that raises (in the prefill's absorb or inside a round) fails only that round; the draft KV
  stays whole and drafting resumes;
- a full draft pool makes rows decode plainly; a vocabulary mismatch is refused naming both sizes; ``close``.

``SMILE_TEST_SCALE=ci`` shrinks the token counts and grids (2 slow cores).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from smile_llm.attention.backend import select_backend
from smile_llm.cache import KvCacheLayout, KvCachePool
from smile_llm.engine import InferenceEngine
from smile_llm.language_model import LanguageModel
from smile_llm.speculative.drafters import DraftModelDrafter, Drafter, DrafterContext
from smile_llm.serving.request import SamplingParams
from smile_llm.speculative.acceptance import RoundRecord

from tests.hf_zoo import assert_clean
from tests.models.mtp_models import build_mtp_model

pytestmark = pytest.mark.filterwarnings("error::RuntimeWarning")  # a failed draft round would hide behind plain steps
CI = os.environ.get("SMILE_TEST_SCALE", "full") == "ci"
NEW = 24 if CI else 40
VOCAB = 97
BASE = [(7 * i + 3) % VOCAB for i in range(22)]
PROMPTS = [BASE, BASE + [5, 9, 13, 2, 71], [(11 * i + 5) % VOCAB for i in range(27)], [4, 8, 15, 4, 8]]
KS = (1, 2, 3, 4)


# ---------------------------------------------------------------------------------------------- checkpoints
def first_layers(src: Path, layers: int, dst: Path) -> Path:
    """A copy of the checkpoint at ``src`` keeping its first ``layers`` decoder layers, final norm and LM head (no
    MTP head): a smaller model with the same vocabulary."""
    cfg = json.loads((src / "config.json").read_text())
    cfg.update(num_hidden_layers=layers, mtp_num_hidden_layers=0)
    tensors = {k: v for k, v in load_file(str(src / "model.safetensors")).items()
               if not k.startswith("mtp.") and not (k.startswith("model.layers.") and int(k.split(".")[2]) >= layers)}
    dst.mkdir(parents=True, exist_ok=True)
    (dst / "config.json").write_text(json.dumps(cfg))
    save_file(tensors, str(dst / "model.safetensors"))
    return dst


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The target (2 untied Llama layers, no MTP head) and its draft models of the same vocabulary."""
    target = build_mtp_model(tmp_path_factory.mktemp("target"), "llama", seed=21, mtp_num_hidden_layers=0)
    return {
        "target": target,
        "self": target,
        "first_layer": first_layers(target, 1, tmp_path_factory.mktemp("first_layer")),
        "random": build_mtp_model(tmp_path_factory.mktemp("random"), "llama", seed=22, layers=1,
                                  mtp_num_hidden_layers=0),
        "other_vocab": build_mtp_model(tmp_path_factory.mktemp("other_vocab"), "llama", seed=23, vocab=101,
                                       layers=1, mtp_num_hidden_layers=0),
    }


def load(path: Path, drafter: Any = None, **kwargs: Any) -> LanguageModel:
    return LanguageModel.from_pretrained(path, page_size=4, max_seq_len=128, max_batch_size=4, drafter=drafter,
                                         **kwargs)


@pytest.fixture(scope="module")
def plain(checkpoints: dict[str, Path]) -> Any:
    """Plain decoding on the target (prefix reuse off), cached per (prompt, sampling)."""
    lm = load(checkpoints["target"])
    lm.pool.prefix_reuse_enabled = False
    cache: dict[tuple[Any, ...], list[int]] = {}

    def run(prompt: list[int], new: int = NEW, **kw: Any) -> list[int]:
        key = (tuple(prompt), new, tuple(sorted(kw.items())))
        if key not in cache:
            cache[key] = lm.generate(prompt, new, speculative_tokens=0, **kw).tokens
        return cache[key]

    yield run
    lm.close()


@pytest.fixture(scope="module", params=["self", "first_layer"])
def spec(request: pytest.FixtureRequest, checkpoints: dict[str, Path]) -> Any:
    """The target drafting with one of the draft models (``drafter="draft:PATH"``)."""
    lm = load(checkpoints["target"], drafter=f"draft:{checkpoints[request.param]}")
    lm.draft_name = request.param
    yield lm
    lm.close()


# ---------------------------------------------------------------------------------------------- checks
def tree_paths(pool: KvCachePool) -> list[tuple[list[int], np.ndarray]]:
    """Every root-to-leaf path of ``pool``'s prefix tree: (tokens, slot ids)."""
    out = []
    for node in pool.radix.nodes():
        if node.children:
            continue
        keys, slots = [], []
        n = node
        while n is not None and n.parent is not None:
            keys.append(n.key)
            slots.append(n.value)
            n = n.parent
        out.append((np.concatenate(keys[::-1]).tolist(), np.concatenate(slots[::-1])))
    return out


def fresh_keys(lm: LanguageModel, tokens: list[int]) -> torch.Tensor:
    """K of every layer ``[L, len, Hkv, D]`` of one fresh forward of ``lm`` over ``tokens`` on a private pool."""
    c = lm.config
    pool = KvCachePool.for_testing(KvCacheLayout(c.num_hidden_layers, c.num_key_value_heads, c.head_dim, 1,
                                                 len(tokens)))
    try:
        pool.activate_step(pool.bind_request([], len(tokens)))
        lm.transformer(torch.tensor([tokens]), np.array([0]), pool, select_backend(torch.device("cpu")))
        return pool.key_cache[:, torch.from_numpy(pool.slot_indices(len(tokens)))].clone()
    finally:
        pool.close()


def assert_pools_clean(lm: LanguageModel, sequences: list[list[int]]) -> None:
    """Both pools whole and unbound; every draft-tree path is a prefix of one of the true sequences (prompts plus
    their outputs) ``lm`` has served, ``sequences`` the latest of them, and holds the KV a fresh draft forward
    computes over it."""
    served = lm.__dict__.setdefault("served", [])
    served.extend(sequences)
    assert_clean(lm.pool)
    drafter = lm.drafter
    assert isinstance(drafter, DraftModelDrafter)
    assert_clean(drafter.pool)
    paths = tree_paths(drafter.pool)
    assert paths, "the draft pool cached nothing"
    for tokens, slots in paths:
        assert any(s[: len(tokens)] == tokens for s in served), f"draft tree path {tokens} is no true sequence"
        stored = drafter.pool.key_cache[:, torch.from_numpy(slots)]
        assert torch.allclose(stored, fresh_keys(drafter.model, tokens), atol=1e-4, rtol=1e-4)


# ---------------------------------------------------------------------------------------------- lossless
@pytest.mark.parametrize("k", KS)
def test_generate_is_plain_decoding_with_prefix_hits_in_both_pools(spec, plain, k):
    seen = []
    for prompt in PROMPTS[:2]:
        matched_before = spec.drafter.pool.prefix_match_tokens
        records: list[RoundRecord] = []
        c = spec.generate(prompt, NEW, speculative_tokens=k, on_round=records.append)
        assert c.tokens == plain(prompt)
        assert records and all(r.k <= k for r in records)
        if prompt is PROMPTS[1]:  # shares PROMPTS[0]'s 22 tokens: at least 20 of them cached (page 4) in both pools
            assert c.stats["cached_tokens"] >= 20
            assert spec.drafter.pool.prefix_match_tokens - matched_before >= 20
        if spec.draft_name == "self":
            assert all(r.num_accepted == r.k for r in records)  # every draft kept: k + 1 tokens per round
            assert c.stats["accepted_drafts"] == c.stats["proposed_drafts"]
        seen.append(prompt + c.tokens)
    assert_pools_clean(spec, seen)


def test_acceptance_follows_the_draft_models_agreement(checkpoints, plain):
    """Mean accepted length at k = 4: the target itself keeps every draft, its first layer fewer, a random model
    the fewest; every output is plain decoding's."""
    mean = {}
    for name in ("self", "first_layer", "random"):
        lm = load(checkpoints["target"], drafter=f"draft:{checkpoints[name]}")
        out = lm.generate_batch(PROMPTS, NEW, speculative_tokens=4)
        assert [c.tokens for c in out] == [plain(p) for p in PROMPTS]
        rounds = sum(c.stats["speculative_rounds"] for c in out)
        mean[name] = sum(c.stats["mean_accepted_length"] * c.stats["speculative_rounds"] for c in out) / rounds
        assert_pools_clean(lm, [p + c.tokens for p, c in zip(PROMPTS, out)])
        lm.close()
    assert mean["self"] > 4.5 and mean["self"] > mean["first_layer"] > mean["random"]


@pytest.mark.parametrize("k", (1, 3) if CI else KS)
def test_generate_batch_of_ragged_prompts_is_plain_decoding(spec, plain, k):
    prompts = PROMPTS + [PROMPTS[2][:9], [1]]
    out = spec.generate_batch(prompts, NEW, speculative_tokens=k)
    assert [c.tokens for c in out] == [plain(p) for p in prompts]
    assert sum(c.stats["speculative_rounds"] for c in out) > 0
    again = spec.generate_batch(prompts[:2], NEW, speculative_tokens=k)  # the whole prompts cached by now
    assert [c.tokens for c in again] == [plain(p) for p in prompts[:2]]
    assert all(c.stats["cached_tokens"] >= 20 for c in again)
    assert_pools_clean(spec, [p + c.tokens for p, c in zip(prompts, out)])


def test_engine_is_plain_decoding(spec, plain):
    prompts = PROMPTS + [PROMPTS[1] + [3, 3], PROMPTS[3] * 3]
    with InferenceEngine(spec, max_batch_size=3) as engine:
        handles = [engine.submit(p, SamplingParams(NEW, speculative_tokens=1 + i % 4)) for i, p in enumerate(prompts)]
        out = [h.result() for h in handles]
    assert [c.tokens for c in out] == [plain(p) for p in prompts]
    assert sum(c.stats["speculative_rounds"] for c in out) > 0
    assert_pools_clean(spec, [p + c.tokens for p, c in zip(prompts, out)])


def test_token_trees_are_plain_decoding(spec, plain):
    """``draft_tree``: the draft model's chain with its next most likely tokens as leaves, one tree-masked verify."""
    out = [spec.generate(p, NEW, draft_tree=(2, 2, 1)) for p in PROMPTS[:2]]
    out += spec.generate_batch(PROMPTS[2:], NEW, draft_tree=(3, 1))
    assert [c.tokens for c in out] == [plain(p) for p in PROMPTS]
    assert all(c.stats["speculative_rounds"] > 0 for c in out)
    assert_pools_clean(spec, [p + c.tokens for p, c in zip(PROMPTS, out)])


def test_a_draft_forward_that_raises_fails_only_its_round(checkpoints, plain, monkeypatch):
    """A draft forward raising in the prefill's absorb stops drafting for that request (plain decoding, no
    rounds); raising inside rounds (a chain step, then a backlog feed) drops those rounds alone (``draft_errors``)
    and drafting resumes. Outputs stay plain decoding's and the draft KV written before stays whole."""
    lm = load(checkpoints["target"], drafter=f"draft:{checkpoints['first_layer']}")
    real = lm.drafter.transformer.forward
    calls = {"n": 0, "fail": set()}

    def flaky(*args: Any, **kwargs: Any) -> Any:
        calls["n"] += 1
        if calls["n"] in calls["fail"]:
            raise RuntimeError("draft device lost")
        return real(*args, **kwargs)

    monkeypatch.setattr(lm.drafter.transformer, "forward", flaky)
    calls.update(n=0, fail={1})  # the prompt's draft prefill
    with pytest.warns(RuntimeWarning, match="failed a prefill.*draft device lost"):
        c = lm.generate(PROMPTS[0], NEW, speculative_tokens=3)
    assert c.tokens == plain(PROMPTS[0]) and c.stats["speculative_rounds"] == 0
    calls.update(n=0, fail={3, 4})  # 1: prefill, 2: round 1's feed, 3: its first chain step, 4: round 2's feed
    with pytest.warns(RuntimeWarning, match="draft device lost"):
        c = lm.generate(PROMPTS[2], NEW, speculative_tokens=3)
    assert c.tokens == plain(PROMPTS[2])
    assert c.stats["draft_errors"] == 2 and c.stats["speculative_rounds"] > 0
    assert_pools_clean(lm, [PROMPTS[2] + c.tokens])
    lm.close()


# ---------------------------------------------------------------------------------------------- sampling
def test_seeded_sampling_equals_plain_sampling_and_sampled_drafts_run(checkpoints, plain):
    lm = load(checkpoints["target"], drafter=f"draft:{checkpoints['first_layer']}")
    served = []
    for prompt in PROMPTS[:3]:
        c = lm.generate(prompt, NEW, temperature=0.8, seed=5, speculative_tokens=3)
        assert c.tokens == plain(prompt, temperature=0.8, seed=5)  # greedy drafts keep the target's own draws
        assert c.stats["speculative_rounds"] > 0
        served.append(prompt + c.tokens)
    sampled = lm.generate_batch(PROMPTS, NEW, temperature=0.9, seed=7, draft_sampling="sample",
                                speculative_tokens=3)
    for c in sampled:
        assert len(c.tokens) == NEW and all(0 <= t < VOCAB for t in c.tokens)
        assert c.stats["speculative_rounds"] > 0 and c.stats["accepted_drafts"] <= c.stats["proposed_drafts"]
    assert sum(c.stats["accepted_drafts"] for c in sampled) > 0
    assert_pools_clean(lm, served + [p + c.tokens for p, c in zip(PROMPTS, sampled)])
    lm.close()


# ---------------------------------------------------------------------------------------------- construction
def test_load_refuses_another_vocabulary_and_close_closes_the_draft_pool(checkpoints):
    with pytest.raises(ValueError, match=r"101 tokens, the target's 97"):
        load(checkpoints["target"], drafter=f"draft:{checkpoints['other_vocab']}")
    target = load(checkpoints["target"])
    parts = DrafterContext(target.transformer, target.pool, target.backend, target.max_seq_len,
                           load_model=LanguageModel.from_pretrained)
    with pytest.raises(ValueError, match="101.*97"):
        DraftModelDrafter.load(checkpoints["other_vocab"], parts)
    other = load(checkpoints["other_vocab"])
    with pytest.raises(ValueError, match="101.*97"):
        DraftModelDrafter(other, target.config.vocab_size)
    with pytest.raises(ValueError, match="num_speculative_tokens"):
        DraftModelDrafter.load(checkpoints["first_layer"], parts, num_speculative_tokens=0)
    other.close()
    drafter = DraftModelDrafter.load(checkpoints["first_layer"], parts, num_speculative_tokens=2)
    assert isinstance(drafter, Drafter) and drafter.num_speculative_tokens == 2
    lm = LanguageModel(target.config, target.transformer, target.tokenizer, target.pool, target.backend,
                       target.max_seq_len, drafter=drafter)
    assert lm.serving_context.speculative_tokens_for(None) == 2
    lm.close()
    assert drafter.pool.closed and target.pool.closed


def test_a_full_draft_pool_decodes_plainly(checkpoints, plain):
    lm = load(checkpoints["target"], drafter=f"draft:{checkpoints['first_layer']}")
    pool = lm.drafter.pool
    held = [pool.bind_request([], 4) for _ in range(pool.num_slots // 4)]  # every page bound elsewhere
    c = lm.generate(PROMPTS[0], NEW, speculative_tokens=3)
    assert c.tokens == plain(PROMPTS[0]) and c.stats["speculative_rounds"] == 0
    for rid in held:
        pool.unbind_request(rid)
    c = lm.generate(PROMPTS[2], NEW, speculative_tokens=3)
    assert c.tokens == plain(PROMPTS[2]) and c.stats["speculative_rounds"] > 0
    assert_pools_clean(lm, [PROMPTS[2] + c.tokens])
    lm.close()


# ---------------------------------------------------------------------------------------------- the shipped draft
def test_the_shipped_draft_model_drafts_for_the_default_model() -> None:
    """``DEFAULT_DRAFT_DIR``: a trained 2-layer model of the default model's vocabulary. As its drafter the output is
    plain decoding's, and on Python source most drafts are kept (its README: 0.91-0.99 at every position)."""
    from smile_llm.models.shipped import DEFAULT_DRAFT_DIR

    lm = LanguageModel.default(max_seq_len=512, drafter=f"draft:{DEFAULT_DRAFT_DIR}")
    try:
        assert isinstance(lm.drafter, DraftModelDrafter) and lm.drafter.transformer.config.num_hidden_layers == 2
        prompt = "def read_lines(path, encoding='utf-8'):\n    \"\"\"Return the lines of the file.\"\"\"\n    "
        out = lm.generate(prompt, 64, speculative_tokens=4)
        assert out.tokens == lm.generate(prompt, 64, speculative_tokens=0).tokens
        assert out.stats["accepted_drafts"] > 0.7 * out.stats["proposed_drafts"], out.stats
    finally:
        lm.close()
