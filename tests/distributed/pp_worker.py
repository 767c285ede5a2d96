"""The ranks of the pipeline-parallel tests: ``spawn(scenario, folder, out, size)`` starts ``size`` processes joined by
a gloo group (bounded timeout, one thread each), as ``tp_worker`` does; rank 0 runs ``scenario`` and writes what it saw
to ``out`` (JSON), the other ranks follow and write how that ended and what their stage holds (``stage_report``).

A pipeline stage runs the same operations in the same order as one process does (its layers, then the activations'
exact copy to the next stage), so PP=N logits equal PP=1 logits bit for bit; with tensor parallelism inside the
stages they differ by rounding only (``tp_worker.logit_tolerance``)."""

from __future__ import annotations

import json
import os
import threading
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from .tp_worker import PROMPTS, TIMEOUT_S, free_port, logits_of, spec_stats

HYBRID_PROMPTS = [[(13 * i + 7) % 256 for i in range(21)], [5, 9, 200, 17], [(7 * i + 3) % 256 for i in range(37)]]


def spawn(scenario: str, folder: Path, out: Path, size: int = 2, **options: Any) -> None:
    """Run ``scenario`` on ``size`` ranks (``options`` reach every rank's scenario); returns when every rank has
    exited (their exit codes are not checked: the scenarios that kill a rank expect one to fail)."""
    port = free_port()
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_rank, args=(r, size, port, scenario, str(folder), str(out), options))
             for r in range(size)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + 300
    for p in procs:
        p.join(timeout=max(1.0, deadline - time.monotonic()))
        if p.is_alive():
            p.kill()


def run(scenario: str, folder: Path, out: Path, size: int = 2, **options: Any) -> list[dict[str, Any]]:
    """Each rank's report (``{"exited": True}`` for a rank that died without one)."""
    spawn(scenario, folder, out, size, **options)
    files = [out / f"rank{r}.json" for r in range(size)]
    return [json.loads(f.read_text()) if f.is_file() else {"exited": True} for f in files]


def _rank(rank: int, size: int, port: int, scenario: str, folder: str, out: str, options: dict[str, Any]) -> None:
    timeout_s = options.pop("timeout_s", TIMEOUT_S)
    os.environ.update({"RANK": str(rank), "WORLD_SIZE": str(size), "MASTER_ADDR": "127.0.0.1",
                       "MASTER_PORT": str(port), "SMILE_TP_TIMEOUT_S": str(timeout_s)})
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timedelta(seconds=timeout_s))
    result: dict[str, Any] = {}
    try:
        SCENARIOS[scenario](rank, Path(folder), result, **options)
    except BaseException as exc:  # noqa: BLE001 - reported to the test
        result["error"] = f"{type(exc).__name__}: {exc}"
        result["traceback"] = traceback.format_exc()
    Path(out, f"rank{rank}.json").write_text(json.dumps(result))
    os._exit(0)


def load(folder: Path, pp: int, tp: int = 1, **kwargs: Any) -> Any:
    from smile_llm.language_model import LanguageModel

    return LanguageModel.from_pretrained(folder, page_size=4, max_seq_len=128, max_batch_size=4, tensor_parallel=tp,
                                         pipeline_parallel=pp, **kwargs)


def stage_report(lm: Any) -> dict[str, Any]:
    """What this rank's stage holds: its layers (the model's numbering), its pools' layers and bytes, which
    ``Transformer.layer`` answers, its parameters' bytes and whether it holds the embedding, LM head and MTP head."""
    from smile_llm.cache import LayerNotHeldError

    tr, stage = lm.transformer, lm.transformer.stage
    held, refused = [], []
    for i in range(lm.config.num_hidden_layers):
        try:
            tr.layer(i)
            held.append(i)
        except LayerNotHeldError:
            refused.append(i)
    pools = lm._tp_pools()
    return {"layers": [stage.layers.start, stage.layers.stop], "held": held, "refused": refused,
            "kv_range": {k: [p.layer_range.start, p.layer_range.stop] for k, p in pools.items()},
            "kv_bytes": {k: sum(t.numel() * t.element_size() for t in (p.key_cache, p.value_cache))
                         if p.num_layers else 0 for k, p in pools.items()},
            "state_bytes": [s.bytes_per_request for s in lm.pool.state_pools],
            "param_bytes": sum(p.numel() * p.element_size() for p in tr.parameters()),
            "embedding_rows": tr.model.embed_tokens.weight.shape[0], "lm_head_rows": tr.lm_head.weight.shape[0],
            "mtp": tr.mtp is not None, "transfers": dict(stage.pipe.sent)}


def _follow_or(lm: Any, result: dict[str, Any], lead: Callable[[], None]) -> None:
    result["stage"] = stage_report(lm)
    if lm.is_follower:
        result["plans"] = lm.follow()
    else:
        lead()


def _generate_all(model: Any, prompts: list[list[int]], n: int) -> dict[str, Any]:
    """Greedy plain, MTP speculative, batched and seeded-sampled output with their speculative counters, and a
    second turn over the first prompt's conversation (a prefix hit)."""
    r: dict[str, Any] = {}
    r["plain"] = model.generate(prompts[0], n, speculative_tokens=0).tokens
    spec = model.generate(prompts[0], n)
    r["spec"], r["spec_stats"] = spec.tokens, spec_stats(spec)
    batch = model.generate_batch(prompts, n - 4)
    r["batch"], r["batch_stats"] = [c.tokens for c in batch], [spec_stats(c) for c in batch]
    sampled = model.generate(prompts[1], n - 4, temperature=0.9, seed=5)
    r["sampled"], r["sampled_stats"] = sampled.tokens, spec_stats(sampled)
    follow_up = model.generate(prompts[2] + r["batch"][2] + [1, 2, 3], 8)
    r["follow_up"], r["cached"] = follow_up.tokens, follow_up.stats["cached_tokens"]
    r["follow_up_stats"] = spec_stats(follow_up)
    return r


def parity(rank: int, folder: Path, result: dict[str, Any], tp: int = 1, hybrid: bool = False) -> None:
    """Rank 0 records, for PP=world/tp (x TP=tp) and for one process: logits of a prompt (one forward, then token by
    token), greedy, speculative, batched, sampled and prefix-hit output with their speculative counters, six
    concurrent engine requests and a constrained one (dense model); the digest check is on."""
    lm = load(folder, dist.get_world_size() // tp, tp, lockstep_check=True)

    def lead() -> None:
        one = load(folder, 1)
        prompts = HYBRID_PROMPTS if hybrid else PROMPTS
        for name, model in (("pp", lm), ("one", one)):
            # first: a fresh pool (the prompt is not in the prefix tree yet)
            logits = {"prompt_logits": logits_of(model, prompts[2], step_by_step=False),
                      "step_logits": logits_of(model, prompts[2], step_by_step=True)}
            r = {**_generate_all(model, prompts, 16 if not hybrid else 12), **logits}
            if not hybrid:
                from smile_llm.engine import InferenceEngine, SamplingParams

                constrained = model.generate(PROMPTS[1], 12, regex="A[0-9A-F]{3}-[0-9]{2,6}")
                r["constrained"], r["constrained_stats"] = constrained.tokens, spec_stats(constrained)
                with InferenceEngine(model, max_batch_size=3) as engine:
                    handles: list[Any] = [None] * 6
                    threads = [threading.Thread(target=lambda i=i: handles.__setitem__(
                        i, engine.submit(PROMPTS[i % 3], SamplingParams(max_new_tokens=10)))) for i in range(6)]
                    for t in threads:
                        t.start()
                    for t in threads:
                        t.join()
                    r["engine"] = [h.result().tokens for h in handles]
                    r["engine_draft_errors"] = [h.result().stats["draft_errors"] for h in handles]
            model.pool.check_invariants()
            result[name] = r
        result["dtype"] = str(lm.transformer.dtype)
        result["one_kv_bytes"] = sum(t.numel() * t.element_size() for t in (one.pool.key_cache, one.pool.value_cache))
        result["one_state_bytes"] = sum(s.bytes_per_request for s in one.pool.state_pools)
        leader = lm.transformer.leader
        one.close()
        lm.close()  # the last plan: stop
        result["plans_sent"] = leader.plans_sent
        result["stage"]["transfers"] = dict(lm.transformer.stage.pipe.sent)

    _follow_or(lm, result, lead)
    if lm.is_follower:
        result["stage"]["transfers"] = dict(lm.transformer.stage.pipe.sent)


def killed(rank: int, folder: Path, result: dict[str, Any], victim: int = 1, hang_s: float = 0.0) -> None:
    """Rank ``victim`` dies at its 5th forward (mid-request), or with ``hang_s`` hangs there that long first (past
    the group's timeout). Rank 0 (when it survives) records what its generate raised and when, then what a second
    generate raises; a surviving follower records how ``follow`` ended."""
    lm = load(folder, dist.get_world_size())
    if rank == victim:
        forward = lm.transformer.forward
        count = [0]

        def dying(*args: Any, **kwargs: Any) -> Any:
            count[0] += 1
            if count[0] == 5:
                time.sleep(hang_s)
                os._exit(3)
            return forward(*args, **kwargs)

        lm.transformer.forward = dying
    t0 = time.monotonic()
    if lm.is_follower:
        try:
            result["plans"] = lm.follow()
        except Exception as exc:  # noqa: BLE001 - what the test inspects
            result["raised"], result["raised_type"] = str(exc)[:300], type(exc).__name__
            result["lockstep_error"] = _is_lockstep_error(exc)
        result["seconds"] = time.monotonic() - t0
        return
    for key in ("first", "second"):
        t0 = time.monotonic()
        try:
            lm.generate(PROMPTS[0], 40, speculative_tokens=0)
            result[key] = None
        except Exception as exc:  # noqa: BLE001 - what the test inspects
            result[key] = {"type": type(exc).__name__, "message": str(exc)[:300],
                           "lockstep_error": _is_lockstep_error(exc)}
        result[f"{key}_seconds"] = time.monotonic() - t0


def _is_lockstep_error(exc: BaseException) -> bool:
    from smile_llm.distributed.lockstep import LockstepError

    return isinstance(exc, LockstepError)


def refused(rank: int, folder: Path, result: dict[str, Any], pp: int = 2, tp: int = 1) -> None:
    """Every rank asks for ``pp`` stages of ``tp`` ranks in a job of another size: the ValueError's message, and
    whether the job's group still works afterwards (nothing was joined or allocated)."""
    try:
        load(folder, pp, tp)
        result["raised"] = None
    except ValueError as exc:
        result["raised"] = str(exc)
    box = [rank]
    dist.broadcast_object_list(box, src=0)
    result["group_works"] = box[0] == 0


SCENARIOS: dict[str, Callable[..., None]] = {"parity": parity, "killed": killed, "refused": refused}
