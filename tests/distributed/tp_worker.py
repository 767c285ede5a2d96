"""The ranks of the tensor-parallel tests: ``spawn(scenario, folder, out, size)`` starts ``size`` processes joined by
a gloo group (bounded timeout); each loads ``folder`` with ``tensor_parallel=size``. Rank 0 runs ``scenario`` and
writes what it saw to ``out`` (JSON); the other ranks follow (and write how that ended)."""

from __future__ import annotations

import json
import os
import socket
import threading
import traceback
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

TIMEOUT_S = 20.0
PROMPTS = [[(7 * i + 3) % 97 for i in range(22)], [5, 9, 11, 2, 40, 41, 42], [(11 * i + 5) % 97 for i in range(37)]]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def spawn(scenario: str, folder: Path, out: Path, size: int = 2) -> None:
    """Run ``scenario`` on ``size`` ranks; returns when every rank has exited (their exit codes are not checked:
    the scenarios that kill a rank expect one to fail)."""
    port = free_port()
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_rank, args=(r, size, port, scenario, str(folder), str(out))) for r in range(size)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=240)
        if p.is_alive():
            p.kill()


def _rank(rank: int, size: int, port: int, scenario: str, folder: str, out: str) -> None:
    os.environ.update({"RANK": str(rank), "WORLD_SIZE": str(size), "MASTER_ADDR": "127.0.0.1",
                       "MASTER_PORT": str(port), "SMILE_TP_TIMEOUT_S": str(TIMEOUT_S)})
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timedelta(seconds=TIMEOUT_S))
    result: dict[str, Any] = {}
    try:
        SCENARIOS[scenario](rank, Path(folder), result)
    except BaseException as exc:  # noqa: BLE001 - reported to the test
        result["error"] = f"{type(exc).__name__}: {exc}"
        result["traceback"] = traceback.format_exc()
    Path(out, f"rank{rank}.json").write_text(json.dumps(result))
    os._exit(0)


def load(folder: Path, tp: int, **kwargs: Any) -> Any:
    from smile_llm.model import LanguageModel

    return LanguageModel.from_pretrained(folder, page_size=4, max_seq_len=128, max_batch_size=4, tensor_parallel=tp,
                                         **kwargs)


def _follow_or(rank: int, lm: Any, result: dict[str, Any], lead: Callable[[], None]) -> None:
    if lm.is_follower:
        result["plans"] = lm.follow()
    else:
        lead()


def logits_of(lm: Any, tokens: list[int], step_by_step: bool) -> list[list[float]]:
    """Float32 logits of ``tokens``: one prompt forward, or the prompt's first half then one token per forward."""
    pool = lm.pool
    rid = pool.bind_request(tokens, len(tokens) + 4)
    pool.activate_step(rid)
    rows = []
    split = len(tokens) // 2 if step_by_step else len(tokens)
    out = lm.transformer(torch.tensor([tokens[:split]]), np.array([0]), pool, lm.backend)
    rows.append(out.logits[0, -1].tolist())
    for pos in range(split, len(tokens)):
        out = lm.transformer(torch.tensor([[tokens[pos]]]), np.array([pos]), pool, lm.backend)
        rows.append(out.logits[0, -1].tolist())
    pool.unbind_request(rid)
    return rows


def parity(rank: int, folder: Path, result: dict[str, Any]) -> None:
    """Rank 0 records, for TP=size and TP=1: prompt and step-by-step logits, greedy generate (plain, speculative,
    batched), seeded sampling, and the engine with concurrent submissions; the digest check is on."""
    lm = load(folder, dist.get_world_size(), lockstep_check=True)

    def lead() -> None:
        from smile_llm.engine import InferenceEngine, SamplingParams

        one = load(folder, 1)
        for name, model in (("tp", lm), ("one", one)):
            r: dict[str, Any] = {}
            r["prompt_logits"] = logits_of(model, PROMPTS[2], step_by_step=False)
            r["step_logits"] = logits_of(model, PROMPTS[2], step_by_step=True)
            r["plain"] = model.generate(PROMPTS[0], 16, speculative_tokens=0).tokens
            spec = model.generate(PROMPTS[0], 16)
            r["spec"], r["rounds"] = spec.tokens, spec.stats["speculative_rounds"]
            r["batch"] = [c.tokens for c in model.generate_batch(PROMPTS, 12)]
            r["sampled"] = model.generate(PROMPTS[1], 12, temperature=0.9, seed=5).tokens
            with InferenceEngine(model, max_batch_size=3) as engine:
                handles: list[Any] = [None] * 6
                threads = [threading.Thread(target=lambda i=i: handles.__setitem__(
                    i, engine.submit(PROMPTS[i % 3], SamplingParams(max_new_tokens=10)))) for i in range(6)]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
                r["engine"] = [h.result().tokens for h in handles]
            model.pool.check_invariants()
            result[name] = r
        leader = lm.transformer.leader
        result["kv_heads"] = lm.pool.num_kv_heads
        one.close()
        lm.close()  # sends the last plan: stop
        result["plans_sent"], result["bytes_sent"] = leader.plans_sent, leader.bytes_sent

    _follow_or(rank, lm, result, lead)


def hybrid(rank: int, folder: Path, result: dict[str, Any]) -> None:
    """A hybrid checkpoint (DeltaNet heads, state pool and snapshots split across ranks): rank 0 records TP=size and
    TP=1 prompt logits, greedy and MTP-speculative generate (verify windows rewind every rank's states), a batch,
    and a second turn that hits a state snapshot; the digest check is on."""
    lm = load(folder, dist.get_world_size(), lockstep_check=True)

    def lead() -> None:
        one = load(folder, 1)
        prompts = [[(13 * i + 7) % 256 for i in range(21)], [5, 9, 200, 17], [(7 * i + 3) % 256 for i in range(37)]]
        for name, model in (("tp", lm), ("one", one)):
            r: dict[str, Any] = {}
            r["prompt_logits"] = logits_of(model, prompts[2], step_by_step=True)
            r["plain"] = model.generate(prompts[0], 12, speculative_tokens=0).tokens
            spec = model.generate(prompts[0], 12)
            r["spec"], r["rounds"] = spec.tokens, spec.stats["speculative_rounds"]
            r["batch"] = [c.tokens for c in model.generate_batch(prompts, 8)]
            follow_up = model.generate(prompts[2] + r["batch"][2] + [1, 2, 3], 8)
            r["follow_up"], r["cached"] = follow_up.tokens, follow_up.stats["cached_tokens"]
            model.pool.check_invariants()
            result[name] = r
        result["state_bytes"] = [lm.pool.state_pools[0].bytes_per_request, one.pool.state_pools[0].bytes_per_request]
        one.close()
        lm.close()

    _follow_or(rank, lm, result, lead)


def greedy(rank: int, folder: Path, result: dict[str, Any]) -> None:
    """Rank 0 records TP=size and TP=1 step-by-step logits and greedy tokens (digest check on)."""
    lm = load(folder, dist.get_world_size(), lockstep_check=True)

    def lead() -> None:
        one = load(folder, 1)
        for name, model in (("tp", lm), ("one", one)):
            result[name] = {"logits": logits_of(model, PROMPTS[2], step_by_step=True),
                            "tokens": model.generate(PROMPTS[0], 12, speculative_tokens=0).tokens,
                            "kv_heads": model.pool.num_kv_heads}
        one.close()
        lm.close()

    _follow_or(rank, lm, result, lead)


def killed(rank: int, folder: Path, result: dict[str, Any]) -> None:
    """Rank 1 dies at its 5th forward (mid-request); rank 0's generate must raise within the timeout."""
    import time

    lm = load(folder, dist.get_world_size())
    if lm.is_follower:
        forward = lm.transformer.forward
        count = [0]

        def dying(*args: Any, **kwargs: Any) -> Any:
            count[0] += 1
            if count[0] == 5:
                os._exit(3)
            return forward(*args, **kwargs)

        lm.transformer.forward = dying
        lm.follow()
        return
    t0 = time.monotonic()
    try:
        lm.generate(PROMPTS[0], 40, speculative_tokens=0)
        result["raised"] = None
    except Exception as exc:  # noqa: BLE001 - what the test inspects
        result["raised"] = f"{type(exc).__name__}: {exc}"[:300]
    result["seconds"] = time.monotonic() - t0


def oversized(rank: int, folder: Path, result: dict[str, Any]) -> None:
    """A world of one process asked for tensor_parallel=2."""
    try:
        load(folder, 2)
        result["raised"] = None
    except ValueError as exc:
        result["raised"] = str(exc)


SCENARIOS: dict[str, Callable[[int, Path, dict[str, Any]], None]] = {
    "parity": parity, "hybrid": hybrid, "greedy": greedy, "killed": killed, "oversized": oversized}
