"""``from_pretrained(kv_dtype=..., kv_scales=...)``: the KV pools store the chosen dtype (FP8 with its scales), the
model still generates (speculation lossless on FP8 KV), and bad names or scales without FP8 are refused."""

from __future__ import annotations

import pytest
import torch

from smile_llm import LanguageModel


def test_fp8_kv_stores_fp8_and_speculation_stays_lossless() -> None:
    lm = LanguageModel.default(max_seq_len=256, kv_dtype="fp8_e4m3", kv_scales=(2.0, 2.0))
    try:
        assert lm.pool.dtype == torch.float8_e4m3fn and lm.pool.compute_dtype == torch.float32
        assert (lm.pool.k_scale, lm.pool.v_scale) == (2.0, 2.0)
        plain = lm.generate("def main(argv):\n", 30, speculative_tokens=0)
        assert lm.generate("def main(argv):\n", 30, speculative_tokens=3).tokens == plain.tokens
        assert len(plain.tokens) == 30
        lm.pool.check_invariants()
    finally:
        lm.close()


def test_bfloat16_kv_and_bad_values() -> None:
    lm = LanguageModel.default(max_seq_len=64, kv_dtype=torch.bfloat16, drafter=None)
    assert lm.pool.dtype == torch.bfloat16
    lm.close()
    with pytest.raises(ValueError, match="kv_dtype must be one of"):
        LanguageModel.default(max_seq_len=64, kv_dtype="int5")
    with pytest.raises(ValueError, match="kv_scales apply to FP8 KV only"):
        LanguageModel.default(max_seq_len=64, kv_scales=(2.0, 2.0))
    # checked for the whole model before a rank joins any process group: every rank refuses alike (here no
    # torchrun job exists, so reaching the join would be another error)
    with pytest.raises(ValueError, match="kv_scales apply to FP8 KV only"):
        LanguageModel.default(max_seq_len=64, kv_scales=(2.0, 2.0), pipeline_parallel=2)
    with pytest.raises(ValueError, match="page_size"):
        LanguageModel.default(max_seq_len=64, kv_dtype="int4", page_size=5, pipeline_parallel=2)


SYSTEM = "# A small utility module.\nimport os\nimport sys\n\n\n"


@pytest.mark.parametrize("kv_dtype", ["nvfp4", "int2", {"k": "fp8_e4m3", "v": "nvfp4"},
                                      ["bfloat16"] * 2 + ["int4"] * 8 + ["bfloat16"] * 2])
def test_packed_kv_reads_the_same_however_the_forwards_were_cut(kv_dtype: object) -> None:
    """Packed pages (quantized once complete) read the same from a prefix hit as from a cold prefill, and a verify
    window that crosses a page boundary and is taken back (speculation) gives plain decoding's tokens: greedy text
    is identical three ways."""
    lm = LanguageModel.default(max_seq_len=256, kv_dtype=kv_dtype)
    cold = LanguageModel.default(max_seq_len=256, kv_dtype=kv_dtype)
    try:
        assert not lm.pool.direct and lm.pool.packed and not lm.tree_rounds
        lm.generate(SYSTEM + "def read_lines(path):\n", 8, speculative_tokens=0)
        warm = lm.generate(SYSTEM + "def main(argv):\n", 40, speculative_tokens=0)
        assert warm.stats["cached_tokens"] == 48  # three pages of the system prompt, quantized in the tree
        spec = lm.generate(SYSTEM + "def main(argv):\n", 40, speculative_tokens=3)
        cold.pool.prefix_reuse_enabled = False
        fresh = cold.generate(SYSTEM + "def main(argv):\n", 40, speculative_tokens=0)
        assert warm.tokens == fresh.tokens == spec.tokens and len(warm.tokens) == 40
        assert spec.stats["mean_accepted_length"] > 1.5  # windows were taken back and crossed pages
        lm.pool.check_invariants()
        assert lm.pool.bound_request_count == 0 and lm.pool.num_tails - lm.pool._kv.tails.free_tails == 0
    finally:
        lm.close()
        cold.close()


def test_packed_kv_on_the_hybrid_model_and_its_formats() -> None:
    lm = LanguageModel.default("hybrid", max_seq_len=256, kv_dtype={"k": "int4", "v": "nvfp4"})
    try:
        assert lm.pool.num_layers == 3 and lm.pool.dtype_for_layer(0) == "k=int4, v=nvfp4"
        plain = lm.generate("def main(argv):\n", 40, speculative_tokens=0)
        assert lm.generate("def main(argv):\n", 40, speculative_tokens=3).tokens == plain.tokens
        lm.pool.check_invariants()
    finally:
        lm.close()
    with pytest.raises(ValueError, match="lists 2 formats; the model has 3 KV layers"):
        LanguageModel.default("hybrid", max_seq_len=64, kv_dtype=["int4", "int4"])
    with pytest.raises(ValueError, match="page_size"):
        LanguageModel.default(max_seq_len=64, kv_dtype="int3", page_size=4)


def test_kv_diff_on_packed_kv_finds_warm_and_cold_alike() -> None:
    """The fingerprint tool on nvfp4 KV: a warm request (its prefix read from the tree, quantized) and a cold one
    hold the same values; each layer's tolerance is its format's rounding step."""
    from smile_llm.serving.kv_diff import kv_diff

    lm = LanguageModel.default(max_seq_len=256, kv_dtype={"k": "fp8_e4m3", "v": "nvfp4"}, drafter=None)
    try:
        report = kv_diff(lm, SYSTEM + "def main(argv):\n", SYSTEM)
        assert report.comparison.agree, report.describe()
    finally:
        lm.close()
