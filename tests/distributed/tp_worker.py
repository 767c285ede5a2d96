"""The ranks of the tensor-parallel tests: ``spawn(scenario, folder, out, size)`` starts ``size`` processes joined by
a gloo group (bounded timeout); each loads ``folder`` with ``tensor_parallel=size``. Rank 0 runs ``scenario`` and
writes what it saw to ``out`` (JSON); the other ranks follow (and write how that ended). Every rank computes with one
thread, so each side's float reductions run in one fixed order; ``logit_tolerance`` bounds how far the orders of
TP=size and TP=1 may move the logits apart."""

from __future__ import annotations

import json
import math
import os
import socket
import threading
import traceback
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

if TYPE_CHECKING:
    from smile_llm.models.checkpoint.config import ModelConfig

TIMEOUT_S = 20.0
PROMPTS = [[(7 * i + 3) % 97 for i in range(22)], [5, 9, 11, 2, 40, 41, 42], [(11 * i + 5) % 97 for i in range(37)]]
SPEC_STATS = ("speculative_rounds", "proposed_drafts", "accepted_drafts", "draft_errors", "accept_length_histogram")
# float rounding moves logits by about eps * sqrt(reduction) per reduction (see logit_tolerance); this factor covers
# how the layers amplify it. Measured |TP=2 - TP=1| / (eps * max|logit| * sqrt(n (2 L + 1))) over 20 random hybrid
# checkpoints (Qwen3-Next on torch's AVX2 and AVX-512 kernels, Qwen3.5 on AVX2) and 8 dense ones: at most 2.0 (hybrid)
# and 0.35 (dense); 8 leaves 4x over the worst
TOLERANCE_FACTOR = 8.0


def logit_tolerance(config: ModelConfig, reference: np.ndarray, dtype: torch.dtype) -> float:
    """The largest ``|TP=N - TP=1|`` logit difference that rounding explains for a model of ``config`` computing in
    ``dtype``, given the TP=1 ``reference`` logits.

    Sharding changes only the order of float additions: a row-parallel output (``o_proj``, ``down_proj``, the DeltaNet
    ``out_proj``, the experts) is summed per rank and then across ranks, where one rank's GEMM blocks the same dot
    product differently. Two orders of a length-``n`` sum differ by about ``eps * sqrt(n)`` relative to the size of
    its terms (rounding errors of either sign add like a random walk: the probabilistic bound, against the worst case
    ``n * eps``). Between the embedding and the logits lie ``2 L + 1`` such sums (two per layer, then the LM head),
    whose errors add like independent ones (``sqrt`` again), and the error ends relative to the logits' scale,
    ``max |logit|``. So the bound is ``TOLERANCE_FACTOR * eps(dtype) * max|logit| * sqrt(n * (2 L + 1))``, ``n`` the
    longest reduction of any layer (hidden size, MLP or expert inner size, attention heads x head dim, DeltaNet key or
    value dim). A sharding defect (a wrong slice, a bias added twice, a head mixed up) moves logits by a sizeable
    fraction of ``max |logit|``, orders of magnitude above it."""
    la, moe = config.linear_attention, config.moe
    widths = [config.hidden_size, config.intermediate_size, config.num_attention_heads * config.head_dim]
    if la is not None:
        widths += [la.key_dim, la.value_dim]
    if moe is not None:
        widths += [moe.moe_intermediate_size, moe.shared_expert_intermediate_size]
    reductions = 2 * config.num_hidden_layers + 1
    scale = max(float(np.abs(reference).max()), 1.0)
    return TOLERANCE_FACTOR * torch.finfo(dtype).eps * scale * math.sqrt(max(widths) * reductions)


def spec_stats(completion: Any) -> dict[str, Any]:
    """The speculative counters of ``completion.stats`` (``SPEC_STATS``): rounds, drafts proposed and kept, rounds
    the drafter failed, and the accepted-length histogram (keys as strings, as JSON writes them)."""
    stats = {key: completion.stats[key] for key in SPEC_STATS}
    stats["accept_length_histogram"] = {str(k): v for k, v in stats["accept_length_histogram"].items()}
    return stats


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
    from smile_llm.language_model import LanguageModel

    return LanguageModel.from_pretrained(folder, page_size=4, max_seq_len=128, max_batch_size=4, tensor_parallel=tp,
                                         **kwargs)


def _follow_or(rank: int, lm: Any, result: dict[str, Any], lead: Callable[[], None]) -> None:
    if lm.is_follower:
        result["plans"] = lm.follow()
    else:
        lead()
    result["group_after_close"] = dist.is_initialized()  # a group the caller made outlives the model


def own_group(rank: int, folder: Path, result: dict[str, Any]) -> None:
    """The model joins the process group itself (the worker's group is gone, a fresh port agreed first): it owns
    it, and closing the model (rank 0's close, the follower's end of ``follow``) destroys it on every rank."""
    port = dist.get_rank() == 0 and free_port()
    box = [port]
    dist.broadcast_object_list(box, src=0)
    dist.destroy_process_group()
    os.environ["MASTER_PORT"] = str(box[0])
    lm = load(folder, 2)
    result["owns_group"] = lm.tp.owns_group

    def lead() -> None:
        result["tokens"] = lm.generate(PROMPTS[1], 4, speculative_tokens=0).tokens
        lm.close()

    _follow_or(rank, lm, result, lead)


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
    batched), seeded sampling, and the engine with concurrent submissions, with the speculative counters of each
    (``spec_stats``; the engine's failed rounds only: its batches depend on the threads' timing); the compute dtype;
    the digest check is on."""
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
            r["spec"], r["spec_stats"] = spec.tokens, spec_stats(spec)
            batch = model.generate_batch(PROMPTS, 12)
            r["batch"], r["batch_stats"] = [c.tokens for c in batch], [spec_stats(c) for c in batch]
            sampled = model.generate(PROMPTS[1], 12, temperature=0.9, seed=5)
            r["sampled"], r["sampled_stats"] = sampled.tokens, spec_stats(sampled)
            # constrained: the grammar's mask, drafts cut where it refuses them, jump-forward windows
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
        leader = lm.transformer.leader
        result["kv_heads"], result["dtype"] = lm.pool.num_kv_heads, str(lm.transformer.dtype)
        one.close()
        lm.close()  # sends the last plan: stop
        result["plans_sent"], result["bytes_sent"] = leader.plans_sent, leader.bytes_sent

    _follow_or(rank, lm, result, lead)


def hybrid(rank: int, folder: Path, result: dict[str, Any]) -> None:
    """A hybrid checkpoint (DeltaNet heads, state pool and snapshots split across ranks): rank 0 records TP=size and
    TP=1 prompt logits, greedy and MTP-speculative generate (verify windows rewind every rank's states), a batch,
    and a second turn that hits a state snapshot, with the speculative counters of each (``spec_stats``); the compute
    dtype; the digest check is on."""
    lm = load(folder, dist.get_world_size(), lockstep_check=True)

    def lead() -> None:
        one = load(folder, 1)
        prompts = [[(13 * i + 7) % 256 for i in range(21)], [5, 9, 200, 17], [(7 * i + 3) % 256 for i in range(37)]]
        for name, model in (("tp", lm), ("one", one)):
            r: dict[str, Any] = {}
            r["prompt_logits"] = logits_of(model, prompts[2], step_by_step=True)
            r["plain"] = model.generate(prompts[0], 12, speculative_tokens=0).tokens
            spec = model.generate(prompts[0], 12)
            r["spec"], r["spec_stats"] = spec.tokens, spec_stats(spec)
            batch = model.generate_batch(prompts, 8)
            r["batch"], r["batch_stats"] = [c.tokens for c in batch], [spec_stats(c) for c in batch]
            follow_up = model.generate(prompts[2] + r["batch"][2] + [1, 2, 3], 8)
            r["follow_up"], r["cached"] = follow_up.tokens, follow_up.stats["cached_tokens"]
            r["follow_up_stats"] = spec_stats(follow_up)
            model.pool.check_invariants()
            result[name] = r
        result["state_bytes"] = [lm.pool.state_pools[0].bytes_per_request, one.pool.state_pools[0].bytes_per_request]
        result["dtype"] = str(lm.transformer.dtype)
        one.close()
        lm.close()

    _follow_or(rank, lm, result, lead)


def greedy(rank: int, folder: Path, result: dict[str, Any]) -> None:
    """Rank 0 records TP=size and TP=1 step-by-step logits, greedy tokens (plain and 24 of them drafted by n-gram
    lookup of single tokens, whose drafts copy ids from the whole vocabulary, with their counters: ``spec_stats``);
    the compute dtype; digest check on."""
    from smile_llm.speculative.drafters.ngram import NgramDrafter

    lm = load(folder, dist.get_world_size(), lockstep_check=True, drafter=NgramDrafter(min_n=1, max_n=3))

    def lead() -> None:
        one = load(folder, 1, drafter=NgramDrafter(min_n=1, max_n=3))
        for name, model in (("tp", lm), ("one", one)):
            ngram = model.generate(PROMPTS[0], 24)
            result[name] = {"logits": logits_of(model, PROMPTS[2], step_by_step=True),
                            "tokens": model.generate(PROMPTS[0], 24, speculative_tokens=0).tokens,
                            "ngram": ngram.tokens, "ngram_stats": spec_stats(ngram),
                            "kv_heads": model.pool.num_kv_heads}
        result["dtype"] = str(lm.transformer.dtype)
        one.close()
        lm.close()

    _follow_or(rank, lm, result, lead)


def packed(rank: int, folder: Path, result: dict[str, Any]) -> None:
    """TP=size and TP=1 on int4 KV (keys per channel, values per token, pages of 8 quantized once complete): each
    rank quantizes its own heads. Rank 0 records step-by-step logits, greedy tokens plain and speculative (MTP,
    verify windows across page boundaries taken back); digest check on."""
    from smile_llm.language_model import LanguageModel

    def packed_model(tp: int, **kwargs: Any) -> Any:
        return LanguageModel.from_pretrained(folder, page_size=8, max_seq_len=128, max_batch_size=4,
                                             tensor_parallel=tp, kv_dtype="int4", **kwargs)

    lm = packed_model(dist.get_world_size(), lockstep_check=True)

    def lead() -> None:
        one = packed_model(1)
        for name, model in (("tp", lm), ("one", one)):
            result[name] = {"logits": logits_of(model, PROMPTS[2], step_by_step=True),
                            "plain": model.generate(PROMPTS[0], 16, speculative_tokens=0).tokens,
                            "spec": model.generate(PROMPTS[0], 16, speculative_tokens=3).tokens,
                            "formats": [model.pool.dtype_for_layer(i) for i in model.pool.layer_range],
                            "direct": model.pool.direct}
        one.close()
        lm.close()

    _follow_or(rank, lm, result, lead)


def compiled(rank: int, folder: Path, result: dict[str, Any]) -> None:
    """Every rank compiled (``compile=True``: the tensor-parallel sums are custom ops inside each rank's graph)
    against TP=1 eager: rank 0 records step-by-step logits, greedy tokens plain and speculative (MTP) of both and
    the compiled variants; digest check on."""
    lm = load(folder, dist.get_world_size(), lockstep_check=True, compile=True)

    def lead() -> None:
        one = load(folder, 1, compile=False)
        for name, model in (("tp", lm), ("one", one)):
            result[name] = {"logits": logits_of(model, PROMPTS[2], step_by_step=True),
                            "plain": model.generate(PROMPTS[0], 16, speculative_tokens=0).tokens,
                            "spec": model.generate(PROMPTS[0], 16, speculative_tokens=3).tokens,
                            "compile": model.compile_stats}
        result["dtype"] = str(lm.transformer.dtype)
        one.close()
        lm.close()

    _follow_or(rank, lm, result, lead)
    result["compile"] = lm.compile_stats


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
    "parity": parity, "hybrid": hybrid, "greedy": greedy, "killed": killed, "oversized": oversized,
    "own_group": own_group, "packed": packed, "compiled": compiled}
