"""RoPE delta rotation (``models/rope_delta.py``): keys computed at positions ``[0, N)`` and turned by the delta ``M``
equal the keys of the same pre-RoPE vectors computed directly at ``[M, M + N)``.

In float64 against an independent float64 RoPE (HF's ``rotate_half`` formula written out) for every RoPE variant the
model families have: default frequencies, a large theta, Llama-3 scaling, the hybrid family's partial rotary, and the
two shipped models' own configs. Then through the models' own attention modules (dense ``Attention`` and the hybrid
``GatedAttention``, their q/k norms and RoPE tables included) for the same hidden states, in float32 and bfloat16,
within each dtype's tolerance."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from smile_llm.models.checkpoint.config import ModelConfig, RopeScaling
from smile_llm.models.forward_context import RopeTable
from smile_llm.models.gated_attention import GatedAttention
from smile_llm.models.layers import Attention, rope_inv_freq
from smile_llm.models.rope_delta import KeyRotation
from smile_llm.models.shipped import DEFAULT_MODEL_DIRS

LLAMA3 = RopeScaling(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=8192)
# (head_dim, rotary_dim, theta, scaling)
VARIANTS = {
    "default": (32, 32, 10000.0, None),
    "large_theta": (128, 128, 1_000_000.0, None),
    "llama3_scaling": (128, 128, 500_000.0, LLAMA3),
    "partial_rotary": (256, 64, 10_000_000.0, None),
}


def shipped(kind: str) -> ModelConfig:
    return ModelConfig.from_pretrained(DEFAULT_MODEL_DIRS[kind])


def rope64(k_pre: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """Keys ``[N, H, D]`` after RoPE at ``positions`` in float64: HF's ``x * cos + rotate_half(x) * sin`` over the
    first ``rotary_dim = 2 * len(inv_freq)`` dims, the rest passed through."""
    r = 2 * len(inv_freq)
    angle = positions.double()[:, None] * inv_freq.double()[None, :]  # [N, r/2]
    cos = torch.cat((angle.cos(), angle.cos()), -1)[:, None, :]
    sin = torch.cat((angle.sin(), angle.sin()), -1)[:, None, :]
    x = k_pre[..., :r]
    half = torch.cat((-x[..., r // 2 :], x[..., : r // 2]), -1)
    return torch.cat((x * cos + half * sin, k_pre[..., r:]), -1)


def variant(name: str) -> tuple[int, torch.Tensor]:
    if name.startswith("shipped_"):
        c = shipped(name.removeprefix("shipped_"))
        return c.head_dim, rope_inv_freq(c.rotary_dim, c.rope_theta, c.rope_scaling)
    head_dim, rotary_dim, theta, scaling = VARIANTS[name]
    return head_dim, rope_inv_freq(rotary_dim, theta, scaling)


@pytest.mark.parametrize("name", [*VARIANTS, "shipped_dense", "shipped_hybrid"])
@pytest.mark.parametrize("delta", [16, 512, 4096, 65536])
def test_turned_keys_equal_keys_computed_at_the_shifted_positions_in_float64(name: str, delta: int) -> None:
    head_dim, inv_freq = variant(name)
    rotation = KeyRotation(inv_freq, head_dim)
    assert rotation.rotary_dim == 2 * len(inv_freq) <= head_dim
    gen = torch.Generator().manual_seed(delta)
    k_pre = torch.randn(48, 3, head_dim, generator=gen, dtype=torch.float64)
    positions = torch.arange(48)
    at_zero = rope64(k_pre, positions, inv_freq)
    direct = rope64(k_pre, positions + delta, inv_freq)
    turned = rotation.rotate(at_zero, delta)
    assert turned.dtype == torch.float64
    torch.testing.assert_close(turned, direct, rtol=0, atol=1e-9)
    r = rotation.rotary_dim
    assert torch.equal(turned[..., r:], at_zero[..., r:])  # the dims past the rotary part pass unchanged
    # turning back undoes it; a delta of 0 is the identity
    torch.testing.assert_close(rotation.rotate(turned, -delta), at_zero, rtol=0, atol=1e-9)
    torch.testing.assert_close(rotation.rotate(at_zero, 0), at_zero, rtol=0, atol=0)


def test_the_shipped_models_cover_full_and_partial_rotary() -> None:
    assert shipped("dense").rotary_dim == shipped("dense").head_dim
    hybrid = shipped("hybrid")
    assert hybrid.rotary_dim < hybrid.head_dim and hybrid.is_hybrid


def test_llama3_scaling_changes_the_frequencies_it_turns_by() -> None:
    plain, scaled = rope_inv_freq(128, 500_000.0, None), rope_inv_freq(128, 500_000.0, LLAMA3)
    assert not torch.equal(plain, scaled)
    k = torch.randn(4, 1, 128, dtype=torch.float64)
    assert not torch.allclose(KeyRotation(plain, 128).rotate(k, 4096), KeyRotation(scaled, 128).rotate(k, 4096))


def test_bad_geometry_and_bad_keys_are_refused() -> None:
    with pytest.raises(ValueError, match="does not fit heads of 8 dims"):
        KeyRotation(torch.ones(5), 8)
    with pytest.raises(ValueError, match="does not fit"):
        KeyRotation(torch.ones(0), 8)
    with pytest.raises(ValueError, match="keys of 6 dims, expected head_dim 8"):
        KeyRotation(torch.ones(4), 8).rotate(torch.zeros(2, 1, 6), 16)


class Capture:
    """A ``LayerContext`` that keeps the keys a layer writes and attends to nothing."""

    states = None

    def __init__(self, cos: torch.Tensor, sin: torch.Tensor) -> None:
        self.cos, self.sin = cos, sin
        self.k: torch.Tensor | None = None

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        self.k = k[0].detach().clone()  # [S, Hkv, D]
        return torch.zeros(q.shape[0] * q.shape[1], q.shape[2], q.shape[3], dtype=q.dtype)

    def reduce(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def commit(self) -> None:
        pass


def module_for(kind: str, dtype: torch.dtype) -> tuple[Any, ModelConfig]:
    torch.manual_seed(3)
    if kind == "dense_llama3":
        c = ModelConfig.from_dict({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 64,
                                   "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 1,
                                   "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
                                   "rope_theta": 500000.0,
                                   "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                    "high_freq_factor": 4.0,
                                                    "original_max_position_embeddings": 64}})
        module: Any = Attention(c, 0)
    elif kind == "dense":
        c = shipped("dense")
        module = Attention(c, 0)
    else:
        c = shipped("hybrid")
        module = GatedAttention(c, 0)
    return module.to(dtype).eval(), c


def keys_at(module: Any, inv_freq: torch.Tensor, x: torch.Tensor, start: int, dtype: torch.dtype) -> torch.Tensor:
    """The keys ``module`` writes for hidden states ``x`` at positions ``start + [0, S)``, with the RoPE tables a
    model of ``dtype`` uses (its ``inv_freq`` buffer is cast with it)."""
    cos, sin = RopeTable().lookup(np.array([start]), x.shape[1], inv_freq, dtype)
    ctx = Capture(cos, sin)
    with torch.no_grad():
        module.forward(x, ctx)
    assert ctx.k is not None
    return ctx.k


# a dtype's tolerance, relative to the keys' largest entry: float32's is set by the model's own float32 angles at
# positions up to ~2k (p * 2**-24 ~ 1.2e-4 rad; measured 4.4e-5), bfloat16's by its rounding (eps 7.8e-3; measured 1e-2)
TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 2e-2}


@pytest.mark.parametrize("kind", ["dense", "dense_llama3", "hybrid"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_attention_modules_keys_turn_into_their_keys_at_the_shifted_positions(kind: str,
                                                                                  dtype: torch.dtype) -> None:
    module, c = module_for(kind, dtype)
    x = torch.randn(1, 40, c.hidden_size, generator=torch.Generator().manual_seed(7)).to(dtype)
    inv_freq = rope_inv_freq(c.rotary_dim, c.rope_theta, c.rope_scaling).to(dtype)
    rotation = KeyRotation(inv_freq, c.head_dim)
    at_zero = keys_at(module, inv_freq, x, 0, dtype)
    for offset in (16, 1024, 1984):
        direct = keys_at(module, inv_freq, x, offset, dtype).float()
        turned = rotation.rotate(at_zero, offset)
        err = float((turned - direct).abs().max() / direct.abs().max())
        assert err < TOLERANCE[dtype], (kind, dtype, offset, err)
        r = c.rotary_dim
        assert torch.equal(turned[..., r:], at_zero[..., r:].float())
