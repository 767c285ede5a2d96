"""Tensor parallelism inside a Ray Serve replica: the replica is rank 0, and starts ranks 1..N-1
as Ray actors in its own placement group (one bundle per rank: the deployment asks for N bundles,
and Ray Serve puts the replica in the first). The ranks join one torch.distributed group over TCP
at rank 0's address (gloo on the CPU, NCCL on CUDA), load their shards, and follow rank 0's plan
until rank 0 closes its model. An actor dies with the replica that started it (Ray's ownership),
and a rank whose peer died fails its next collective within the group's timeout."""

from __future__ import annotations

import socket
from datetime import timedelta
from typing import Any

import ray
import torch.distributed as dist
from ray.util.placement_group import get_current_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from ...distributed.group import DEFAULT_TIMEOUT_S
from ..model_options import ModelOptions

JOIN_TIMEOUT_S = DEFAULT_TIMEOUT_S


def join_group(address: str, rank: int, size: int, backend: str) -> None:
    """Join the ``size``-rank default process group that rank 0 hosts at ``address``
    (``host:port``), bounded by ``JOIN_TIMEOUT_S``."""
    dist.init_process_group(backend, init_method=f"tcp://{address}", rank=rank, world_size=size,
                            timeout=timedelta(seconds=JOIN_TIMEOUT_S))


class TensorParallelRank:
    """Rank ``rank`` > 0 of a replica's model: ``run`` joins the group, loads this rank's shards
    and follows rank 0 until rank 0 closes (then leaves the group); it returns the steps
    followed."""

    def run(self, address: str, rank: int, options: ModelOptions, backend: str) -> int:
        join_group(address, rank, options.tensor_parallel, backend)
        model = None
        try:
            model = options.load()
            return int(model.follow())
        finally:
            if model is not None:
                model.close()
            if dist.is_initialized():
                dist.destroy_process_group()


class ReplicaRanks:
    """Ranks 1..N-1 of this replica's model, started from rank 0 (the replica), whose
    ``address`` they meet at. Call ``join`` on rank 0, then load rank 0's model."""

    def __init__(self, options: ModelOptions, backend: str, cpus_per_rank: float,
                 gpus_per_rank: float = 0.0) -> None:
        self.options, self.backend = options, backend
        host = ray.util.get_node_ip_address()
        with socket.socket() as s:  # a free port on this node for the rendezvous
            s.bind((host, 0))
            self.address = f"{host}:{s.getsockname()[1]}"
        group = get_current_placement_group()
        rank_actor: Any = ray.remote(TensorParallelRank)
        self.actors: list[Any] = []
        self.runs: list[Any] = []
        for rank in range(1, options.tensor_parallel):
            strategy = (PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=rank)
                        if group is not None else None)
            actor = rank_actor.options(num_cpus=cpus_per_rank, num_gpus=gpus_per_rank,
                                       scheduling_strategy=strategy).remote()
            self.actors.append(actor)
            self.runs.append(actor.run.remote(self.address, rank, options, backend))

    def join(self) -> None:
        """Rank 0 joins the group (the other ranks are joining it meanwhile)."""
        join_group(self.address, 0, self.options.tensor_parallel, self.backend)

    def close(self, timeout_s: float = JOIN_TIMEOUT_S) -> None:
        """After rank 0 closed its model: wait (bounded) for the ranks to leave, then end their
        actors and leave the group."""
        try:
            ray.wait(self.runs, num_returns=len(self.runs), timeout=timeout_s)
        finally:
            for actor in self.actors:
                ray.kill(actor)
            if dist.is_initialized():
                dist.destroy_process_group()
