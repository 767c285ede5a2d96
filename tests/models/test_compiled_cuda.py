"""The compiled forward on CUDA (GPU only: marked ``cuda``, skipped without a CUDA device and flashinfer;
``scripts/gpu_check.sh`` runs it in its compiled step): the layers as inductor graphs around FlashInfer's attention,
inside the decode and verify CUDA graphs.

A random Qwen3-style model with head dim 128 (within FlashInfer's kernels), bf16, an MTP head. One forward's logits
compiled are eager's within bf16 tolerance with the same choice wherever the top logit clearly leads; generation
compiled, plain and speculative, captures its graphs, replays them and leaves the pool clean.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from smile_llm.attention.flashinfer import flashinfer_available
from smile_llm.language_model import LanguageModel

from tests.serving.test_cuda_graphs_cuda import assert_close, model_dir  # noqa: F401 - the fixture

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not (torch.cuda.is_available() and flashinfer_available()),
                       reason="needs a CUDA device and flashinfer (pip install -e '.[gpu]')"),
]


def load(folder, compile: bool) -> LanguageModel:
    return LanguageModel.from_pretrained(folder, device="cuda", dtype=torch.bfloat16, page_size=4,
                                         max_batch_size=4, max_seq_len=256, mem_fraction=0.25, compile=compile)


def test_compiled_layers_on_cuda_match_eager_and_run_in_cuda_graphs(model_dir):  # noqa: F811 - the fixture
    eager, compiled = load(model_dir, False), load(model_dir, True)
    try:
        assert compiled.backend.name == "flashinfer" and compiled.compile_stats["compiled"]
        ids = list(range(3, 40))
        outs = []
        for lm in (eager, compiled):
            rid = lm.pool.bind_request([], len(ids))
            lm.pool.activate_step(rid)
            outs.append(lm.transformer(torch.tensor([ids], device="cuda"), np.array([0]), lm.pool, lm.backend))
            lm.pool.unbind_requests()
        assert_close(outs[1], outs[0])
        prompts = [[5, 9, 200, 17, 3], list(range(50, 90))]
        for k in (0, 3):
            done = compiled.generate_batch(prompts, 24, speculative_tokens=k, min_new_tokens=24)
            assert [len(c.tokens) for c in done] == [24, 24]
        assert compiled.runner.decode_graphs.captures >= 1
        assert compiled.compile_stats["compiled_variants"] >= 2
        compiled.pool.check_invariants()
        assert compiled.pool.bound_request_count == 0
    finally:
        eager.close()
        compiled.close()
        torch.cuda.empty_cache()
