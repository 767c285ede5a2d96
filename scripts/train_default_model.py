#!/usr/bin/env python3
"""Train the small default models shipped in ``smile_llm/models/default/`` and ``smile_llm/models/default_hybrid/``.

A byte-level Qwen3-architecture model (``--arch dense``, the default) or a hybrid Qwen3.5 model (``--arch hybrid``:
Gated DeltaNet and gated full-attention layers, modules in ``hybrid_train_modules.py``), each with a 1-layer MTP
(multi-token prediction) head, trained on CPU on the Python standard library's own ``.py`` sources. Parameters are saved with Hugging Face Qwen3 names (the MTP head
under ``mtp.*``, Qwen3-Next style), so ``transformers.Qwen3ForCausalLM`` can load the main model and the
project's own loader can load both.

Reproducible with ``--seed`` (with ``--steps`` the run is fully determined; with ``--minutes`` the number of
steps depends on the machine's speed).

Example::

    python scripts/train_default_model.py --minutes 40 --threads 1 --seed 1234
    python scripts/train_default_model.py --arch hybrid --minutes 40 --threads 1 --seed 1234
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import sysconfig
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

EOS = 256
VOCAB = 257
REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO / "smile_llm" / "model" / "default"
HYBRID_OUT = REPO / "smile_llm" / "model" / "default_hybrid"
sys.path.insert(0, str(Path(__file__).resolve().parent))
from hybrid_train_modules import MLP, HybridWithMTP, MtpForwards, hybrid_hf_config, init_hybrid_weights  # noqa: E402
EXCLUDED_DIRS = {"site-packages", "test", "tests", "idlelib", "lib2to3"}


# --------------------------------------------------------------------------------------------------------------
# Corpus
# --------------------------------------------------------------------------------------------------------------
def stdlib_files() -> list[Path]:
    root = Path(sysconfig.get_paths()["stdlib"])
    files = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in EXCLUDED_DIRS and d != "__pycache__")
        for name in filenames:
            if name.endswith(".py"):
                files.append(Path(dirpath) / name)
    files.sort(key=lambda p: str(p.relative_to(root)))
    return files


def build_corpus(holdout_every: int):
    root = Path(sysconfig.get_paths()["stdlib"])
    files = stdlib_files()
    train_parts, held_parts = [], []
    n_train = n_held = 0
    for i, path in enumerate(files):
        data = np.frombuffer(path.read_bytes(), dtype=np.uint8).astype(np.int16)
        part = np.concatenate([data, np.array([EOS], dtype=np.int16)])
        if i % holdout_every == holdout_every - 1:
            held_parts.append(part)
            n_held += 1
        else:
            train_parts.append(part)
            n_train += 1
    train = torch.from_numpy(np.concatenate(train_parts).astype(np.int64))
    held = torch.from_numpy(np.concatenate(held_parts).astype(np.int64))
    info = {
        "python_version": sys.version.split()[0],
        "stdlib_root": str(root),
        "files": len(files),
        "train_files": n_train,
        "heldout_files": n_held,
        "train_tokens": int(train.numel()),
        "heldout_tokens": int(held.numel()),
        "bytes": int(train.numel() + held.numel() - len(files)),
    }
    return train, held, info


# --------------------------------------------------------------------------------------------------------------
# Model (Qwen3 architecture; module names match the HF state dict)
# --------------------------------------------------------------------------------------------------------------
class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float):
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    freqs = positions.float()[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


class Attention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        d, hd = cfg["hidden_size"], cfg["head_dim"]
        self.nh, self.nkv, self.hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], hd
        self.q_proj = nn.Linear(d, self.nh * hd, bias=False)
        self.k_proj = nn.Linear(d, self.nkv * hd, bias=False)
        self.v_proj = nn.Linear(d, self.nkv * hd, bias=False)
        self.o_proj = nn.Linear(self.nh * hd, d, bias=False)
        self.q_norm = RMSNorm(hd, cfg["rms_norm_eps"])
        self.k_norm = RMSNorm(hd, cfg["rms_norm_eps"])

    def forward(self, x, cos, sin):
        b, s, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(b, s, self.nh, self.hd)).transpose(1, 2)
        k = self.k_norm(self.k_proj(x).view(b, s, self.nkv, self.hd)).transpose(1, 2)
        v = self.v_proj(x).view(b, s, self.nkv, self.hd).transpose(1, 2)
        cos, sin = cos.to(q.dtype), sin.to(q.dtype)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        rep = self.nh // self.nkv
        if rep > 1:  # HF repeat_kv: each kv head serves `rep` consecutive query heads
            k = k.repeat_interleave(rep, dim=1)
            v = v.repeat_interleave(rep, dim=1)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(o.transpose(1, 2).reshape(b, s, self.nh * self.hd))


class DecoderLayer(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg["hidden_size"], cfg["rms_norm_eps"])
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg["hidden_size"], cfg["rms_norm_eps"])
        self.mlp = MLP(cfg)

    def forward(self, x, cos, sin):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class Qwen3Body(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg["vocab_size"], cfg["hidden_size"])
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg["num_hidden_layers"]))
        self.norm = RMSNorm(cfg["hidden_size"], cfg["rms_norm_eps"])


class MTPHead(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        d = cfg["hidden_size"]
        self.pre_fc_norm_embedding = RMSNorm(d, cfg["rms_norm_eps"])
        self.pre_fc_norm_hidden = RMSNorm(d, cfg["rms_norm_eps"])
        self.fc = nn.Linear(2 * d, d, bias=False)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg["mtp_num_hidden_layers"]))
        self.norm = RMSNorm(d, cfg["rms_norm_eps"])


class Qwen3WithMTP(MtpForwards, nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.model = Qwen3Body(cfg)
        self.mtp = MTPHead(cfg)

    def _rope(self, start: int, length: int):
        pos = torch.arange(start, start + length)
        return rope_cos_sin(pos, self.cfg["head_dim"], self.cfg["rope_theta"])


def init_weights(model: Qwen3WithMTP, n_layers: int):
    std = 0.02
    for name, p in model.named_parameters():
        if p.dim() == 1:
            continue  # norms start at one
        if name.endswith("o_proj.weight") or name.endswith("down_proj.weight"):
            nn.init.normal_(p, std=std / math.sqrt(2 * n_layers))
        else:
            nn.init.normal_(p, std=std)


def hf_config(args) -> dict:
    return {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "vocab_size": VOCAB,
        "hidden_size": args.hidden,
        "intermediate_size": args.intermediate,
        "num_hidden_layers": args.layers,
        "num_attention_heads": args.heads,
        "num_key_value_heads": args.kv_heads,
        "head_dim": args.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": 2048,
        "initializer_range": 0.02,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "rope_scaling": None,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "use_cache": True,
        "use_sliding_window": False,
        "sliding_window": None,
        "max_window_layers": args.layers,
        "tie_word_embeddings": True,
        "torch_dtype": "float32",
        "bos_token_id": EOS,
        "eos_token_id": EOS,
        "mtp_num_hidden_layers": 1,
        "speculative_config": {"num_speculative_tokens": 3},
    }


# --------------------------------------------------------------------------------------------------------------
# Training helpers
# --------------------------------------------------------------------------------------------------------------
def sample_windows(data: torch.Tensor, batch: int, length: int, gen: torch.Generator):
    starts = torch.randint(0, data.numel() - length, (batch,), generator=gen)
    return torch.stack([data[s:s + length] for s in starts.tolist()])


def fixed_windows(data: torch.Tensor, count: int, length: int):
    stride = max(1, (data.numel() - length) // count)
    return torch.stack([data[i * stride:i * stride + length] for i in range(count)])


def losses(model, win, autocast: bool):
    """win: [B, L+3]. Returns (main CE, MTP1 CE, MTP2 CE) in nats."""
    L = win.shape[1] - 3
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        h, logits = model.forward_main(win[:, :L])
        m1, lg1 = model.forward_mtp(h, win[:, 1:L + 1], 1)
        _, lg2 = model.forward_mtp(m1, win[:, 2:L + 2], 2)
    ce = lambda lg, tgt: F.cross_entropy(lg.float().reshape(-1, VOCAB), tgt.reshape(-1))
    return ce(logits, win[:, 1:L + 1]), ce(lg1, win[:, 2:L + 2]), ce(lg2, win[:, 3:L + 3])


@torch.no_grad()
def evaluate(model, windows, batch: int, autocast: bool = False):
    model.eval()
    tot = [0.0, 0.0, 0.0]
    n = 0
    for i in range(0, windows.shape[0], batch):
        w = windows[i:i + batch]
        out = losses(model, w, autocast)
        for j in range(3):
            tot[j] += out[j].item() * w.shape[0]
        n += w.shape[0]
    model.train()
    return [t / n / math.log(2) for t in tot]  # bits per byte


@torch.no_grad()
def mtp_agreement(model, windows, batch: int):
    """Teacher-forced draft quality on held-out windows (float32)."""
    model.eval()
    c = dict(n1=0, agree1=0, acc1=0, n2=0, agree2=0, acc2=0, main_acc=0)
    for i in range(0, windows.shape[0], batch):
        w = windows[i:i + batch]
        L = w.shape[1] - 3
        h, logits = model.forward_main(w[:, :L])
        m1, lg1 = model.forward_mtp(h, w[:, 1:L + 1], 1)
        _, lg2 = model.forward_mtp(m1, w[:, 2:L + 2], 2)
        g = logits.argmax(-1)            # main greedy for token t+1 at position t
        d1 = lg1.argmax(-1)              # draft for token t+2 from position t
        d2 = lg2.argmax(-1)              # chained draft for token t+3 from position t
        c["main_acc"] += (g == w[:, 1:L + 1]).sum().item()
        # main greedy for token t+2 is g at position t+1
        c["agree1"] += (d1[:, :L - 1] == g[:, 1:]).sum().item()
        c["acc1"] += (d1 == w[:, 2:L + 2]).sum().item()
        c["n1"] += d1[:, :L - 1].numel()
        c["agree2"] += (d2[:, :L - 2] == g[:, 2:]).sum().item()
        c["acc2"] += (d2 == w[:, 3:L + 3]).sum().item()
        c["n2"] += d2[:, :L - 2].numel()
    model.train()
    n_all = windows.shape[0] * (windows.shape[1] - 3)
    return {
        "main_next_byte_accuracy": c["main_acc"] / n_all,
        "mtp1_agreement_with_main_greedy": c["agree1"] / c["n1"],
        "mtp1_accuracy_vs_true": c["acc1"] / n_all,
        "mtp2_chained_agreement_with_main_greedy": c["agree2"] / c["n2"],
        "mtp2_chained_accuracy_vs_true": c["acc2"] / n_all,
    }


@torch.no_grad()
def greedy_sample(model, prompt: str, n: int) -> str:
    model.eval()
    ids = list(prompt.encode("utf-8"))
    out = []
    for _ in range(n):
        _, logits = model.forward_main(torch.tensor([ids]))
        nxt = int(logits[0, -1].argmax())
        if nxt == EOS:
            break
        ids.append(nxt)
        out.append(nxt)
    model.train()
    return prompt + bytes(out).decode("utf-8", errors="replace")


def lr_at(progress: float, step: int, args) -> float:
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    p = min(1.0, max(0.0, progress))
    return args.lr * (args.min_lr_frac + (1 - args.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * p)))


def save_outputs(model, cfg, out: Path):
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().float().contiguous().clone() for k, v in model.state_dict().items()}
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    os.chmod(out / "model.safetensors", 0o644)
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    tok = {"type": "byte", "vocab_size": VOCAB, "eos_token": "<|endoftext|>", "eos_token_id": EOS,
           "bos_token_id": EOS}
    (out / "smile_tokenizer.json").write_text(json.dumps(tok, indent=2) + "\n")


def plot_curve(history, evals, path: Path, arch: str = "Qwen3"):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    if history:
        steps = [h[0] for h in history]
        bpb = [h[1] / math.log(2) for h in history]
        k = max(1, len(bpb) // 100)
        smooth = [sum(bpb[max(0, i - k):i + 1]) / len(bpb[max(0, i - k):i + 1]) for i in range(len(bpb))]
        ax.plot(steps, bpb, alpha=0.25, color="tab:blue")
        ax.plot(steps, smooth, color="tab:blue", label="train (main head), bits/byte")
    if evals:
        ax.plot([e[0] for e in evals], [e[1] for e in evals], "o-", color="tab:red",
                label="held-out (main head), bits/byte")
        ax.plot([e[0] for e in evals], [e[2] for e in evals], "s--", color="tab:orange",
                label="held-out MTP1 (t+2), bits/byte")
        ax.plot([e[0] for e in evals], [e[3] for e in evals], "^:", color="tab:green",
                label="held-out MTP2 chained (t+3), bits/byte")
    ax.set_xlabel("step")
    ax.set_ylabel("bits per byte")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend()
    ax.set_title(f"smile_llm default model (byte-level {arch} + MTP) on the Python stdlib")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def hf_check(model, out: Path, windows, hybrid: bool = False) -> dict:
    """Load the saved folder with transformers (Qwen3ForCausalLM, or Qwen3_5ForCausalLM for the hybrid model) and
    compare logits."""
    try:
        import transformers
        from transformers import Qwen3ForCausalLM
        if hybrid:
            from transformers import Qwen3_5ForCausalLM as Qwen3ForCausalLM  # noqa: N814
    except Exception as exc:  # pragma: no cover
        return {"ok": False, "error": f"transformers unavailable: {exc}"}
    hf, info = Qwen3ForCausalLM.from_pretrained(str(out), torch_dtype=torch.float32, output_loading_info=True,
                                                attn_implementation="eager")
    hf.eval()
    ids = windows[:2, :200]
    with torch.no_grad():
        ref = model.forward_main(ids)[1]
        got = hf(input_ids=ids).logits
    diff = (ref - got).abs().max().item()
    missing = [k for k in info.get("missing_keys", []) if k != "lm_head.weight"]
    return {"transformers": transformers.__version__, "missing_keys": list(info.get("missing_keys", [])),
            "unexpected_keys_count": len(info.get("unexpected_keys", [])),
            "unexpected_non_mtp": [k for k in info.get("unexpected_keys", []) if not k.startswith("mtp.")],
            "max_abs_logit_diff": diff, "ok": (not missing) and diff < 1e-4}


# --------------------------------------------------------------------------------------------------------------
def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", choices=("dense", "hybrid"), default="dense")
    ap.add_argument("--out", type=Path, default=None, help="default: smile_llm/models/default[_hybrid]")
    ap.add_argument("--full-every", type=int, default=4, help="hybrid: every Nth layer is full attention")
    ap.add_argument("--linear-heads", type=int, default=4, help="hybrid: DeltaNet key (= value) heads")
    ap.add_argument("--linear-head-dim", type=int, default=32, help="hybrid: DeltaNet head dim")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--minutes", type=float, default=40.0, help="wall-clock training budget")
    ap.add_argument("--steps", type=int, default=0, help="fixed step count (overrides --minutes for the schedule)")
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--head-dim", type=int, default=32)
    ap.add_argument("--intermediate", type=int, default=384)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--min-lr-frac", type=float, default=0.1)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--mtp1-weight", type=float, default=0.5)
    ap.add_argument("--mtp2-weight", type=float, default=0.25)
    ap.add_argument("--bf16", action="store_true", help="bf16 autocast for training forward/backward")
    ap.add_argument("--holdout-every", type=int, default=50)
    ap.add_argument("--eval-every-s", type=float, default=150.0)
    ap.add_argument("--eval-windows", type=int, default=64)
    ap.add_argument("--final-eval-windows", type=int, default=256)
    ap.add_argument("--bench", type=int, default=0, help="only time N steps (fp32 and bf16) and exit")
    args = ap.parse_args(argv)
    hybrid = args.arch == "hybrid"
    if args.out is None:
        args.out = HYBRID_OUT if hybrid else DEFAULT_OUT

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    t_start = time.time()

    train, held, corpus = build_corpus(args.holdout_every)
    print(f"corpus: {json.dumps(corpus)}", flush=True)

    if hybrid:
        cfg = hybrid_hf_config(hf_config(args), args)
        model = HybridWithMTP(cfg)
        init_hybrid_weights(model, args.layers)
    else:
        cfg = hf_config(args)
        model = Qwen3WithMTP(cfg)
        init_weights(model, args.layers)
    n_params = sum(p.numel() for p in model.parameters())
    n_mtp = sum(p.numel() for p in model.mtp.parameters())
    print(f"params: total {n_params:,} (main {n_params - n_mtp:,}, mtp {n_mtp:,})", flush=True)

    L = args.seq_len + 3
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=args.lr, betas=(0.9, 0.95), eps=1e-8)

    if args.bench:
        for ac in (False, True):
            for i in range(args.bench + 1):
                if i == 1:
                    t0 = time.time()
                w = sample_windows(train, args.batch, L, gen)
                l0, l1, l2 = losses(model, w, ac)
                (l0 + args.mtp1_weight * l1 + args.mtp2_weight * l2).backward()
                opt.zero_grad(set_to_none=True)
            dt = (time.time() - t0) / args.bench
            print(f"bench bf16={ac}: {dt:.3f} s/step, {args.batch * args.seq_len / dt:,.0f} tok/s", flush=True)
        return

    eval_w = fixed_windows(held, args.eval_windows, L)
    budget = args.minutes * 60.0
    history, evals = [], []
    step = 0
    t_train = time.time()
    last_eval = t_train
    last_log = t_train
    eval_time = 0.0
    while True:
        elapsed = time.time() - t_train - eval_time
        if args.steps:
            if step >= args.steps:
                break
            progress = step / args.steps
        else:
            if elapsed >= budget:
                break
            progress = elapsed / budget
        lr = lr_at(progress, step, args)
        for g in opt.param_groups:
            g["lr"] = lr
        w = sample_windows(train, args.batch, L, gen)
        l0, l1, l2 = losses(model, w, args.bf16)
        loss = l0 + args.mtp1_weight * l1 + args.mtp2_weight * l2
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        history.append((step, l0.item(), l1.item(), l2.item()))
        now = time.time()
        if now - last_log >= 30 or step == 1:
            toks = step * args.batch * args.seq_len
            print(f"step {step} t={now - t_train:.0f}s lr={lr:.2e} loss main={l0.item():.3f} "
                  f"mtp1={l1.item():.3f} mtp2={l2.item():.3f} gnorm={gnorm:.2f} tokens={toks:,} "
                  f"({toks / (now - t_train - eval_time):,.0f} tok/s)", flush=True)
            last_log = now
        if now - last_eval >= args.eval_every_s:
            te = time.time()
            bpb = evaluate(model, eval_w, 16)
            eval_time += time.time() - te
            evals.append((step, *bpb))
            print(f"eval step {step}: held-out bpb main={bpb[0]:.4f} mtp1={bpb[1]:.4f} mtp2={bpb[2]:.4f}",
                  flush=True)
            last_eval = time.time()
            plot_curve(history, evals, Path("/tmp/train_default_loss_curve.png"))

    train_wall = time.time() - t_train
    tokens = step * args.batch * args.seq_len
    print(f"training done: {step} steps, {tokens:,} tokens, {train_wall:.0f}s", flush=True)

    model.eval()
    final_w = fixed_windows(held, args.final_eval_windows, L)
    bpb = evaluate(model, final_w, 16)
    evals.append((step, *bpb))
    agree = mtp_agreement(model, final_w, 16)
    print(f"final held-out bpb: main={bpb[0]:.4f} mtp1={bpb[1]:.4f} mtp2={bpb[2]:.4f}", flush=True)
    print(f"final agreement: {json.dumps(agree)}", flush=True)

    out = args.out
    save_outputs(model, cfg, out)
    plot_curve(history, evals, out / "loss_curve.png", "hybrid Qwen3.5" if hybrid else "Qwen3")
    samples = {p: greedy_sample(model, p, 200) for p in ("def ", "import os\n")}
    for p, s in samples.items():
        print(f"sample {p!r}: {s!r}", flush=True)
    check = hf_check(model, out, final_w, hybrid)
    print(f"hf check: {json.dumps(check)}", flush=True)

    cmd = "python scripts/train_default_model.py " + " ".join(sys.argv[1:] if argv is None else argv)
    total_wall = time.time() - t_start
    size = (out / "model.safetensors").stat().st_size
    fence = "```"
    if hybrid:
        types = cfg["layer_types"]
        pattern = "".join("L" if t == "linear_attention" else "F" for t in types)
        num_full = types.count("full_attention")
        head = f"""# Default hybrid model (`LanguageModel.default(kind="hybrid")`)

A small byte-level hybrid Qwen3.5 model (Gated DeltaNet and gated full-attention layers) with a 1-layer MTP
(multi-token prediction) head, trained on CPU by `scripts/train_default_model.py --arch hybrid`. It writes
Python-like text; it is a demo and test model for the hybrid serving path (DeltaNet state pool, state snapshots for
prefix reuse, MTP speculation with state rewind), not a useful assistant.

## Files

- `config.json`: a Hugging Face Qwen3.5 text config (`model_type` `qwen3_5_text`, `Qwen3_5ForCausalLM`) plus
  `mtp_num_hidden_layers: 1` and `speculative_config.num_speculative_tokens: 3`.
- `smile_tokenizer.json`: the byte tokenizer (ids 0..255 are bytes, 256 is `<|endoftext|>`, used as bos and eos).
- `model.safetensors`: float32 weights, Hugging Face Qwen3.5 names (`model.*`; `lm_head` is tied to
  `model.embed_tokens`, so it is not stored) and the MTP head under `mtp.*` (`pre_fc_norm_embedding`,
  `pre_fc_norm_hidden`, `fc` [hidden, 2*hidden], `layers.0.*` a gated full-attention layer, `norm`). {{size:,}} bytes.
- `loss_curve.png`: training loss and held-out bits per byte against the step.

## Architecture

hidden {args.hidden}, {args.layers} layers `{pattern}` (L: Gated
DeltaNet, F: gated full attention), SwiGLU MLP {args.intermediate}, zero-centred RMSNorms (eps 1e-6), tied
embeddings, vocabulary 257. Full attention: {args.heads} query heads / {args.kv_heads} kv heads of dim {args.head_dim},
a sigmoid output gate, q/k norms, RoPE theta 10000 on the first quarter of each head. Gated DeltaNet:
{args.linear_heads} key and value heads of dim {args.linear_head_dim}, causal conv of width 4 over q/k/v, L2-normalised
q/k, decay from `A_log`/`dt_bias`, gated RMSNorm with `z`. Parameters: {{n_params:,}} ({{n_params - n_mtp:,}} main,
{{n_mtp:,}} MTP head). Per request the DeltaNet state is fixed-size; only the {num_full} full-attention
layers keep KV.

MTP head: as in the dense default model (`fc` over the normed next-token embedding and the normed pre-norm hidden
state, one decoder layer, here gated full attention, `mtp.norm`, the shared lm_head), trained on the
next-next-token loss (weight {args.mtp1_weight}) and chained on its own output (weight {args.mtp2_weight}).

"""
    else:
        head = f"""# Default model (`LanguageModel.default()`)

A small byte-level model with the Qwen3 architecture and a 1-layer MTP (multi-token prediction) head, trained on
CPU by `scripts/train_default_model.py`. It writes Python-like text; it is a demo and test model, not a useful
assistant.

## Files

- `config.json`: a Hugging Face Qwen3 config (`Qwen3ForCausalLM`) plus `mtp_num_hidden_layers: 1` and
  `speculative_config.num_speculative_tokens: 3`.
- `smile_tokenizer.json`: the byte tokenizer (ids 0..255 are bytes, 256 is `<|endoftext|>`, used as bos and eos).
- `model.safetensors`: float32 weights, Hugging Face Qwen3 names (`model.*`; `lm_head` is tied to
  `model.embed_tokens`, so it is not stored) and the MTP head under `mtp.*` (`pre_fc_norm_embedding`,
  `pre_fc_norm_hidden`, `fc` [hidden, 2*hidden], `layers.0.*` with decoder-layer names, `norm`). {{size:,}} bytes.
- `loss_curve.png`: training loss and held-out bits per byte against the step.

## Architecture

hidden {args.hidden}, {args.layers} layers, {args.heads} query heads / {args.kv_heads} kv heads of dim
{args.head_dim}, SwiGLU MLP {args.intermediate}, RMSNorm eps 1e-6, q/k norm, RoPE theta 10000 (rotate-half),
tied embeddings, vocabulary 257. Parameters: {{n_params:,}} ({{n_params - n_mtp:,}} main, {{n_mtp:,}} MTP head).

MTP head: for position t, `x = fc(cat([pre_fc_norm_embedding(embed(token[t+1])), pre_fc_norm_hidden(h[t])]))`,
where `h[t]` is the last decoder layer's output before the final norm; then the MTP decoder layer (causal
attention over the MTP positions, RoPE position t+1), `mtp.norm` and the shared lm_head predict token[t+2]. For
chained drafts the head is fed its own pre-norm output as the hidden input (and the drafted token as the
embedding input); it was trained that way too (loss weight {args.mtp2_weight}), besides the next-next-token loss
(weight {args.mtp1_weight}).

"""
    head = head.replace("{size:,}", f"{size:,}").replace("{n_params:,}", f"{n_params:,}")
    head = head.replace("{n_params - n_mtp:,}", f"{n_params - n_mtp:,}").replace("{n_mtp:,}", f"{n_mtp:,}")
    readme = head + f"""## Corpus

The `.py` files of the Python {corpus['python_version']} standard library (`sysconfig.get_paths()["stdlib"]`,
without `site-packages`, `test`, `tests`, `idlelib`, `lib2to3` and `__pycache__`), sorted by relative path, each
file's bytes followed by `<|endoftext|>`: {corpus['files']:,} files, {corpus['bytes']:,} bytes. Every
{args.holdout_every}th file is held out: {corpus['train_files']:,} training files ({corpus['train_tokens']:,}
tokens), {corpus['heldout_files']:,} held-out files ({corpus['heldout_tokens']:,} tokens).

## Training

{fence}
{cmd}
{fence}

AdamW (betas 0.9/0.95, weight decay {args.weight_decay} on matrices), lr {args.lr} with {args.warmup} warmup steps
and cosine decay to {args.min_lr_frac:.0%} over the wall-clock budget, gradient clipping 1.0, batches of
{args.batch} random windows of {args.seq_len} bytes, {'bf16 autocast' if args.bf16 else 'float32'}, seed
{args.seed}, {args.threads} CPU thread(s) (torch {torch.__version__}).

- steps: {step:,}
- tokens seen: {tokens:,} (main head)
- training wall time: {train_wall / 60:.1f} min (whole script {total_wall / 60:.1f} min)

## Results (held out, {args.final_eval_windows} windows of {args.seq_len} bytes, float32)

- bits per byte, main head: **{bpb[0]:.4f}**
- bits per byte, MTP head (token t+2): {bpb[1]:.4f}; chained MTP (token t+3): {bpb[2]:.4f}
- main head next-byte accuracy: {agree['main_next_byte_accuracy']:.3f}
- MTP draft 1 (t+2): agrees with the main head's greedy byte {agree['mtp1_agreement_with_main_greedy']:.3f},
  accuracy vs the true byte {agree['mtp1_accuracy_vs_true']:.3f}
- MTP draft 2, chained (t+3): agrees with the main head's greedy byte
  {agree['mtp2_chained_agreement_with_main_greedy']:.3f}, accuracy vs the true byte
  {agree['mtp2_chained_accuracy_vs_true']:.3f}

(Teacher-forced: the drafts are fed the true previous bytes.)

Hugging Face check: `transformers.{'Qwen3_5ForCausalLM' if hybrid else 'Qwen3ForCausalLM'}.from_pretrained` (transformers {check.get('transformers')})
loads the folder with missing keys {check.get('missing_keys')} and {check.get('unexpected_keys_count')} unexpected
(`mtp.*`) keys; max |logit difference| against the training model {check.get('max_abs_logit_diff', float('nan')):.2e}.

## Greedy samples (200 bytes)

Prompt `"def "`:

{fence}
{samples['def ']}
{fence}

Prompt `"import os\\n"`:

{fence}
{samples['import os' + chr(10)]}
{fence}
"""
    (out / "README.md").write_text(readme)
    summary = {"steps": step, "tokens": tokens, "train_wall_s": train_wall, "total_wall_s": total_wall,
               "params": n_params, "mtp_params": n_mtp, "heldout_bpb": bpb, **agree, "hf_check": check,
               "corpus": corpus}
    print("SUMMARY " + json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
