"""Gated DeltaNet operators (``smile_llm.models.deltanet``) against independent oracles, on the CPU.

- The gated delta rule: both PyTorch forms against a float64 step-by-step oracle written here from the recurrence
  (float32 vs float64: max error <= 1e-5 of the reference's largest magnitude), against each other, against
  transformers' ``torch_chunk_gated_delta_rule`` / ``torch_recurrent_gated_delta_rule`` (qwen3_next and qwen3_5),
  state continuity across splits, per-position states against prefix runs, grouped values (HV = 2 x HK, as
  Qwen3-Next's 16 key / 32 value heads), T = 1, batches, bfloat16 inputs, the dispatcher on the CPU.
- The short causal conv: against ``nn.Conv1d`` and HF's ``causal_conv1d_fn`` / ``causal_conv1d_update`` fallbacks,
  across splits and decode steps, per-position states.
- The gated RMSNorm: bit-equal to HF's ``Qwen3NextRMSNormGated`` and ``Qwen3_5RMSNormGated``.

CUDA (fla-core) comparisons are in ``test_deltanet_ops_cuda.py``.
"""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F

from smile_llm.models.deltanet import (
    RECURRENT_MAX_LEN,
    causal_conv1d_prefill,
    causal_conv1d_update,
    chunk_gated_delta_rule,
    fla_available,
    fla_chunk_gated_delta_rule,
    gated_delta_rule,
    gated_rms_norm,
    recurrent_gated_delta_rule,
)

CI = os.environ.get("SMILE_TEST_SCALE", "full") == "ci"
LONG_T = 150 if CI else 300  # crosses two chunk boundaries of 64 and ends mid-chunk
FORMS = {"recurrent": recurrent_gated_delta_rule, "chunk": chunk_gated_delta_rule}
F32_REL = 1e-5  # float32 forms vs the float64 oracle, relative to the oracle's largest magnitude


# ------------------------------------------------------------------------------------------------ the oracle
def oracle(q, k, v, g, beta, initial_state=None, l2norm=False):
    """float64, one position at a time, straight from the recurrence (HF's conventions):

    S_t = exp(g_t) S_{t-1};  S_t += k_t (beta_t (v_t - S_t^T k_t))^T;  o_t = S_t^T (q_t / sqrt(DK)).
    Value head h reads query/key head h // (HV // HK). Returns (out [B, T, HV, DV], states [B, T, HV, DK, DV]).
    """
    q, k, v, g, beta = (x.double() for x in (q, k, v, g, beta))
    batch, seq_len, num_k_heads, k_dim = k.shape
    num_v_heads, v_dim = v.shape[2:]
    key_head = torch.arange(num_v_heads) // (num_v_heads // num_k_heads)
    q, k = q[:, :, key_head], k[:, :, key_head]
    if l2norm:
        q = q / torch.sqrt((q * q).sum(-1, keepdim=True) + 1e-6)
        k = k / torch.sqrt((k * k).sum(-1, keepdim=True) + 1e-6)
    q = q / k_dim ** 0.5
    state = (torch.zeros(batch, num_v_heads, k_dim, v_dim, dtype=torch.float64) if initial_state is None
             else initial_state.double().clone())
    out = torch.zeros(batch, seq_len, num_v_heads, v_dim, dtype=torch.float64)
    states = torch.zeros(batch, seq_len, num_v_heads, k_dim, v_dim, dtype=torch.float64)
    for t in range(seq_len):
        state = state * torch.exp(g[:, t])[..., None, None]
        read = torch.einsum("bhkv,bhk->bhv", state, k[:, t])
        delta = beta[:, t, :, None] * (v[:, t] - read)
        state = state + torch.einsum("bhk,bhv->bhkv", k[:, t], delta)
        out[:, t] = torch.einsum("bhkv,bhk->bhv", state, q[:, t])
        states[:, t] = state
    return out, states


def make_inputs(seed, batch=2, seq_len=9, num_k_heads=2, num_v_heads=2, k_dim=8, v_dim=6, dtype=torch.float32,
                with_state=True, unit_keys=False):
    """Random inputs with HF-like ranges: g = -exp(A) softplus(a) in log space, beta = sigmoid(b).

    ``unit_keys``: keys of norm <= 1, so the delta rule stays contractive without in-kernel L2 normalisation.
    """
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=gen)

    q = randn(batch, seq_len, num_k_heads, k_dim)
    k = randn(batch, seq_len, num_k_heads, k_dim)
    if unit_keys:
        k = k / k.norm(dim=-1, keepdim=True).clamp(min=1.0)
    v = randn(batch, seq_len, num_v_heads, v_dim)
    g = -torch.rand(num_v_heads, generator=gen).mul(3).exp() * F.softplus(randn(batch, seq_len, num_v_heads))
    beta = torch.sigmoid(randn(batch, seq_len, num_v_heads))
    state = randn(batch, num_v_heads, k_dim, v_dim) if with_state else None
    q, k, v = (x.to(dtype) for x in (q, k, v))
    return q, k, v, g, beta, state


def assert_rel_close(actual, expected, rel, what=""):
    """max |actual - expected| <= rel * max |expected| (both compared in float64)."""
    err = (actual.double() - expected.double()).abs().max().item()
    scale = expected.double().abs().max().item()
    assert err <= rel * scale, f"{what}: max error {err:.3g} > {rel:g} x {scale:.3g}"


# ------------------------------------------------------------------------------------------------ delta rule
CASES = {  # name -> make_inputs keywords
    "single token": dict(seq_len=1),
    "short window": dict(seq_len=5),
    "two chunks, ragged": dict(seq_len=LONG_T, batch=1),
    "grouped values": dict(seq_len=70, num_k_heads=2, num_v_heads=4),
    "batch 3, no state": dict(seq_len=13, batch=3, with_state=False),
    "head dims 16 x 32": dict(seq_len=20, k_dim=16, v_dim=32, num_k_heads=1, num_v_heads=3),
}


@pytest.mark.parametrize("l2norm", [True, False], ids=["l2norm", "raw-keys"])
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("form", list(FORMS))
def test_forms_equal_the_float64_oracle(form, case, l2norm):
    q, k, v, g, beta, state = make_inputs(list(CASES).index(case), unit_keys=not l2norm, **CASES[case])
    result = FORMS[form](q, k, v, g, beta, state, output_final_state=True, use_qk_l2norm_in_kernel=l2norm,
                         output_all_states=True)
    out, states = oracle(q, k, v, g, beta, state, l2norm)
    assert result.output.dtype == torch.float32 and result.output.shape == out.shape
    assert result.final_state.dtype == torch.float32 and result.all_states.dtype == torch.float32
    assert result.all_states.shape == states.shape
    assert_rel_close(result.output, out, F32_REL, "output")
    assert_rel_close(result.final_state, states[:, -1], F32_REL, "final state")
    assert_rel_close(result.all_states, states, F32_REL, "all states")


@pytest.mark.parametrize("chunk_size", [1, 3, 8, 16, 64, 200])
def test_chunked_equals_recurrent_for_any_chunk_size(chunk_size):
    q, k, v, g, beta, state = make_inputs(7, seq_len=37, num_k_heads=1, num_v_heads=2)
    ref = recurrent_gated_delta_rule(q, k, v, g, beta, state, True, True, True)
    got = chunk_gated_delta_rule(q, k, v, g, beta, state, True, True, True, chunk_size=chunk_size)
    for name in ("output", "final_state", "all_states"):
        assert_rel_close(getattr(got, name), getattr(ref, name), F32_REL, name)


def test_states_are_returned_only_when_asked():
    q, k, v, g, beta, state = make_inputs(3)
    for form in FORMS.values():
        result = form(q, k, v, g, beta, state)
        assert result.final_state is None and result.all_states is None
        both = form(q, k, v, g, beta, state, output_final_state=True, output_all_states=True)
        if form is recurrent_gated_delta_rule:  # its states are copies of the one it carries: exact
            assert torch.equal(both.all_states[:, -1], both.final_state)
        else:  # the chunked form computes each position's state apart from the chunk's update of the carried one
            assert_rel_close(both.all_states[:, -1], both.final_state, F32_REL, "last state")
        # exact: the flags add copies or extra reads, never change the ops that compute the output
        assert torch.equal(result.output, both.output)


@pytest.mark.parametrize("family", ["qwen3_next", "qwen3_5"])
@pytest.mark.parametrize("form", list(FORMS))
def test_equal_to_transformers_reference(form, family):
    module = pytest.importorskip(f"transformers.models.{family}.modeling_{family}")
    q, k, v, g, beta, state = make_inputs(11, batch=2, seq_len=LONG_T - 50, num_k_heads=2, num_v_heads=4)
    ours = FORMS[form](q, k, v, g, beta, state, output_final_state=True, use_qk_l2norm_in_kernel=True)
    hf_forms = {"recurrent": module.torch_recurrent_gated_delta_rule, "chunk": module.torch_chunk_gated_delta_rule}
    hf_out, hf_state = hf_forms[form](q, k, v, g=g, beta=beta, initial_state=state, output_final_state=True,
                                      use_qk_l2norm_in_kernel=True)
    assert ours.output.shape == hf_out.shape and ours.final_state.shape == hf_state.shape
    assert_rel_close(ours.output, hf_out, F32_REL, "output")
    assert_rel_close(ours.final_state, hf_state, F32_REL, "final state")


@pytest.mark.parametrize("form", list(FORMS))
def test_state_continuity_across_splits(form):
    """[0, T) at once == [0, t) then [t, T) from the state it left, for splits inside and across chunks."""
    q, k, v, g, beta, state = make_inputs(5, batch=2, seq_len=LONG_T, num_k_heads=1, num_v_heads=2)
    whole = FORMS[form](q, k, v, g, beta, state, True, True)
    for split in (1, 64, LONG_T - 3):
        first = FORMS[form](q[:, :split], k[:, :split], v[:, :split], g[:, :split], beta[:, :split], state, True,
                            True)
        second = FORMS[form](q[:, split:], k[:, split:], v[:, split:], g[:, split:], beta[:, split:],
                             first.final_state, True, True)
        assert_rel_close(torch.cat([first.output, second.output], 1), whole.output, F32_REL, f"output @{split}")
        assert_rel_close(second.final_state, whole.final_state, F32_REL, f"state @{split}")


def test_prefill_by_chunks_then_decode_steps_equals_one_run():
    """The serving pattern: chunked prefill, then one recurrent step per token carrying the state."""
    q, k, v, g, beta, state = make_inputs(9, batch=2, seq_len=80, num_k_heads=2, num_v_heads=4)
    whole = chunk_gated_delta_rule(q, k, v, g, beta, state, True, True)
    prefill = chunk_gated_delta_rule(q[:, :72], k[:, :72], v[:, :72], g[:, :72], beta[:, :72], state, True, True)
    outputs, carried = [prefill.output], prefill.final_state
    for t in range(72, 80):
        step = recurrent_gated_delta_rule(q[:, t:t + 1], k[:, t:t + 1], v[:, t:t + 1], g[:, t:t + 1],
                                          beta[:, t:t + 1], carried, True, True)
        outputs.append(step.output)
        carried = step.final_state
    assert_rel_close(torch.cat(outputs, 1), whole.output, F32_REL, "output")
    assert_rel_close(carried, whole.final_state, F32_REL, "final state")


@pytest.mark.parametrize("form", list(FORMS))
def test_all_states_equal_prefix_runs(form):
    """all_states[:, t] is the final state of the prefix [0, t] (what a verify window restores)."""
    q, k, v, g, beta, state = make_inputs(13, batch=2, seq_len=6, num_k_heads=1, num_v_heads=2)
    window = FORMS[form](q, k, v, g, beta, state, use_qk_l2norm_in_kernel=True, output_all_states=True)
    for t in range(6):
        prefix = recurrent_gated_delta_rule(q[:, :t + 1], k[:, :t + 1], v[:, :t + 1], g[:, :t + 1],
                                            beta[:, :t + 1], state, True, True)
        assert_rel_close(window.all_states[:, t], prefix.final_state, F32_REL, f"state after {t}")


@pytest.mark.parametrize("form", list(FORMS))
def test_bfloat16_inputs(form):
    """bf16 q/k/v: float32 inside, bf16 output (within bf16 rounding of the oracle on the same inputs), float32
    states equal to the float32 run on the same (bf16-valued) inputs."""
    q, k, v, g, beta, state = make_inputs(17, seq_len=70, num_k_heads=2, num_v_heads=4, dtype=torch.bfloat16)
    result = FORMS[form](q, k, v, g, beta, state, True, True)
    assert result.output.dtype == torch.bfloat16 and result.final_state.dtype == torch.float32
    out, states = oracle(q, k, v, g, beta, state, True)
    assert_rel_close(result.output, out, 2 ** -7, "output")  # one bf16 rounding of the output
    as32 = FORMS[form](q.float(), k.float(), v.float(), g, beta, state, True, True)
    # exact: a form casts its inputs to float32 first, so both runs are one float32 computation on the same values
    assert torch.equal(result.final_state, as32.final_state)
    assert torch.equal(result.output, as32.output.to(torch.bfloat16))


def test_inputs_are_not_mutated():
    q, k, v, g, beta, state = make_inputs(19, seq_len=70)
    copies = [x.clone() for x in (q, k, v, g, beta, state)]
    for form in FORMS.values():
        result = form(q, k, v, g, beta, state, True, True, True)
        assert result.final_state.data_ptr() != state.data_ptr()
    for before, after in zip(copies, (q, k, v, g, beta, state)):
        assert torch.equal(before, after)


def test_empty_window_returns_the_initial_state():
    q, k, v, g, beta, state = make_inputs(23, seq_len=0)
    for form in FORMS.values():
        result = form(q, k, v, g, beta, state, True, output_all_states=True)
        assert result.output.shape == (2, 0, 2, 6) and result.all_states.shape == (2, 0, 2, 8, 6)
        assert torch.equal(result.final_state, state)


@pytest.mark.parametrize("bad", ["k heads", "v heads", "g", "beta", "state"])
def test_shape_mismatch_raises(bad):
    q, k, v, g, beta, state = make_inputs(29, num_k_heads=2, num_v_heads=4)
    if bad == "k heads":
        k = k[:, :, :1]
    elif bad == "v heads":
        v = v[:, :, :3]
    elif bad == "g":
        g = g[:, :-1]
    elif bad == "beta":
        beta = beta[..., :2]
    else:
        state = state.transpose(-1, -2)
    for form in FORMS.values():
        with pytest.raises(ValueError):
            form(q, k, v, g, beta, state)


def test_dispatcher_on_cpu_uses_the_pytorch_forms():
    """Short windows and per-position states go to the recurrent form, longer windows to the chunked form."""
    for seq_len in (1, RECURRENT_MAX_LEN, RECURRENT_MAX_LEN + 1, 70):
        q, k, v, g, beta, state = make_inputs(31, seq_len=seq_len)
        expected_form = recurrent_gated_delta_rule if seq_len <= RECURRENT_MAX_LEN else chunk_gated_delta_rule
        got = gated_delta_rule(q, k, v, g, beta, state, True, True)
        expected = expected_form(q, k, v, g, beta, state, True, True)  # the form it dispatches to: exact
        assert torch.equal(got.output, expected.output) and torch.equal(got.final_state, expected.final_state)
        assert got.all_states is None
        got = gated_delta_rule(q, k, v, g, beta, state, True, True, output_all_states=True)
        expected = recurrent_gated_delta_rule(q, k, v, g, beta, state, True, True, True)
        for name in ("output", "final_state", "all_states"):
            assert torch.equal(getattr(got, name), getattr(expected, name)), (seq_len, name)


@pytest.mark.skipif(fla_available(), reason="fla is installed here")
def test_fla_wrapper_without_fla_says_how_to_install():
    q, k, v, g, beta, state = make_inputs(37)
    with pytest.raises(ImportError, match="pip install fla-core"):
        fla_chunk_gated_delta_rule(q, k, v, g, beta, state)


def test_fla_wrappers_follow_flas_calling_convention(monkeypatch):
    """With a stand-in ``fla.ops.gated_delta_rule`` (fla-core 0.6's signatures, computing with our recurrent form):
    the wrappers hand fla repeated query/key heads, the 1/sqrt(DK) scale, a float32 state and keyword arguments,
    and return fla's output in q's dtype. The real kernels are compared in test_deltanet_ops_cuda.py."""
    import sys
    import types

    from smile_llm.models.deltanet import fla_kernels

    seen = []

    def fake_kernel(name):
        def kernel(q, k, v, g=None, beta=None, scale=None, initial_state=None, output_final_state=False,
                   use_qk_l2norm_in_kernel=False, **kwargs):
            seen.append((name, q.shape[2], scale, initial_state.dtype, kwargs))
            assert q.shape[2] == v.shape[2] and q.is_contiguous() and k.is_contiguous()
            result = recurrent_gated_delta_rule(q, k, v, g, beta, initial_state, True, use_qk_l2norm_in_kernel)
            return result.output.to(v.dtype), result.final_state if output_final_state else None
        return kernel

    fake = types.ModuleType("fla.ops.gated_delta_rule")
    fake.chunk_gated_delta_rule = fake_kernel("chunk")
    fake.fused_recurrent_gated_delta_rule = fake_kernel("recurrent")
    for name, module in (("fla", types.ModuleType("fla")), ("fla.ops", types.ModuleType("fla.ops")),
                         ("fla.ops.gated_delta_rule", fake)):
        monkeypatch.setitem(sys.modules, name, module)
    fla_kernels.fla_available.cache_clear()
    try:
        assert fla_kernels.fla_available()
        q, k, v, g, beta, state = make_inputs(41, seq_len=9, num_k_heads=2, num_v_heads=4, k_dim=16)
        expected = recurrent_gated_delta_rule(q, k, v, g, beta, state, True, True)
        for wrapper in (fla_kernels.fla_chunk_gated_delta_rule, fla_kernels.fla_recurrent_gated_delta_rule):
            got = wrapper(q, k, v, g, beta, state.double(), True, True)  # the stand-in runs `expected`'s form: exact
            assert torch.equal(got.output, expected.output) and torch.equal(got.final_state, expected.final_state)
            assert wrapper(q, k, v, g, beta, state, False, True).final_state is None
        assert [entry[:4] for entry in seen] == [("chunk", 4, 0.25, torch.float32)] * 2 + [
            ("recurrent", 4, 0.25, torch.float32)] * 2
        assert all(entry[4] == {} for entry in seen)
    finally:
        fla_kernels.fla_available.cache_clear()


# ------------------------------------------------------------------------------------------------ causal conv
def conv_inputs(seed, batch=2, seq_len=11, channels=6, kernel=4, dtype=torch.float32, bias=True):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, seq_len, channels, generator=gen).to(dtype)
    weight = torch.randn(channels, kernel, generator=gen).to(dtype)
    b = torch.randn(channels, generator=gen).to(dtype) if bias else None
    state = torch.randn(batch, channels, kernel - 1, generator=gen).to(dtype)
    return x, weight, b, state


@pytest.mark.parametrize("bias", [True, False])
def test_conv_from_a_fresh_sequence_equals_nn_conv1d(bias):
    x, weight, b, _ = conv_inputs(41, bias=bias)
    conv = torch.nn.Conv1d(6, 6, kernel_size=4, groups=6, padding=3, bias=bias)
    with torch.no_grad():
        conv.weight.copy_(weight.unsqueeze(1))
        if bias:
            conv.bias.copy_(b)
        expected = F.silu(conv(x.transpose(1, 2))[:, :, :11]).transpose(1, 2)
    result = causal_conv1d_prefill(x, weight, b)
    torch.testing.assert_close(result.output, expected, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(causal_conv1d_prefill(x, weight, b, activation=None).output,
                               conv(x.transpose(1, 2))[:, :, :11].transpose(1, 2).detach(), rtol=1e-6, atol=1e-6)
    assert torch.equal(result.final_state, x[:, -3:].transpose(1, 2))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_conv_equals_hf_fallbacks(dtype):
    module = pytest.importorskip("transformers.models.qwen3_next.modeling_qwen3_next")
    x, weight, _, state = conv_inputs(43, dtype=dtype, bias=False)
    fresh = causal_conv1d_prefill(x, weight)
    hf_fresh = module.causal_conv1d_fn(x.transpose(1, 2), weight, None, activation="silu")
    torch.testing.assert_close(fresh.output, hf_fresh.transpose(1, 2), rtol=1e-6, atol=1e-6)
    hf_state = state.clone()  # HF's update writes the next state into its argument
    hf_out = module.causal_conv1d_update(x.transpose(1, 2), hf_state, weight, None, "silu")
    after = causal_conv1d_prefill(x, weight, None, state)
    torch.testing.assert_close(after.output, hf_out.transpose(1, 2), rtol=1e-6, atol=1e-6)
    assert torch.equal(after.final_state, hf_state)
    assert after.output.dtype == dtype and after.final_state.dtype == dtype


@pytest.mark.parametrize("activation", [None, "silu"])
def test_conv_continuity_across_splits_and_decode_steps(activation):
    """Bit-equal sums however the sequence is split; after SiLU within an ulp (torch's vectorised and scalar SiLU
    may round differently). States are inputs, so always bit-equal."""
    x, weight, b, state = conv_inputs(47, seq_len=12)
    exact = activation is None

    def check(actual, expected):
        if exact:
            assert torch.equal(actual, expected)
        else:
            torch.testing.assert_close(actual, expected, rtol=2e-7, atol=0)

    whole = causal_conv1d_prefill(x, weight, b, state, activation)
    for split in (1, 2, 5, 11):
        first = causal_conv1d_prefill(x[:, :split], weight, b, state, activation)
        second = causal_conv1d_prefill(x[:, split:], weight, b, first.final_state, activation)
        check(torch.cat([first.output, second.output], 1), whole.output)
        assert torch.equal(second.final_state, whole.final_state)
    carried, outputs = state, []
    for t in range(12):
        step = causal_conv1d_update(x[:, t], carried, weight, b, activation)
        assert step.output.shape == (2, 6)
        outputs.append(step.output)
        carried = step.final_state
    check(torch.stack(outputs, 1), whole.output)
    assert torch.equal(carried, whole.final_state)


def test_conv_all_states_equal_prefix_runs():
    x, weight, b, state = conv_inputs(53, seq_len=5)
    window = causal_conv1d_prefill(x, weight, b, state, output_all_states=True)
    assert window.all_states.shape == (2, 5, 6, 3)
    for t in range(5):
        assert torch.equal(window.all_states[:, t], causal_conv1d_prefill(x[:, :t + 1], weight, b, state).final_state)
    assert torch.equal(window.all_states[:, -1], window.final_state)


def test_conv_does_not_mutate_its_state_and_checks_shapes():
    x, weight, b, state = conv_inputs(59)
    before = state.clone()
    causal_conv1d_prefill(x, weight, b, state)
    causal_conv1d_update(x[:, 0], state, weight, b)
    assert torch.equal(state, before)
    with pytest.raises(ValueError, match="conv_state"):
        causal_conv1d_prefill(x, weight, b, state[:, :, 1:])
    with pytest.raises(ValueError, match="weight"):
        causal_conv1d_prefill(x, weight[:5], b)


# ------------------------------------------------------------------------------------------------ gated norm
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("family", ["qwen3_next", "qwen3_5"])
def test_gated_rms_norm_equals_hf_module(family, dtype):
    module = pytest.importorskip(f"transformers.models.{family}.modeling_{family}")
    norm_class = module.Qwen3NextRMSNormGated if family == "qwen3_next" else module.Qwen3_5RMSNormGated
    gen = torch.Generator().manual_seed(61)
    x = torch.randn(5, 3, 16, generator=gen).to(dtype)
    gate = torch.randn(5, 3, 16, generator=gen).to(dtype)
    norm = norm_class(16, eps=1e-6).to(dtype)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(16, generator=gen))  # plain weight: HF initialises it to ones, not zeros
    with torch.no_grad():
        expected = norm(x, gate)
    got = gated_rms_norm(x, gate, norm.weight.detach(), eps=1e-6)
    # exact: the same torch ops as the module, in its order, on the same tensors
    assert got.dtype == dtype and torch.equal(got, expected)


def test_gated_rms_norm_formula_in_float64():
    gen = torch.Generator().manual_seed(67)
    x, gate, weight = torch.randn(4, 8, generator=gen), torch.randn(4, 8, generator=gen), torch.randn(8, generator=gen)
    xd = x.double()
    expected = weight.double() * xd / torch.sqrt(xd.pow(2).mean(-1, keepdim=True) + 1e-6) * F.silu(gate.double())
    torch.testing.assert_close(gated_rms_norm(x, gate, weight).double(), expected, rtol=1e-6, atol=1e-6)
