"""The gated delta rule step by step: for decode steps and short verify windows.

Per value head, with state ``S`` [DK, DV] and q already scaled (see ``convention``)::

    S_t = exp(g_t) * S_{t-1}
    S_t = S_t + k_t (beta_t * (v_t - S_t^T k_t))^T     the delta rule: write the part of
                                                       v_t that S_t misses
    o_t = S_t^T q_t

Three small batched matmuls per position, the state updated in place: the form for a few positions
(up to 3 on the CPU, and whenever per-position states are wanted); ``chunked`` is the prefill form.
"""

from __future__ import annotations

import torch

from .convention import DeltaRuleOutput, head_major_inputs


def recurrent_gated_delta_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                               beta: torch.Tensor, initial_state: torch.Tensor | None = None,
                               output_final_state: bool = False,
                               use_qk_l2norm_in_kernel: bool = False,
                               output_all_states: bool = False) -> DeltaRuleOutput:
    """The recurrence above over ``[0, T)`` from ``initial_state`` (zeros when ``None``); layouts
    in ``convention``.

    ``output_all_states`` also returns the state after every position
    (float32[B, T, HV, DK, DV]) so a verify window can restore the one after its last accepted
    token. Inputs are not mutated; T may be 0.
    """
    x = head_major_inputs(q, k, v, g, beta, initial_state, use_qk_l2norm_in_kernel)
    batch, heads, seq_len, v_dim = x.v.shape
    k_dim = x.k.shape[-1]
    # (batch, head) pairs, one bmm batch; every tensor below is a view or fresh
    rows = batch * heads
    state = x.state.view(rows, k_dim, v_dim)  # float32, fresh, updated in place
    # token-major [T, B*HV, ...]: position t's heads are adjacent in memory (twice as fast as
    # head-major here)
    qs, ks, vs = (t.permute(2, 0, 1, 3).reshape(seq_len, rows, 1, t.shape[-1])
                  for t in (x.q, x.k, x.v))
    decay, beta32 = (t.permute(2, 0, 1).reshape(seq_len, rows, 1, 1) for t in (x.g.exp(), x.beta))
    out = vs.new_empty(seq_len, rows, 1, v_dim)
    all_states = state.new_empty(batch, seq_len, heads, k_dim, v_dim) if output_all_states else None
    for t in range(seq_len):
        k_t = ks[t]  # [B*HV, 1, DK]
        state.mul_(decay[t])
        delta = (vs[t] - torch.bmm(k_t, state)).mul_(beta32[t])  # [B*HV, 1, DV]
        state.baddbmm_(k_t.transpose(1, 2), delta)  # += k_t delta^T
        torch.bmm(qs[t], state, out=out[t])
        if all_states is not None:
            all_states[:, t] = state.view(batch, heads, k_dim, v_dim)
    final_state = state.view(batch, heads, k_dim, v_dim)
    # [B, T, HV, DV]
    output = out.view(seq_len, batch, heads, v_dim).transpose(0, 1).to(q.dtype).contiguous()
    return DeltaRuleOutput(output, final_state if output_final_state else None, all_states)
