"""LanguageModel: a checkpoint, its tokenizer, a KV pool and an attention backend, and ``generate()``.

One request's path (DESIGN.md section 2): ``bind_with_prefix`` (radix match, lock, private pages) -> prefill the
unmatched prompt tokens -> decode one token per step, sampling each from the last logits -> ``finish_exclusive``
inserts the written KV into the tree for the next call. KV is released on every exit: finished into the tree when
the rows' KV is whole (normal end, stop, cancellation between steps), unbound without insertion after an error.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..attention.backend import AttentionBackend, select_backend
from ..cache import KvCacheLayout, KvCachePool
from ..cache.tokens import as_int_array
from .config import ModelConfig
from .listener import notify
from .sampling import make_generator, sample
from .tokenizer import StreamDecoder, Tokenizer, load_tokenizer
from .transformer import Transformer
from .weights import load_into, read_checkpoint

DEFAULT_MODEL_DIR = Path(__file__).parent / "default"
PREFILL_CHUNK = 512  # prompt tokens per forward: bounds activation memory on long prompts


class GenerationCancelled(RuntimeError):
    """``cancel()`` returned True between two steps; the request's KV was released."""


@dataclass(frozen=True)
class Completion:
    text: str
    prompt_tokens: list[int]
    tokens: list[int]  # generated ids, without a stop token id (a stop string's tokens stay; text is cut)
    finish_reason: str  # "stop" or "length"
    logprobs: list[float] | None
    stats: dict[str, Any] = field(default_factory=dict)


class LanguageModel:
    """A causal LM served from a static paged KV pool with prefix reuse."""

    def __init__(self, config: ModelConfig, transformer: Transformer, tokenizer: Tokenizer, pool: KvCachePool,
                 backend: AttentionBackend, max_seq_len: int | None = None) -> None:
        self.config, self.transformer, self.tokenizer = config, transformer, tokenizer
        self.pool, self.backend = pool, backend
        self.max_seq_len = max_seq_len or pool.num_slots  # longest prompt + completion of one request

    # ------------------------------------------------------------------ loading
    @classmethod
    def from_pretrained(cls, path: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype | None = None,
                        mem_fraction: float | None = None, page_size: int = 16, *, max_batch_size: int = 4,
                        max_seq_len: int | None = None) -> LanguageModel:
        """Load ``config.json``, ``*.safetensors`` (sharded too) and the tokenizer from ``path``; size a KV pool
        for ``max_batch_size`` rows of ``max_seq_len`` tokens (default: the model's context, at most 4096)."""
        folder = Path(path)
        config = ModelConfig.from_pretrained(folder)
        device = torch.device(device)
        dtype = dtype or (torch.bfloat16 if device.type == "cuda" else torch.float32)
        transformer = Transformer(config)
        load_into(transformer, read_checkpoint(folder), dtype,
                  tied=("lm_head.weight",) if config.tie_word_embeddings else ())
        transformer.to(device=device, dtype=dtype).eval()
        tokenizer = load_tokenizer(folder, config.eos_token_ids, config.vocab_size)
        seq = max_seq_len or min(config.max_position_embeddings, 4096)
        layout = KvCacheLayout(config.num_hidden_layers, config.num_key_value_heads, config.head_dim,
                               max_batch_size, seq)
        pool = KvCachePool.allocate(layout, device, dtype, mem_fraction or 0.85, page_size)
        return cls(config, transformer, tokenizer, pool, select_backend(device), seq)

    @classmethod
    def default(cls, **kwargs: Any) -> LanguageModel:
        """The small byte-level Qwen3-architecture model shipped in the package (see its README.md)."""
        return cls.from_pretrained(DEFAULT_MODEL_DIR, **kwargs)

    # ------------------------------------------------------------------ input checks
    def encode(self, prompt: str | Sequence[int]) -> list[int]:
        """Token ids of ``prompt`` (text through the tokenizer, or ids checked against the vocabulary)."""
        if isinstance(prompt, str):
            ids = self.tokenizer.encode(prompt)
        else:
            try:
                ids = as_int_array(prompt, "prompt").tolist()
            except ValueError as exc:
                raise ValueError(f"{exc} (token ids outside the vocabulary [0, {self.config.vocab_size}))") from None
        if not ids:
            raise ValueError("the prompt is empty; give at least one token")
        bad = [t for t in ids if not 0 <= t < self.config.vocab_size]
        if bad:
            raise ValueError(f"token {bad[0]} is outside the vocabulary [0, {self.config.vocab_size})")
        return ids

    @staticmethod
    def _check_sampling(max_new_tokens: Any, temperature: Any, top_p: Any) -> None:
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be an int >= 0, got {max_new_tokens!r}")
        if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or \
                not math.isfinite(temperature) or temperature < 0:
            raise ValueError(f"temperature must be a finite number >= 0, got {temperature!r}")
        if isinstance(top_p, bool) or not isinstance(top_p, (int, float)) or not 0.0 < top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {top_p!r}")

    def _clamp_new_tokens(self, ids: list[int], max_new_tokens: int) -> int:
        """Smile's rule: a prompt longer than ``max_seq_len`` is an error; new tokens stop at ``max_seq_len``."""
        if len(ids) > self.max_seq_len:
            raise ValueError(f"prompt of {len(ids)} tokens exceeds max_seq_len {self.max_seq_len}; shorten it or "
                             f"load the model with a larger max_seq_len")
        return min(max_new_tokens, self.max_seq_len - len(ids))

    def _stops(self, stop: Any) -> tuple[set[int], list[str]]:
        """EOS ids plus ``stop``: a token id, a string, or a list/tuple of those."""
        ids, texts = set(self.config.eos_token_ids), []
        if stop is None:
            entries: list[Any] = []
        elif isinstance(stop, (list, tuple)):
            entries = list(stop)
        else:
            entries = [stop]
        for s in entries:
            if isinstance(s, str):
                if s:
                    texts.append(s)
            elif isinstance(s, int) and not isinstance(s, bool) and 0 <= s < self.config.vocab_size:
                ids.add(s)
            else:
                raise ValueError(f"stop entries must be token ids in [0, {self.config.vocab_size}) or strings, "
                                 f"got {s!r}")
        return ids, texts

    # ------------------------------------------------------------------ generation
    def generate(self, prompt: str | Sequence[int], max_new_tokens: int = 256, *, temperature: float = 0.0,
                 top_p: float = 1.0, logprobs: bool = False, seed: int = 0, listener: Any = None,
                 cancel: Callable[[], bool] | None = None, stop: Any = None,
                 speculative_tokens: int | None = None) -> Completion:
        """Generate up to ``max_new_tokens`` tokens after ``prompt`` (ids or text). Greedy at temperature 0, else
        nucleus sampling; a nonzero ``seed`` makes the output reproducible. Stops at an EOS or ``stop`` token or
        string (finish_reason "stop") or after ``max_new_tokens`` or at the pool's capacity ("length").
        ``cancel`` is polled between steps (GenerationCancelled). ValueError for bad input.

        ``speculative_tokens`` (drafts per round from the MTP head) is validated here; speculative rounds come with
        the MTP draft path, until then every step is a plain decode step (``stats["speculative_rounds"]`` is 0)."""
        if speculative_tokens is not None and (isinstance(speculative_tokens, bool) or
                                               not isinstance(speculative_tokens, int) or speculative_tokens < 0):
            raise ValueError(f"speculative_tokens must be None or an int >= 0, got {speculative_tokens!r}")
        ids = self.encode(prompt)
        self._check_sampling(max_new_tokens, temperature, top_p)
        stop_ids, stop_texts = self._stops(stop)
        max_new_tokens = self._clamp_new_tokens(ids, max_new_tokens)
        pool = self.pool
        matched = pool.bind_with_prefix(ids, len(ids) + max_new_tokens)
        capacity = pool.request_capacity
        run = _Run(self, ids, matched, temperature, top_p, logprobs, seed, listener, stop_ids, stop_texts)
        whole = False
        try:
            notify(listener, "on_input_tokens", len(ids))
            notify(listener, "on_cached_input_tokens", min(matched, len(ids)))
            # Each step: poll cancel, run one forward (the prefill first), sample and stream one token. A generated
            # token sits at position len(ids) + i, which must stay below the bound capacity.
            while len(run.tokens) < max_new_tokens and len(ids) + len(run.tokens) < capacity:
                if cancel is not None and cancel():
                    whole = True
                    raise GenerationCancelled("aborted: cancel() returned True between steps; KV released")
                if run.forwards == 0:
                    run.prefill(ids[matched:], matched)
                else:
                    run.decode_step(len(ids) + len(run.tokens) - 1)
                if run.take_next():
                    break
            whole = True
        finally:  # the pool inserts only KV that was written (kv_len), so the sequence may run past it
            if whole:
                pool.finish_exclusive(ids + run.tokens)
            else:
                pool.unbind_requests()
        return run.completion()

    def generate_batch(self, prompts: Iterable[str | Sequence[int]], max_new_tokens: int = 256, *,
                       temperature: float = 0.0, top_p: float = 1.0, logprobs: bool = False, seed: int = 0,
                       stop: Any = None) -> list[Completion]:
        """Generate for several prompts as one ragged batch: each is bound with ``bind_request`` (prefix reuse
        included) and prefilled on its own, then all rows decode together, one token per row per step, rows
        leaving the batch as they finish. Row i samples with seed ``seed + i`` (when seed is nonzero). Greedy
        results equal ``generate`` on each prompt. KvCacheExhaustedError if the rows do not fit together."""
        prompt_ids = [self.encode(p) for p in prompts]
        if not prompt_ids:
            return []
        self._check_sampling(max_new_tokens, temperature, top_p)
        limits = [self._clamp_new_tokens(ids, max_new_tokens) for ids in prompt_ids]
        stop_ids, stop_texts = self._stops(stop)
        pool = self.pool
        rows: dict[int, _Run] = {}
        whole = False
        try:
            for i, ids in enumerate(prompt_ids):
                rid = pool.bind_request(ids, len(ids) + limits[i])
                row_seed = ((seed + i) or (1 << 62)) if seed else 0  # nonzero seeds stay nonzero per row
                rows[rid] = _Run(self, ids, pool.matched_prefix_len(rid), temperature, top_p, logprobs,
                                 row_seed, None, stop_ids, stop_texts)
                rows[rid].limit = limits[i]
            for rid, run in rows.items():
                pool.activate_step(rid)
                run.prefill(run.prompt[run.matched :], run.matched)
            alive = [rid for rid in rows if rows[rid].limit > 0]
            while alive:
                alive = [rid for rid in alive
                         if not rows[rid].take_next() and len(rows[rid].tokens) < rows[rid].limit]
                if not alive:
                    break
                pool.activate_step(*alive)
                tokens = torch.tensor([[rows[r].tokens[-1]] for r in alive], dtype=torch.int64, device=pool.device)
                start = np.array([len(rows[r].prompt) + len(rows[r].tokens) - 1 for r in alive], dtype=np.int64)
                out = self.transformer(tokens, start, pool, self.backend)
                for row, rid in enumerate(alive):
                    rows[rid].logits = out.logits[row : row + 1, -1]
                    rows[rid].forwards += 1
            whole = True
        finally:
            for rid, run in rows.items():
                if whole:
                    pool.finish_request(rid, run.prompt + run.tokens)
                else:
                    pool.unbind_request(rid)
        return [run.completion() for run in rows.values()]

    def close(self) -> None:
        self.pool.close()


class _Run:
    """The state of one generate() call: tokens so far, streaming, stop detection and stats."""

    def __init__(self, model: LanguageModel, prompt: list[int], matched: int, temperature: float, top_p: float,
                 logprobs: bool, seed: int, listener: Any, stop_ids: set[int], stop_texts: list[str]) -> None:
        self.model, self.prompt, self.matched = model, prompt, matched
        self.temperature, self.top_p = float(temperature), float(top_p)
        self.generator = make_generator(seed, model.pool.device)
        self.listener, self.stop_ids, self.stop_texts = listener, stop_ids, stop_texts
        self.tokens: list[int] = []
        self.limit = 0  # generate_batch: this row's max new tokens
        self.logprobs: list[float] | None = [] if logprobs else None
        self.finish_reason = "length"
        self.stream = StreamDecoder(model.tokenizer)
        self.text = ""  # text of the generated tokens, up to any stop string
        self.cut = False  # a stop string ended the text
        self.sent = 0  # characters of ``text`` already given to on_text
        self.logits: torch.Tensor | None = None
        self.t0 = time.perf_counter()
        self.prefill_s = 0.0
        self.forwards = 0

    def _forward(self, tokens: list[int], start: int) -> None:
        model = self.model
        x = torch.tensor([tokens], dtype=torch.int64, device=model.pool.device)
        out = model.transformer(x, np.array([start], dtype=np.int64), model.pool, model.backend)
        self.logits = out.logits[:, -1]
        self.forwards += 1

    def prefill(self, tokens: list[int], start: int) -> None:
        for i in range(0, len(tokens), PREFILL_CHUNK):
            self._forward(tokens[i : i + PREFILL_CHUNK], start + i)
        self.prefill_s = time.perf_counter() - self.t0

    def decode_step(self, position: int) -> None:
        self._forward([self.tokens[-1]], position)

    def take_next(self) -> bool:
        """Sample the next token from the last logits; True when generation must stop here."""
        assert self.logits is not None
        token_t, logprob_t = sample(self.logits, self.temperature, self.top_p, self.generator,
                                    with_logprobs=self.logprobs is not None)
        token = int(token_t[0])
        if token in self.stop_ids:
            self.finish_reason = "stop"
            self._flush()
            return True
        self.tokens.append(token)
        if self.logprobs is not None and logprob_t is not None:
            self.logprobs.append(float(logprob_t[0]))
        notify(self.listener, "on_generated_tokens", 1)
        chunk = self.stream.push(token)
        self.text += chunk
        for s in self.stop_texts:
            at = self.text.find(s, max(0, len(self.text) - len(chunk) - len(s) + 1))  # only where it can be new
            if at >= 0:
                self.text = self.text[:at]
                self.cut = True
                self.finish_reason = "stop"
                self._flush()
                return True
        self._flush(hold=max((len(s) - 1 for s in self.stop_texts), default=0))
        return False

    def _flush(self, hold: int = 0) -> None:
        """Give ``on_text`` the new text, holding back the last ``hold`` characters (a stop string may start)."""
        end = max(self.sent, len(self.text) - hold)
        if end > self.sent:
            notify(self.listener, "on_text", self.text[self.sent : end])
            self.sent = end

    def completion(self) -> Completion:
        if not self.cut:
            self.text += self.stream.finish()
        self._flush()
        elapsed = time.perf_counter() - self.t0
        decode_s = max(elapsed - self.prefill_s, 1e-9)
        stats = {
            "prompt_tokens": len(self.prompt),
            "cached_tokens": self.matched,
            "generated_tokens": len(self.tokens),
            "forwards": self.forwards,
            "speculative_rounds": 0,
            "proposed_drafts": 0,
            "accepted_drafts": 0,
            "prefill_s": self.prefill_s,
            "decode_s": decode_s,
            "tokens_per_s": max(len(self.tokens) - 1, 0) / decode_s,
        }
        return Completion(self.text, list(self.prompt), list(self.tokens), self.finish_reason, self.logprobs, stats)
