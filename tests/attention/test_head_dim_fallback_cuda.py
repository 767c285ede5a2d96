"""The shipped models (head dim 32) on a GPU: FlashInfer's prefill kernels run head dims 64, 128 and 256 only, so
each model falls back to the PyTorch reference with one warning naming the reason and still generates correctly
(GPU only: every test is marked ``cuda`` and skipped without CUDA and flashinfer; ``scripts/gpu_check.sh`` runs
them in its head-dim-32 step).

In float32 the GPU's greedy tokens equal the CPU's (plain, MTP speculation, a token tree); in the default bfloat16
the first token of a prompt whose top two logits are 1.1 apart equals the CPU's float32 one. No FlashInfer JIT
module is built: the reference serves every forward.
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch

from smile_llm.attention.flashinfer import flashinfer_available
from smile_llm import DEFAULT_DRAFT_DIR, LanguageModel

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not (torch.cuda.is_available() and flashinfer_available()),
                       reason="needs a CUDA device and flashinfer (pip install -e '.[gpu]')"),
]

PROMPTS = ["import os\n", "def main():\n    "]
CONFIDENT = "import numpy as np\n\n\ndef "  # its first token's top two logits are 1.1 apart (float32, CPU)
SIZE: dict[str, Any] = {"max_seq_len": 256, "max_batch_size": 2, "mem_fraction": 0.3}


def _load_warned(**kwargs: Any) -> tuple[LanguageModel, list[str]]:
    """A default model on CUDA and the FlashInfer fallback warnings its loading gave."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        lm = LanguageModel.default(device="cuda", **SIZE, **kwargs)
    return lm, [str(w.message) for w in caught if "FlashInfer" in str(w.message)]


def test_the_default_model_falls_back_with_one_warning_and_generates() -> None:
    cpu = LanguageModel.default(**SIZE)
    lm, fallbacks = _load_warned()
    try:
        assert len(fallbacks) == 1 and "head dim 32" in fallbacks[0] and "reference" in fallbacks[0]
        assert lm.backend.name == "reference" and lm.transformer.dtype == torch.bfloat16
        assert lm.runner.decode_graphs is None and lm.runner.verify_graphs is None  # graphs need FlashInfer
        out = lm.generate(CONFIDENT, 16, speculative_tokens=0)
        assert out.tokens[0] == cpu.generate(CONFIDENT, 1, speculative_tokens=0).tokens[0]
        spec = lm.generate(CONFIDENT, 16)  # MTP speculation: verify windows on the reference, on the GPU
        assert 0 < len(out.tokens) <= 16 and spec.tokens and spec.stats["speculative_rounds"] > 0
        lm.pool.check_invariants()
    finally:
        lm.close()
        cpu.close()


def test_in_float32_the_gpu_generates_the_cpus_tokens() -> None:
    cpu = LanguageModel.default(**SIZE)
    lm, fallbacks = _load_warned(dtype=torch.float32)
    try:
        assert len(fallbacks) == 1 and "head dim 32" in fallbacks[0] and "float32 queries" in fallbacks[0]
        want = [c.tokens for c in cpu.generate_batch(PROMPTS, 24, speculative_tokens=0)]
        assert [c.tokens for c in lm.generate_batch(PROMPTS, 24, speculative_tokens=0)] == want
        assert [c.tokens for c in lm.generate_batch(PROMPTS, 24)] == want  # MTP: verify windows, rewinds
        tree = lm.generate(PROMPTS[0], 24, draft_tree=(2, 2))  # a custom mask on the device, host-built
        assert tree.tokens == want[0] and tree.stats["speculative_rounds"] > 0
        lm.pool.check_invariants()
    finally:
        lm.close()
        cpu.close()


def test_a_draft_model_chooses_for_itself() -> None:
    """The draft model (head dim 32 too) is loaded by ``from_pretrained``: its own choice, its own warning."""
    lm, fallbacks = _load_warned(drafter=f"draft:{DEFAULT_DRAFT_DIR}")
    try:
        assert len(fallbacks) == 2 and all("head dim 32" in f for f in fallbacks)
        assert lm.backend.name == "reference" and lm.drafter is not None
        assert lm.drafter.backend.name == "reference"  # type: ignore[attr-defined]
        out = lm.generate(PROMPTS[0], 12)
        assert out.tokens and out.stats["speculative_rounds"] > 0 and out.stats["draft_errors"] == 0
    finally:
        lm.close()
