"""Tiny random checkpoints WITH an MTP head for the speculative-decoding tests, written without ``transformers``.

``build_mtp_model`` makes a Qwen3-, Qwen2- or Llama-style config dict with ``mtp_num_hidden_layers: 1``, a
``Transformer`` with seeded random weights, saves ``config.json`` + ``model.safetensors`` (HF names from the
state dict, the tied ``lm_head`` left out) and returns the folder. ``good_drafts=True`` makes a one-layer model
whose MTP head copies the main layer and reads only the token embedding, so with the whole context in its history
its drafts mostly agree with the target (long accepted runs; use an untied family, a tied LM head makes the model
repeat one token); random heads are mostly rejected. ``exact_logits`` computes a model's logits of a
whole sequence with one fresh forward on a private pool (the reference for distribution tests).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch

from smile_llm.attention.backend import select_backend
from smile_llm.cache import KvCacheLayout, KvCachePool
from smile_llm.language_model import LanguageModel
from smile_llm.models.checkpoint.config import ModelConfig
from smile_llm.models.transformer import Transformer

from tests.hf_zoo import randomize as randomize_weights

FAMILY_EXTRA: dict[str, dict[str, Any]] = {
    "qwen3": {"model_type": "qwen3", "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
              "tie_word_embeddings": True},
    "qwen2": {"model_type": "qwen2", "num_attention_heads": 4, "num_key_value_heads": 2},
    "llama": {"model_type": "llama", "num_attention_heads": 4, "num_key_value_heads": 2},
}


def mtp_config(family: str, vocab: int = 97, hidden: int = 32, layers: int = 2, **extra: Any) -> dict[str, Any]:
    cfg: dict[str, Any] = {"vocab_size": vocab, "hidden_size": hidden, "intermediate_size": 2 * hidden,
                           "num_hidden_layers": layers, "max_position_embeddings": 512, "rms_norm_eps": 1e-6,
                           "rope_theta": 10000.0, "bos_token_id": None, "eos_token_id": None,
                           "mtp_num_hidden_layers": 1, "speculative_config": {"num_speculative_tokens": 3}}
    cfg.update(FAMILY_EXTRA[family])
    cfg.update(extra)
    return cfg


def randomize(model: torch.nn.Module, seed: int, logit_scale: float = 1.0) -> None:
    """``conftest.randomize``, then ``logit_scale`` multiplies the LM head (or the tied embedding's use as one,
    through the final norm, and the MTP head's norm)."""
    randomize_weights(model, seed)
    if logit_scale != 1.0:
        assert isinstance(model, Transformer)
        with torch.no_grad():
            model.model.norm.weight.mul_(logit_scale)
            if model.mtp is not None:
                model.mtp.norm.weight.mul_(logit_scale)


def make_good_drafter(model: Transformer) -> None:
    """One main layer: the MTP head becomes that layer fed only the (unit-RMS) token embedding, with the main final
    norm, so MTP position t computes what the target computes at position t+1 (missing only the context before the
    history offset): its drafts mostly equal the target's greedy tokens."""
    assert model.mtp is not None and len(model.model.layers) == 1
    d = model.config.hidden_size
    with torch.no_grad():
        emb = model.model.embed_tokens.weight
        emb.div_(emb.pow(2).mean(-1, keepdim=True).sqrt())  # unit RMS rows: pre_fc_norm_embedding is ~identity
        model.mtp.pre_fc_norm_embedding.weight.fill_(1.0)
        fc = torch.zeros(d, 2 * d)
        fc[:, :d] = torch.eye(d)
        model.mtp.fc.weight.copy_(fc)
        model.mtp.layers[0].load_state_dict(model.model.layers[0].state_dict())
        model.mtp.norm.weight.copy_(model.model.norm.weight)


def save_checkpoint(model: Transformer, cfg: dict[str, Any], folder: Path) -> Path:
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(cfg))
    state = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
    if cfg.get("tie_word_embeddings"):
        state.pop("lm_head.weight")
    save_file(state, str(folder / "model.safetensors"))
    return folder


def build_mtp_model(folder: Path, family: str = "qwen3", seed: int = 0, *, good_drafts: bool = False,
                    logit_scale: float = 1.0, **cfg_extra: Any) -> Path:
    """Write a random MTP checkpoint into ``folder`` and return it."""
    if good_drafts:
        cfg_extra.setdefault("layers", 1)
    cfg = mtp_config(family, **cfg_extra)
    torch.manual_seed(seed)
    model = Transformer(ModelConfig.from_dict(cfg))
    randomize(model, seed, logit_scale)
    if good_drafts:
        make_good_drafter(model)
    return save_checkpoint(model, cfg, folder)


def load(folder: Path, page_size: int = 16, max_seq_len: int = 128, **kwargs: Any) -> LanguageModel:
    return LanguageModel.from_pretrained(folder, page_size=page_size, max_seq_len=max_seq_len, **kwargs)


def exact_logits(lm: LanguageModel, ids: list[int]) -> torch.Tensor:
    """float32 logits ``[len(ids), V]`` of one full forward over ``ids`` on a private page-size-1 pool."""
    c = lm.config
    pool = KvCachePool.for_testing(KvCacheLayout(c.num_hidden_layers, c.num_key_value_heads, c.head_dim, 1,
                                                 len(ids)))
    try:
        rid = pool.bind_request([], len(ids))
        pool.activate_step(rid)
        out = lm.transformer(torch.tensor([ids], dtype=torch.int64), np.array([0], dtype=np.int64), pool,
                             select_backend(torch.device("cpu")))
        return out.logits[0].clone()
    finally:
        pool.close()
