"""Lockstep: every rank's pools make rank 0's decisions, and every rank runs rank 0's forwards.

Rank 0 (the ``Leader``) runs the scheduler, the sampler and the drafter, exactly as on one device.
Its pools record every state-changing call that succeeded (``KvCachePool.record_calls``: binds,
finishes, ``activate_step``, seal/truncate, grow, offload/restore, ...). Each forward (target or MTP
draft) first sends one **plan** to the other ranks: the calls recorded since the last plan, then the
forward's inputs (tokens, start positions, logit columns; the MTP head's hidden input), and, with
``check``, each pool's ``state_digest`` after those calls. A follower (``follow``) replays the calls
on its own pools (same calls, same order: the same pages, ids and tree), compares digests
(``LockstepError`` on divergence, loudly, and it stops: rank 0's next collective then fails too),
then runs the same forward, whose all-reduces and all-gathers meet rank 0's. Sampled tokens reach
the followers as the next forward's inputs, so sampling happens once. Rank 0 builds each forward's
context (every check of its inputs) before it sends the plan, so a refused forward sends nothing;
once a plan is out, an exception on any rank breaks the group (``LockstepError``; the others'
collectives time out).

While rank 0 is idle it sends a heartbeat plan every ``timeout_s / 4``, so a follower waiting for a
plan can tell a hung rank 0 from an idle one: every wait is bounded by the process group's timeout.
A dead rank breaks the connections (gloo reports it at once; NCCL's watchdog aborts after its
timeout); either way the other ranks end instead of hanging forever. ``Leader.stop`` ends the
followers' loops (``LanguageModel.close`` on rank 0), after which each rank closes its own pools.

With pipeline parallelism (``pipeline``) the plans go to every rank of the job: each stage replays
the calls on its own pools and runs its own layers of each forward.
"""

from __future__ import annotations

import atexit
import contextlib
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np
import torch

from ..cache import KvCachePool
from ..cache.offload import OffloadedKv
from .group import TensorParallel

Call = tuple[str, str, tuple[Any, ...], dict[str, Any]]  # (pool key, verb, args, kwargs)


class LockstepError(RuntimeError):
    """A rank's pools diverged from rank 0's, or a recorded call failed on a follower."""


class Leader:
    """Rank 0's side: records its pools' calls, sends a plan before each forward and
    heartbeats while idle. Every send and every forward holds one lock, so the ranks'
    collectives stay in the same order."""

    def __init__(self, tp: TensorParallel, pools: Mapping[str, KvCachePool],
                 check: bool = False) -> None:
        self.tp, self.pools, self.check = tp, dict(pools), check
        self._keys = {id(pool): key for key, pool in self.pools.items()}
        self._calls: list[Call] = []
        self._calls_lock = threading.Lock()
        self._lock = threading.RLock()  # one send or forward at a time
        self._last_send = time.monotonic()
        self._stopped = False
        self.broken: str | None = None  # why the group can no longer be used
        self.plans_sent = 0
        self.bytes_sent = 0
        for key, pool in self.pools.items():
            pool.record_calls(self._recorder(key))
        self._heartbeat = threading.Thread(target=self._beat, name="smile-llm-tp-heartbeat",
                                           daemon=True)
        self._heartbeat.start()
        # a rank-0 program that ends without close(): the followers still end
        atexit.register(self._stop_at_exit)

    def _stop_at_exit(self) -> None:
        with contextlib.suppress(Exception):
            self.stop()

    def _recorder(self, key: str) -> Callable[[str, tuple[Any, ...], dict[str, Any]], None]:
        def record(verb: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            # followers keep their own
            args = tuple(a.request_id if isinstance(a, OffloadedKv) else a for a in args)
            with self._calls_lock:
                self._calls.append((key, verb, args, dict(kwargs)))

        return record

    def record_rewind(self, kept: np.ndarray) -> None:
        """The last verify forward's DeltaNet states were rewound to ``kept`` (a hybrid model): the
        followers rewind theirs at the same point among the recorded calls."""
        with self._calls_lock:
            self._calls.append(("states", "rewind", (np.asarray(kept),), {}))

    def _send(self, op: tuple[Any, ...]) -> None:
        if self.broken is not None:
            raise LockstepError(f"the tensor-parallel group is broken: {self.broken}")
        # no verb between taking the calls and the digests they lead to
        with contextlib.ExitStack() as held:
            for pool in self.pools.values():
                held.enter_context(pool.lock)
            with self._calls_lock:
                calls, self._calls = self._calls, []
            digests = ({key: pool.state_digest() for key, pool in self.pools.items()}
                       if self.check else None)
        plan = (calls, op, digests)
        try:
            self.tp.broadcast_object(plan)
        except Exception as exc:  # a rank died or hung: no later plan can reach every rank
            self.broken = f"sending plan {self.plans_sent + 1} failed: {exc!r}"
            raise LockstepError(f"the tensor-parallel group is broken: {self.broken}") from exc
        self.plans_sent += 1
        self.bytes_sent += plan_bytes(plan)
        self._last_send = time.monotonic()

    @contextlib.contextmanager
    def forward(self, pool: KvCachePool, tokens: torch.Tensor, start: np.ndarray,
                logit_cols: np.ndarray | None, keep_states: bool) -> Iterator[None]:
        """Send a target forward's plan, then hold the lock while rank 0 runs it (the body)."""
        with self._lock:
            self._send(("forward", self._keys[id(pool)], tokens.cpu(), np.asarray(start),
                        logit_cols, keep_states))
            with self._fatal():
                yield

    @contextlib.contextmanager
    def draft(self, pool: KvCachePool, tokens: torch.Tensor, hidden: torch.Tensor,
              start: np.ndarray, cols: np.ndarray | None) -> Iterator[None]:
        """Send an MTP draft step's plan (its hidden input included), then hold the lock
        while rank 0 runs it."""
        with self._lock:
            self._send(("draft", self._keys[id(pool)], tokens.cpu(), hidden.detach().cpu(),
                        np.asarray(start), cols))
            with self._fatal():
                yield

    @contextlib.contextmanager
    def chain_step(self, pool: KvCachePool, tokens: torch.Tensor, hidden: torch.Tensor,
                   start: np.ndarray, steps: int, column: int) -> Iterator[None]:
        """Send column ``column`` of a draft chain (``DraftChain``; at column 0 the followers build
        the chain of ``steps`` columns over histories ending at ``start``), then hold the lock
        while rank 0 runs it."""
        with self._lock:
            self._send(("chain", self._keys[id(pool)], tokens.cpu(), hidden.detach().cpu(),
                        np.asarray(start), steps, column))
            with self._fatal():
                yield

    @contextlib.contextmanager
    def _fatal(self) -> Iterator[None]:
        """A forward that raises on rank 0 after its plan went out leaves the followers inside
        collectives rank 0 never joins: the group is broken from then on (every later plan raises
        LockstepError; the followers' collectives time out)."""
        try:
            yield
        except BaseException as exc:
            self.broken = f"rank 0's forward raised after its plan was sent: {exc!r}"
            raise

    def stop(self) -> None:
        """End the followers' loops (after the calls recorded so far). Idempotent."""
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
            for pool in self.pools.values():
                pool.record_calls(None)
            if self.broken is None:
                self._send(("stop",))

    def _beat(self) -> None:
        interval = max(0.05, self.tp.timeout_s / 4)
        while not self._stopped:
            time.sleep(interval / 4)
            if (time.monotonic() - self._last_send < interval
                    or not self._lock.acquire(blocking=False)):
                continue
            try:
                if not self._stopped and time.monotonic() - self._last_send >= interval:
                    self._send(("heartbeat",))
            except Exception:  # noqa: BLE001 - a broken group: the next forward on rank 0 raises
                # with the reason
                return
            finally:
                self._lock.release()


def follow(tp: TensorParallel, pools: Mapping[str, KvCachePool],
           run_forward: Callable[[KvCachePool, torch.Tensor, np.ndarray, np.ndarray | None, bool],
                                 Any],
           run_draft: Callable[[KvCachePool, torch.Tensor, torch.Tensor, np.ndarray,
                                np.ndarray | None], Any],
           begin_chain: Callable[[KvCachePool, np.ndarray, int], Any], device: torch.device) -> int:
    """A follower's loop: receive each plan, replay its calls on ``pools``, check the digests, run
    its forward (``run_forward``, ``run_draft``, or a column of the draft chain ``begin_chain``
    built at column 0); returns the number of plans once rank 0 stops. LockstepError on divergence,
    when a replayed call or forward raises (rank 0 checked them before sending), or when a plan does
    not come (rank 0 died or hung past the timeout)."""
    handles: dict[tuple[str, int], OffloadedKv] = {}
    plans = 0
    last: Any = None  # the last forward's output (its DeltaNet states, for a rewind)
    chain: Any = None  # the current draft round's chain
    while True:
        try:
            calls, op, digests = tp.broadcast_object()
        except Exception as exc:
            raise LockstepError(f"rank {tp.rank}: waiting for plan {plans + 1} failed (rank 0 "
                                f"died, hung past the timeout or broke the group): {exc!r}") \
                from exc
        plans += 1
        for key, verb, args, kwargs in calls:
            try:
                # verb "rewind": the last verify forward's states, as rank 0 did
                if key == "states":
                    last.states.rewind(*args)
                    continue
                pool = pools[key]
                if verb == "restore_request":
                    pool.restore_request(args[0], handles.pop((key, args[0])))
                elif verb == "offload_request":
                    handles[(key, args[0])] = pool.offload_request(*args)
                else:
                    getattr(pool, verb)(*args, **kwargs)
            except Exception as exc:
                raise LockstepError(f"rank {tp.rank}: replaying {key} {verb}{args!r} failed where "
                                    f"rank 0 succeeded: {exc!r}") from exc
        if digests is not None:
            for key, want in digests.items():
                got = pools[key].state_digest()
                if got != want:
                    raise LockstepError(f"rank {tp.rank}: the {key} pool diverged from rank 0 "
                                        f"after {plans} plans (digest {got[:12]} != {want[:12]})")
        kind = op[0]
        if kind == "stop":
            return plans
        try:
            if kind == "forward":
                _, key, tokens, start, cols, keep = op
                last = run_forward(pools[key], tokens.to(device), start, cols, keep)
            elif kind == "draft":
                _, key, tokens, hidden, start, cols = op
                run_draft(pools[key], tokens.to(device), hidden.to(device), start, cols)
            elif kind == "chain":
                _, key, tokens, hidden, start, steps, column = op
                if column == 0:
                    chain = begin_chain(pools[key], start, steps)
                chain.step(tokens.to(device), hidden.to(device))
        except Exception as exc:
            # rank 0 validated these inputs before sending them: the ranks cannot go on together
            raise LockstepError(f"rank {tp.rank}: {kind} of plan {plans} raised where rank 0's did "
                                f"not: {exc!r}") \
                from exc


def plan_bytes(plan: Any) -> int:
    """Bytes of the tensors and arrays in a plan (what it costs on the wire, pickling aside)."""
    if isinstance(plan, torch.Tensor):
        return plan.numel() * plan.element_size()
    if isinstance(plan, np.ndarray):
        return int(plan.nbytes)
    if isinstance(plan, (list, tuple)):
        return sum(plan_bytes(p) for p in plan)
    if isinstance(plan, dict):
        return sum(plan_bytes(v) for v in plan.values())
    return 8 if isinstance(plan, (int, float)) else 0
