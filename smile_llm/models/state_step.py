"""StateStep: one forward's view of the active rows' Gated DeltaNet state in the pool's
attached ``StatePool``.

The state pool holds ``conv`` ``[max_requests, L, conv_dim, K-1]`` (the model dtype) and
``recurrent`` ``[max_requests, L, H_v, d_k, d_v]`` (float32) for the model's L DeltaNet layers
(``state_specs``). A forward reads each layer's rows at their slots and writes the state after the
window back in place. ``valid`` gives each row's real positions when the window is right-padded (a
padded prefill batch); the state written is the one after them.

A speculative verify window keeps the state after every window position (``keep_positions``): once
the target has accepted ``kept[b]`` drafts of row b, ``rewind(kept)`` puts back the state after the
row's last kept position, with no second forward (Smile's checkpoint replay).

Prefix snapshots: when the state pool keeps them, a row whose window crosses a page boundary leaves
a snapshot of its state at the last boundary it reaches (``StatePool.stage_snapshot``), committed
with the forward (``commit``): the prefix tree can then serve that page-aligned prefix to a later
request, state included. A plain or prefill window takes it from the layers (``capture``; the
boundary may lie inside the window, see ``capture_at``); a verify window from its per-position
states once the accepted length is known (``rewind``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from ..cache import StatePool, StateSpec
from .checkpoint.config import ModelConfig
from .checkpoint.hybrid_config import LINEAR_ATTENTION


def state_specs(config: ModelConfig, dtype: torch.dtype,
                layers: int | None = None) -> dict[str, StateSpec]:
    """The state pool kinds of a hybrid model: per request, every DeltaNet layer's conv and
    recurrent state; ``layers``: how many DeltaNet layers (default: the model's; a pipeline stage
    holds its own). A stage with none keeps one element per request and kind: the slots and
    snapshots every stage books alike (``stages``), no state."""
    la = config.linear_attention
    if la is None:
        raise ValueError("state_specs needs a hybrid config (linear_attention geometry)")
    recurrent_dtype = getattr(torch, la.state_dtype)
    if layers is None:
        layers = sum(1 for t in config.layer_types if t == LINEAR_ATTENTION)
    if layers == 0:
        return {"conv": StateSpec((1,), dtype), "recurrent": StateSpec((1,), recurrent_dtype)}
    return {"conv": StateSpec((layers, *la.conv_state_shape), dtype),
            "recurrent": StateSpec((layers, *la.recurrent_state_shape), recurrent_dtype)}


class StateStep:
    """The active rows' slots (``ids`` in step order, at positions ``start[b] + [0, S)``), their
    valid lengths, read and write of one layer's state, and the rows' prefix snapshots at page
    boundaries (``page_size``)."""

    def __init__(self, states: StatePool, ids: Sequence[int], start: np.ndarray, seqlen: int,
                 page_size: int, valid: np.ndarray | None = None,
                 keep_positions: bool = False) -> None:
        self.pool, self.ids, self.start, self.page_size = states, list(ids), start, page_size
        self.slots = states.slots(ids)
        self.conv, self.recurrent = states.buffers["conv"], states.buffers["recurrent"]
        self.valid = None if valid is None or bool((valid >= seqlen).all()) else valid
        self.keep_positions = keep_positions
        # bool [B, S], True on each row's real positions (None: all are real); the same
        # for every layer
        self.real: torch.Tensor | None = None
        if self.valid is not None:
            ends = torch.from_numpy(self.valid).to(self.slots.device)
            self.real = torch.arange(seqlen, device=ends.device)[None, :] < ends[:, None]
        # layer -> per-position (conv, recurrent)
        self._kept: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        # snapshot rows: window offsets (positions consumed) of the last page boundary each row
        # reaches, staged slots
        self.capture_rows: torch.Tensor | None = None
        self.capture_at: torch.Tensor | None = None  # int64 [B]: 0 for rows taking none
        # some row's boundary lies before its window's end (two masked rule runs)
        self.capture_inside = False
        # min and max of capture_at, on the host (no device sync per layer)
        self.capture_span = (0, 0)
        self._capture_slots: torch.Tensor | None = None
        if states.snapshot_capacity and not keep_positions:
            ends = start + (np.full(len(start), seqlen) if self.valid is None else self.valid)
            self._stage(ends)

    def _stage(self, ends: np.ndarray) -> list[int]:
        """Stage a snapshot for every row whose window reaches a page boundary (its last one), given
        each row's end position; returns the rows staged (each with ``capture_at`` and a slot)."""
        boundary = ends // self.page_size * self.page_size
        rows, slots = [], []
        for b in np.flatnonzero(boundary > self.start).tolist():
            slot = self.pool.stage_snapshot(self.ids[b], int(boundary[b]))
            if slot is not None:
                rows.append(b)
                slots.append(slot)
        if rows:
            device = self.slots.device
            at = np.zeros(len(self.start), dtype=np.int64)
            at[rows] = boundary[rows] - self.start[rows]
            self.capture_rows = torch.tensor(rows, dtype=torch.int64, device=device)
            self.capture_at = torch.from_numpy(at).to(device)
            self._capture_slots = torch.tensor(slots, dtype=torch.int64, device=device)
            self.capture_inside = bool((at[rows] < (ends - self.start)[rows]).any())
            self.capture_span = (int(at.min()), int(at.max()))
        return rows

    def read(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``layer``'s conv state ``[B, C, K-1]`` and recurrent state float32
        ``[B, H_v, d_k, d_v]`` (copies)."""
        return self.conv[self.slots, layer], self.recurrent[self.slots, layer]

    def write(self, layer: int, conv: torch.Tensor, recurrent: torch.Tensor) -> None:
        """Store ``layer``'s state after the window for every row."""
        self.conv[self.slots, layer] = conv.to(self.conv.dtype)
        self.recurrent[self.slots, layer] = recurrent.to(self.recurrent.dtype)

    def capture(self, layer: int, conv: torch.Tensor, recurrent: torch.Tensor) -> None:
        """Store ``layer``'s state at each capturing row's boundary (``conv`` ``[B, C, K-1]``,
        ``recurrent`` ``[B, H_v, d_k, d_v]``, rows without a capture ignored) into the row's
        staged snapshot slot."""
        if self.capture_rows is None or self._capture_slots is None:
            return
        snap = self.pool.snapshots.buffers
        rows = self.capture_rows
        snap["conv"][self._capture_slots, layer] = conv[rows].to(self.conv.dtype)
        snap["recurrent"][self._capture_slots, layer] = recurrent[rows].to(self.recurrent.dtype)

    def commit(self) -> None:
        """The forward succeeded: its staged snapshots are whole
        (``StatePool.commit_snapshots``)."""
        if self.capture_rows is not None:
            self.pool.commit_snapshots([self.ids[b] for b in self.capture_rows.tolist()])

    def keep(self, layer: int, conv: torch.Tensor, recurrent: torch.Tensor) -> None:
        """Hold ``layer``'s state after every window position: conv ``[B, S, C, K-1]``, recurrent
        float32 ``[B, S, H_v, d_k, d_v]`` (only when ``keep_positions``)."""
        self._kept[layer] = (conv, recurrent)

    def rewind(self, kept: np.ndarray) -> None:
        """After a verify window: row b keeps window positions ``[0, kept[b]]``, so every layer's
        state of row b becomes the one after position ``kept[b]`` (rows that kept the whole window
        already hold it). RuntimeError unless the forward kept its per-position states."""
        if not self.keep_positions:
            raise RuntimeError("rewind needs a forward that kept its per-position states "
                               "(keep_positions)")
        kept = np.asarray(kept, dtype=np.int64)
        device = self.slots.device
        for layer, (conv, recurrent) in self._kept.items():
            last = conv.shape[1] - 1
            rows = np.flatnonzero(kept < last)
            if len(rows) == 0:
                continue
            r = torch.from_numpy(rows).to(device)
            at = torch.from_numpy(kept[rows]).to(device)
            self.conv[self.slots[r], layer] = conv[r, at].to(self.conv.dtype)
            self.recurrent[self.slots[r], layer] = recurrent[r, at].to(self.recurrent.dtype)
        if self.pool.snapshot_capacity and self._stage(self.start + kept + 1):
            assert self.capture_at is not None and self.capture_rows is not None
            every = torch.arange(len(self.start), device=device)
            # the state after window position capture_at - 1
            before = (self.capture_at - 1).clamp(min=0)
            for layer, (conv, recurrent) in self._kept.items():
                self.capture(layer, conv[every, before], recurrent[every, before])
            self.commit()

    def conv_state_at_ends(self, conv_state: torch.Tensor, mixed: torch.Tensor) -> torch.Tensor:
        """The conv state after each row's last real input (see ``conv_state_after``)."""
        assert self.valid is not None
        return conv_state_after(conv_state, mixed, torch.from_numpy(self.valid).to(mixed.device))


def conv_state_after(conv_state: torch.Tensor, mixed: torch.Tensor,
                     consumed: torch.Tensor) -> torch.Tensor:
    """The conv state after row b consumed ``consumed[b]`` window inputs: the K-1 inputs
    ending there, from the previous state ``[B, C, K-1]`` followed by the window's inputs
    ``mixed`` ``[B, S, C]``."""
    window = torch.cat((conv_state.to(mixed.dtype), mixed.transpose(1, 2)), dim=2)  # [B, C, K-1+S]
    width = conv_state.shape[2]
    idx = ((consumed[:, None] + torch.arange(width, device=window.device))[:, None, :]
           .expand(-1, window.shape[1], -1))
    return window.gather(2, idx)
