"""Pipeline parallelism on ``torch.distributed``: the job's ranks in stages, each holding a
contiguous range of the decoder layers, and the point-to-point transfers between them.

A job of ``pipeline_parallel * tensor_parallel`` processes (``torchrun``): rank
``stage * tensor_parallel + t`` is tensor-parallel rank ``t`` of stage ``stage``. A stage's ranks
share one process group for their all-reduces and all-gathers (``TensorParallel.group``); the
lockstep's plans go to every rank of the job (``PipelineParallel.world``). Rank 0 (stage 0, ``t``
0) schedules and samples.

Each forward (prefill, decode, verify window) moves one activation ``[B, S, D]`` down the pipeline:
rank ``(s, t)`` sends the output of its layers to rank ``(s + 1, t)``, which receives it as its
input. The last stage's rank ``(last, 0)`` returns what the scheduler needs to rank 0: the logits
(float32, ``[B, S or 1, V]``) and the last layer's hidden states (the MTP head's input), or an MTP
draft step's logits and head output. Every transfer's shape follows from the forward's plan, which
every rank already holds. Every receive is bounded by the process group's timeout; a neighbour that
dies breaks the connection (gloo raises at once). Either way the transfer raises ``PipelineError``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta

import torch
import torch.distributed as dist

from .. import env
from .group import DEFAULT_TIMEOUT_S, TensorParallel
from .lockstep import LockstepError

TensorSpec = tuple[tuple[int, ...], torch.dtype]  # the shape and dtype of a received tensor


class PipelineError(LockstepError):
    """A pipeline stage's send or receive failed: its neighbour died, hung past the process group's
    timeout, or left the group. The forward fails on every rank (rank 0's requests with this error,
    the other ranks' ``follow()`` with a ``LockstepError``) and the group is not used again."""


def split_layers(num_layers: int, num_stages: int) -> list[range]:
    """The balanced split of ``num_layers`` decoder layers over ``num_stages`` stages: contiguous
    ranges in order, the first ``num_layers % num_stages`` stages one layer longer (the last stage
    also runs the final norm, the LM head and the MTP head).

    >>> split_layers(10, 4)
    [range(0, 3), range(3, 6), range(6, 8), range(8, 10)]
    >>> split_layers(4, 2)
    [range(0, 2), range(2, 4)]
    """
    per, extra = divmod(num_layers, num_stages)
    starts = [s * per + min(s, extra) for s in range(num_stages + 1)]
    return [range(starts[s], starts[s + 1]) for s in range(num_stages)]


def check_pipeline_parallel(size: object, num_layers: int) -> int:
    """``size`` as the number of stages; ValueError unless it is an int in ``[1, num_layers]``
    (every stage holds at least one decoder layer)."""
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ValueError(f"pipeline_parallel must be an int >= 1, got {size!r}")
    if size > num_layers:
        raise ValueError(f"pipeline_parallel={size} is more stages than the model's {num_layers} "
                         "decoder layers; every stage holds at least one layer")
    return size


@dataclass(frozen=True)
class PipelineParallel:
    """This rank's place in the pipeline: ``stage`` of ``num_stages``, its stage's tensor-parallel
    group ``tp`` and the whole job ``world`` (rank ``rank`` of it; the lockstep's plans and the
    pools' size agreement). ``sent`` counts the bytes this rank sent down the pipeline
    (``activations``) and back to rank 0 (``outputs``)."""

    rank: int
    stage: int
    num_stages: int
    tp: TensorParallel
    world: TensorParallel
    sent: dict[str, int] = field(default_factory=lambda: {"activations": 0, "outputs": 0},
                                 compare=False)

    @property
    def is_last(self) -> bool:
        """The stage that computes the logits and runs the MTP head."""
        return self.stage == self.num_stages - 1

    @property
    def returns_outputs(self) -> bool:
        """This rank sends each forward's outputs to rank 0: the last stage's tensor-parallel
        rank 0 (its other ranks hold the same tensors)."""
        return self.is_last and self.tp.rank == 0 and self.rank != 0

    def send_next(self, x: torch.Tensor) -> None:
        """Send this stage's output ``x`` to the same tensor-parallel rank of the next stage.
        PipelineError when the send fails."""
        peer = self.rank + self.tp.size
        self._transfer("sending activations to", dist.send, x.contiguous(), peer)
        self.sent["activations"] += x.numel() * x.element_size()

    def recv_prev(self, shape: tuple[int, ...], dtype: torch.dtype,
                  device: torch.device) -> torch.Tensor:
        """The previous stage's output, ``shape`` of ``dtype``, on ``device``. PipelineError when
        it does not come within the group's timeout or the peer is gone."""
        x = torch.empty(shape, dtype=dtype, device=device)
        self._transfer("receiving activations from", dist.recv, x, self.rank - self.tp.size)
        return x

    def send_outputs(self, *tensors: torch.Tensor) -> None:
        """Send a forward's outputs to rank 0 (on ``returns_outputs`` ranks; nothing elsewhere).
        PipelineError when a send fails."""
        if not self.returns_outputs:
            return
        for t in tensors:
            self._transfer("returning outputs to", dist.send, t.contiguous(), 0)
            self.sent["outputs"] += t.numel() * t.element_size()

    def recv_outputs(self, specs: Sequence[TensorSpec],
                     device: torch.device) -> list[torch.Tensor]:
        """On rank 0: the last stage's outputs, one tensor per ``(shape, dtype)`` of ``specs``;
        elsewhere empty tensors (a stage's follower never reads them). PipelineError when they do
        not come within the group's timeout or the peer is gone."""
        if self.rank != 0:
            return [torch.empty(0, dtype=dtype, device=device) for _, dtype in specs]
        peer = (self.num_stages - 1) * self.tp.size
        out = [torch.empty(shape, dtype=dtype, device=device) for shape, dtype in specs]
        for t in out:
            self._transfer("receiving outputs from", dist.recv, t, peer)
        return out

    def _transfer(self, what: str, op: Callable[[torch.Tensor, int], object], tensor: torch.Tensor,
                  peer: int) -> None:
        """``op(tensor, peer)`` (``dist.send`` or ``dist.recv``); PipelineError naming this rank,
        the transfer, its shape and the peer when it fails."""
        try:
            op(tensor, peer)
        except Exception as exc:
            raise PipelineError(f"rank {self.rank} (stage {self.stage}): {what} rank {peer} "
                                f"{tuple(tensor.shape)} failed: {exc}") from exc


def init_pipeline(tensor_parallel: int, pipeline_parallel: int, device: torch.device,
                  timeout_s: float | None = None) -> PipelineParallel:
    """This process's place in a job of ``pipeline_parallel`` stages of ``tensor_parallel`` ranks:
    joins (or reuses) the default process group from the ``torchrun`` environment (NCCL for a CUDA
    ``device``, gloo otherwise; every wait bounded by ``timeout_s``, default ``SMILE_TP_TIMEOUT_S``
    or 60 s) and makes each stage's tensor-parallel group. ValueError, before any group is joined,
    unless both sizes are ints >= 1 and the job has ``tensor_parallel * pipeline_parallel``
    processes; a group made here is destroyed by ``world.leave()``."""
    if timeout_s is None:
        timeout_s = env.tp_timeout_s(DEFAULT_TIMEOUT_S)
    for name, value in (("tensor_parallel", tensor_parallel),
                        ("pipeline_parallel", pipeline_parallel)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    size = tensor_parallel * pipeline_parallel
    hint = (f"pipeline_parallel={pipeline_parallel} x tensor_parallel={tensor_parallel} needs "
            f"{size} processes, one per rank: launch with torchrun --nproc-per-node {size}")
    created = not dist.is_initialized()
    if created:
        if not env.distributed_launch():
            raise ValueError(f"{hint} (RANK and WORLD_SIZE are not set)")
        if env.world_size() != size:
            raise ValueError(f"{hint}; the job has {env.world_size()} processes")
        if device.type == "cuda":
            torch.cuda.set_device(env.local_rank())
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo",
                                timeout=timedelta(seconds=timeout_s))
    world = dist.get_world_size()
    if world != size:
        if created:
            dist.destroy_process_group()
        raise ValueError(f"{hint}; the job has {world} processes")
    rank = dist.get_rank()
    stage = rank // tensor_parallel
    tp = TensorParallel(0, 1, timeout_s)
    if tensor_parallel > 1:
        # every rank makes every stage's group, in the same order (torch.distributed's rule)
        groups = [dist.new_group(list(range(s * tensor_parallel, (s + 1) * tensor_parallel)),
                                 timeout=timedelta(seconds=timeout_s))
                  for s in range(pipeline_parallel)]
        tp = TensorParallel(rank % tensor_parallel, tensor_parallel, timeout_s,
                            group=groups[stage])
    return PipelineParallel(rank, stage, pipeline_parallel, tp,
                            TensorParallel(rank, size, timeout_s, owns_group=created))
