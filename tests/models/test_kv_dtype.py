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
        LanguageModel.default(max_seq_len=64, kv_dtype="int4")
    with pytest.raises(ValueError, match="kv_scales apply to FP8 KV only"):
        LanguageModel.default(max_seq_len=64, kv_scales=(2.0, 2.0))
