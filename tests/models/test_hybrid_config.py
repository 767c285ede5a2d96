"""Hybrid families (Qwen3.5, Qwen3-Next): config normalisation, derived layer types, bad input, the checkpoint layout
check on saved and tampered checkpoints, DeltaNet state sizes, and the HF fixtures as parity oracles."""

from __future__ import annotations

import re

import pytest
import torch

from smile_llm.models.checkpoint.config import ModelConfig
from smile_llm.models.checkpoint.hybrid_config import LinearAttentionConfig, MoeConfig
from smile_llm.models.checkpoint.hybrid_layout import check_hybrid_checkpoint, expected_hybrid_tensors, to_module_names
from smile_llm.models.checkpoint.weights import checkpoint_shapes

from tests.models.hybrid_models import HYBRID_PROMPT, hybrid_hf_config, hybrid_zoo, make_multimodal  # noqa: F401 (fixture)

L, F = "linear_attention", "full_attention"


def hybrid(family: str = "qwen3_5", model_type: str | None = None, **kw) -> ModelConfig:
    d = {"model_type": model_type or family, **hybrid_hf_config(family)}
    d.update(kw)
    return ModelConfig.from_dict({k: v for k, v in d.items() if v is not None})


# ------------------------------------------------------------------------------------------------ normalisation
def test_qwen3_5_text_fields():
    c = hybrid("qwen3_5", "qwen3_5_text")
    assert (c.model_type, c.vocab_size, c.hidden_size, c.num_hidden_layers, c.intermediate_size) == \
        ("qwen3_5", 257, 64, 4, 96)
    assert (c.num_attention_heads, c.num_key_value_heads, c.head_dim) == (4, 2, 32)
    assert c.layer_types == (L, L, L, F) and c.is_hybrid
    assert c.linear_attention == LinearAttentionConfig(2, 4, 16, 8, 4, "float32")
    assert c.moe is None
    assert (c.partial_rotary_factor, c.rotary_dim, c.rope_theta, c.rope_scaling) == (0.25, 8, 10000.0, None)
    assert (c.mrope_section, c.mrope_interleaved) == ((2, 1, 1), True)
    assert c.attn_output_gate and c.zero_centered_norm and c.qk_norm and not c.attention_bias
    assert (c.mtp_num_hidden_layers, c.num_speculative_tokens, c.eos_token_ids) == (1, 3, (256,))
    assert (c.weight_prefix, c.ignored_weight_prefixes, c.notes) == ("model.", (), ())
    assert hybrid("qwen3_5", "Qwen3_5").model_type == "qwen3_5"  # flat qwen3_5 without text_config


def test_qwen3_next_fields():
    c = hybrid("qwen3_next")
    assert c.model_type == "qwen3_next" and c.layer_types == (L, L, L, F)
    assert c.moe == MoeConfig(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                              shared_expert_intermediate_size=48, norm_topk_prob=True, decoder_sparse_step=1,
                              mlp_only_layers=(1,))
    assert [c.moe.is_sparse(i) for i in range(4)] == [True, False, True, True]
    assert (c.partial_rotary_factor, c.mrope_section, c.attn_output_gate, c.zero_centered_norm) == \
        (0.25, None, True, True)
    step2 = hybrid("qwen3_next", decoder_sparse_step=2, mlp_only_layers=[]).moe
    assert step2 is not None and [step2.is_sparse(i) for i in range(4)] == [False, True, False, True]
    assert hybrid("qwen3_next", num_experts=0).moe is None  # HF: every layer dense


def test_hf_defaults_when_keys_are_absent():
    """A minimal config means what it means to transformers: head_dim 256, 16/32 DeltaNet heads of 128, conv 4,
    partial rotary 0.25, 512 experts top 10 (Qwen3NextConfig's defaults, the 80B-A3B geometry)."""
    minimal = {"model_type": "qwen3_next", "vocab_size": 100, "hidden_size": 64, "intermediate_size": 96,
               "num_hidden_layers": 8, "num_attention_heads": 4}
    c = ModelConfig.from_dict(minimal)
    assert (c.head_dim, c.num_key_value_heads, c.rotary_dim) == (256, 4, 64)
    assert c.layer_types == (L, L, L, F, L, L, L, F)
    assert c.linear_attention == LinearAttentionConfig(16, 32, 128, 128, 4)
    assert c.moe == MoeConfig(512, 10, 512, 512, True, 1, ())
    transformers = pytest.importorskip("transformers")
    hf = transformers.Qwen3NextConfig(**{k: v for k, v in minimal.items() if k != "model_type"})
    assert (hf.head_dim, hf.linear_num_value_heads, hf.num_experts, hf.num_experts_per_tok) == (256, 32, 512, 10)
    assert tuple(hf.layer_types) == c.layer_types


def test_top_level_rope_keys_of_published_configs():
    """Hub configs put rope_theta and partial_rotary_factor at the top level (rope_scaling null)."""
    c = hybrid("qwen3_next", rope_parameters=None, rope_scaling=None, rope_theta=1e7, partial_rotary_factor=0.5)
    assert (c.rope_theta, c.partial_rotary_factor, c.rotary_dim, c.rope_scaling) == (1e7, 0.5, 16, None)


@pytest.mark.parametrize("interval, n, expected", [
    (4, 8, (L, L, L, F, L, L, L, F)), (2, 3, (L, F, L)), (1, 2, (F, F)), (5, 4, (L, L, L, L))])
def test_layer_types_derived_from_full_attention_interval(interval, n, expected):
    c = hybrid("qwen3_5", layer_types=None, num_hidden_layers=n, full_attention_interval=interval)
    assert c.layer_types == expected
    transformers = pytest.importorskip("transformers")
    assert tuple(transformers.Qwen3_5TextConfig(num_hidden_layers=n, full_attention_interval=interval)
                 .layer_types) == expected


def test_multimodal_qwen3_5_reads_text_config():
    text = {**hybrid_hf_config("qwen3_5"), "model_type": "qwen3_5_text"}
    del text["eos_token_id"]
    c = ModelConfig.from_dict({"model_type": "qwen3_5", "text_config": text, "vision_config": {"depth": 2},
                               "eos_token_id": 9, "image_token_id": 250})
    assert (c.model_type, c.hidden_size, c.layer_types, c.eos_token_ids) == ("qwen3_5", 64, (L, L, L, F), (9,))
    assert c.weight_prefix == "model.language_model." and c.ignored_weight_prefixes == ("model.visual.",)
    assert c.notes == ("multimodal Qwen3.5 checkpoint: only the text model is served; the vision tower "
                       "(model.visual.*) and image/video tokens are ignored",)


def test_dense_families_keep_their_defaults():
    c = ModelConfig.from_dict({"model_type": "qwen3", "vocab_size": 97, "hidden_size": 32, "intermediate_size": 64,
                               "num_hidden_layers": 3, "num_attention_heads": 4, "partial_rotary_factor": 0.5,
                               "layer_types": ["full_attention", "sliding_attention", "full_attention"]})
    assert c.layer_types == (F, F, F) and not c.is_hybrid
    assert (c.linear_attention, c.moe, c.mrope_section, c.partial_rotary_factor, c.rotary_dim) == \
        (None, None, None, 1.0, 8)
    assert not c.attn_output_gate and not c.zero_centered_norm and c.weight_prefix == "model."
    with pytest.raises(ValueError, match="not a hybrid family"):
        expected_hybrid_tensors(c)


# ------------------------------------------------------------------------------------------------ bad input
@pytest.mark.parametrize("kw, message", [
    ({"layer_types": [L, "sliding_attention", L, F]},
     "layer_types[1] is 'sliding_attention': unknown layer type; use one of ('linear_attention', 'full_attention')"),
    ({"layer_types": [L, L, F]}, "layer_types has 3 entries but num_hidden_layers is 4"),
    ({"layer_types": None, "full_attention_interval": 0}, "full_attention_interval 0 must be at least 1"),
    ({"linear_num_value_heads": 6, "linear_num_key_heads": 4},
     "linear_num_value_heads 6 is not a multiple of linear_num_key_heads 4"),
    ({"num_attention_heads": 3}, "num_attention_heads 3 is not a multiple of num_key_value_heads 2"),
    ({"linear_key_head_dim": 0}, "linear_key_head_dim 0 must be positive"),
    ({"rope_parameters": {"rope_theta": 1e4, "partial_rotary_factor": 0.25, "mrope_section": [2, 2, 1]}},
     "mrope_section [2, 2, 1] sums to 5 but the rotary dimension 8 has 4 frequencies"),
    ({"rope_parameters": {"rope_theta": 1e4, "partial_rotary_factor": 0.1}},
     "partial_rotary_factor 0.1 gives rotary dimension 3 of head_dim 32; it must be even and in [2, head_dim]"),
    ({"attn_output_gate": False}, "attn_output_gate false is not supported"),
    ({"hidden_act": "gelu"}, "hidden_act 'gelu' is not supported for qwen3_5 (only 'silu')"),
])
def test_bad_hybrid_configs(kw, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        hybrid("qwen3_5", **kw)


@pytest.mark.parametrize("kw, message", [
    ({"num_experts_per_tok": 5}, "num_experts_per_tok 5 exceeds num_experts 4"),
    ({"mlp_only_layers": [4]}, "mlp_only_layers names layer 4 but num_hidden_layers is 4"),
    ({"decoder_sparse_step": 0}, "decoder_sparse_step 0 must be positive"),
])
def test_bad_moe_configs(kw, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        hybrid("qwen3_next", **kw)


# ------------------------------------------------------------------------------------------------ DeltaNet state
def test_deltanet_state_sizes():
    la = hybrid("qwen3_5").linear_attention
    assert la is not None
    assert (la.key_dim, la.value_dim, la.conv_dim) == (32, 32, 96)
    assert (la.conv_state_shape, la.recurrent_state_shape) == ((96, 3), (4, 16, 8))
    assert la.state_bytes(4, 4) == 96 * 3 * 4 + 4 * 16 * 8 * 4 == 3200  # x 3 DeltaNet layers per request
    # Qwen3-Next-80B-A3B (transformers' defaults) and Qwen3.5-27B: bf16 conv state, fp32 recurrent state
    next80 = LinearAttentionConfig(16, 32, 128, 128, 4)
    assert (next80.conv_state_shape, next80.recurrent_state_shape) == ((8192, 3), (32, 128, 128))
    assert next80.state_bytes(2, 4) == 2_146_304 and 36 * next80.state_bytes(2, 4) == 77_266_944
    q35_27b = LinearAttentionConfig(16, 48, 128, 128, 4)
    assert q35_27b.state_bytes(2, 4) == 3_207_168 and 48 * q35_27b.state_bytes(2, 4) == 153_944_064


# ------------------------------------------------------------------------------------------------ layout check
def _shapes(c: ModelConfig) -> dict[str, tuple[int, ...]]:
    return dict(expected_hybrid_tensors(c))


def test_layout_names_of_both_projection_styles():
    c35, cnx = hybrid("qwen3_5"), hybrid("qwen3_next")
    s35, snx = _shapes(c35), _shapes(cnx)
    p = "model.layers.0.linear_attn."
    assert {n[len(p):]: s for n, s in s35.items() if n.startswith(p)} == {
        "in_proj_qkv.weight": (96, 64), "in_proj_z.weight": (32, 64), "in_proj_b.weight": (4, 64),
        "in_proj_a.weight": (4, 64), "conv1d.weight": (96, 1, 4), "dt_bias": (4,), "A_log": (4,),
        "norm.weight": (8,), "out_proj.weight": (64, 32)}
    assert snx[p + "in_proj_qkvz.weight"] == (128, 64) and snx[p + "in_proj_ba.weight"] == (8, 64)
    assert s35["model.layers.3.self_attn.q_proj.weight"] == (256, 64)  # 4 heads x 32 x 2 (query and gate)
    assert snx["model.layers.0.mlp.experts.3.down_proj.weight"] == (64, 32)
    assert snx["model.layers.0.mlp.shared_expert_gate.weight"] == (1, 64)
    assert snx["model.layers.1.mlp.gate_proj.weight"] == (96, 64)  # mlp_only_layers: dense
    assert snx["mtp.layers.0.mlp.gate.weight"] == (4, 64) and s35["mtp.layers.0.mlp.up_proj.weight"] == (96, 64)
    assert [n for n in s35 if n.startswith("mtp.") and ".layers." not in n] == [
        "mtp.fc.weight", "mtp.pre_fc_norm_embedding.weight", "mtp.pre_fc_norm_hidden.weight", "mtp.norm.weight"]
    assert s35["mtp.fc.weight"] == (64, 128)
    assert len(s35) == 2 + 4 * 2 + 3 * 9 + 6 + 4 * 3 + 1 + (4 + 2 + 6 + 3)
    assert len(snx) == 2 + 4 * 2 + 3 * 7 + 6 + 3 * (1 + 12 + 4) + 3 + 1 + (4 + 2 + 6 + 17)


@pytest.mark.parametrize("family", ["qwen3_5", "qwen3_next"])
def test_layout_check_passes_on_saved_checkpoints(hybrid_zoo, family):  # noqa: F811
    hf = hybrid_zoo(family)
    config = ModelConfig.from_pretrained(hf.path)
    shapes = checkpoint_shapes(hf.path)
    check_hybrid_checkpoint(config, shapes)
    # the checkpoint minus the MTP tensors the fixture added is exactly what transformers saved and holds
    hf_names = {n for n, _ in hf.model.named_parameters()}
    saved = {n for n in shapes if not n.startswith("mtp.")}
    if family == "qwen3_5":
        assert saved == hf_names
    else:  # transformers fuses experts in memory (gate_up_proj / down_proj [E, ...]) and saves one module each
        assert "model.layers.0.mlp.experts.gate_up_proj" in hf_names
        assert {re.sub(r"experts\.\d+\.(gate|up)_proj\.weight", "experts.gate_up_proj",
                       re.sub(r"experts\.\d+\.down_proj\.weight", "experts.down_proj", n)) for n in saved} == hf_names


def test_layout_check_on_a_multimodal_checkpoint(hybrid_zoo, tmp_path):  # noqa: F811
    folder = make_multimodal(hybrid_zoo("qwen3_5").path, tmp_path / "mm")
    config = ModelConfig.from_pretrained(folder)
    shapes = checkpoint_shapes(folder)
    assert "model.visual.patch_embed.proj.weight" in shapes
    check_hybrid_checkpoint(config, shapes)
    renamed = to_module_names(shapes, config)
    assert set(renamed) == set(checkpoint_shapes(hybrid_zoo("qwen3_5").path))


@pytest.mark.parametrize("tamper, message", [
    (lambda s: s.update({"model.layers.0.linear_attn.in_proj_qkv.weight": (80, 64)}),
     "tensor 'model.layers.0.linear_attn.in_proj_qkv.weight' has shape (80, 64) in the checkpoint but the config "
     "gives (96, 64); layer_types[0] is 'linear_attention'"),
    (lambda s: s.pop("model.layers.2.linear_attn.A_log"),
     "checkpoint lacks 1 tensors the config needs, first 'model.layers.2.linear_attn.A_log' (shape (4,)); "
     "layer_types[2] is 'linear_attention'"),
    (lambda s: s.update({"mtp.layers.1.input_layernorm.weight": (64,)}),
     "checkpoint has 1 tensors the config does not describe, first 'mtp.layers.1.input_layernorm.weight' "
     "(shape (64,)); the config has mtp_num_hidden_layers 1"),
    (lambda s: s.pop("mtp.fc.weight"),
     "checkpoint lacks 1 tensors the config needs, first 'mtp.fc.weight' (shape (64, 128)); the config has "
     "mtp_num_hidden_layers 1"),
    (lambda s: s.update({"mtp.fc.weight": (64, 64)}),
     "tensor 'mtp.fc.weight' has shape (64, 64) in the checkpoint but the config gives (64, 128); the config has "
     "mtp_num_hidden_layers 1"),
    (lambda s: s.update({"model.layers.3.self_attn.q_proj.weight": (128, 64)}),  # no output gate rows
     "tensor 'model.layers.3.self_attn.q_proj.weight' has shape (128, 64) in the checkpoint but the config gives "
     "(256, 64); layer_types[3] is 'full_attention'"),
    (lambda s: s.update({"model.layers.4.input_layernorm.weight": (64,)}),
     "checkpoint has 1 tensors the config does not describe, first 'model.layers.4.input_layernorm.weight' "
     "(shape (64,)); num_hidden_layers is 4"),
])
def test_layout_check_refuses_tampered_checkpoints(tamper, message):
    config = hybrid("qwen3_5")
    shapes = _shapes(config)
    tamper(shapes)
    with pytest.raises(ValueError, match=re.escape(message)):
        check_hybrid_checkpoint(config, shapes)


def test_layout_check_names_a_layer_type_disagreement():
    """The checkpoint's layer 3 is full attention, the config says linear: the first DeltaNet tensor is missing."""
    shapes = _shapes(hybrid("qwen3_5"))
    config = hybrid("qwen3_5", layer_types=[L, L, L, L])
    with pytest.raises(ValueError, match=re.escape(
            "checkpoint lacks 9 tensors the config needs, first 'model.layers.3.linear_attn.in_proj_qkv.weight' "
            "(shape (96, 64)); layer_types[3] is 'linear_attention'")):
        check_hybrid_checkpoint(config, shapes)


def test_layout_check_head_count_disagreement_names_both_shapes():
    shapes = _shapes(hybrid("qwen3_next"))
    config = hybrid("qwen3_next", linear_num_value_heads=2)
    with pytest.raises(ValueError, match=re.escape(
            "tensor 'model.layers.0.linear_attn.in_proj_qkvz.weight' has shape (128, 64) in the checkpoint but the "
            "config gives (96, 64); layer_types[0] is 'linear_attention'")):
        check_hybrid_checkpoint(config, shapes)


def test_layout_check_tied_lm_head_and_mtp_tensors_without_mtp_config():
    tied = hybrid("qwen3_5", tie_word_embeddings=True)
    shapes = _shapes(tied)
    assert "lm_head.weight" not in shapes
    check_hybrid_checkpoint(tied, shapes)
    check_hybrid_checkpoint(tied, {**shapes, "lm_head.weight": (257, 64)})  # a tied head may still be saved
    with pytest.raises(ValueError, match=re.escape("tensor 'lm_head.weight' has shape (256, 64)")):
        check_hybrid_checkpoint(tied, {**shapes, "lm_head.weight": (256, 64)})
    no_mtp = hybrid("qwen3_5", mtp_num_hidden_layers=0)
    with pytest.raises(ValueError, match=re.escape("checkpoint has 15 tensors the config does not describe, first "
                                                   "'mtp.fc.weight' (shape (64, 128)); the config has "
                                                   "mtp_num_hidden_layers 0")):
        check_hybrid_checkpoint(no_mtp, _shapes(hybrid("qwen3_5")))


# ------------------------------------------------------------------------------------------------ HF oracles
@pytest.mark.parametrize("family", ["qwen3_5", "qwen3_next"])
def test_hf_fixture_is_a_valid_oracle(hybrid_zoo, family):  # noqa: F811
    """Full-prompt logits are finite and varied, and HF's cached step-by-step decode (recurrent DeltaNet form, conv
    update) agrees with its full forward (chunked form) to 1e-4: both paths of the oracle agree."""
    hf = hybrid_zoo(family)
    full = hf.logits(HYBRID_PROMPT)
    assert full.shape == (len(HYBRID_PROMPT), 257) and torch.isfinite(full).all()
    assert len(set(full.argmax(-1).tolist())) >= 8 and float(full.std()) > 0.5
    split = 13
    with torch.no_grad():
        out = hf.model(torch.tensor([HYBRID_PROMPT[:split]]), use_cache=True)
        steps = [out.logits[0]]
        cache = out.cache if hasattr(out, "cache") else out.past_key_values
        for t in HYBRID_PROMPT[split:]:
            out = hf.model(torch.tensor([[t]]), cache=cache, use_cache=True)
            cache = out.cache if hasattr(out, "cache") else out.past_key_values
            steps.append(out.logits[0])
    assert float((torch.cat(steps) - full).abs().max()) < 1e-4


def test_qwen3_5_multimodal_rotary_equals_1d_rotary_for_text():
    """Text positions are equal in the t/h/w sections, so the mRoPE recomposition is the 1-D partial rotary:
    cos/sin of ``positions * inv_freq`` over ``rotary_dim`` dims, inv_freq = theta^(-2i/rotary_dim)."""
    transformers = pytest.importorskip("transformers")
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5TextRotaryEmbedding

    kwargs = hybrid_hf_config("qwen3_5", rope_parameters={
        "rope_type": "default", "rope_theta": 1e6, "partial_rotary_factor": 0.5, "mrope_section": [3, 3, 2],
        "mrope_interleaved": True})
    c = ModelConfig.from_dict({"model_type": "qwen3_5_text", **kwargs})
    rotary = Qwen3_5TextRotaryEmbedding(transformers.Qwen3_5TextConfig(**kwargs))
    pos = torch.tensor([[0, 1, 5, 77, 300]])
    cos, sin = rotary(torch.zeros(1, dtype=torch.float32), pos)
    inv = 1.0 / (c.rope_theta ** (torch.arange(0, c.rotary_dim, 2, dtype=torch.float32) / c.rotary_dim))
    ang = pos[0, :, None].float() * inv
    assert cos.shape[-1] == c.rotary_dim == 16
    emb = torch.cat([ang, ang], -1)
    assert torch.allclose(cos[0], emb.cos()) and torch.allclose(sin[0], emb.sin())


def test_qwen3_next_qkvz_grouping_matches_hf():
    """docs/hybrid.md: in_proj_qkvz rows are grouped per key head as [q (d_k) | k (d_k) | v (r*d_v) | z (r*d_v)] with
    r = H_v / H_k, and in_proj_ba per key head as [b (r) | a (r)]; transformers' reordering agrees."""
    transformers = pytest.importorskip("transformers")
    from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextGatedDeltaNet

    cfg = transformers.Qwen3NextConfig(**hybrid_hf_config("qwen3_next"))
    layer = Qwen3NextGatedDeltaNet(cfg, 0)
    x = torch.randn(1, 3, 64, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        qkvz, ba = layer.in_proj_qkvz(x), layer.in_proj_ba(x)
        q, k, v, z, b, a = layer.fix_query_key_value_ordering(qkvz, ba)
    hk, dk, dv, r = 2, 16, 8, 2
    g = qkvz.view(1, 3, hk, 2 * dk + 2 * r * dv)  # exact below: transformers' q, k, v, z, b, a are slices of these
    assert torch.equal(q, g[..., :dk]) and torch.equal(k, g[..., dk:2 * dk])
    assert torch.equal(v, g[..., 2 * dk:2 * dk + r * dv].reshape(1, 3, hk * r, dv))
    assert torch.equal(z, g[..., 2 * dk + r * dv:].reshape(1, 3, hk * r, dv))
    gba = ba.view(1, 3, hk, 2 * r)
    assert torch.equal(b, gba[..., :r].reshape(1, 3, hk * r)) and torch.equal(a, gba[..., r:].reshape(1, 3, hk * r))
