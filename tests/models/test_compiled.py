"""The compiled forward (``from_pretrained(compile=True)``, ``smile_llm.models.compiled``) against the eager one.

- Greedy tokens compiled equal eager and transformers' on the HF parity configs (dense families; Qwen3.5 and
  Qwen3-Next hybrids, whose DeltaNet mixers and sparse MoE blocks run outside the graph) and on the shipped models,
  plain and speculative (the MTP head eager beside compiled layers, and a compiled draft model): identical token
  sequences, because the greedy choices lead by far more than inductor's fused reductions move a logit
  (tests/conftest.py).
- Logits of one forward within fp32 rounding of the eager ones (inductor fuses and reorders reductions: not bit for
  bit, and that is said here rather than hidden).
- Few variants whatever the windows: prefills of 1 to 40 tokens in batches of 1 to 4, decode steps, verify windows
  of every draft count and prefix hits make at most two variants of the layers (a window of one token, or of more;
  the hybrid layers four: one row or more as well); more would be a recompile storm.
- Two models of one structure share the compiled function and each computes with its own weights, dense and hybrid
  (each model's DeltaNet mixers run, on its own state).
- A second process takes the compiled code from inductor's on-disk cache: no inductor compile the second time.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from smile_llm.language_model import LanguageModel
from smile_llm.models.shipped import DEFAULT_DRAFT_DIR, DEFAULT_MODEL_DIRS

from tests.hf_zoo import FAMILIES, GEN_LEN, LONG_PROMPT, PROMPT, assert_clean, expected_greedy
from tests.models.mtp_models import exact_logits
from tests.models.hybrid_models import HYBRID_FAMILIES, HYBRID_PROMPT, hybrid_zoo  # noqa: F401 - fixture

PROMPTS = [PROMPT, LONG_PROMPT, PROMPT[:5]]
SHIPPED_PROMPTS = ["def main(argv):\n    ", "import os\nimport sys\n", "class Pool:\n"]


@pytest.mark.parametrize("family", FAMILIES)
def test_dense_families_compiled_greedy_equals_eager_and_transformers(zoo, family):
    hf = zoo(family)
    eager, compiled = hf.load(compile=False), hf.load(compile=True)
    try:
        assert compiled.compile_stats["compiled"] and not eager.compile_stats["compiled"]
        want = [expected_greedy(hf, p, GEN_LEN) for p in PROMPTS]
        for model in (eager, compiled):
            got = [(c.tokens, c.finish_reason) for c in model.generate_batch(PROMPTS, GEN_LEN)]
            assert got == want
            assert (model.generate(PROMPT, GEN_LEN).tokens, "x") == (want[0][0], "x")
            assert_clean(model.pool)
        # one forward: within fp32 rounding of eager (depth 2, fused reductions), far below any greedy margin
        a, b = exact_logits(compiled, LONG_PROMPT), exact_logits(eager, LONG_PROMPT)
        tol = 64 * torch.finfo(torch.float32).eps * max(1.0, b.abs().max().item())
        assert (a - b).abs().max().item() <= tol
        assert compiled.transformer.compiled is not None and compiled.transformer.compiled.variants <= 2
    finally:
        eager.close()
        compiled.close()


@pytest.mark.parametrize("family", HYBRID_FAMILIES)
def test_hybrid_families_compiled_greedy_equals_transformers(hybrid_zoo, family):  # noqa: F811 - the fixture
    """DeltaNet mixers (and Qwen3-Next's sparse MoE) run outside the graph on the forward's own state."""
    hf = hybrid_zoo(family)
    lm = hf.load(page_size=4, max_seq_len=128, max_batch_size=4, drafter=None, compile=True)
    try:
        prompts = [HYBRID_PROMPT, [5, 9, 200, 17], [(7 * i + 3) % 256 for i in range(37)]]
        want = [expected_greedy(hf, p, 10) for p in prompts]
        assert [(c.tokens, c.finish_reason) for c in lm.generate_batch(prompts, 10)] == want
        assert (lm.generate(prompts[0], 10).tokens, 0) == (want[0][0], 0)
        # inductor specialises the gated attention's sliced q/k on one row: one row or more times one token or
        # more, four variants at most, whatever the shapes
        assert lm.compile_stats["compiled"] and 1 <= lm.compile_stats["compiled_variants"] <= 4
        lm.pool.check_invariants()
        assert lm.pool.bound_request_count == 0
    finally:
        lm.close()


@pytest.mark.parametrize("kind", sorted(DEFAULT_MODEL_DIRS))
def test_shipped_models_compiled_equal_eager_plain_and_speculative(kind):
    """The shipped models with their MTP heads: plain and speculative greedy tokens compiled are eager's, and
    speculation stays lossless; the layers' variants stay at most two (dense) or four (hybrid)."""
    eager = LanguageModel.default(kind, compile=False)
    compiled = LanguageModel.default(kind, compile=True)
    try:
        for k in (0, 3):
            want = [c.tokens for c in eager.generate_batch(SHIPPED_PROMPTS, 24, speculative_tokens=k)]
            got = [c.tokens for c in compiled.generate_batch(SHIPPED_PROMPTS, 24, speculative_tokens=k)]
            assert got == want
        assert [c.tokens for c in compiled.generate_batch(SHIPPED_PROMPTS, 24, speculative_tokens=0)] == want
        transformer = compiled.transformer
        assert transformer.compiled is not None and transformer.mtp is not None
        # dense: one token or more; hybrid: times one row or more (the gated attention's sliced q/k)
        assert transformer.compiled.variants <= (2 if kind == "dense" else 4)
        stats = compiled.compile_stats
        assert stats["compiled"] and stats["compiled_variants"] >= 2
        # the seconds are this model's: zero when an earlier model of this structure in the process made the variants
        assert (stats["compile_seconds"] > 0) == (transformer.compiled.stats.variants > 0)
    finally:
        eager.close()
        compiled.close()


def test_a_compiled_target_compiles_its_draft_model():
    eager = LanguageModel.default("dense", drafter=f"draft:{DEFAULT_DRAFT_DIR}", compile=False)
    compiled = LanguageModel.default("dense", drafter=f"draft:{DEFAULT_DRAFT_DIR}", compile=True)
    try:
        draft = compiled.drafter.model  # type: ignore[union-attr]
        assert draft.compile_stats["compiled"]
        for model in (eager, compiled):
            out = model.generate(SHIPPED_PROMPTS[0], 24, speculative_tokens=3)
            assert out.stats["speculative_rounds"] > 0
        want = eager.generate(SHIPPED_PROMPTS[0], 24, speculative_tokens=0).tokens
        assert compiled.generate(SHIPPED_PROMPTS[0], 24, speculative_tokens=3).tokens == want
    finally:
        eager.close()
        compiled.close()


def test_every_window_shape_shares_a_few_variants(zoo):
    """The recompile-storm check: prefills of 1..40 tokens in ragged batches of 1..4, decode steps, verify windows
    of k = 1..4 with their draft steps and prefix hits (windows that start mid-page) leave at most two variants of
    the layers; tokens stay the eager model's."""
    from tests.models.mtp_models import build_mtp_model

    folder = build_mtp_model(Path(zoo.factory.mktemp("compiled_mtp")) / "qwen3", "qwen3", seed=5)
    eager = LanguageModel.from_pretrained(folder, page_size=4, max_seq_len=128, max_batch_size=4, compile=False)
    lm = LanguageModel.from_pretrained(folder, page_size=4, max_seq_len=128, max_batch_size=4, compile=True)
    try:
        rng = np.random.default_rng(0)
        for n in (1, 2, 3, 4):
            prompts = [rng.integers(2, 97, size=int(rng.integers(1, 41))).tolist() for _ in range(n)]
            for k in (0, n):
                want = [c.tokens for c in eager.generate_batch(prompts, 6, speculative_tokens=k)]
                got = [c.tokens for c in lm.generate_batch(prompts, 6, speculative_tokens=k)]
                assert got == want, (n, k)
        # prefix hits: the same prompts again start mid-page
        got = [c.tokens for c in lm.generate_batch(prompts, 6, speculative_tokens=2)]
        assert got == [c.tokens for c in eager.generate_batch(prompts, 6, speculative_tokens=2)]
        assert lm.transformer.compiled is not None and lm.transformer.mtp is not None
        assert lm.transformer.compiled.variants <= 2, lm.transformer.compiled.stats.shapes
        assert_clean(lm.pool)
    finally:
        eager.close()
        lm.close()


def test_two_models_of_one_structure_share_the_function_and_keep_their_weights(zoo):
    """``llama`` and ``llama3`` have the same layers (their RoPE differs in the tables, which are inputs) and other
    weights: one compiled function serves both, each with its own weights and tables."""
    a_hf, b_hf = zoo("llama"), zoo("llama3")
    a, b = a_hf.load(compile=True), b_hf.load(compile=True)
    try:
        assert a.transformer.compiled is not None and b.transformer.compiled is not None
        assert a.transformer.compiled._code is b.transformer.compiled._code
        for hf, lm in ((a_hf, a), (b_hf, b)):
            assert lm.generate(LONG_PROMPT, GEN_LEN).tokens == expected_greedy(hf, LONG_PROMPT, GEN_LEN)[0]
    finally:
        a.close()
        b.close()


def test_two_hybrid_models_of_one_structure_each_run_their_own_outside_blocks(hybrid_zoo, tmp_path):  # noqa: F811
    """A graph traced for one hybrid model calls the DeltaNet mixers of whichever model runs it: two checkpoints of
    one structure and other weights each give their own transformers' tokens, also after the first is closed (the
    blocks were once keyed per model, and the second model ran the first's mixers, then failed once it closed)."""
    from tests.models.hybrid_models import build_hybrid_model

    a_hf = hybrid_zoo("qwen3_5")
    b_hf = build_hybrid_model("qwen3_5", tmp_path / "other", seed=4321)
    a = a_hf.load(page_size=4, max_seq_len=128, max_batch_size=2, drafter=None, compile=True)
    b = b_hf.load(page_size=4, max_seq_len=128, max_batch_size=2, drafter=None, compile=True)
    try:
        assert a.transformer.compiled._code is b.transformer.compiled._code
        for hf, lm in ((a_hf, a), (b_hf, b)):
            assert lm.generate(HYBRID_PROMPT, 10).tokens == expected_greedy(hf, HYBRID_PROMPT, 10)[0]
        a.close()
        assert b.generate(HYBRID_PROMPT, 10).tokens == expected_greedy(b_hf, HYBRID_PROMPT, 10)[0]
    finally:
        a.close()
        b.close()


CACHE_SCRIPT = textwrap.dedent("""
    import json, sys
    import torch
    from torch._dynamo.utils import counters
    from smile_llm.language_model import LanguageModel
    torch.set_num_threads(1)
    lm = LanguageModel.from_pretrained(sys.argv[1], page_size=4, max_seq_len=64, compile=True)
    tokens = lm.generate([3, 1, 4, 1, 5, 9, 2, 6], 4).tokens
    print(json.dumps({"tokens": tokens, "stats": lm.compile_stats,
                      "inductor": dict(counters["inductor"])}))
""")


def test_a_second_process_takes_the_compiled_code_from_the_on_disk_cache(zoo, tmp_path):
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"), "SMILE_COMPILE": "1"}
    runs = []
    for _ in range(2):
        done = subprocess.run([sys.executable, "-c", CACHE_SCRIPT, str(zoo("qwen2").path)], env=env,
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    first, second = runs
    assert first["tokens"] == second["tokens"]
    assert first["stats"]["compiled_variants"] == second["stats"]["compiled_variants"] >= 1
    assert first["inductor"].get("fxgraph_cache_miss", 0) >= 1
    assert second["inductor"].get("fxgraph_cache_miss", 0) == 0, second["inductor"]
    assert second["inductor"].get("fxgraph_cache_hit", 0) >= 1, second["inductor"]
