"""Attention split in two key sets and merged by log-sum-exp (``attention.torch.merge``), and the torch backend's
decode with its LSE (the fused one-chunk path a draft chain's history uses), against the float64 reference
(``attention.reference``)."""

from __future__ import annotations

import math
from unittest import mock

import numpy as np
import pytest
import torch

from smile_llm.attention.torch import merge, run as torch_run
from smile_llm.attention.torch.merge import dense_attention, merge_by_lse
from smile_llm.attention.reference import dense_reference_attention, reference_paged_attention
from smile_llm.attention.torch.backend import TorchBackend

from .cases import make_case


def dense64(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The float64 reference of ``q`` ``[B, H, G, D]`` over ``k``/``v`` ``[B, H, L, D]``: out and LSE [..., 1]."""
    out, lse = dense_reference_attention(q, k, v, scale=scale)
    return out, lse.unsqueeze(-1)


@pytest.mark.parametrize("fused", [True, False], ids=["cpu-kernel", "matmuls"])
@pytest.mark.parametrize("keys", [1, 3, 40])
def test_dense_attention_matches_float64(fused: bool, keys: int) -> None:
    g = torch.Generator().manual_seed(keys)
    q, k, v = (torch.randn(2, 3, n, 8, generator=g) for n in (4, keys, keys))
    want, want_lse = dense64(q, k, v, 0.35)
    if fused:
        out, lse = dense_attention(q, k, v, 0.35)
    else:  # the branch every other device takes
        out, lse = merge._dense_matmuls(q, k, v, 0.35)
    assert out.shape == (2, 3, 4, 8) and lse.shape == (2, 3, 4, 1)
    assert (out.double() - want).abs().max().item() < 1e-5
    assert (lse.double() - want_lse).abs().max().item() < 1e-5


@pytest.mark.parametrize("split", [1, 7, 19])
def test_merging_two_parts_equals_attention_over_all_keys(split: int) -> None:
    """Keys [0, split) and [split, 20) attended apart and merged give attention over all 20 (float64 reference)."""
    g = torch.Generator().manual_seed(split)
    q, k, v = torch.randn(1, 2, 3, 16, generator=g), torch.randn(1, 2, 20, 16, generator=g), \
        torch.randn(1, 2, 20, 16, generator=g)
    out0, lse0 = dense_attention(q, k[:, :, :split], v[:, :, :split], 0.25)
    out1, lse1 = dense_attention(q, k[:, :, split:], v[:, :, split:], 0.25)
    want, _ = dense64(q, k, v, 0.25)
    assert (merge_by_lse(out0, lse0, out1, lse1).double() - want).abs().max().item() < 1e-5


def test_a_part_without_keys_weighs_nothing() -> None:
    """A part whose LSE is -inf (a row that saw no key; its output 0) leaves the other part's output exact."""
    g = torch.Generator().manual_seed(3)
    out1 = torch.randn(1, 2, 3, 4, generator=g)
    lse1 = torch.randn(1, 2, 3, 1, generator=g)
    merged = merge_by_lse(torch.zeros(1, 2, 3, 4), torch.full((1, 2, 3, 1), -math.inf), out1.clone(), lse1)
    assert torch.equal(merged, out1)  # weights exp(-inf) = 0 and exp(0) = 1 are exact in IEEE arithmetic


@pytest.mark.parametrize("lengths", [[37], [5, 0, 23], [16, 16, 1]])
def test_torch_backend_decode_returns_the_lse_of_the_reference(lengths: list[int]) -> None:
    """A decode plan (one query per row, rows of any length, an empty row too) run with ``return_lse``: the output
    and the base-2 LSE equal the float64 reference's (an empty row: output 0, LSE -inf). Every such plan takes the fused
    CPU kernel that returns the LSE (padded rows and the empty row masked)."""
    case = make_case(np.random.default_rng(len(lengths)), lengths, None, 4, 2, 3, 8)
    backend = TorchBackend()
    backend.plan(case.meta, num_qo_heads=6, num_kv_heads=2, head_dim=8)
    with mock.patch.object(torch_run, "one_chunk_flash", wraps=torch_run.one_chunk_flash) as fused:
        out, lse = backend.run(case.q, case.k, case.v, return_lse=True)
    assert fused.called
    want, want_lse = reference_paged_attention(case.q, case.k, case.v, case.meta)
    assert (out.double() - want).abs().max().item() < 1e-5
    seen = want_lse > -math.inf
    assert torch.equal(lse > -math.inf, seen)
    assert (lse.double()[seen] - want_lse[seen]).abs().max().item() < 1e-5
