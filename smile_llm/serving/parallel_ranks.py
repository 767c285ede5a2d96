"""The ranks of a tensor- or pipeline-parallel model (docs/tensor_parallel.md,
docs/pipeline_parallel.md): the pools every rank keeps in lockstep, the ranks' agreement on their
geometry, rank 0's ``Leader`` and the other ranks' replay loop (``distributed.lockstep``).

Every rank of the job holds the same pools (the model's KV pool and its drafter's) with the same
slots, pages and state snapshots, whatever part of the model it holds: its own KV heads (tensor
parallelism) or its own layers (pipeline parallelism; a stage without attention layers books a pool
of none). Rank 0 leads; the others replay its plans and run its forwards.
"""

from __future__ import annotations

import numpy as np

from ..attention.backend import AttentionBackend, companion_backend
from ..cache import KvCachePool
from ..distributed.group import TensorParallel
from ..distributed.lockstep import Leader, follow
from ..models.transformer import Transformer
from ..speculative.draft_chain import DraftChain
from ..speculative.drafters import Drafter


def lockstep_pools(pool: KvCachePool, drafter: Drafter | None) -> dict[str, KvCachePool]:
    """The pools every rank keeps in lockstep: the main pool and the drafter's, if it has one."""
    pools = {"main": pool}
    draft_pool = getattr(drafter, "pool", None)
    if isinstance(draft_pool, KvCachePool) and draft_pool is not pool:
        pools["draft"] = draft_pool
    return pools


def join_lockstep(world: TensorParallel, pools: dict[str, KvCachePool], transformer: Transformer,
                  check: bool) -> None:
    """Every rank of ``world``: the same pools (slots, page size and state snapshots per pool;
    ValueError naming the difference otherwise), every rank loaded (the gather is a barrier), then
    rank 0 leads (``transformer.leader``; ``check``: the digest check before every forward)."""
    shape = {key: (p.num_slots, p.page_size, tuple(s.snapshot_capacity for s in p.state_pools))
             for key, p in pools.items()}
    everyone = world.all_gather_object(shape)
    if any(other != shape for other in everyone):
        raise ValueError("the ranks' pools differ (slots, page size, snapshots per pool): "
                         f"{everyone}; give every rank the same free memory or a smaller "
                         "mem_fraction")
    if world.is_leader:
        transformer.leader = Leader(world, pools, check)


def follow_leader(world: TensorParallel, pools: dict[str, KvCachePool], transformer: Transformer,
                  backend: AttentionBackend) -> int:
    """A rank > 0's loop (``lockstep.follow``): replay rank 0's plans on ``pools`` and run each
    forward on ``transformer`` (its slices or its stage) until rank 0 stops; returns the plans
    replayed. The errors of ``follow``."""
    # the draft chains' own (DraftChain), made at the first chain
    chain_backends: list[AttentionBackend] = []

    def begin_chain(pool: KvCachePool, start: np.ndarray, steps: int) -> DraftChain:
        if not chain_backends:
            chain_backends.append(companion_backend(backend, pool.device))
        return DraftChain(transformer, pool, chain_backends[0], start, steps)

    return follow(world, pools,
                  lambda pool, t, s, c, k: transformer.forward(t, s, pool, backend, c, k),
                  lambda pool, t, h, s, c: transformer.draft(t, h, s, pool, backend, c),
                  begin_chain, pools["main"].device)
