"""Tiny random hybrid checkpoints (Qwen3.5 and Qwen3-Next) saved by ``transformers``, the HF parity oracles.

``build_hybrid_model(family, folder, seed)`` makes a seeded ``Qwen3_5ForCausalLM`` / ``Qwen3NextForCausalLM`` (hidden
64, 4 layers ``[linear, linear, linear, full]``, 4 heads of 32 with 2 KV heads, DeltaNet 2 key heads x 16 and 4 value
heads x 8, conv width 4, vocab 257; Next: 4 experts, top 2, a shared expert, layer 1 dense through
``mlp_only_layers``), saves it with ``save_pretrained(safe_serialization=True)``, appends seeded MTP tensors
(``transformers`` has no MTP module and saves none), writes ``smile_tokenizer.json`` (byte tokenizer, EOS 256) and
returns a ``conftest.HFModel`` (folder + float32 eval HF model: ``logits``, ``greedy``, ``load``). The MTP head has no
HF oracle. ``make_multimodal(src, dst)`` rewrites a Qwen3.5 checkpoint the way a multimodal release stores it.
Fixtures that need ``transformers`` skip cleanly without it.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from smile_llm.models.checkpoint.config import ModelConfig
from smile_llm.models.checkpoint.hybrid_layout import expected_hybrid_tensors

from tests.hf_zoo import HFModel

HYBRID_VOCAB = 257
HYBRID_EOS = 256
HYBRID_FAMILIES = ("qwen3_5", "qwen3_next")
HYBRID_PROMPT = [(13 * i + 7) % 256 for i in range(21)]  # 21 tokens: not a multiple of 4, 8 or 16

_COMMON: dict[str, Any] = {
    "vocab_size": HYBRID_VOCAB, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 4,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32, "max_position_embeddings": 512,
    "rms_norm_eps": 1e-6, "layer_types": ["linear_attention"] * 3 + ["full_attention"],
    "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 16, "linear_value_head_dim": 8,
    "linear_conv_kernel_dim": 4, "mtp_num_hidden_layers": 1, "tie_word_embeddings": False,
    "bos_token_id": None, "eos_token_id": HYBRID_EOS, "pad_token_id": None,
}
_FAMILY: dict[str, dict[str, Any]] = {
    "qwen3_5": {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25,
                                    "mrope_section": [2, 1, 1], "mrope_interleaved": True}},
    "qwen3_next": {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
                   "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                   "shared_expert_intermediate_size": 48, "norm_topk_prob": True, "decoder_sparse_step": 1,
                   "mlp_only_layers": [1]},
}


def hybrid_hf_config(family: str, **overrides: Any) -> dict[str, Any]:
    """The keyword arguments of the tiny HF config of ``family`` (also a valid ``config.json`` body once
    ``model_type`` is added)."""
    cfg = {**_COMMON, **_FAMILY[family]}
    cfg.update(overrides)
    return cfg


def _fill(name: str, p: torch.Tensor, g: torch.Generator) -> None:
    """One parameter at a scale that gives varied logits: zero-centred norms near 0 (scale 1 + w), the DeltaNet
    gated norm near 1, decays A = exp(A_log) in [0.5, 4], projections ~1.5/sqrt(fan_in)."""
    noise = torch.randn(p.shape, generator=g)
    if name.endswith("linear_attn.norm.weight"):
        p.copy_(1.0 + 0.2 * noise)
    elif p.dim() == 1 and "norm" in name:
        p.copy_(0.2 * noise)
    elif name.endswith("A_log"):
        p.copy_(torch.empty(p.shape).uniform_(0.5, 4.0, generator=g).log())
    elif name.endswith(("dt_bias", "bias")):
        p.copy_(0.3 * noise)
    elif "embed_tokens" in name:
        p.copy_(0.5 * noise)
    else:  # 2-D [out, in], conv [C, 1, K], fused experts [E, out, in]: fan-in is the last dim
        p.copy_(1.5 * noise / math.sqrt(p.shape[-1]))


def randomize_hybrid(model: torch.nn.Module, seed: int) -> None:
    """Seeded re-initialisation of every parameter (see ``_fill``)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            _fill(name, p, g)


def mtp_tensors(config: ModelConfig, seed: int) -> dict[str, torch.Tensor]:
    """Seeded float32 MTP tensors (every ``mtp.*`` name of the layout) at the scales of ``_fill``."""
    g = torch.Generator().manual_seed(seed + 7919)
    out: dict[str, torch.Tensor] = {}
    for name, shape in expected_hybrid_tensors(config).items():
        if name.startswith("mtp."):
            out[name] = torch.empty(shape)
            _fill(name, out[name], g)
    return out


def build_hybrid_model(family: str, folder: Path, seed: int = 0, **overrides: Any) -> HFModel:
    """Save a tiny random ``family`` checkpoint (plus MTP tensors when ``mtp_num_hidden_layers`` > 0) into
    ``folder`` and return it with its HF model."""
    transformers = pytest.importorskip("transformers")
    from safetensors.torch import load_file, save_file

    config_cls, model_cls = {
        "qwen3_5": (transformers.Qwen3_5TextConfig, transformers.Qwen3_5ForCausalLM),
        "qwen3_next": (transformers.Qwen3NextConfig, transformers.Qwen3NextForCausalLM),
    }[family]
    torch.manual_seed(seed)
    model = model_cls(config_cls(**hybrid_hf_config(family, **overrides))).eval()
    randomize_hybrid(model, seed)
    model.save_pretrained(folder, safe_serialization=True)
    config = ModelConfig.from_pretrained(folder)
    if config.mtp_num_hidden_layers:
        path = folder / "model.safetensors"
        tensors = load_file(str(path))
        tensors.update(mtp_tensors(config, seed))
        save_file(tensors, str(path), metadata={"format": "pt"})
    (folder / "smile_tokenizer.json").write_text(json.dumps({"vocab_size": HYBRID_VOCAB,
                                                             "eos_token_id": HYBRID_EOS}))
    return HFModel(family, folder, model, HYBRID_EOS)


def make_multimodal(src: Path, dst: Path) -> Path:
    """Copy a Qwen3.5 checkpoint as a multimodal release stores it: ``config.json`` with ``model_type`` ``qwen3_5``
    and the text config under ``text_config`` (plus a small ``vision_config``), text tensors under
    ``model.language_model.``, one vision tensor under ``model.visual.``; ``lm_head`` and ``mtp.*`` unchanged."""
    from safetensors.torch import load_file, save_file

    dst.mkdir(parents=True, exist_ok=True)
    text = json.loads((src / "config.json").read_text())
    top = {"model_type": "qwen3_5", "architectures": ["Qwen3_5ForConditionalGeneration"], "text_config": text,
           "vision_config": {"depth": 1, "hidden_size": 16, "out_hidden_size": text["hidden_size"]},
           "image_token_id": 250, "tie_word_embeddings": False}
    (dst / "config.json").write_text(json.dumps(top))
    tensors = {("model.language_model." + n[len("model."):] if n.startswith("model.") else n): t
               for n, t in load_file(str(src / "model.safetensors")).items()}
    tensors["model.visual.patch_embed.proj.weight"] = torch.zeros(16, 3, 2, 16, 16)
    save_file(tensors, str(dst / "model.safetensors"), metadata={"format": "pt"})
    shutil.copy(src / "smile_tokenizer.json", dst / "smile_tokenizer.json")
    return dst


class HybridZoo:
    """Lazily built, session-cached hybrid checkpoints, by family."""

    def __init__(self, factory: pytest.TempPathFactory) -> None:
        self.factory = factory
        self.models: dict[str, HFModel] = {}

    def __call__(self, family: str) -> HFModel:
        if family not in self.models:
            seed = 2000 + HYBRID_FAMILIES.index(family)
            self.models[family] = build_hybrid_model(family, self.factory.mktemp(family), seed)
        return self.models[family]


@pytest.fixture(scope="session")
def hybrid_zoo(tmp_path_factory: pytest.TempPathFactory) -> HybridZoo:
    """Import this fixture into a test module (``from tests.models.hybrid_models import hybrid_zoo``) to use it."""
    pytest.importorskip("transformers")
    return HybridZoo(tmp_path_factory)
