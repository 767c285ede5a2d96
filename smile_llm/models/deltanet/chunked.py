"""The gated delta rule by chunks (the WY / UT-transform form): for prefill and long verify windows.

Within a chunk of C positions that starts from state ``S0``, let ``G_i = g_1 + ... + g_i``
(cumulative log-decay) and ``u_i`` the value actually written at position i
(``beta_i * (v_i - S_{i-1}'^T k_i)`` with ``S'`` decayed). Unrolling the recurrence (``recurrent``)
gives, for i, j in the chunk::

    S_i = exp(G_i) S0 + sum_{j <= i} exp(G_i - G_j) k_j u_j^T
    u_i + sum_{j < i} beta_i exp(G_i - G_j) (k_i . k_j) u_j = beta_i v_i - beta_i exp(G_i) S0^T k_i
    o_i = exp(G_i) S0^T q_i + sum_{j <= i} exp(G_i - G_j) (q_i . k_j) u_j

The second line is a unit lower-triangular system ``(I + A) u = beta v - w S0`` solved once per
chunk for both right-hand sides (``u = u_v - u_k S0``), in parallel over all chunks; only the
hand-over of ``S0`` from chunk to chunk is sequential. Every exponent is ``<= 0`` (positions above
the diagonal are masked before ``exp``), so nothing overflows. Padding positions
(k = v = g = beta = 0) leave the state unchanged, so T need not divide by C.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .convention import DeltaRuleOutput, head_major_inputs, token_major_output

DEFAULT_CHUNK_SIZE = 64


def chunk_gated_delta_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                           beta: torch.Tensor, initial_state: torch.Tensor | None = None,
                           output_final_state: bool = False,
                           use_qk_l2norm_in_kernel: bool = False, output_all_states: bool = False,
                           chunk_size: int = DEFAULT_CHUNK_SIZE) -> DeltaRuleOutput:
    """Same contract and result as ``recurrent_gated_delta_rule`` (layouts in ``convention``),
    computed by chunks.

    Chunks hold ``min(chunk_size, T)`` positions; the last one is zero-padded.
    ``output_all_states`` costs one extra [C, DK, C] x [C, DV] product per chunk: 3-5x the
    recurrent form's time on 2-8 positions, so ``gated_delta_rule`` asks the recurrent form for
    per-position states. Inputs are not mutated.
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be positive, got {chunk_size}")
    x = head_major_inputs(q, k, v, g, beta, initial_state, use_qk_l2norm_in_kernel)
    batch, heads, seq_len, v_dim = x.v.shape
    k_dim = x.k.shape[-1]
    state = x.state  # float32[B, HV, DK, DV], fresh
    if seq_len == 0:
        empty_states = state.new_empty(batch, 0, heads, k_dim, v_dim) if output_all_states else None
        return DeltaRuleOutput(token_major_output(x.v, q.dtype),
                               state if output_final_state else None, empty_states)

    size = min(chunk_size, seq_len)
    pad = -seq_len % size
    num_chunks = (seq_len + pad) // size
    rows = batch * heads  # (batch, head) pairs: the batch of every bmm below

    # [B, HV, T(, D)] -> [B*HV, N, C(, D)] contiguous, padded
    def chunked(t: torch.Tensor) -> torch.Tensor:
        if pad:
            t = F.pad(t, (0, 0, 0, pad)) if t.dim() == 4 else F.pad(t, (0, pad))
        return t.reshape(rows, num_chunks, size, *t.shape[3:]).contiguous()

    qc, kc, vc, gc, bc = (chunked(t) for t in (x.q, x.k, x.v, x.g, x.beta))
    cum = gc.cumsum(-1)  # G_i, [B*HV, N, C]
    causal = torch.ones(size, size, dtype=torch.bool, device=cum.device).tril()
    # exp(G_i - G_j), j<=i
    decay = (cum.unsqueeze(-1) - cum.unsqueeze(-2)).masked_fill(~causal, float("-inf")).exp()
    eye = torch.eye(size, dtype=cum.dtype, device=cum.device).expand_as(decay)
    # I + A, [B*HV, N, C, C]
    system = eye + (bc.unsqueeze(-1) * _bmm(kc, kc.transpose(-1, -2)) * decay).tril(-1)
    # C columns, not DK + DV
    inverse = torch.linalg.solve_triangular(system, eye, upper=False, unitriangular=True)
    u_v = _bmm(inverse, vc * bc.unsqueeze(-1))  # u = u_v - u_k S0, [B*HV, N, C, DV]
    u_k = _bmm(inverse, kc * (bc * cum.exp()).unsqueeze(-1))  # [B*HV, N, C, DK]
    # (q_i . k_j) exp(G_i - G_j), lower triangle
    scores = _bmm(qc, kc.transpose(-1, -2)).mul_(decay)
    q_read = qc * cum.exp().unsqueeze(-1)  # reads S0: exp(G_i) q_i
    # writes into the last state
    k_write = (kc * (cum[..., -1:] - cum).exp().unsqueeze(-1)).transpose(-1, -2)
    chunk_decay = cum[..., -1].exp()[..., None, None]  # exp(G_C), [B*HV, N, 1, 1]

    state = state.view(rows, k_dim, v_dim)  # updated in place
    out = torch.empty_like(vc)  # float32[B*HV, N, C, DV]
    all_states = (state.new_empty(rows, num_chunks, size, k_dim, v_dim) if output_all_states
                  else None)
    # slices [:, n] are strided [B*HV, ...] batches: bmm reads them in place
    for n in range(num_chunks):
        u = torch.baddbmm(u_v[:, n], u_k[:, n], state, alpha=-1)  # [B*HV, C, DV]
        torch.baddbmm(torch.bmm(scores[:, n], u), q_read[:, n], state, out=out[:, n])
        if all_states is not None:  # S_i = exp(G_i) S0 + sum_{j<=i} exp(G_i - G_j) k_j u_j^T
            # [., C, DK, C]
            weighted_k = (decay[:, n].unsqueeze(-1) * kc[:, n].unsqueeze(-3)).transpose(-1, -2)
            all_states[:, n] = (cum[:, n].exp()[..., None, None] * state.unsqueeze(1)
                                + weighted_k @ u.unsqueeze(1))
        state.mul_(chunk_decay[:, n]).baddbmm_(k_write[:, n], u)

    final_state = state.view(batch, heads, k_dim, v_dim)
    output = token_major_output(out.view(batch, heads, -1, v_dim)[:, :, :seq_len], q.dtype)
    states = None
    if all_states is not None:  # -> [B, T, HV, DK, DV]
        states = (all_states.view(batch, heads, -1, k_dim, v_dim)[:, :, :seq_len]
                  .transpose(1, 2).contiguous())
    return DeltaRuleOutput(output, final_state if output_final_state else None, states)


def _bmm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """[R, N, I, J] @ [R, N, J, L] as one bmm over R*N (a transposed operand is read in
    place, not copied)."""
    rows, num_chunks = a.shape[:2]
    out = torch.bmm(a.reshape(rows * num_chunks, *a.shape[2:]),
                    b.reshape(rows * num_chunks, *b.shape[2:]))
    return out.view(rows, num_chunks, *out.shape[1:])
