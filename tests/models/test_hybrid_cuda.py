"""Hybrid models served on CUDA (GPU only: marked ``cuda``, skipped without a CUDA device; ``scripts/gpu_check.sh``
runs it in its fla-core step): fla-core's gated delta rule (when it imports, else the PyTorch forms on the GPU), the
state pool and its prefix snapshots on the device, attention on the PyTorch reference (these float32 models of head
dim 32 are beyond FlashInfer's kernels: the model falls back, with one warning). Greedy output equals the CPU
model's, single, batched, speculative (the MTP head) and on a prefix hit."""

from __future__ import annotations

import pytest
import torch

from tests.models.hybrid_models import HYBRID_PROMPT, hybrid_zoo  # noqa: F401 - fixture
from .test_hybrid_parity import PROMPTS

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


@pytest.mark.parametrize("family", ["qwen3_5", "qwen3_next"])
def test_greedy_output_on_cuda_equals_the_cpu(hybrid_zoo, family):  # noqa: F811 - the fixture above
    hf = hybrid_zoo(family)
    cpu = hf.load(page_size=16, max_seq_len=160, max_batch_size=4, drafter=None)
    gpu = hf.load(page_size=16, max_seq_len=160, max_batch_size=4, device="cuda", dtype=torch.float32)
    try:
        assert gpu.backend.name == "reference"
        want = [c.tokens for c in cpu.generate_batch(PROMPTS, 12)]
        assert gpu.generate(PROMPTS[0], 12, speculative_tokens=0).tokens == want[0]
        assert [c.tokens for c in gpu.generate_batch(PROMPTS, 12, speculative_tokens=0)] == want
        assert [c.tokens for c in gpu.generate_batch(PROMPTS, 12)] == want  # MTP speculation: verify + rewind
        longer = HYBRID_PROMPT * 3 + [1, 2, 3]
        first = gpu.generate(longer, 8)
        again = gpu.generate(longer + first.tokens + [9], 8)  # a hit restores a snapshot taken on the device
        assert again.stats["cached_tokens"] > 0
        assert again.tokens == cpu.generate(longer + first.tokens + [9], 8).tokens
        gpu.pool.check_invariants()
    finally:
        cpu.close()
        gpu.close()
