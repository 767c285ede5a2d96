"""fla-core's gated-delta-rule kernels against the PyTorch forms (GPU only: every test is marked ``cuda`` and skipped
without CUDA and fla-core; ``scripts/gpu_check.sh`` runs them).

Inputs as Qwen3-Next's: head dims 128, twice as many value heads as key heads, in-kernel L2 normalisation, a random
initial state, windows that end mid-chunk. Tolerances are relative to the reference's largest magnitude: float32
5e-3 (fla's Triton dots may use TF32), bfloat16 2e-2 (fla keeps some intermediates in the input dtype); states are
float32 in both. The PyTorch forms themselves are checked against a float64 oracle in ``test_deltanet_ops.py``.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from smile_llm.models.deltanet import (
    FLA_RECURRENT_MAX_LEN,
    chunk_gated_delta_rule,
    fla_available,
    fla_chunk_gated_delta_rule,
    fla_recurrent_gated_delta_rule,
    gated_delta_rule,
    recurrent_gated_delta_rule,
)

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not (torch.cuda.is_available() and fla_available()),
                       reason="needs a CUDA device and fla-core (pip install fla-core)"),
]

REL = {torch.float32: 5e-3, torch.bfloat16: 2e-2}


def make_inputs(seed, batch=2, seq_len=150, num_k_heads=2, num_v_heads=4, k_dim=128, v_dim=128,
                dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=gen)

    q, k = randn(batch, seq_len, num_k_heads, k_dim), randn(batch, seq_len, num_k_heads, k_dim)
    v = randn(batch, seq_len, num_v_heads, v_dim)
    g = -torch.rand(num_v_heads, generator=gen).mul(3).exp() * F.softplus(randn(batch, seq_len, num_v_heads))
    beta = torch.sigmoid(randn(batch, seq_len, num_v_heads))
    state = randn(batch, num_v_heads, k_dim, v_dim) * 0.1
    q, k, v = (x.to("cuda", dtype) for x in (q, k, v))
    return q, k, v, g.cuda(), beta.cuda(), state.cuda()  # g, beta and the state stay float32


def assert_rel_close(actual, expected, rel, what=""):
    err = (actual.double() - expected.double()).abs().max().item()
    scale = expected.double().abs().max().item()
    assert err <= rel * scale, f"{what}: max error {err:.3g} > {rel:g} x {scale:.3g}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("seq_len", [1, 64, 150])
def test_fla_chunk_equals_pytorch_chunk(seq_len, dtype):
    q, k, v, g, beta, state = make_inputs(1, seq_len=seq_len, dtype=dtype)
    ours = chunk_gated_delta_rule(q, k, v, g, beta, state, True, True)
    fla = fla_chunk_gated_delta_rule(q, k, v, g, beta, state, True, True)
    assert fla.output.dtype == dtype and fla.output.shape == ours.output.shape
    assert fla.final_state.dtype == torch.float32 and fla.final_state.shape == ours.final_state.shape
    assert_rel_close(fla.output, ours.output, REL[dtype], "output")
    assert_rel_close(fla.final_state, ours.final_state, REL[dtype], "final state")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("seq_len", [1, 4])
def test_fla_recurrent_equals_pytorch_recurrent(seq_len, dtype):
    q, k, v, g, beta, state = make_inputs(2, seq_len=seq_len, dtype=dtype)
    ours = recurrent_gated_delta_rule(q, k, v, g, beta, state, True, True)
    fla = fla_recurrent_gated_delta_rule(q, k, v, g, beta, state, True, True)
    assert fla.output.dtype == dtype and fla.final_state.dtype == torch.float32
    assert_rel_close(fla.output, ours.output, REL[dtype], "output")
    assert_rel_close(fla.final_state, ours.final_state, REL[dtype], "final state")


def test_pytorch_forms_on_cuda_equal_the_cpu():
    q, k, v, g, beta, state = make_inputs(3, seq_len=70)
    for form in (recurrent_gated_delta_rule, chunk_gated_delta_rule):
        on_gpu = form(q, k, v, g, beta, state, True, True, True)
        on_cpu = form(*(x.cpu() for x in (q, k, v, g, beta, state)), True, True, True)
        for name in ("output", "final_state", "all_states"):
            assert_rel_close(getattr(on_gpu, name).cpu(), getattr(on_cpu, name), 1e-5, name)


def test_fla_prefill_then_decode_steps_equal_one_run():
    q, k, v, g, beta, state = make_inputs(4, seq_len=140)
    whole = fla_chunk_gated_delta_rule(q, k, v, g, beta, state, True, True)
    prefill = fla_chunk_gated_delta_rule(q[:, :130], k[:, :130], v[:, :130], g[:, :130], beta[:, :130], state,
                                         True, True)
    outputs, carried = [prefill.output], prefill.final_state
    for t in range(130, 140):
        step = fla_recurrent_gated_delta_rule(q[:, t:t + 1], k[:, t:t + 1], v[:, t:t + 1], g[:, t:t + 1],
                                              beta[:, t:t + 1], carried, True, True)
        outputs.append(step.output)
        carried = step.final_state
    assert_rel_close(torch.cat(outputs, 1), whole.output, REL[torch.float32], "output")
    assert_rel_close(carried, whole.final_state, REL[torch.float32], "final state")


def test_fla_does_not_mutate_the_initial_state():
    q, k, v, g, beta, state = make_inputs(5, seq_len=20)
    before = state.clone()
    fla_chunk_gated_delta_rule(q, k, v, g, beta, state, True, True)
    fla_recurrent_gated_delta_rule(q[:, :1], k[:, :1], v[:, :1], g[:, :1], beta[:, :1], state, True, True)
    assert torch.equal(state, before)


def test_dispatcher_on_cuda(monkeypatch):
    """fla's fused recurrent kernel for short windows, its chunked kernel above, the PyTorch form (on the GPU) when
    per-position states are asked for."""
    from smile_llm.models.deltanet import dispatch

    calls = []

    def spy(name, kernel):
        def wrapped(*args):
            calls.append(name)
            return kernel(*args)
        return wrapped

    monkeypatch.setattr(dispatch, "fla_recurrent_gated_delta_rule", spy("recurrent", fla_recurrent_gated_delta_rule))
    monkeypatch.setattr(dispatch, "fla_chunk_gated_delta_rule", spy("chunk", fla_chunk_gated_delta_rule))
    cases = ((1, "recurrent"), (FLA_RECURRENT_MAX_LEN, "recurrent"), (FLA_RECURRENT_MAX_LEN + 1, "chunk"))
    for seq_len, name in cases:
        q, k, v, g, beta, state = make_inputs(6, seq_len=seq_len)
        calls.clear()
        got = gated_delta_rule(q, k, v, g, beta, state, True, True)
        assert calls == [name] and got.output.is_cuda and got.final_state is not None
    q, k, v, g, beta, state = make_inputs(7, seq_len=4)
    calls.clear()
    got = gated_delta_rule(q, k, v, g, beta, state, True, True, output_all_states=True)
    expected = recurrent_gated_delta_rule(q, k, v, g, beta, state, True, True, True)
    assert calls == [] and got.all_states is not None and got.all_states.is_cuda
    assert torch.equal(got.all_states, expected.all_states)  # the form it dispatches to, on the same inputs
