"""Token-tree verify windows through FlashInfer on a GPU (GPU only: every test is marked ``cuda`` and skipped without
CUDA and flashinfer; ``scripts/gpu_check.sh`` runs them in its token-tree step, with the kernel-level
``test_token_tree_masks_match_reference`` of ``test_flashinfer_cuda.py``).

A tree's custom mask is planned on fa2 (fa3, which compute capability 9.x takes for plain prefill, has no custom
masks) with ``qo_indptr`` on the CSR's device (FlashInfer's mask plan does arithmetic on both). A random Qwen3-style
model, head dim 128, with an MTP head: in fp16, one tree verify forward through FlashInfer equals the reference's on
a copy of the same KV within 2e-3 of the largest logit (on the CPU the fp16 model is within 0.4e-3 of the float32
one, while dropping the tree's mask moves the logits by 2e-2); in bf16, ``generate(draft_tree=...)`` runs its tree
rounds on the GPU.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from smile_llm.attention.flashinfer import FlashInferBackend, flashinfer_available
from smile_llm.attention.torch.backend import TorchBackend
from smile_llm.cache import KvCachePool
from smile_llm.language_model import LanguageModel
from smile_llm.models.checkpoint.config import ModelConfig
from smile_llm.models.transformer import Transformer
from smile_llm.speculative.draft_tree import DraftTree, window_mask

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not (torch.cuda.is_available() and flashinfer_available()),
                       reason="needs a CUDA device and flashinfer (pip install -e '.[gpu]')"),
]

CONFIG = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 257, "hidden_size": 256,
          "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
          "head_dim": 128, "max_position_embeddings": 1024, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
          "tie_word_embeddings": True, "eos_token_id": 256, "mtp_num_hidden_layers": 1,
          "speculative_config": {"num_speculative_tokens": 3}}
PROMPTS = [[5, 17, 3, 44, 9, 60, 2, 81, 33, 12, 7], list(range(40, 58))]  # 11 and 18 tokens: ragged rows
REL = 2e-3  # fp16, relative to the reference's largest logit magnitude


def _prefilled_pool(tr: Transformer) -> KvCachePool:
    """Both prompts but their last token, prefilled through the reference (the same KV in every such pool)."""
    pool = KvCachePool(2, 64 * 4, 2, 128, 4, "cuda", tr.dtype)
    pool.prefix_reuse_enabled = False
    ids = []
    for prompt in PROMPTS:
        rid = pool.bind_request(prompt[:-1], 32)
        pool.activate_step(rid)
        tr(torch.tensor([prompt[:-1]], device="cuda"), np.array([0]), pool, TorchBackend())
        ids.append(rid)
    pool.activate_step(*ids)
    return pool


def test_a_tree_verify_forward_through_flashinfer_equals_the_reference() -> None:
    torch.manual_seed(0)
    tr = Transformer(ModelConfig.from_dict(CONFIG)).to("cuda", torch.float16).eval()
    parents = np.array([[0, 0, 1, 1, 2], [0, 1, 2, 2, 0]])  # bushy and chain-like, 5 nodes each
    tokens = torch.tensor([[11, 12, 13, 14, 15], [21, 22, 23, 24, 25]])
    tree = DraftTree(tokens, parents)
    window = torch.cat([torch.tensor([[p[-1]] for p in PROMPTS]), tokens], dim=1).cuda()
    start = np.array([len(p) - 1 for p in PROMPTS])
    offsets, mask = tree.depths(), window_mask(tree, start)
    want = tr(window, start, _prefilled_pool(tr), TorchBackend(), offsets=offsets, mask=mask).logits.float()
    backend = FlashInferBackend("cuda")
    got = tr(window, start, _prefilled_pool(tr), backend, offsets=offsets, mask=mask).logits.float()
    assert backend.kernel == "prefill"
    assert torch.isfinite(got).all()
    err, scale = (got - want).abs().max().item(), want.abs().max().item()
    assert err <= REL * scale, f"max error {err:.3g} > {REL} x {scale:.3g}"
    causal = tr(window, start, _prefilled_pool(tr), TorchBackend()).logits.float()  # the same window, no tree
    assert (causal - want).abs().max().item() > 2 * REL * scale  # the tolerance tells a dropped mask apart


def test_generate_with_token_trees_runs_its_rounds_on_flashinfer(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    torch.manual_seed(0)
    tr = Transformer(ModelConfig.from_dict(CONFIG))
    save_file({k: v.contiguous() for k, v in tr.state_dict().items() if k != "lm_head.weight"},
              str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps(CONFIG))
    lm = LanguageModel.from_pretrained(tmp_path, device="cuda", dtype=torch.bfloat16, page_size=4, max_batch_size=2,
                                       max_seq_len=256, mem_fraction=0.3)
    try:
        assert lm.backend.name == "flashinfer" and lm.tree_rounds
        out = lm.generate(PROMPTS[1], 16, draft_tree=(2, 2))
        assert out.tokens and out.stats["speculative_rounds"] > 0 and out.stats["draft_errors"] == 0
        again = lm.generate(PROMPTS[1] + out.tokens, 8, draft_tree=(3, 1))  # a prefix hit on tree-decoded KV
        assert again.tokens and again.stats["cached_tokens"] > 0
        lm.pool.check_invariants()
    finally:
        lm.close()
