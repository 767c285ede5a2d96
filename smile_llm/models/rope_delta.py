"""RoPE delta rotation: keys computed at positions ``[0, N)`` moved to ``[M, M + N)`` without
recomputing them (a registered segment spliced at a shifted offset, ``docs/segments.md``).

RoPE turns each pair of dims ``(i, i + r/2)`` of a head (HF's ``rotate_half`` layout over the first
``r = rotary_dim`` dims; the rest pass through) by the angle ``p * inv_freq[i]`` at position ``p``.
Turns of one pair compose by adding their angles, so ``R(M + p) k = R(M) R(p) k``: turning stored
keys by ``M * inv_freq[i]`` gives the keys the same pre-RoPE vectors have at ``M + p``, for every
``p`` at once (one uniform delta). The identity holds for any ``inv_freq``, so Llama-3 scaling
(which only changes ``inv_freq``) and a partial rotary (the hybrid family's first ``rotary_dim``
dims) take the same code; Qwen3.5's multimodal RoPE is 1-D for text (every section sees the same
position), so its keys turn the same way.

Precision: the angles are formed in float64 from the model's own ``inv_freq`` values and the turn is
computed in float32 (float64 for float64 keys), so the rotated keys differ from a direct computation
only by the rounding of the stored keys and of the model's float32 angles at large positions.
"""

from __future__ import annotations

import torch


class KeyRotation:
    """The RoPE turn of one model's keys by a position delta: ``inv_freq`` ``[rotary_dim / 2]`` (the
    model's buffer, any float dtype) over heads of ``head_dim`` dims (``rotary_dim <= head_dim``;
    the dims past ``rotary_dim`` pass unchanged). ValueError for an empty ``inv_freq`` or a rotary
    part wider than the head."""

    def __init__(self, inv_freq: torch.Tensor, head_dim: int) -> None:
        freq = inv_freq.detach().reshape(-1).to(torch.float64).cpu()
        if len(freq) == 0 or 2 * len(freq) > head_dim:
            raise ValueError(f"inv_freq of {len(freq)} frequencies does not fit heads of "
                             f"{head_dim} dims (rotary_dim = 2 * len(inv_freq) <= head_dim)")
        self.inv_freq = freq  # float64 [rotary_dim / 2], host
        self.rotary_dim = 2 * len(freq)
        self.head_dim = int(head_dim)

    def cos_sin(self, delta: int) -> tuple[torch.Tensor, torch.Tensor]:
        """float64 host ``cos`` and ``sin`` ``[rotary_dim]`` of the angles ``delta * inv_freq``;
        ``sin`` has its first half negated, so a turn is ``x * cos + x.roll(r / 2, -1) * sin``
        (``rotate_half`` as a roll, like ``RopeTable``)."""
        angle = float(delta) * self.inv_freq
        cos, sin = angle.cos(), angle.sin()
        return torch.cat((cos, cos)), torch.cat((-sin, sin))

    def rotate(self, k: torch.Tensor, delta: int) -> torch.Tensor:
        """``k`` ``[..., head_dim]`` (keys after RoPE at positions ``p``) as the keys at
        ``p + delta``: float32 (float64 for float64 ``k``) on ``k``'s device; ``k`` unchanged.
        ValueError unless the last dim is ``head_dim``."""
        if k.shape[-1] != self.head_dim:
            raise ValueError(f"keys of {k.shape[-1]} dims, expected head_dim {self.head_dim}")
        work = torch.float64 if k.dtype == torch.float64 else torch.float32
        cos, sin = (t.to(device=k.device, dtype=work) for t in self.cos_sin(delta))
        r = self.rotary_dim
        x = k.to(work)
        rot = x[..., :r]
        rot = rot * cos + rot.roll(r // 2, -1) * sin
        return torch.cat((rot, x[..., r:]), dim=-1) if r < self.head_dim else rot

    def __call__(self, layer: int, k: torch.Tensor, delta: int) -> torch.Tensor:
        """``rotate(k, delta)``: the form ``KvCachePool.splice_kv`` takes (every layer of a model
        shares one RoPE, so ``layer`` is not read)."""
        return self.rotate(k, delta)

    def __repr__(self) -> str:
        return f"KeyRotation(rotary_dim={self.rotary_dim}, head_dim={self.head_dim})"
