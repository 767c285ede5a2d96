"""The Gated DeltaNet token mixer of the hybrid families (HF ``Qwen3NextGatedDeltaNet`` /
``Qwen3_5GatedDeltaNet``, with their parameter names), over the per-request state of the
forward's ``StateStep``.

Per layer and request the state is the short conv's last K-1 inputs (``[conv_dim, K-1]``) and the
delta rule's memory (float32 ``[H_v, d_k, d_v]``). A forward reads the active rows' state, runs the
window (``causal_conv1d_prefill`` and ``gated_delta_rule``, which picks the step-by-step form for
short windows and the chunked one for prefills), and writes the state after each row's last real
position back (and, when the state pool keeps prefix snapshots, the state at the last page boundary
the window reaches, see ``StateStep``). Right padding (a padded prefill batch) leaves a row's state
as it was after its last real token: the padded positions get decay ``g = 0`` and ``beta = 0`` (the
delta rule then keeps its memory unchanged) and the conv state is taken at the row's own end.

The two families differ only in how the input projections are laid out (``_project``); either way
every input projection of a layer is one matmul (their weights are row views of one fused tensor,
see ``fuse_rows``).
"""

from __future__ import annotations

from abc import abstractmethod
from typing import TYPE_CHECKING

import torch
from torch import nn
from torch.nn import functional as F

from .checkpoint.config import ModelConfig
from .deltanet import causal_conv1d_prefill, gated_delta_rule, gated_rms_norm
from .layers import PreparedModule, fuse_rows
from .state_step import conv_state_after

if TYPE_CHECKING:
    from .forward_context import LayerContext


class GatedDeltaNet(PreparedModule):
    """Projections (``_project``), the causal conv over q/k/v, the gated delta rule with
    L2-normalised q/k, the gated RMSNorm with ``z`` and ``out_proj``. ``linear_layer`` indexes the
    state pool's per-layer state."""

    def __init__(self, config: ModelConfig, linear_layer: int) -> None:
        super().__init__()
        la = config.linear_attention
        if la is None:
            raise ValueError("a GatedDeltaNet layer needs the config's linear_attention geometry")
        self.linear_layer = linear_layer
        self.num_k_heads, self.num_v_heads = la.num_key_heads, la.num_value_heads
        self.head_k_dim, self.head_v_dim = la.key_head_dim, la.value_head_dim
        self.key_dim, self.value_dim, self.conv_dim = la.key_dim, la.value_dim, la.conv_dim
        self.conv_kernel_size = la.conv_kernel_dim
        self.eps = config.rms_norm_eps
        self.conv1d = nn.Conv1d(self.conv_dim, self.conv_dim, self.conv_kernel_size,
                                groups=self.conv_dim, padding=self.conv_kernel_size - 1, bias=False)
        self.dt_bias = nn.Parameter(torch.ones(self.num_v_heads))
        self.A_log = nn.Parameter(torch.zeros(self.num_v_heads))
        self.norm = _GatedNormWeight(self.head_v_dim)
        self.out_proj = nn.Linear(self.value_dim, config.hidden_size, bias=False)

    @abstractmethod
    def _project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor,
                                                 torch.Tensor]:
        """``x`` ``[B, S, D]`` -> (q|k|v ``[B, S, conv_dim]`` in that channel order, z
        ``[B, S, H_v, d_v]``, b and a ``[B, S, H_v]``)."""

    def forward(self, x: torch.Tensor, ctx: LayerContext) -> torch.Tensor:
        """``x`` ``[B, S, D]`` -> ``[B, S, D]``; advances the active rows' state of this layer
        past the window."""
        b, s, _ = x.shape
        states = ctx.states
        if states is None:
            raise RuntimeError("a hybrid model's forward needs the pool's attached StatePool "
                               "(ForwardContext.states)")
        conv_state, recurrent_state = states.read(self.linear_layer)
        mixed, z, beta_logits, a = self._project(x)
        weight = self.conv1d.weight.squeeze(1)  # [C, K]
        keep = states.keep_positions
        conv = causal_conv1d_prefill(mixed, weight, None, conv_state, output_all_states=keep)
        q, k, v = conv.output.split([self.key_dim, self.key_dim, self.value_dim], dim=-1)
        q = q.reshape(b, s, self.num_k_heads, self.head_k_dim)
        k = k.reshape(b, s, self.num_k_heads, self.head_k_dim)
        v = v.reshape(b, s, self.num_v_heads, self.head_v_dim)
        beta = beta_logits.sigmoid()
        g = -self.A_log.float().exp() * F.softplus(a.float() + self.dt_bias)
        real = states.real  # None, or bool [B, S]: False on right padding
        if real is not None:
            beta = beta * real[..., None].to(beta.dtype)
            g = g * real[..., None]
        new_conv = (conv.final_state if real is None
                    else states.conv_state_at_ends(conv_state, mixed))
        # a prefix snapshot inside the window: run the rule up to it, then on from it
        if states.capture_inside:
            assert states.capture_at is not None
            output, boundary, final = self._rule_split_at(q, k, v, g, beta, recurrent_state,
                                                          states.capture_at, real,
                                                          states.capture_span)
            states.capture(self.linear_layer,
                           conv_state_after(conv_state, mixed, states.capture_at), boundary)
        else:
            rule = gated_delta_rule(q, k, v, g, beta, initial_state=recurrent_state,
                                    output_final_state=True, use_qk_l2norm_in_kernel=True,
                                    output_all_states=keep)
            assert rule.final_state is not None
            output, final = rule.output, rule.final_state
            # a verify window: the state after every position, for rewind once drafts are accepted
            if keep:
                assert conv.all_states is not None and rule.all_states is not None
                states.keep(self.linear_layer, conv.all_states, rule.all_states)
            # snapshots at the window's end, if any
            states.capture(self.linear_layer, new_conv, final)
        states.write(self.linear_layer, new_conv, final)
        out = gated_rms_norm(output, z, self.norm.weight, self.eps)  # [B, S, H_v, d_v]
        return F.linear(out.reshape(b, s, self.value_dim), self.out_proj.weight)


    @staticmethod
    def _rule_split_at(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                       beta: torch.Tensor, initial: torch.Tensor, split: torch.Tensor,
                       real: torch.Tensor | None,
                       span: tuple[int, int] | None = None) -> tuple[torch.Tensor, torch.Tensor,
                                                                     torch.Tensor]:
        """The gated delta rule over the window with row b's state also taken after its first
        ``split[b]`` positions: (output, state at the split, final state). Two runs: the first
        over positions ``[0, max split)`` with each row's positions from its split on masked, the
        second from the first's final state over ``[min split, S)`` with each row's positions
        before its split masked (``g = 0``, ``beta = 0`` keep the memory unchanged). A single row
        (or rows split alike) computes each position once; each position's output comes from the
        run that holds it."""
        # ``span``: known on the host
        lo, hi = span if span is not None else (int(split.min()), int(split.max()))
        before = torch.arange(q.shape[1], device=q.device)[None, :] < split[:, None]  # [B, S]
        after = ~before if real is None else ~before & real

        def masked(mask: torch.Tensor, a: int,
                   b: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                                    torch.Tensor]:
            m = mask[:, a:b, None]
            return q[:, a:b], k[:, a:b], v[:, a:b], g[:, a:b] * m, beta[:, a:b] * m.to(beta.dtype)

        first = gated_delta_rule(*masked(before, 0, hi), initial_state=initial,
                                 output_final_state=True, use_qk_l2norm_in_kernel=True)
        second = gated_delta_rule(*masked(after, lo, q.shape[1]), initial_state=first.final_state,
                                  output_final_state=True, use_qk_l2norm_in_kernel=True)
        assert first.final_state is not None and second.final_state is not None
        overlap = torch.where(before[:, lo:hi, None, None], first.output[:, lo:hi],
                              second.output[:, : hi - lo])
        output = torch.cat((first.output[:, :lo], overlap, second.output[:, hi - lo :]), dim=1)
        return output, first.final_state, second.final_state


class _GatedNormWeight(nn.Module):
    """Holds ``norm.weight`` (plain, initialised to ones) for ``gated_rms_norm``."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))


class Qwen3NextGatedDeltaNet(GatedDeltaNet):
    """Qwen3-Next's projections: ``in_proj_qkvz`` and ``in_proj_ba`` grouped by key head (each group
    holds its q, k, then the v and z of its ``H_v / H_k`` value heads; b and a likewise)."""

    def __init__(self, config: ModelConfig, linear_layer: int) -> None:
        super().__init__(config, linear_layer)
        d = config.hidden_size
        self.in_proj_qkvz = nn.Linear(d, 2 * self.key_dim + 2 * self.value_dim, bias=False)
        self.in_proj_ba = nn.Linear(d, 2 * self.num_v_heads, bias=False)
        self._prepare()

    def _prepare(self) -> None:
        self.in_weight, _ = fuse_rows(self.in_proj_qkvz, self.in_proj_ba)

    def _project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor,
                                                 torch.Tensor]:
        b, s, _ = x.shape
        hk, dk, dv = self.num_k_heads, self.head_k_dim, self.head_v_dim
        per = self.num_v_heads // hk
        qkvz, ba = F.linear(x, self.in_weight).split([2 * self.key_dim + 2 * self.value_dim,
                                                      2 * self.num_v_heads], dim=-1)
        q, k, v, z = qkvz.reshape(b, s, hk, 2 * dk + 2 * per * dv).split(
            [dk, dk, per * dv, per * dv], dim=-1)
        ba = ba.reshape(b, s, hk, 2 * per)
        beta_logits, a = ba.split([per, per], dim=-1)
        mixed = torch.cat((q.reshape(b, s, -1), k.reshape(b, s, -1), v.reshape(b, s, -1)), dim=-1)
        return (mixed, z.reshape(b, s, self.num_v_heads, dv),
                beta_logits.reshape(b, s, self.num_v_heads), a.reshape(b, s, self.num_v_heads))


class Qwen3_5GatedDeltaNet(GatedDeltaNet):  # noqa: N801 - the family's name
    """Qwen3.5's projections: ``in_proj_qkv`` (q, k, v in channel order), ``in_proj_z``,
    ``in_proj_b``, ``in_proj_a``."""

    def __init__(self, config: ModelConfig, linear_layer: int) -> None:
        super().__init__(config, linear_layer)
        d = config.hidden_size
        self.in_proj_qkv = nn.Linear(d, self.conv_dim, bias=False)
        self.in_proj_z = nn.Linear(d, self.value_dim, bias=False)
        self.in_proj_b = nn.Linear(d, self.num_v_heads, bias=False)
        self.in_proj_a = nn.Linear(d, self.num_v_heads, bias=False)
        self._prepare()

    def _prepare(self) -> None:
        self.in_weight, _ = fuse_rows(self.in_proj_qkv, self.in_proj_z, self.in_proj_b,
                                      self.in_proj_a)

    def _project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor,
                                                 torch.Tensor]:
        b, s, _ = x.shape
        h = self.num_v_heads
        qkv, z, beta_logits, a = F.linear(x, self.in_weight).split([self.conv_dim, self.value_dim,
                                                                    h, h], dim=-1)
        return qkv, z.reshape(b, s, h, self.head_v_dim), beta_logits, a


def gated_deltanet(config: ModelConfig, linear_layer: int) -> GatedDeltaNet:
    """The family's DeltaNet layer: Qwen3-Next's grouped projections or Qwen3.5's separate ones."""
    cls = Qwen3NextGatedDeltaNet if config.model_type == "qwen3_next" else Qwen3_5GatedDeltaNet
    return cls(config, linear_layer)
