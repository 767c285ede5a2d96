#!/usr/bin/env python
"""A Qwen3-0.6B-shaped model on one GPU: ``LanguageModel`` against Hugging Face ``transformers`` on the same random
weights, in the same process, greedy: decode at batch 1 against the HBM floor, the output throughput of a batch of
32 and the time to first token of a 4,096-token prompt.

The model has Qwen3-0.6B's shape (28 layers, hidden 1024, 16 heads / 8 KV heads of 128, intermediate 3072, vocab
151,936, tied embeddings) and seeded random weights (norms near 1, projections ~1.5/sqrt(fan_in), so the logits are
varied rather than one repeated token), written once in ``--dtype`` as ``config.json`` + ``model.safetensors`` (the
names taken from this project's own module tree; no download, no tokenizer: the byte tokenizer serves token ids)
into ``--model-dir`` and reused from there. Ours is ``LanguageModel.from_pretrained(folder, device, dtype,
drafter=None)`` with prefix reuse off (every prompt prefilled in full, as HF does); HF is
``AutoModelForCausalLM.from_pretrained`` of the same folder on the same device (where transformers does not import
or predates Qwen3, ours runs alone and the JSON says why). Both decode greedily with ``min_new_tokens =
max_new_tokens``, so neither stops early.

- single stream: a 512-token prompt, 256 new tokens; decode tokens/s from the time stamps of the first and the last
  new token (ours: a ``GenerationListener``'s ``on_token``; HF: a streamer's ``put``). The HBM floor is the
  weights' bytes (every unique tensor, the tied embedding once: each decode step reads them all) over the device's
  memory bandwidth, measured with a large device-to-device copy (read + write bytes over time); the spec bandwidth
  of known GPUs is printed beside it. Goal: decode reaches >= 0.70 of the floor's tokens/s (measured bandwidth).
- batch: 32 prompts of 512 tokens, 128 new tokens each; output tokens/s over the whole call, prefill included
  (ours ``generate_batch``, HF batched ``generate`` with left padding and an attention mask). Goal: ours/HF >= 5.
- TTFT: a 4,096-token prompt, wall time of ``generate(prompt, 1)`` against HF ``generate(max_new_tokens=1)``.
  Goal: HF time / ours >= 1.0.

Each engine's first call of each figure (FlashInfer's JIT builds, CUDA-graph capture, cuBLAS set-up) is reported
apart; the steady figures are medians of ``--repeats`` runs after it, ours and HF interleaved. Every figure is
written to the ``--out`` JSON as soon as it is measured, so a run cut short keeps what ran; ``--budget`` skips what
would not end before the deadline and lists it under ``skipped``. Exit status 0, or 124 when the budget cut
something. ``--small`` is a tiny shape and workload that runs on the CPU in seconds (the test suite runs it).

    python benchmarks/gpu_vs_hf.py --device cuda
    python benchmarks/gpu_vs_hf.py --device cuda --budget 240 --out /tmp/gpu_vs_hf.json
    .venv/bin/python benchmarks/gpu_vs_hf.py --small --device cpu
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_env import code_version  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
GOAL_FLOOR_FRACTION = 0.70  # batch-1 decode tokens/s over the HBM floor's
GOAL_BATCH_RATIO = 5.0  # batch output tokens/s, ours / HF
GOAL_TTFT_RATIO = 1.0  # HF TTFT / ours
# HBM bandwidth in GB/s from the vendors' data sheets, matched in order against torch.cuda.get_device_name()
SPEC_BANDWIDTH_GBPS = [("H200", 4800.0), ("GH200", 4000.0), ("H100 NVL", 3900.0), ("H100 PCIe", 2000.0),
                       ("H100", 3350.0), ("B200", 8000.0), ("A100 80GB PCIe", 1935.0), ("A100-SXM4-80GB", 2039.0),
                       ("A100", 1555.0), ("L40S", 864.0), ("A10G", 600.0), ("A10", 600.0), ("L4", 300.0),
                       ("RTX 4090", 1008.0)]


@dataclass(frozen=True)
class Shape:
    """A Qwen3 geometry."""

    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    max_positions: int

    def config(self, dtype: torch.dtype) -> dict[str, Any]:
        """The HF ``config.json`` of this shape (tied embeddings, EOS the last id, no BOS)."""
        return {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": self.vocab,
                "hidden_size": self.hidden, "intermediate_size": self.intermediate,
                "num_hidden_layers": self.layers, "num_attention_heads": self.heads,
                "num_key_value_heads": self.kv_heads, "head_dim": self.head_dim,
                "max_position_embeddings": self.max_positions, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
                "hidden_act": "silu", "attention_bias": False, "tie_word_embeddings": True,
                "bos_token_id": None, "eos_token_id": self.vocab - 1, "pad_token_id": None,
                "torch_dtype": str(dtype).removeprefix("torch.")}


@dataclass(frozen=True)
class Workload:
    """Prompt lengths and new tokens of the three figures."""

    single_prompt_len: int
    single_new: int
    batch_size: int
    batch_prompt_len: int
    batch_new: int
    ttft_prompt_len: int
    repeats: int
    min_item_s: float  # an item starts only with this much of the budget left

    @property
    def max_seq_len(self) -> int:
        return max(self.single_prompt_len + self.single_new, self.batch_prompt_len + self.batch_new,
                   self.ttft_prompt_len + 1) + 64


QWEN3_0_6B = Shape("qwen3-0.6b", layers=28, hidden=1024, heads=16, kv_heads=8, head_dim=128, intermediate=3072,
                   vocab=151936, max_positions=40960)
SMALL = Shape("small", layers=2, hidden=64, heads=4, kv_heads=2, head_dim=16, intermediate=128, vocab=1000,
              max_positions=512)
FULL_WORK = Workload(512, 256, 32, 512, 128, 4096, repeats=5, min_item_s=20.0)
SMALL_WORK = Workload(24, 12, 4, 16, 8, 64, repeats=2, min_item_s=0.0)


# ------------------------------------------------------------------------------------------- the checkpoint
def build_checkpoint(folder: Path, shape: Shape, dtype: torch.dtype, device: torch.device, seed: int = 0) -> bool:
    """Write ``shape``'s random checkpoint into ``folder`` unless a complete one of the same config is there;
    returns whether it was built. Tensors are drawn on ``device`` (fast on a GPU) one at a time, named after this
    project's module tree (which uses HF's names), the tied ``lm_head`` left out; written to a sibling folder first
    and renamed, so a run cut short never leaves a half checkpoint to reuse."""
    from safetensors.torch import save_file

    from smile_llm.models.checkpoint.config import ModelConfig
    from smile_llm.models.transformer import Transformer

    cfg = shape.config(dtype)
    if (folder / "model.safetensors").is_file() and (folder / "config.json").is_file():
        try:
            if json.loads((folder / "config.json").read_text()) == cfg:
                return False
        except ValueError:
            pass
    with torch.device("meta"):
        names = {k: tuple(v.shape) for k, v in Transformer(ModelConfig.from_dict(cfg)).state_dict().items()}
    names.pop("lm_head.weight", None)  # tied to model.embed_tokens.weight
    gen = torch.Generator(device=device).manual_seed(seed)
    state = {}
    for name, size in names.items():
        noise = torch.randn(size, generator=gen, device=device)
        if len(size) == 1:  # the norms
            w = 1.0 + 0.2 * noise
        elif "embed_tokens" in name:
            w = 0.3 * noise
        else:
            w = noise * (1.5 / size[1] ** 0.5)
        state[name] = w.to(dtype).cpu().contiguous()
    tmp = folder.with_name(f"{folder.name}.part{os.getpid()}")
    tmp.mkdir(parents=True, exist_ok=True)
    save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    (tmp / "config.json").write_text(json.dumps(cfg, indent=2))
    if folder.exists():
        shutil.rmtree(folder)  # a checkpoint of another config
    tmp.rename(folder)
    return True


# ------------------------------------------------------------------------------------------- the results file
class Results:
    """The ``--out`` JSON, rewritten whole (a temporary file renamed over it) after every change."""

    def __init__(self, path: Path, head: dict[str, Any]) -> None:
        self.path = path
        self.data: dict[str, Any] = head | {"status": "running", "figures": {}, "skipped": []}
        self.budget_cut = False
        self.save()

    def figure(self, name: str, **fields: Any) -> dict[str, Any]:
        entry: dict[str, Any] = self.data["figures"].setdefault(name, {})
        entry.update(fields)
        return entry

    def skip(self, item: str, reason: str, *, budget: bool = False) -> None:
        self.data["skipped"].append({"item": item, "reason": reason})
        self.budget_cut |= budget
        print(f"  skipped {item}: {reason}", flush=True)
        self.save()

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(self.data, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)


class Budget:
    """Seconds from the start of the run within which every measurement must end (None: no limit)."""

    def __init__(self, seconds: float | None) -> None:
        self.deadline = None if seconds is None else time.perf_counter() + seconds

    def left(self) -> float:
        return float("inf") if self.deadline is None else self.deadline - time.perf_counter()

    def fits(self, seconds: float) -> bool:
        return seconds <= self.left()


# ------------------------------------------------------------------------------------------- the device
def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def copy_bandwidth(device: torch.device, nbytes: int, repeats: int = 10) -> float:
    """Bytes/s of ``dst.copy_(src)`` of ``nbytes`` on ``device`` (each copy reads and writes ``nbytes``), the
    median of ``repeats`` after one untimed copy."""
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=device).uniform_()
    dst = torch.empty_like(src)
    dst.copy_(src)
    sync(device)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        dst.copy_(src)
        sync(device)
        times.append(time.perf_counter() - t0)
    del src, dst
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return 2 * nbytes / statistics.median(times)


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    import platform

    return f"CPU ({platform.processor() or platform.machine()}, {os.cpu_count()} cores)"


def spec_bandwidth(name: str) -> float | None:
    """Data-sheet bytes/s of a known GPU named ``name`` (None for others and CPUs)."""
    for key, gbps in SPEC_BANDWIDTH_GBPS:
        if key in name:
            return gbps * 1e9
    return None


# ------------------------------------------------------------------------------------------- one call each
class TokenStamps:
    """When each token arrives: a ``GenerationListener`` for ours (``on_token``) and a streamer for HF (``put``:
    the prompt first, then one call per new token)."""

    def __init__(self) -> None:
        self.stamps: list[float] = []

    def on_token(self, token_id: int) -> None:
        self.stamps.append(time.perf_counter())

    def put(self, value: torch.Tensor) -> None:
        self.stamps.append(time.perf_counter())

    def end(self) -> None:
        pass

    def decode_tokens_per_s(self, first: int) -> float:
        """Tokens after the first new one (stamp ``first``) over the time from it to the last."""
        span = self.stamps[-1] - self.stamps[first]
        return (len(self.stamps) - 1 - first) / max(span, 1e-9)


class Engines:
    """The two engines on the same folder, each called the same way per figure; every call returns a dict with
    ``value`` (the figure) and ``wall_s``, plus the generated tokens."""

    def __init__(self, lm: Any, hf: Any, device: torch.device, eos: int) -> None:
        self.lm, self.hf, self.device, self.eos = lm, hf, device, eos

    def _timed(self, fn: Callable[[], Any]) -> tuple[Any, float]:
        sync(self.device)
        t0 = time.perf_counter()
        out = fn()
        sync(self.device)
        return out, time.perf_counter() - t0

    def _hf_generate(self, prompts: Sequence[list[int]], new: int, streamer: Any = None) -> list[list[int]]:
        width = max(len(p) for p in prompts)
        ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts], device=self.device)  # left padding
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=self.device)
        with torch.inference_mode():
            out = self.hf.generate(ids, attention_mask=mask, max_new_tokens=new, min_new_tokens=new,
                                   do_sample=False, pad_token_id=0, eos_token_id=self.eos, streamer=streamer)
        return [row[width:].tolist() for row in out]

    def single_ours(self, prompt: list[int], new: int) -> dict[str, Any]:
        from smile_llm.serving.listener import GenerationListener

        class Listener(TokenStamps, GenerationListener):
            pass

        clock = Listener()
        c, wall = self._timed(lambda: self.lm.generate(prompt, new, min_new_tokens=new, listener=clock))
        assert len(clock.stamps) == len(c.tokens), "on_token is called once per generated token"
        return {"value": clock.decode_tokens_per_s(0), "wall_s": wall, "tokens": c.tokens}

    def single_hf(self, prompt: list[int], new: int) -> dict[str, Any]:
        clock = TokenStamps()
        out, wall = self._timed(lambda: self._hf_generate([prompt], new, streamer=clock))
        return {"value": clock.decode_tokens_per_s(1), "wall_s": wall, "tokens": out[0]}

    def batch_ours(self, prompts: list[list[int]], new: int) -> dict[str, Any]:
        cs, wall = self._timed(lambda: self.lm.generate_batch(prompts, new, min_new_tokens=new))
        rows = [c.tokens for c in cs]
        return {"value": sum(map(len, rows)) / wall, "wall_s": wall, "tokens": rows}

    def batch_hf(self, prompts: list[list[int]], new: int) -> dict[str, Any]:
        rows, wall = self._timed(lambda: self._hf_generate(prompts, new))
        return {"value": sum(map(len, rows)) / wall, "wall_s": wall, "tokens": rows}

    def ttft_ours(self, prompt: list[int]) -> dict[str, Any]:
        c, wall = self._timed(lambda: self.lm.generate(prompt, 1, min_new_tokens=1))
        return {"value": wall, "wall_s": wall, "tokens": c.tokens}

    def ttft_hf(self, prompt: list[int]) -> dict[str, Any]:
        out, wall = self._timed(lambda: self._hf_generate([prompt], 1))
        return {"value": wall, "wall_s": wall, "tokens": out[0]}


# ------------------------------------------------------------------------------------------- one figure
def measure(res: Results, budget: Budget, name: str, unit: str, calls: dict[str, Callable[[], dict[str, Any]]],
            repeats: int, min_start_s: float) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """The first call of each engine, then up to ``repeats`` interleaved steady runs, each written to ``res`` as
    it ends; the next run starts only when the last one's time still fits the budget. Returns the figure's entry
    in ``res`` (``{engine: {"first", "runs", "median"}}``) and each engine's tokens of its last call, or None when
    the figure was skipped whole."""
    if not budget.fits(min_start_s):
        left = budget.left()
        res.skip(name, "the budget is spent" if left <= 0 else
                 f"{left:.0f} s of the budget left, it needs about {min_start_s:.0f} s", budget=True)
        return None
    entry = res.figure(name, unit=unit, **{e: {"first": None, "runs": [], "median": None} for e in calls})
    tokens: dict[str, Any] = {}
    t0 = time.perf_counter()
    for engine, call in calls.items():
        r = call()
        tokens[engine] = r.pop("tokens")
        entry[engine]["first"] = r
        print(f"  {name:8s} {engine:4s} first call: {r['value']:.4g} {unit} ({r['wall_s']:.2f} s)", flush=True)
        res.save()
    round_s = time.perf_counter() - t0
    for i in range(repeats):
        if not budget.fits(round_s):
            res.skip(f"{name} steady runs {i + 1}..{repeats}",
                     f"{budget.left():.0f} s of the budget left, a run takes {round_s:.0f} s", budget=True)
            break
        t0 = time.perf_counter()
        for engine, call in calls.items():
            r = call()
            tokens[engine] = r.pop("tokens")
            entry[engine]["runs"].append(r)
            entry[engine]["median"] = statistics.median(x["value"] for x in entry[engine]["runs"])
            res.save()
        round_s = time.perf_counter() - t0
    return entry, tokens


def steady(entry: dict[str, Any] | None, engine: str) -> float | None:
    """The median of the steady runs, or None when none ran."""
    if entry is None or engine not in entry:
        return None
    value = entry[engine]["median"]
    return None if value is None else float(value)


def agreement(ours: Sequence[int], theirs: Sequence[int]) -> dict[str, Any]:
    """Lengths and the common start of two token lists."""
    common = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), min(len(ours), len(theirs)))
    return {"ours_len": len(ours), "hf_len": len(theirs), "common_prefix": common}


def ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else a / b


def fmt(value: float | None, spec: str = ".1f") -> str:
    return "-" if value is None else format(value, spec)


def load_hf(folder: Path, device: torch.device, dtype: torch.dtype, res: Results) -> tuple[Any, str | None]:
    """HF's model of ``folder`` on ``device`` in ``dtype`` and the transformers version; (None, version) with the
    reason under ``skipped`` when transformers does not import or cannot load a Qwen3 (then ours runs alone)."""
    try:
        import transformers
        from transformers import AutoModelForCausalLM
        from transformers.utils import logging as hf_logging
    except ImportError as exc:
        res.skip("hf", f"transformers does not import ({exc}): ours only")
        return None, None
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    version = transformers.__version__
    major_minor = tuple(int(x) for x in version.split(".")[:2] if x.isdigit())
    dtype_kw = "dtype" if major_minor >= (4, 56) else "torch_dtype"  # the older name before 4.56
    try:
        hf: Any = AutoModelForCausalLM.from_pretrained(str(folder), **{dtype_kw: dtype})
    except (ValueError, KeyError, OSError) as exc:  # e.g. a transformers without Qwen3 (before 4.51)
        res.skip("hf", f"transformers {version} cannot load the checkpoint ({type(exc).__name__}: "
                       f"{str(exc)[:200]}): ours only")
        return None, version
    return hf.to(device=device, dtype=dtype).eval(), version


# ------------------------------------------------------------------------------------------- main
def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    p.add_argument("--dtype", choices=["bfloat16", "float16", "float32"], default=None,
                   help="weights and compute (default bfloat16 on CUDA, float32 elsewhere)")
    p.add_argument("--small", action="store_true",
                   help="a tiny shape (2 layers, hidden 64, vocab 1000) and workload: seconds on a CPU")
    p.add_argument("--repeats", type=int, default=None, help="steady runs after the first call (5; --small 2)")
    p.add_argument("--quick", action="store_true", help="2 steady runs")
    p.add_argument("--budget", type=float, default=None,
                   help="seconds from the start within which every measurement ends; what does not fit is skipped")
    p.add_argument("--model-dir", type=Path, default=None,
                   help="the checkpoint folder, built once and reused (default: under the temporary folder)")
    p.add_argument("--out", type=Path, default=RESULTS / "gpu_vs_hf.json", help="the JSON of every figure")
    args = p.parse_args(argv)
    if args.quick:
        args.repeats = 2
    if args.repeats is not None and args.repeats < 1:
        p.error("--repeats must be at least 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    start = time.perf_counter()
    budget = Budget(args.budget)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("gpu_vs_hf: torch sees no CUDA device (use --device cpu, with --small for a short run)")
    dtype = getattr(torch, args.dtype or ("bfloat16" if device.type == "cuda" else "float32"))
    dtype_name = str(dtype).removeprefix("torch.")
    shape, work = (SMALL, SMALL_WORK) if args.small else (QWEN3_0_6B, FULL_WORK)
    if args.repeats is not None:
        work = dataclasses.replace(work, repeats=args.repeats)
    folder = args.model_dir or (Path(tempfile.gettempdir()) / "smile_gpu_vs_hf"
                                / f"{shape.name}-{dtype_name}-{device.type}")
    name = device_name(device)
    res = Results(args.out, {
        "script": "gpu_vs_hf", "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "code_version": code_version(), "device": name, "torch": torch.__version__, "dtype": dtype_name,
        "shape": dataclasses.asdict(shape), "workload": dataclasses.asdict(work), "budget_s": args.budget,
        "model_dir": str(folder),
        "goals": {"decode_floor_fraction": GOAL_FLOOR_FRACTION, "batch_ours_over_hf": GOAL_BATCH_RATIO,
                  "ttft_hf_over_ours": GOAL_TTFT_RATIO}})
    try:
        built = build_checkpoint(folder, shape, dtype, device)
        big = 1 << (30 if device.type == "cuda" else 26)  # 1 GiB on a GPU, 64 MiB on a CPU
        copy_bps = copy_bandwidth(device, big)
        spec_bps = spec_bandwidth(name) if device.type == "cuda" else None
        res.data["bandwidth"] = {"copy_bytes_per_s": copy_bps, "spec_bytes_per_s": spec_bps,
                                 "copy_size_bytes": big}
        from smile_llm import LanguageModel

        t0 = time.perf_counter()
        lm = LanguageModel.from_pretrained(folder, device=device, dtype=dtype, drafter=None,
                                           max_batch_size=work.batch_size, max_seq_len=work.max_seq_len)
        lm.pool.prefix_reuse_enabled = False  # every prompt prefilled in full, as HF does
        ours_load_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        hf, hf_version = load_hf(folder, device, dtype, res)
        hf_load_s = time.perf_counter() - t0 if hf is not None else None
        weights_bytes = sum(p.numel() * p.element_size() for p in lm.transformer.parameters())  # unique tensors
        graphs = getattr(lm.runner, "decode_graphs", None) is not None
        res.data.update({"transformers": hf_version, "checkpoint_built": built, "weights_bytes": weights_bytes,
                         "load_s": {"ours": ours_load_s, "hf": hf_load_s}, "attention_backend": lm.backend.name,
                         "cuda_graphs": graphs,
                         "hf_attention": getattr(getattr(hf, "config", None), "_attn_implementation", None)})
        res.save()
        print(f"gpu_vs_hf: {name}; random Qwen3 of {shape.name}'s shape "
              f"({weights_bytes / dtype.itemsize / 1e6:.3g}M parameters, {shape.layers} layers, hidden "
              f"{shape.hidden}, {shape.heads}/{shape.kv_heads} heads of {shape.head_dim}, vocab {shape.vocab}), "
              f"{dtype_name}; ours on {lm.backend.name}{' with CUDA graphs' if graphs else ''}, HF "
              f"{hf_version or 'absent'}; torch {torch.__version__}; code {code_version()}; checkpoint "
              f"{'built' if built else 'reused'} in {folder}; load average "
              f"{', '.join(f'{x:.1f}' for x in os.getloadavg())}", flush=True)
        print(f"  weights {weights_bytes / 1e9:.3f} GB; copy bandwidth {copy_bps / 1e9:.0f} GB/s (spec "
              f"{fmt(spec_bps and spec_bps / 1e9, '.0f')} GB/s): HBM floor {copy_bps / weights_bytes:.0f} "
              f"tokens/s at batch 1; loads: ours {ours_load_s:.1f} s, HF {fmt(hf_load_s, '.1f')} s; "
              f"{time.perf_counter() - start:.0f} s so far", flush=True)
        try:
            run_figures(res, budget, Engines(lm, hf, device, shape.vocab - 1), work, shape.vocab)
        finally:
            lm.close()
    except BaseException as exc:
        res.data["status"] = ("interrupted" if isinstance(exc, KeyboardInterrupt)
                              else f"failed: {type(exc).__name__}: {str(exc)[:300]}")
        res.save()
        raise
    res.data["status"] = "partial" if res.budget_cut else "complete"
    res.data["elapsed_s"] = time.perf_counter() - start
    res.save()
    report(res.data, work, res.path)
    return 124 if res.budget_cut else 0


def run_figures(res: Results, budget: Budget, eng: Engines, work: Workload, vocab: int) -> None:
    """The three figures in turn, each with its derived values (ratios, the floor, token agreement)."""
    gen = torch.Generator().manual_seed(1)

    def prompt(n: int) -> list[int]:
        return torch.randint(0, vocab - 1, (n,), generator=gen).tolist()  # never the EOS id (vocab - 1)

    def calls(ours: Callable[[], dict[str, Any]], theirs: Callable[[], dict[str, Any]]
              ) -> dict[str, Callable[[], dict[str, Any]]]:
        return {"ours": ours} | ({"hf": theirs} if eng.hf is not None else {})

    p1 = prompt(work.single_prompt_len)
    single = measure(res, budget, "single", "tokens/s",
                     calls(lambda: eng.single_ours(p1, work.single_new), lambda: eng.single_hf(p1, work.single_new)),
                     work.repeats, work.min_item_s)
    if single is not None:
        entry, toks = single
        decode, weights_bytes = steady(entry, "ours"), res.data["weights_bytes"]
        spec_bps = res.data["bandwidth"]["spec_bytes_per_s"]
        floor = res.data["bandwidth"]["copy_bytes_per_s"] / weights_bytes
        entry.update(floor_tokens_per_s=floor, floor_fraction=ratio(decode, floor),
                     spec_floor_fraction=ratio(decode, spec_bps and spec_bps / weights_bytes),
                     ours_over_hf=ratio(decode, steady(entry, "hf")), prompt=p1, tokens=toks)
        if "hf" in toks:
            entry["agreement"] = agreement(toks["ours"], toks["hf"])
        res.save()
    pb = [prompt(work.batch_prompt_len) for _ in range(work.batch_size)]
    batch = measure(res, budget, "batch", "tokens/s",
                    calls(lambda: eng.batch_ours(pb, work.batch_new), lambda: eng.batch_hf(pb, work.batch_new)),
                    work.repeats, work.min_item_s)
    if batch is not None:
        entry, toks = batch
        entry["ours_over_hf"] = ratio(steady(entry, "ours"), steady(entry, "hf"))
        entry["ours_lens"] = [len(r) for r in toks["ours"]]
        if "hf" in toks:
            entry["hf_lens"] = [len(r) for r in toks["hf"]]
            entry["rows_identical"] = sum(a == b for a, b in zip(toks["ours"], toks["hf"]))
            entry["first_tokens_equal"] = sum(a[:1] == b[:1] for a, b in zip(toks["ours"], toks["hf"]))
        res.save()
    pt = prompt(work.ttft_prompt_len)
    ttft = measure(res, budget, "ttft", "s", calls(lambda: eng.ttft_ours(pt), lambda: eng.ttft_hf(pt)),
                   work.repeats, work.min_item_s)
    if ttft is not None:
        entry, toks = ttft
        entry.update(hf_over_ours=ratio(steady(entry, "hf"), steady(entry, "ours")), tokens=toks)
        res.save()


def report(data: dict[str, Any], work: Workload, out: Path) -> None:
    """The table of steady figures, the first calls, the goals and the ``headline:`` line."""
    figs = data["figures"]
    single, batch, ttft = figs.get("single"), figs.get("batch"), figs.get("ttft")

    def first(entry: dict[str, Any] | None, engine: str) -> str:
        f = entry and entry.get(engine, {}).get("first")
        return "-" if not f else f"{f['wall_s']:.2f} s"

    def met(value: float | None, goal: float) -> str:
        return "not measured" if value is None else ("met" if value >= goal else "missed")

    decode, fraction = steady(single, "ours"), single and single.get("floor_fraction")
    batch_ratio, ttft_ratio = batch and batch.get("ours_over_hf"), ttft and ttft.get("hf_over_ours")
    ttft_ours, ttft_hf = steady(ttft, "ours"), steady(ttft, "hf")
    print(f"\nsteady figures, medians of up to {work.repeats} runs after the first call "
          f"({data['device']}, {data['dtype']}):")
    print(f"{'figure':34s} {'ours':>10s} {'HF':>10s} {'ratio':>8s}  goal")
    print(f"{f'decode, batch 1 (tokens/s)':34s} {fmt(decode):>10s} {fmt(steady(single, 'hf')):>10s} "
          f"{fmt(single and single.get('ours_over_hf'), '.2f'):>7s}x  decode >= {GOAL_FLOOR_FRACTION:.2f} of the "
          f"HBM floor ({fmt(single and single.get('floor_tokens_per_s'), '.0f')} tokens/s): "
          f"{fmt(fraction, '.3g')}, {met(fraction, GOAL_FLOOR_FRACTION)}")
    print(f"{f'batch {work.batch_size} x {work.batch_new} new (tokens/s)':34s} {fmt(steady(batch, 'ours')):>10s} "
          f"{fmt(steady(batch, 'hf')):>10s} {fmt(batch_ratio, '.2f'):>7s}x  ours/HF >= {GOAL_BATCH_RATIO:.0f}x: "
          f"{met(batch_ratio, GOAL_BATCH_RATIO)}")
    print(f"{f'TTFT, {work.ttft_prompt_len}-token prompt (ms)':34s} {fmt(ttft_ours and ttft_ours * 1e3):>10s} "
          f"{fmt(ttft_hf and ttft_hf * 1e3):>10s} {fmt(ttft_ratio, '.2f'):>7s}x  HF/ours >= {GOAL_TTFT_RATIO:.1f}x: "
          f"{met(ttft_ratio, GOAL_TTFT_RATIO)}")
    print("first calls (JIT builds, graph capture), wall: " + "; ".join(
        f"{label} ours {first(e, 'ours')}, HF {first(e, 'hf')}"
        for label, e in (("decode", single), ("batch", batch), ("TTFT", ttft))))
    if single and "agreement" in single:
        a = single["agreement"]
        print(f"greedy tokens, batch 1: {a['ours_len']} ours, {a['hf_len']} HF, the first {a['common_prefix']} "
              f"identical; batch: {batch and batch.get('rows_identical', '-')} of {work.batch_size} rows "
              f"identical (random weights in {data['dtype']}: near-ties may part the two, so not asserted)")
    for s in data["skipped"]:
        print(f"skipped {s['item']}: {s['reason']}")
    print(f"(JSON {out}: {data.get('status')}, {data.get('elapsed_s', 0):.0f} s)")
    print(f"headline: {data['shape']['name']} {data['dtype']} on {data['device']}: decode b1 {fmt(decode, '.0f')} "
          f"tok/s = {fmt(fraction, '.3g')} of HBM floor (goal >= {GOAL_FLOOR_FRACTION:.2f}), batch "
          f"{work.batch_size} ours/HF {fmt(batch_ratio, '.2f')}x (goal >= {GOAL_BATCH_RATIO:.0f}x), TTFT "
          f"{work.ttft_prompt_len} HF/ours {fmt(ttft_ratio, '.2f')}x (goal >= {GOAL_TTFT_RATIO:.1f}x)"
          + ("; partial (budget)" if data.get("status") == "partial" else ""))


if __name__ == "__main__":
    raise SystemExit(main())
