"""The short causal depthwise convolution over the concatenated q/k/v projection
(``linear_conv_kernel_dim`` = K).

Layouts::

    x            [B, T, C]       token-major, as the projection produces it
    weight       [C, K]          HF's ``conv1d.weight[:, 0, :]``; weight[:, K-1] multiplies
                                 the current input
    bias         [C] or None     (Qwen3-Next / Qwen3.5 have none)
    conv_state   [B, C, K-1]     the last K-1 inputs before the window, oldest first; zeros
                                 before a sequence

``y_t = act(bias + sum_j weight[:, j] * x_{t-K+1+j})`` with inputs before the window taken from
``conv_state``. As in HF, inputs are rounded to weight's dtype, the output (and SiLU) is in
weight's dtype, then cast to x's. HF's cache keeps K columns of which the convolution reads the
last K-1; a state here is exactly those K-1. States hold inputs (in x's dtype), so they depend on x
alone, not on the weights.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

import torch
import torch.nn.functional as F

Activation = Literal["silu"] | None


class ConvOutput(NamedTuple):
    """``all_states`` is ``None`` unless asked for."""

    output: torch.Tensor  # [B, T, C], dtype of x
    final_state: torch.Tensor  # [B, C, K-1], dtype of x: the state after the window's last input
    all_states: torch.Tensor | None  # [B, T, C, K-1]: [:, t] is the state after input t


def causal_conv1d_prefill(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                          conv_state: torch.Tensor | None = None, activation: Activation = "silu",
                          output_all_states: bool = False) -> ConvOutput:
    """The convolution over a window ``x`` that follows ``conv_state`` (zeros when ``None``: a
    sequence start).

    Each output sums its K taps in a fixed order in float32, so the sums do not depend on how a
    sequence is split into windows: prefill, verify windows and decode steps give the same bits
    before the activation (torch's SiLU may differ by an ulp between its vectorised and scalar
    paths). Returns fresh tensors; ``conv_state`` is not mutated. Raises ``ValueError`` on
    mismatched shapes.
    """
    window = _with_history(x, weight, conv_state)  # [B, K-1+T, C], dtype of x
    seq_len, kernel = x.shape[1], weight.shape[1]
    taps = window.to(weight.dtype).to(torch.float32)  # HF rounds the inputs to the weight's dtype
    w32 = weight.to(torch.float32)
    y = taps[:, :seq_len] * w32[:, 0]
    for j in range(1, kernel):
        # a product then a sum: no fused multiply-add, same bits anywhere
        y += taps[:, j:j + seq_len] * w32[:, j]
    if bias is not None:
        y += bias.to(torch.float32)
    y = y.to(weight.dtype)  # HF's convolution output dtype; the activation runs there too
    if activation == "silu":
        y = F.silu(y)
    all_states = None
    if output_all_states:  # the state after input t is window[:, t+1 : t+K]
        all_states = window[:, 1:].unfold(1, kernel - 1, 1).contiguous()  # [B, T, C, K-1]
    return ConvOutput(y.to(x.dtype), window[:, seq_len:].transpose(1, 2).contiguous(), all_states)


def causal_conv1d_update(x: torch.Tensor, conv_state: torch.Tensor, weight: torch.Tensor,
                         bias: torch.Tensor | None = None,
                         activation: Activation = "silu") -> ConvOutput:
    """One decode step: ``x`` [B, C] after ``conv_state``; returns output [B, C] and the next state.

    ``causal_conv1d_prefill`` on a window of one input: decode steps equal a prefill of the same
    inputs (exactly before the activation).
    """
    result = causal_conv1d_prefill(x.unsqueeze(1), weight, bias, conv_state, activation)
    return ConvOutput(result.output.squeeze(1), result.final_state, None)


def _with_history(x: torch.Tensor, weight: torch.Tensor,
                  conv_state: torch.Tensor | None) -> torch.Tensor:
    """[B, K-1+T, C]: the state's K-1 inputs followed by the window, token-major, in x's dtype."""
    if x.dim() != 3 or weight.dim() != 2 or weight.shape[0] != x.shape[2] or weight.shape[1] < 2:
        raise ValueError(f"x must be [B, T, C] and weight [C, K] with K >= 2: x {tuple(x.shape)}, "
                         f"weight {tuple(weight.shape)}")
    batch, _, channels = x.shape
    state_shape = (batch, channels, weight.shape[1] - 1)
    if conv_state is None:
        return F.pad(x, (0, 0, state_shape[2], 0))
    if tuple(conv_state.shape) != state_shape:
        raise ValueError(f"conv_state must be [B, C, K-1] = {list(state_shape)}, got "
                         f"{tuple(conv_state.shape)}")
    return torch.cat([conv_state.transpose(1, 2).to(x.dtype), x], dim=1)
