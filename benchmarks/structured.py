#!/usr/bin/env python
"""Structured (JSON-schema constrained) generation: what the constraint costs per token, how many target forwards
jump-forward and speculation save, and the same requests through Hugging Face ``transformers`` with xgrammar.

Models, built in a temporary folder with fixed seeds (nothing is downloaded):

- a random Qwen3 (hidden 512, 4 layers, 8 heads / 4 KV heads of 64, intermediate 1536, tied) with a byte-level BPE
  ``tokenizer.json`` trained by ``tokenizers`` on generated JSON text, so JSON punctuation, keys and separators
  (``", "``, ``": "``, ``"}``...) are tokens of their own; ``<|endoftext|>`` (id 0) is EOS;
- for speculation with an MTP head, the embedded default model (trained weights, byte tokenizer, 1-layer MTP head).

Three bounded schemas (every property required, ``additionalProperties: false``, strings with ``maxLength``, enums,
integer ranges, arrays with ``maxItems``), so random weights still finish a valid object: ``user`` (flat),
``order`` (nested object, array of objects), ``event`` (nested object, integer array). Prompts hold two or three
seeded example records of the schema. Greedy decoding throughout.

1. Overhead: each prompt is generated constrained (``json_schema=``, ``speculative_tokens=0``), then free with
   ``max_new_tokens =`` the constrained length (no ``min_new_tokens``: its processor would add its own cost to the
   free peer; the script counts free rows that end at EOS sooner, timed over their own tokens). Per-token decode
   time is ``stats["decode_s"] / (tokens - 1)``; ratio constrained / free, with ``lm.jump_forward = False`` (the
   constraint's whole cost: mask, applying it, advancing) and ``True`` (forced tokens appended by one verify
   forward). Batch 1 (``generate``) and batch
   16 (``generate_batch`` of 16 prompts; the free peer submits the same 16 prompts with each row's own length, as
   ``generate_batch`` does). Goal: under 10% overhead. Also: the model's forwards at batch 16 (calls of
   ``lm.transformer``) against the rows' own ``stats["forwards"]`` summed, and the cost of applying a bitmask to
   the logits alone (``mask_logits`` against xgrammar's ``apply_token_bitmask_inplace``) at the model's vocabulary
   and at Qwen3's 151,936.
2. Target forwards per output token (``stats["target_forwards_per_token"]``): token by token (jump-forward off, no
   drafts), jump-forward alone, speculation alone (n-gram prompt lookup on the random model, the MTP head on the
   default model), both; outputs checked identical across the four.
3. Peers: HF ``generate`` with ``xgrammar.contrib.hf.LogitsProcessor`` on the same weights and schema (xgrammar
   ``compile_json_schema(any_whitespace=False, separators=(", ", ": "))``, the layout smile-llm uses): time per
   token against ours, and the greedy tokens compared. llguidance (smile-llm's engine) writes forced text only in
   the tokenizer's own tokenization (``{"`` where xgrammar also allows ``{`` then ``"``), so the two differ by
   design. The same schema is also given to smile-llm as a Lark grammar with ``%llguidance {"no_forcing": true}``,
   and, to take the engines' different length-bounded strings out too (xgrammar 0.2.9's take raw control bytes
   and no escapes), with every such string as a ``pattern`` (``pattern_twin``): those outputs must match
   xgrammar's token for token. The masks of both engines are compared position by position along our outputs,
   every difference classified; the outputs are checked as strict JSON valid under the schema (``jsonschema``).
   Raw mask cost: the same token sequence replayed through xgrammar's ``GrammarMatcher``
   (``fill_next_token_bitmask`` + ``accept_token``) and llguidance's ``LLMatcher`` (``unsafe_compute_mask_ptr`` +
   ``consume_token``, with smile-llm's token table and grammar text), microseconds per token.

Every timed figure is a median of ``--repeats`` runs (variants interleaved within a run). One torch thread by
default: the machine is shared, and two OpenMP threads on two busy cores stall at every barrier (a 5 ms decode
step measured 100-300 ms with 2 threads at load average 3-6).

    .venv/bin/python benchmarks/structured.py
    .venv/bin/python benchmarks/structured.py --quick
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_env import code_version  # noqa: E402
from realistic_size import StepClock  # noqa: E402

# the peer of part 3 (and of the bitmask-application figures): the optional "peers" extra
HAVE_XGRAMMAR = importlib.util.find_spec("xgrammar") is not None

EOS_TEXT = "<|endoftext|>"
MAX_NEW = 320  # every schema's longest output is well below this
QWEN3_VOCAB = 151936  # a real vocabulary, for the cost of applying a mask
LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}  # smile-llm's JSON layout

WORDS = ("alice bob carol dave erin frank grace heidi ivan judy mallory niaj olivia peggy rupert sybil trent "
         "victor walter paris tokyo berlin madrid lisbon oslo rome vienna prague dublin admin editor viewer guest "
         "red green blue black white small large fast slow open closed pending paid shipped cancelled click view "
         "purchase signup linux macos windows android ios mobile desktop tablet widget gadget bolt nut gear lamp "
         "error warning info debug alpha beta gamma delta").split()

SCHEMAS: dict[str, dict[str, Any]] = {
    "user": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 16},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "email": {"type": "string", "maxLength": 24},
            "role": {"enum": ["admin", "editor", "viewer", "guest"]},
            "active": {"type": "boolean"},
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 10}, "maxItems": 3},
        },
        "required": ["name", "age", "email", "role", "active", "tags"],
        "additionalProperties": False,
    },
    "order": {
        "type": "object",
        "properties": {
            "order_id": {"type": "integer", "minimum": 1, "maximum": 999999},
            "customer": {
                "type": "object",
                "properties": {"name": {"type": "string", "maxLength": 16},
                               "city": {"enum": ["paris", "tokyo", "berlin", "madrid", "oslo"]}},
                "required": ["name", "city"],
                "additionalProperties": False,
            },
            "items": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {"sku": {"type": "string", "maxLength": 8},
                                   "quantity": {"type": "integer", "minimum": 1, "maximum": 99},
                                   "unit_price": {"type": "integer", "minimum": 0, "maximum": 10000}},
                    "required": ["sku", "quantity", "unit_price"],
                    "additionalProperties": False,
                },
                "maxItems": 3,
            },
            "status": {"enum": ["pending", "paid", "shipped", "cancelled"]},
        },
        "required": ["order_id", "customer", "items", "status"],
        "additionalProperties": False,
    },
    "event": {
        "type": "object",
        "properties": {
            "event": {"enum": ["click", "view", "purchase", "signup"]},
            "timestamp": {"type": "integer", "minimum": 0, "maximum": 2000000000},
            "source": {
                "type": "object",
                "properties": {"device": {"enum": ["mobile", "desktop", "tablet"]},
                               "os": {"enum": ["linux", "macos", "windows", "android", "ios"]},
                               "version": {"type": "string", "maxLength": 8}},
                "required": ["device", "os", "version"],
                "additionalProperties": False,
            },
            "scores": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 100}, "maxItems": 5},
            "note": {"type": "string", "maxLength": 24},
        },
        "required": ["event", "timestamp", "source", "scores", "note"],
        "additionalProperties": False,
    },
}


# ---------------------------------------------------------------------------------------------- data and models
def instance(schema: dict[str, Any], rng: random.Random) -> Any:
    """A random value of ``schema`` (the subset the schemas above use)."""
    if "enum" in schema:
        return rng.choice(schema["enum"])
    kind = schema["type"]
    if kind == "object":
        return {k: instance(v, rng) for k, v in schema["properties"].items()}
    if kind == "array":
        return [instance(schema["items"], rng) for _ in range(rng.randint(0, schema.get("maxItems", 4)))]
    if kind == "integer":
        lo, hi = schema.get("minimum", -1000), schema.get("maximum", 1000)
        return rng.randint(lo, min(hi, lo + 10 ** rng.randint(1, len(str(hi)))))
    if kind == "boolean":
        return rng.random() < 0.5
    text = rng.choice(WORDS)
    while rng.random() < 0.4:
        text += rng.choice(" _.-@") + rng.choice(WORDS)
    return text[: schema.get("maxLength", 32)]


def corpus(seed: int) -> list[str]:
    """JSON text to train the tokenizer on: records of every schema plus free-form objects."""
    rng = random.Random(seed)
    out = []
    for _ in range(1500):
        for schema in SCHEMAS.values():
            out.append(json.dumps(instance(schema, rng)))
        free = {rng.choice(WORDS): rng.choice([rng.randint(-999, 99999), rng.choice(WORDS), None, True, [1, 2]])
                for _ in range(rng.randint(1, 5))}
        out.append(f"Record {rng.randint(1, 99)}: {json.dumps(free)}\n")
    return out


def build_checkpoint(folder: Path, vocab: int) -> tuple[Any, int]:
    """Train the BPE tokenizer and save it with a random Qwen3 into ``folder``; returns the HF model and EOS id."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import Qwen3Config, Qwen3ForCausalLM

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=[EOS_TEXT], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus(0), trainer)
    tok.save(str(folder / "tokenizer.json"))
    eos = tok.token_to_id(EOS_TEXT)
    assert eos is not None
    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=tok.get_vocab_size(), hidden_size=512, intermediate_size=1536, num_hidden_layers=4,
                      num_attention_heads=8, num_key_value_heads=4, head_dim=64, max_position_embeddings=2048,
                      tie_word_embeddings=True, bos_token_id=None, eos_token_id=eos, pad_token_id=None)
    hf = Qwen3ForCausalLM(cfg).eval()
    hf.save_pretrained(folder, safe_serialization=True)
    return hf, eos


def prompts_for(name: str, count: int, seed: int, python: bool = False) -> list[str]:
    """``count`` prompts of two or three example records of schema ``name`` (as Python source for the default
    model, which was trained on the standard library)."""
    rng = random.Random(seed)
    out = []
    for i in range(count):
        records = [json.dumps(instance(SCHEMAS[name], rng)) for _ in range(rng.randint(2, 3))]
        if python:
            out.append(f"{name.upper()}S_{i} = [\n" + "".join(f"    {r},\n" for r in records) + "    ")
        else:
            out.append("".join(f"{name} record {j + 1}: {r}\n" for j, r in enumerate(records))
                       + f"{name} record {len(records) + 1}: ")
    return out


def med(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


# ---------------------------------------------------------------------------------------------- 1. overhead
FREE_RUNS = {"rows": 0, "early": 0}  # free rows run, and those that stopped at EOS before the constrained length


def overhead_b1(lm: Any, schema: dict, prompts: list[str]) -> tuple[float, float, float, int]:
    """One run over ``prompts`` at batch 1: seconds per decoded token free, constrained (jump-forward off),
    constrained (jump-forward on); and the constrained tokens decoded."""
    free = con = jf = 0.0
    steps = free_steps = 0
    for p in prompts:
        lm.jump_forward = False
        c = lm.generate(p, MAX_NEW, json_schema=schema, speculative_tokens=0)
        n = len(c.tokens)
        assert c.stats["constraint_complete"], f"constrained output did not finish: {c.text!r}"
        u = lm.generate(p, n, speculative_tokens=0)
        FREE_RUNS["rows"] += 1
        FREE_RUNS["early"] += len(u.tokens) < n
        lm.jump_forward = True
        j = lm.generate(p, MAX_NEW, json_schema=schema, speculative_tokens=0)
        assert j.tokens == c.tokens, "jump-forward changed the output"
        con, free, jf = con + c.stats["decode_s"], free + u.stats["decode_s"], jf + j.stats["decode_s"]
        steps += n - 1
        free_steps += len(u.tokens) - 1
    lm.jump_forward = True
    return free / free_steps, con / steps, jf / steps, steps


class ForwardCounter:
    """Counts the model's forwards (calls of ``lm.transformer``), whatever rows each one carries."""

    def __init__(self, lm: Any) -> None:
        self.count = 0
        module = lm.transformer
        inner = module.forward

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.count += 1
            return inner(*args, **kwargs)

        module.forward = counted


BATCH_FORWARDS = {"constrained": [0, 0], "jump-forward": [0, 0]}  # model forwards, rows' own forwards (summed)


def overhead_batch(lm: Any, schema: dict, prompts: list[str],
                   counter: ForwardCounter) -> tuple[list[float], list[float], list[float], int]:
    """One run of ``generate_batch(prompts)`` at batch ``len(prompts)``: [decode seconds per row-token, wall seconds
    per token] for free, constrained (jump-forward off), constrained (jump-forward on); and the tokens generated."""
    from smile_llm import SamplingParams

    def figures(out: list[Any], wall: float) -> list[float]:
        steps = sum(len(c.tokens) - 1 for c in out)
        return [sum(c.stats["decode_s"] for c in out) / steps, wall / sum(len(c.tokens) for c in out)]

    def count(kind: str, out: list[Any], before: int) -> None:
        BATCH_FORWARDS[kind][0] += counter.count - before
        BATCH_FORWARDS[kind][1] += sum(c.stats["forwards"] for c in out)

    lm.jump_forward = False
    t0, before = time.perf_counter(), counter.count
    con = lm.generate_batch(prompts, MAX_NEW, json_schema=schema, speculative_tokens=0)
    con_f = figures(con, time.perf_counter() - t0)
    count("constrained", con, before)
    assert all(c.stats["constraint_complete"] for c in con), "a constrained row did not finish"
    lengths = [len(c.tokens) for c in con]
    t0 = time.perf_counter()
    handles = [lm.submit(p, SamplingParams(max_new_tokens=n, speculative_tokens=0)) for p, n in zip(prompts, lengths)]
    free = [h.result() for h in handles]
    free_f = figures(free, time.perf_counter() - t0)
    FREE_RUNS["rows"] += len(free)
    FREE_RUNS["early"] += sum(len(c.tokens) < n for c, n in zip(free, lengths))
    lm.jump_forward = True
    t0, before = time.perf_counter(), counter.count
    jf = lm.generate_batch(prompts, MAX_NEW, json_schema=schema, speculative_tokens=0)
    jf_f = figures(jf, time.perf_counter() - t0)
    count("jump-forward", jf, before)
    assert [c.tokens for c in jf] == [c.tokens for c in con], "jump-forward changed a row"
    return free_f, con_f, jf_f, sum(lengths)


KINDS = ("free", "constrained", "jump-forward")


def overhead_section(lm: Any, schemas: list[str], prompts: dict[str, list[str]], batch_prompts: dict[str, list[str]],
                     args: argparse.Namespace) -> tuple[float, float, float, float]:
    """Runs ``overhead_b1`` and ``overhead_batch`` over every schema ``args.repeats`` times, prints the table;
    returns the ratios constrained/free at batch 1 and at the batch size, jump-forward off and on."""
    counter = ForwardCounter(lm)
    # per (batch, schema): per kind, the run's seconds per token; "all" sums the schemas' seconds and tokens
    per: dict[tuple[int, str], dict[str, list[float]]] = {}
    wall: dict[str, list[float]] = {k: [] for k in KINDS}
    tokens: dict[tuple[int, str], int] = {}
    for _ in range(args.repeats):
        total = {(b, k): [0.0, 0] for b in (1, args.batch) for k in KINDS}
        total_wall = {k: [0.0, 0] for k in KINDS}
        for name in schemas:
            *times, steps = overhead_b1(lm, SCHEMAS[name], prompts[name])
            tokens[1, name] = steps + len(prompts[name])
            for kind, t in zip(KINDS, times):
                per.setdefault((1, name), {k: [] for k in KINDS})[kind].append(t)
                total[1, kind][0] += t * steps
                total[1, kind][1] += steps
            *figs, toks = overhead_batch(lm, SCHEMAS[name], batch_prompts[name], counter)
            tokens[args.batch, name] = toks
            steps = toks - args.batch
            for kind, (decode, w) in zip(KINDS, figs):
                per.setdefault((args.batch, name), {k: [] for k in KINDS})[kind].append(decode)
                total[args.batch, kind][0] += decode * steps
                total[args.batch, kind][1] += steps
                total_wall[kind][0] += w * toks
                total_wall[kind][1] += toks
        for (b, kind), (sec, n) in total.items():
            per.setdefault((b, "all"), {k: [] for k in KINDS})[kind].append(sec / n)
        for kind, (sec, n) in total_wall.items():
            wall[kind].append(sec / n)
    print(f"  {'batch':>5} {'schema':<7} {'tokens':>6} {'free ms/tok':>11} {'constrained':>11} {'ratio':>6} "
          f"{'+jump-fwd':>10} {'ratio':>6}")
    ratios = {}
    order = [(b, name) for b in (1, args.batch) for name in [*schemas, "all"]]
    for b, name in order:
        runs = per[b, name]
        free, con, jf = (med(runs[k]) for k in KINDS)
        # ratios: the median over runs of each run's ratio (the variants of a run ran back to back)
        r = med([c / f for c, f in zip(runs["constrained"], runs["free"])])
        r_jf = med([j / f for j, f in zip(runs["jump-forward"], runs["free"])])
        ratios[b, name] = (r, r_jf)
        print(f"  {b:>5} {name:<7} {tokens.get((b, name), ''):>6} {free * 1e3:>11.2f} {con * 1e3:>11.2f} {r:>6.3f} "
              f"{jf * 1e3:>10.2f} {r_jf:>6.3f}")
    wr = med([c / f for c, f in zip(wall["constrained"], wall["free"])])
    wr_jf = med([j / f for j, f in zip(wall["jump-forward"], wall["free"])])
    print(f"  (batch {args.batch}: decode ms per row-token, each row's decode_s over its tokens; wall time of the "
          f"whole batch, prefill included, per token: constrained/free {wr:.3f}, with jump-forward {wr_jf:.3f})")
    (r1, r1_jf), (rn, rn_jf) = ratios[1, "all"], ratios[args.batch, "all"]
    print(f"  goal: constrained/free < 1.10 with jump-forward off: batch 1 {r1:.3f} "
          f"({'met' if r1 < 1.1 else 'MISSED'}), batch {args.batch} {rn:.3f} ({'met' if rn < 1.1 else 'MISSED'})")
    print(f"  free rows that ended at EOS before the constrained length: {FREE_RUNS['early']} of {FREE_RUNS['rows']}")
    (con_model, con_rows), (jf_model, jf_rows) = BATCH_FORWARDS["constrained"], BATCH_FORWARDS["jump-forward"]
    print(f"  batch {args.batch}, all runs: model forwards {con_model} with jump-forward off, {jf_model} on (the rows' "
          f"own forwards summed: {con_rows} and {jf_rows})")
    for vocab in (lm.config.vocab_size, QWEN3_VOCAB) if HAVE_XGRAMMAR else ():
        for batch in (1, args.batch):
            ours, theirs = apply_cost(vocab, batch)
            print(f"  applying a bitmask to [{batch}, {vocab}] float32 logits, per step: smile-llm mask_logits "
                  f"{ours * 1e6:,.0f} us, xgrammar apply_token_bitmask_inplace on a copy {theirs * 1e6:,.0f} us",
                  flush=True)
    return r1, r1_jf, rn, rn_jf


def apply_cost(vocab: int, batch: int) -> tuple[float, float]:
    """Median seconds of one ``mask_logits`` (smile-llm: unpack the bitmask, -inf the rest into a new tensor) and one
    ``xgrammar.apply_token_bitmask_inplace`` on ``[batch, vocab]`` logits with a random mask (7 blocks of calls,
    each about 20 ms, the median block)."""
    import xgrammar as xgr

    from smile_llm.sampling.token_mask import mask_logits

    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(batch, vocab, generator=gen)
    words = torch.randint(-(1 << 31), 1 << 31, (batch, (vocab + 31) // 32), dtype=torch.int64, generator=gen)
    bitmask = words.to(torch.int32)
    packed = bitmask.numpy()
    t0 = time.perf_counter()
    mask_logits(logits, packed)
    calls = max(3, int(0.02 / (time.perf_counter() - t0)))
    out: list[list[float]] = [[], []]
    for _ in range(7):
        t0 = time.perf_counter()
        for _ in range(calls):
            mask_logits(logits, packed)
        t1 = time.perf_counter()
        for _ in range(calls):
            xgr.apply_token_bitmask_inplace(logits.clone(), bitmask)
        t2 = time.perf_counter()
        out[0].append((t1 - t0) / calls)
        out[1].append((t2 - t1) / calls)
    return med(out[0]), med(out[1])


# ---------------------------------------------------------------------------------------------- 2. forwards
VARIANTS = (("token by token", False, 0), ("jump-forward", True, 0), ("speculation", False, None),
            ("jump-forward + speculation", True, None))


def forwards_case(lm: Any, schemas: list[str], prompts: dict[str, list[str]], repeats: int) -> dict[str, Any]:
    """Per variant: target forwards per token (over every prompt), median decode ms per token, mean accepted
    length; outputs checked identical across the variants."""
    forwards = {v[0]: 0.0 for v in VARIANTS}
    timing: dict[str, list[float]] = {v[0]: [] for v in VARIANTS}
    accepted: dict[str, list[float]] = {v[0]: [] for v in VARIANTS}
    steps, tokens, forced = 0, 0, 0
    for rep in range(repeats):
        run = {v[0]: 0.0 for v in VARIANTS}
        for name in schemas:
            for p in prompts[name]:
                ref: list[int] = []
                for label, jump, k in VARIANTS:
                    lm.jump_forward = jump
                    c = lm.generate(p, MAX_NEW, json_schema=SCHEMAS[name], speculative_tokens=k)
                    assert c.stats["constraint_complete"], f"{label}: output did not finish: {c.text!r}"
                    ref = ref or c.tokens
                    assert c.tokens == ref, f"{label}: output differs from token-by-token decoding"
                    run[label] += c.stats["decode_s"]
                    if rep == 0:
                        forwards[label] += c.stats["target_forwards_per_token"] * (len(c.tokens) - 1)
                        if c.stats["speculative_rounds"]:
                            accepted[label].append(c.stats["mean_accepted_length"])
                        if label == "jump-forward":
                            forced += c.stats["forced_tokens"]
                if rep == 0:
                    steps += len(ref) - 1
                    tokens += len(ref)
        for label in run:
            timing[label].append(run[label])
    lm.jump_forward = True
    return {"tokens": tokens, "forced": forced,
            "rows": {label: (forwards[label] / steps, med(timing[label]) / steps * 1e3,
                             statistics.fmean(accepted[label]) if accepted[label] else 0.0)
                     for label, _, _ in VARIANTS}}


# ---------------------------------------------------------------------------------------------- 3. peers
def no_forcing_grammar(schema: dict) -> str:
    """The schema as an llguidance Lark grammar with forced-text canonicalisation off (every tokenization of forced
    text allowed, as xgrammar does), in smile-llm's JSON layout."""
    return '%llguidance {"no_forcing": true}\nstart: %json ' + json.dumps(schema | {"x-guidance": LAYOUT})


def allowed_set(words: np.ndarray, vocab: int) -> np.ndarray:
    """bool [vocab]: the tokens a little-endian int32 bitmask allows."""
    return np.unpackbits(np.ascontiguousarray(words).view(np.uint8), bitorder="little")[:vocab].astype(bool)


class Engines:
    """Both grammar engines over the random model's vocabulary: llguidance with smile-llm's own token table, limits
    and grammar text, xgrammar with ``TokenizerInfo.from_huggingface``."""

    def __init__(self, lm: Any, folder: Path, vocab: int, eos: int) -> None:
        import xgrammar as xgr
        from transformers import PreTrainedTokenizerFast

        from smile_llm.sampling.grammar_compiler import parser_limits
        from smile_llm.sampling.token_table import token_table

        self.xgr, self.vocab, self.eos = xgr, vocab, eos
        self.ll_table = token_table(lm.tokenizer, vocab, (eos,))
        self.limits = parser_limits()
        hf_tok = PreTrainedTokenizerFast(tokenizer_file=str(folder / "tokenizer.json"), eos_token=EOS_TEXT)
        self.xgr_info = xgr.TokenizerInfo.from_huggingface(hf_tok, vocab_size=vocab, stop_token_ids=[eos])
        self.xgr_compiler = xgr.GrammarCompiler(self.xgr_info)
        self.words = (vocab + 31) // 32
        # tokens the engines' length-bounded JSON strings treat differently: raw control bytes and DEL, backslash
        decoded = self.xgr_info.decoded_vocab
        self.string_char = np.array([i < len(decoded) and any(c < 0x20 or c in b"\x7f\\" for c in decoded[i])
                                     for i in range(vocab)])

    def xgr_grammar(self, schema: dict) -> Any:
        return self.xgr_compiler.compile_json_schema(json.dumps(schema), any_whitespace=False,
                                                     separators=(", ", ": "))

    def ll_matcher(self, source: str) -> Any:
        from llguidance import LLMatcher

        m = LLMatcher(self.ll_table, source, log_level=0, limits=self.limits)
        assert not m.is_error(), m.get_error()
        return m

    def ll_mask(self, m: Any) -> np.ndarray:
        out = np.zeros(self.words, dtype=np.int32)
        m.unsafe_compute_mask_ptr(out.ctypes.data, out.nbytes)
        return out

    def compare_masks(self, ll_source: str, compiled: Any, tokens: list[int]) -> dict[str, int]:
        """Walk ``tokens`` (then EOS) through both engines and compare their masks at every position. Counts:
        ``positions``; ``differ``; of those, ``string`` where every token only one engine allows is a string
        character the two treat differently (xgrammar's length-bounded strings take raw control bytes and DEL and
        no backslash escapes; llguidance the reverse), ``forced`` where llguidance allows one token (the
        tokenizer's own tokenization of forced text) and xgrammar others as well, ``other`` the rest."""
        ll, xm = self.ll_matcher(ll_source), self.xgr.GrammarMatcher(compiled)
        bitmask = self.xgr.allocate_token_bitmask(1, self.vocab)
        counts = dict.fromkeys(("positions", "differ", "string", "forced", "other"), 0)
        for i in range(len(tokens) + 1):
            a = allowed_set(self.ll_mask(ll), self.vocab)
            xm.fill_next_token_bitmask(bitmask)
            b = allowed_set(bitmask[0].numpy(), self.vocab)
            counts["positions"] += 1
            if (a != b).any():
                counts["differ"] += 1
                only_ll, only_x = (a & ~b & ~self.string_char), (b & ~a & ~self.string_char)
                if not only_ll.any() and not only_x.any():
                    counts["string"] += 1
                elif not only_ll.any() and a.sum() == 1:
                    counts["forced"] += 1
                else:
                    counts["other"] += 1
            if i < len(tokens):
                assert ll.consume_token(tokens[i]) and xm.accept_token(tokens[i]), f"token {i} refused"
        assert a[self.eos] and a.sum() == 1 and b[self.eos] and b.sum() == 1, "the end does not allow only EOS"
        return counts

    def mask_cost(self, ll_sources: list[str], compiled: Any, tokens: list[int]) -> list[float]:
        """One replay of ``tokens`` through fresh matchers: seconds per token of the mask alone and of mask +
        advance, for llguidance on each of ``ll_sources`` and for xgrammar (in that order)."""
        ll = [self.ll_matcher(source) for source in ll_sources]
        xm = self.xgr.GrammarMatcher(compiled)
        bitmask = self.xgr.allocate_token_bitmask(1, self.vocab)
        out = np.zeros(self.words, dtype=np.int32)
        ptr, nbytes = out.ctypes.data, out.nbytes
        clock = time.perf_counter
        sums = [0.0] * (2 * len(ll) + 2)
        for t in tokens:
            for k, m in enumerate(ll):
                t0 = clock()
                m.unsafe_compute_mask_ptr(ptr, nbytes)
                t1 = clock()
                m.consume_token(t)
                t2 = clock()
                sums[2 * k] += t1 - t0
                sums[2 * k + 1] += t2 - t0
            t0 = clock()
            xm.fill_next_token_bitmask(bitmask)
            t1 = clock()
            xm.accept_token(t)
            t2 = clock()
            sums[-2] += t1 - t0
            sums[-1] += t2 - t0
        return [x / len(tokens) for x in sums]


def json_valid(text: str, schema: dict) -> bool:
    """Whether ``text`` is strict JSON (``json.loads``: no raw control characters in strings) of ``schema``."""
    try:
        value = json.loads(text)
    except ValueError:
        return False
    try:
        import jsonschema
    except ImportError:
        return True
    return jsonschema.Draft202012Validator(schema).is_valid(value)


def pattern_twin(schema: Any) -> Any:
    """``schema`` with every length-bounded string written as a ``pattern`` of lowercase letters, digits and spaces
    (the same bound), where both engines allow the same characters."""
    if isinstance(schema, dict):
        if schema.get("type") == "string" and "maxLength" in schema:
            return {"type": "string", "pattern": "^[a-z0-9 ]{0,%d}$" % schema["maxLength"]}
        return {k: pattern_twin(v) for k, v in schema.items()}
    return [pattern_twin(v) for v in schema] if isinstance(schema, list) else schema


def hf_generate(hf: Any, ids: list[int], eos: int, compiled: Any, clock: StepClock | None = None) -> list[int]:
    """HF greedy ``generate`` with xgrammar's logits processor; the tokens before the EOS it ends with."""
    from xgrammar.contrib.hf import LogitsProcessor

    with torch.inference_mode():
        h = hf.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                        max_new_tokens=MAX_NEW, do_sample=False, streamer=clock, pad_token_id=eos, eos_token_id=eos,
                        logits_processor=[LogitsProcessor(compiled)])
    out = h[0, len(ids):].tolist()
    assert out and out[-1] == eos, "HF + xgrammar did not end with EOS"
    return out[:-1]


def first_difference(lm: Any, ours: list[int], theirs: list[int]) -> str:
    """Where two outputs part: the token index, both tokens' text, and whether either is a string character the
    engines treat differently (a raw control byte or DEL, a backslash)."""
    d = next((i for i, (x, y) in enumerate(zip(ours, theirs)) if x != y), min(len(ours), len(theirs)))
    a, b = lm.decode(ours[d:d + 1]), lm.decode(theirs[d:d + 1])
    why = ("xgrammar's token is a raw control character (invalid JSON)" if any(ord(ch) < 0x20 for ch in b)
           else "xgrammar's token holds DEL" if "\x7f" in b else "our token starts an escape" if "\\" in a else "")
    return f"at token {d}, ours {a!r}, xgrammar {b!r}" + (f": {why}" if why else "")


def peers(lm: Any, hf: Any, engines: Engines, schemas: list[str], prompts: dict[str, list[str]],
          repeats: int) -> dict[str, Any]:
    """HF + xgrammar against ours on the same prompts: per-token times, token identity, JSON validity, mask
    agreement, mask cost."""
    eos = engines.eos
    times: dict[str, list[float]] = {k: [] for k in ("ours", "ours_jf", "hf_xgr", "hf_free")}
    cases = 0
    same = dict.fromkeys(("default", "no_forcing", "twin default", "twin no_forcing"), 0)
    valid = {"ours": 0, "no_forcing": 0, "hf_xgr": 0}
    diffs: list[str] = []
    agree = {key: dict.fromkeys(("positions", "differ", "string", "forced", "other"), 0)
             for key in ("default", "no_forcing")}
    cost: list[list[float]] = [[] for _ in range(6)]
    replayed = 0
    compiled = {name: engines.xgr_grammar(SCHEMAS[name]) for name in schemas}
    twins = {name: engines.xgr_grammar(pattern_twin(SCHEMAS[name])) for name in schemas}
    sources = {name: grammar_source(json_schema=SCHEMAS[name]) for name in schemas}
    nf_sources = {name: grammar_source(grammar=no_forcing_grammar(SCHEMAS[name])) for name in schemas}
    for rep in range(repeats):
        run = {k: [0.0, 0] for k in times}
        for name in schemas:
            for p in prompts[name]:
                ids = lm.encode(p)
                lm.jump_forward = False
                c = lm.generate(ids, MAX_NEW, json_schema=SCHEMAS[name], speculative_tokens=0)
                lm.jump_forward = True
                j = lm.generate(ids, MAX_NEW, json_schema=SCHEMAS[name], speculative_tokens=0)
                clock = StepClock()
                ht = hf_generate(hf, ids, eos, compiled[name], clock)
                # stamps: the prompt, then each token up to the EOS: len(ht) steps after the first token
                clock_free = StepClock()
                with torch.inference_mode():
                    hf.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                max_new_tokens=len(ht) + 1, min_new_tokens=len(ht) + 1, do_sample=False,
                                streamer=clock_free, pad_token_id=eos)
                for key, total, steps in (("ours", c.stats["decode_s"], len(c.tokens) - 1),
                                          ("ours_jf", j.stats["decode_s"], len(j.tokens) - 1),
                                          ("hf_xgr", clock.stamps[-1] - clock.stamps[1], len(ht)),
                                          ("hf_free", clock_free.stamps[-1] - clock_free.stamps[1], len(ht))):
                    run[key][0] += total
                    run[key][1] += steps
                if rep:
                    continue
                cases += 1
                nf = lm.generate(ids, MAX_NEW, grammar=no_forcing_grammar(SCHEMAS[name]), speculative_tokens=0)
                same["default"] += c.tokens == ht
                same["no_forcing"] += nf.tokens == ht
                if nf.tokens != ht:
                    diffs.append(f"{name}, no_forcing: {first_difference(lm, nf.tokens, ht)}")
                elif c.tokens != ht and not diffs:
                    diffs.append(f"{name}, json_schema: {first_difference(lm, c.tokens, ht)}")
                for key, text in (("ours", c.text), ("no_forcing", nf.text), ("hf_xgr", lm.decode(ht))):
                    valid[key] += json_valid(text, SCHEMAS[name])
                twin = pattern_twin(SCHEMAS[name])
                ht_twin = hf_generate(hf, ids, eos, twins[name])
                same["twin default"] += lm.generate(ids, MAX_NEW, json_schema=twin).tokens == ht_twin
                same["twin no_forcing"] += lm.generate(ids, MAX_NEW, grammar=no_forcing_grammar(twin)).tokens == ht_twin
                for key, source, path in (("default", sources[name], c.tokens),
                                          ("no_forcing", nf_sources[name], nf.tokens)):
                    for k, v in engines.compare_masks(source, compiled[name], path).items():
                        agree[key][k] += v
                for _ in range(repeats):
                    for lst, x in zip(cost, engines.mask_cost([sources[name], nf_sources[name]], compiled[name],
                                                              c.tokens)):
                        lst.append(x)
                replayed += len(c.tokens)
        for key in times:
            times[key].append(run[key][0] / run[key][1])
    return {"times": {k: med(v) for k, v in times.items()}, "cases": cases, "same": same, "valid": valid,
            "diffs": diffs, "agree": agree, "cost": [med(v) for v in cost], "replayed": replayed}


def grammar_source(**field: Any) -> str:
    """smile-llm's llguidance grammar text for one constraint field (``json_schema=`` or ``grammar=``)."""
    from smile_llm.sampling.constraint import constraint_of

    constraint = constraint_of(**field)
    assert constraint is not None
    return constraint.source


# ---------------------------------------------------------------------------------------------- main
def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=5, help="runs per timed figure (the median is reported)")
    p.add_argument("--prompts", type=int, default=4, help="prompts per schema at batch 1")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--vocab", type=int, default=4096, help="BPE vocabulary of the random model")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--quick", action="store_true", help="3 repeats, 2 prompts, schemas user and order, batch 8")
    args = p.parse_args()
    schemas = list(SCHEMAS)
    if args.quick:
        args.repeats, args.prompts, args.batch = 3, 2, 8
        schemas = ["user", "order"]
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    torch.set_num_threads(args.threads)
    t_start = time.perf_counter()
    folder = Path(tempfile.mkdtemp(prefix="structured_bench_"))
    try:
        run(args, schemas, folder, t_start)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def run(args: argparse.Namespace, schemas: list[str], folder: Path, t_start: float) -> None:
    """Every section, on the checkpoint built in ``folder``."""
    from smile_llm import LanguageModel

    hf, eos = build_checkpoint(folder, args.vocab)
    cfg = hf.config
    vocab = cfg.vocab_size
    lm = LanguageModel.from_pretrained(folder, drafter=None, max_batch_size=args.batch, max_seq_len=640)
    lm.pool.prefix_reuse_enabled = False  # the free peer reruns the same prompts: prefill them again, like HF
    prompts = {name: prompts_for(name, args.prompts, seed=10 + i) for i, name in enumerate(schemas)}
    batch_prompts = {name: prompts_for(name, args.batch, seed=20 + i) for i, name in enumerate(schemas)}
    params = sum(t.numel() for t in hf.parameters())
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"structured: smile_llm {code_version()}, torch {torch.__version__}, {os.cpu_count()} cpus (load average "
          f"{load}), {args.threads} torch threads; medians of {args.repeats} runs; greedy")
    print(f"model: random Qwen3 {params / 1e6:.1f}M parameters (hidden {cfg.hidden_size}, {cfg.num_hidden_layers} "
          f"layers, {cfg.num_attention_heads}/{cfg.num_key_value_heads} heads of {cfg.head_dim}, intermediate "
          f"{cfg.intermediate_size}, tied), byte-level BPE of {vocab} tokens trained on JSON text (EOS id {eos}); "
          f"schemas {', '.join(schemas)}; {args.prompts} prompts per schema at batch 1, {args.batch} at batch "
          f"{args.batch}", flush=True)
    for name in schemas:  # warm-up: token table, grammars, both decode paths, both batch sizes
        lm.generate(prompts[name][0], MAX_NEW, json_schema=SCHEMAS[name], speculative_tokens=0)
        lm.generate(prompts[name][0], 16, speculative_tokens=0)
        lm.generate_batch(batch_prompts[name], 8, json_schema=SCHEMAS[name], speculative_tokens=0)

    # 1. overhead
    print("\n1. constraint overhead per decoded token (same prompts; free = unconstrained with max_new_tokens = "
          "the constrained length)", flush=True)
    ratio1, ratio1_jf, ratio_n, ratio_n_jf = overhead_section(lm, schemas, prompts, batch_prompts, args)

    # 2. forwards per token
    print("\n2. target forwards per output token, JSON output (outputs identical across the four variants)",
          flush=True)
    lm_ng = LanguageModel.from_pretrained(folder, drafter="ngram", max_batch_size=1, max_seq_len=640)
    default_prompts = {name: prompts_for(name, args.prompts, seed=30 + i, python=True)
                       for i, name in enumerate(schemas)}
    lm_mtp = LanguageModel.default(max_batch_size=1, max_seq_len=1024)
    results2 = {}
    for label, model, ps in (("random Qwen3, n-gram drafter", lm_ng, prompts),
                             ("default model (trained, byte tokenizer), MTP head", lm_mtp, default_prompts)):
        for name in schemas:
            model.generate(ps[name][0], MAX_NEW, json_schema=SCHEMAS[name])  # warm-up
        results2[label] = r = forwards_case(model, schemas, ps, args.repeats)
        print(f"  {label}: {r['tokens']} tokens over {len(schemas) * args.prompts} prompts, {r['forced']} of them "
              f"forced by the grammar")
        base = r["rows"]["token by token"]
        print(f"    {'':<27} {'forwards/token':>14} {'(fewer)':>8} {'ms/token':>9} {'(faster)':>8}")
        for row, (fpt, ms, acc) in r["rows"].items():
            extra = f"   mean accepted length {acc:.2f}" if acc else ""
            print(f"    {row:<27} {fpt:14.3f} {base[0] / fpt:7.2f}x {ms:9.2f} {base[1] / ms:7.2f}x{extra}", flush=True)
    lm_ng.close()
    lm_mtp.close()

    # 3. peers
    rng = results2["random Qwen3, n-gram drafter"]["rows"]
    mtp = results2["default model (trained, byte tokenizer), MTP head"]["rows"]
    summary = (f"structured output overhead constrained/free batch 1 {ratio1:.3f}, batch {args.batch} "
               f"{ratio_n:.3f} (goal < 1.10; jump-forward on {ratio1_jf:.2f} / {ratio_n_jf:.2f}); forwards/token "
               f"token-by-token -> jump-forward+speculation {rng['token by token'][0]:.2f} -> "
               f"{rng['jump-forward + speculation'][0]:.2f} (n-gram), {mtp['token by token'][0]:.2f} -> "
               f"{mtp['jump-forward + speculation'][0]:.2f} (MTP)")
    if not HAVE_XGRAMMAR:
        print("\n3. peers: skipped, xgrammar is not installed (pip install -e \".[peers]\")")
        print(f"headline: {summary}")
        lm.close()
        return
    print("\n3. peers: HF transformers generate + xgrammar LogitsProcessor, same weights, schemas and prompts "
          "(batch 1)", flush=True)
    engines = Engines(lm, folder, vocab, eos)
    with torch.inference_mode():
        hf.generate(torch.tensor([lm.encode(prompts[schemas[0]][0])]), max_new_tokens=8, do_sample=False,
                    pad_token_id=eos)
    r3 = peers(lm, hf, engines, schemas, prompts, args.repeats)
    t = r3["times"]
    print(f"  decode ms/token: ours {t['ours'] * 1e3:.2f} (jump-forward off), {t['ours_jf'] * 1e3:.2f} (on); "
          f"HF + xgrammar {t['hf_xgr'] * 1e3:.2f}; HF free (same lengths) {t['hf_free'] * 1e3:.2f}")
    print(f"  HF+xgrammar / ours: {t['hf_xgr'] / t['ours']:.2f}x (jump-forward off), "
          f"{t['hf_xgr'] / t['ours_jf']:.2f}x (on); xgrammar's overhead in HF: {t['hf_xgr'] / t['hf_free']:.3f}")
    same, valid, n = r3["same"], r3["valid"], r3["cases"]
    print(f"  greedy tokens identical to HF + xgrammar: {same['default']}/{n} with json_schema= (llguidance writes "
          f"forced text in the tokenizer's own tokens), {same['no_forcing']}/{n} with the schema as a no_forcing "
          f"grammar")
    for line in r3["diffs"]:
        print(f"    {line}")
    print(f"  the schemas with every bounded string as a pattern ^[a-z0-9 ]{{0,n}}$: {same['twin default']}/{n} "
          f"identical with json_schema=, {same['twin no_forcing']}/{n} as a no_forcing grammar")
    print(f"  outputs that are strict JSON (json.loads) valid under the schema: ours {valid['ours']}/{n}, "
          f"ours no_forcing {valid['no_forcing']}/{n}, HF + xgrammar {valid['hf_xgr']}/{n}")
    for key, c in r3["agree"].items():
        print(f"  masks along our {key} outputs, llguidance ({key}) vs xgrammar: {c['differ']} of {c['positions']} "
              f"positions differ: {c['forced']} forced text (llguidance one token, xgrammar other tokenizations "
              f"too), {c['string']} string characters only (control bytes, DEL, escapes), {c['other']} other")
    ll_m, ll_a, nf_m, nf_a, x_m, x_a = r3["cost"]
    print(f"  raw mask cost, {r3['replayed']} tokens of our outputs replayed (vocab {vocab}), us/token mask (with "
          f"the advance): llguidance {ll_m * 1e6:.1f} ({ll_a * 1e6:.1f}), llguidance no_forcing {nf_m * 1e6:.1f} "
          f"({nf_a * 1e6:.1f}), xgrammar {x_m * 1e6:.1f} ({x_a * 1e6:.1f}); llguidance/xgrammar {ll_m / x_m:.2f}x")
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"(load average at the end {load}; {time.perf_counter() - t_start:.0f} s)")
    print(f"headline: {summary}; HF+xgrammar/ours {t['hf_xgr'] / t['ours']:.2f}x; "
          f"mask us/token llguidance {ll_m * 1e6:.1f} xgrammar {x_m * 1e6:.1f}")
    lm.close()


if __name__ == "__main__":
    main()
