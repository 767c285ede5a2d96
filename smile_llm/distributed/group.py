"""TensorParallel: this process's rank in a tensor-parallel group and the collectives
the model needs.

One process per rank, started by ``torchrun`` (which sets ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``
and ``MASTER_PORT``; across machines its rendezvous does the same). ``init_tensor_parallel(size)``
joins (or reuses) the default process group: NCCL when the model lives on CUDA, gloo on the CPU,
with a bounded ``timeout`` so that a rank that dies or hangs makes every collective of the others
raise instead of waiting forever. The tensor-parallel group is the whole world (one model per job).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from .. import env

DEFAULT_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class TensorParallel:
    """``rank`` of ``size`` ranks in the default process group, or in ``group`` (a pipeline stage's
    tensor-parallel ranks, ``distributed.pipeline``). ``size == 1`` is plain single-device
    serving: every collective is the identity. ``sent`` counts the bytes this rank contributed to
    each kind of collective."""

    rank: int
    size: int
    timeout_s: float = DEFAULT_TIMEOUT_S
    sent: dict[str, int] = field(default_factory=lambda: {"all_reduce": 0, "all_gather": 0},
                                 compare=False)
    # init_tensor_parallel created the default process group (leave() destroys it)
    owns_group: bool = False
    # the collectives' process group (None: the default group, every rank of the job)
    group: Any = field(default=None, compare=False, repr=False)

    @property
    def is_leader(self) -> bool:
        """Rank 0: it runs the scheduler and samples; the others follow its plan."""
        return self.rank == 0

    def leave(self) -> None:
        """Destroy the default process group if ``init_tensor_parallel`` created it (a rank that
        exits with its gloo or NCCL group still up aborts in the group's destructor); a group the
        caller made is left to the caller. Idempotent; a no-op for one rank."""
        if self.owns_group and dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """The sum of every rank's ``x`` (in place; returned). The identity for one rank."""
        if self.size > 1:
            dist.all_reduce(x, group=self.group)
            self.sent["all_reduce"] += x.numel() * x.element_size()
        return x

    def all_gather_last(self, x: torch.Tensor) -> torch.Tensor:
        """Every rank's ``x`` concatenated along the last dimension, in rank order (equal
        shapes on every rank)."""
        if self.size == 1:
            return x
        parts = [torch.empty_like(x) for _ in range(self.size)]
        dist.all_gather(parts, x.contiguous(), group=self.group)
        self.sent["all_gather"] += x.numel() * x.element_size()
        return torch.cat(parts, dim=-1)

    def broadcast_object(self, obj: Any = None) -> Any:
        """Rank 0's ``obj`` on every rank (pickled; tensors inside travel on the CPU)."""
        box = [obj]
        dist.broadcast_object_list(box, src=0 if self.group is None else
                                   dist.get_global_rank(self.group, 0), group=self.group)
        return box[0]

    def all_gather_object(self, obj: Any) -> list[Any]:
        """Every rank's ``obj``, in rank order."""
        out: list[Any] = [None] * self.size
        dist.all_gather_object(out, obj, group=self.group)
        return out


def init_tensor_parallel(size: int, device: torch.device,
                         timeout_s: float | None = None) -> TensorParallel:
    """This process's place in a ``size``-rank tensor-parallel group: joins the default process
    group from the ``torchrun`` environment unless it already exists (NCCL for a CUDA ``device``,
    gloo otherwise), with collectives bounded by ``timeout_s`` (default ``SMILE_TP_TIMEOUT_S`` or
    60 s; give an existing group the same timeout). A group made here is destroyed by
    ``TensorParallel.leave()`` (the model's ``close()``). ValueError when ``size`` is not a positive
    int or differs from the world size, or when ``size > 1`` outside a distributed launch;
    ``size == 1`` needs no process group."""
    if timeout_s is None:
        timeout_s = env.tp_timeout_s(DEFAULT_TIMEOUT_S)
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ValueError(f"tensor_parallel must be an int >= 1, got {size!r}")
    if size == 1:
        return TensorParallel(0, 1, timeout_s)
    created = not dist.is_initialized()
    if created:
        if not env.distributed_launch():
            raise ValueError(f"tensor_parallel={size} needs one process per rank: launch with "
                             f"torchrun --nproc-per-node {size} (RANK and WORLD_SIZE are not set)")
        if device.type == "cuda":
            torch.cuda.set_device(env.local_rank())
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo",
                                timeout=timedelta(seconds=timeout_s))
    world = dist.get_world_size()
    if size != world:
        if created:
            dist.destroy_process_group()
        raise ValueError(f"tensor_parallel={size} but the job has {world} processes; launch "
                         f"torchrun with --nproc-per-node {size} (one rank per shard)")
    return TensorParallel(dist.get_rank(), size, timeout_s, owns_group=created)
