"""The calling convention of the gated delta rule (Hugging Face's ``torch_*_gated_delta_rule``
and fla's kernels).

Layouts, token-major as the projections produce them::

    q, k           [B, T, HK, DK]   any float dtype; the output takes q's dtype
    v              [B, T, HV, DV]   HV a multiple of HK: value head h reads query/key
                                    head h // (HV // HK)
    g              [B, T, HV]       log-decay (<= 0): the state is multiplied by
                                    exp(g_t) before step t
    beta           [B, T, HV]       write strength in (0, 1)
    initial_state  [B, HV, DK, DV]  any float dtype, read as float32, never mutated

Every form computes in float32, scales q by ``DK ** -0.5`` and, with ``use_qk_l2norm_in_kernel``,
first L2-normalises q and k (float32, ``x * rsqrt(sum(x^2) + 1e-6)``, exactly as HF and fla). States
come out float32.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

L2NORM_EPS = 1e-6


class DeltaRuleOutput(NamedTuple):
    """What a gated-delta-rule form returns; a state is ``None`` unless its flag asked for it."""

    output: torch.Tensor  # [B, T, HV, DV], dtype of q
    final_state: torch.Tensor | None  # float32[B, HV, DK, DV]: the state after the last position
    # float32[B, T, HV, DK, DV]: [:, t] is the state after position t
    all_states: torch.Tensor | None


class HeadMajorInputs(NamedTuple):
    """Validated float32 inputs, heads before time, q/k repeated to HV heads. Strides are
    the inputs' (usually token-major views): each form lays them out in memory as its
    loop reads them."""

    q: torch.Tensor  # float32[B, HV, T, DK], normalised if asked, scaled by DK ** -0.5
    k: torch.Tensor  # float32[B, HV, T, DK], normalised if asked
    v: torch.Tensor  # float32[B, HV, T, DV]
    g: torch.Tensor  # float32[B, HV, T]
    beta: torch.Tensor  # float32[B, HV, T]
    # float32[B, HV, DK, DV]: a fresh tensor (zeros, or a copy of initial_state)
    state: torch.Tensor


def l2norm(x: torch.Tensor, dim: int = -1, eps: float = L2NORM_EPS) -> torch.Tensor:
    """``x * rsqrt(sum(x^2, dim) + eps)``, in x's dtype (HF's ``l2norm``, fla's convention)."""
    return x * torch.rsqrt((x * x).sum(dim=dim, keepdim=True) + eps)


def head_major_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                      beta: torch.Tensor, initial_state: torch.Tensor | None,
                      use_qk_l2norm_in_kernel: bool) -> HeadMajorInputs:
    """Checks the layouts above and returns the float32 head-major inputs; raises
    ``ValueError`` on a mismatch."""
    check_shapes(q, k, v, g, beta, initial_state)
    num_k_heads, num_v_heads = k.shape[2], v.shape[2]
    # grouped values: consecutive value heads share one query/key head
    if num_v_heads != num_k_heads:
        q = q.repeat_interleave(num_v_heads // num_k_heads, dim=2)
        k = k.repeat_interleave(num_v_heads // num_k_heads, dim=2)
    # views when float32
    q, k, v, g, beta = (x.transpose(1, 2).to(torch.float32) for x in (q, k, v, g, beta))
    if use_qk_l2norm_in_kernel:
        q, k = l2norm(q), l2norm(k)
    q = q * q.shape[-1] ** -0.5
    batch, _, _, k_dim = k.shape
    if initial_state is None:
        state = torch.zeros(batch, num_v_heads, k_dim, v.shape[-1], dtype=torch.float32,
                            device=v.device)
    else:
        state = initial_state.to(device=v.device, dtype=torch.float32,
                                 memory_format=torch.contiguous_format, copy=True)
    return HeadMajorInputs(q, k, v, g, beta, state)


def token_major_output(out: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """float32[B, HV, T, DV] -> [B, T, HV, DV] in ``dtype``, contiguous."""
    return out.transpose(1, 2).to(dtype, memory_format=torch.contiguous_format)


def check_shapes(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                 beta: torch.Tensor, initial_state: torch.Tensor | None) -> None:
    """Raises ``ValueError`` naming the tensor when a shape departs from the convention."""
    if q.dim() != 4 or q.shape != k.shape:
        raise ValueError(f"q and k must be [B, T, HK, DK] and equal: q {tuple(q.shape)}, k "
                         f"{tuple(k.shape)}")
    batch, seq_len, num_k_heads, k_dim = k.shape
    if v.dim() != 4 or v.shape[:2] != (batch, seq_len) or v.shape[2] % num_k_heads:
        raise ValueError(f"v must be [B, T, HV, DV] with HV a multiple of HK={num_k_heads}: v "
                         f"{tuple(v.shape)}, k {tuple(k.shape)}")
    heads = (batch, seq_len, v.shape[2])
    for name, x in (("g", g), ("beta", beta)):
        if tuple(x.shape) != heads:
            raise ValueError(f"{name} must be [B, T, HV] = {list(heads)}, got {tuple(x.shape)}")
    if (initial_state is not None
            and tuple(initial_state.shape) != (batch, v.shape[2], k_dim, v.shape[3])):
        raise ValueError("initial_state must be [B, HV, DK, DV] = "
                         f"{[batch, v.shape[2], k_dim, v.shape[3]]}, "
                         f"got {tuple(initial_state.shape)}")
