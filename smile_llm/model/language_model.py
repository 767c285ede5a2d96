"""LanguageModel: a checkpoint, its tokenizer, a KV pool and an attention backend, and ``generate()``.

One request's path (DESIGN.md section 2): ``bind_with_prefix`` (radix match, lock, private pages) -> prefill the
unmatched prompt tokens -> decode one token per step, sampling each from the last logits -> ``finish_exclusive``
inserts the written KV into the tree for the next call. KV is released on every exit: finished into the tree when
the rows' KV is whole (normal end, stop, cancellation between steps), unbound without insertion after an error.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..attention.backend import AttentionBackend, select_backend
from ..cache import KvCacheLayout, KvCachePool
from ..cache.tokens import as_int_array
from .config import MAX_SPECULATIVE_TOKENS, ModelConfig
from .decoder import BATCHED_PREFILL_TOKENS, Decoder
from .drafter import MtpDrafter
from .listener import notify
from .sequence import Sequence as SequenceState
from .tokenizer import Tokenizer, load_tokenizer
from .transformer import Transformer
from .weights import load_into, read_checkpoint

DEFAULT_MODEL_DIR = Path(__file__).parent / "default"
PER_ROUND_ROWS = 256  # rows of the per-round draft pool: larger batches draft in several rounds


class GenerationCancelled(RuntimeError):
    """``cancel()`` returned True between two steps; the request's KV was released."""


@dataclass(frozen=True)
class Completion:
    """The result of one generation: ``text`` (cut at a stop string), ``prompt_tokens``, generated ``tokens`` (without a
    stop token id), ``finish_reason`` ("stop" or "length"), ``logprobs`` (one per token, or None) and ``stats``
    (counters and timings; see ``Sequence.stats``)."""

    text: str
    prompt_tokens: list[int]
    tokens: list[int]  # generated ids, without a stop token id (a stop string's tokens stay; text is cut)
    finish_reason: str  # "stop" or "length"
    logprobs: list[float] | None
    stats: dict[str, Any] = field(default_factory=dict)


class LanguageModel:
    """A causal LM served from a static paged KV pool with prefix reuse."""

    def __init__(self, config: ModelConfig, transformer: Transformer, tokenizer: Tokenizer, pool: KvCachePool,
                 backend: AttentionBackend, max_seq_len: int | None = None, *, cuda_graphs: bool = True,
                 draft_kv: str = "history") -> None:
        self.config, self.transformer, self.tokenizer = config, transformer, tokenizer
        self.pool, self.backend = pool, backend
        self.max_seq_len = max_seq_len or pool.num_slots  # longest prompt + completion of one request
        self.drafter: MtpDrafter | None = None
        if transformer.mtp is not None:
            rows = max(1, pool.num_slots // max(1, self.max_seq_len))
            if draft_kv == "per_round":  # MAX_SPECULATIVE_TOKENS positions per row and round, for any batch
                layout = KvCacheLayout(config.mtp_num_hidden_layers, config.num_key_value_heads, config.head_dim,
                                       max(rows, PER_ROUND_ROWS), MAX_SPECULATIVE_TOKENS + 2)
                mtp_pool = KvCachePool.for_mtp(layout, pool.device, pool.dtype, pool.page_size)
                self.drafter = MtpDrafter(transformer, mtp_pool, backend, "per_round")
            elif draft_kv == "history":
                layout = KvCacheLayout(config.mtp_num_hidden_layers, config.num_key_value_heads, config.head_dim,
                                       rows, self.max_seq_len)
                try:
                    history = KvCachePool.for_mtp_history(layout, pool.device, pool.dtype, pool.page_size,
                                                          pool.num_slots)
                    self.drafter = MtpDrafter(transformer, history, backend)
                except RuntimeError:  # too little memory for the draft history: decode without speculation
                    self.drafter = None
            else:
                raise ValueError(f'draft_kv must be "history" or "per_round", got {draft_kv!r}')
        self.decoder = Decoder(transformer, pool, backend, self.drafter)
        if cuda_graphs and pool.device.type == "cuda":
            from .graphs import DecodeGraphRunner, VerifyGraphRunner, cuda_graphs_supported

            if cuda_graphs_supported(pool):
                self.decoder.decode_graphs = DecodeGraphRunner(transformer, pool)
                self.decoder.verify_graphs = VerifyGraphRunner(transformer, pool)
        self.serving_engine: Any = None  # set while an InferenceEngine serves this model

    # ------------------------------------------------------------------ loading
    @classmethod
    def from_pretrained(cls, path: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype | None = None,
                        mem_fraction: float | None = None, page_size: int = 16, *, max_batch_size: int = 4,
                        max_seq_len: int | None = None, cuda_graphs: bool = True,
                        draft_kv: str = "history", speculative_max_batch: int | None = None) -> LanguageModel:
        """Load ``config.json``, ``*.safetensors`` (sharded too) and the tokenizer from ``path``; size a KV pool
        for ``max_batch_size`` rows of ``max_seq_len`` tokens (default: the model's context, at most 4096).
        ``cuda_graphs``: replay decode and verify forwards from CUDA graphs on CUDA with FlashInfer (no effect
        elsewhere; ``SMILE_CUDA_GRAPHS=0`` also turns them off). ``draft_kv`` (MTP models): "history" keeps each
        request's draft KV over its whole context (the default), "per_round" drafts context-free each round.
        ``speculative_max_batch``: see the property of that name."""
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
        lm = cls(config, transformer, tokenizer, pool, select_backend(device), seq, cuda_graphs=cuda_graphs,
                 draft_kv=draft_kv)
        lm.speculative_max_batch = speculative_max_batch
        return lm

    @property
    def speculative_max_batch(self) -> int | None:
        """The most rows a decoding step may hold and still speculate (None, the default: no limit). A step with
        more rows decodes plainly, in ``generate_batch`` and in the engine alike (vLLM's
        ``speculative_disable_by_batch_size``): a large batch already amortises each forward, and its verify
        windows multiply the attention work. Rows keep their draft history, so they speculate again once the
        batch shrinks. ValueError unless None or an int >= 0."""
        return self.decoder.speculative_max_batch

    @speculative_max_batch.setter
    def speculative_max_batch(self, value: int | None) -> None:
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            raise ValueError(f"speculative_max_batch must be None or an int >= 0, got {value!r}")
        self.decoder.speculative_max_batch = value

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
    def speculative_tokens_for(self, requested: int | None) -> int:
        """Drafts per round for a request: 0 without an MTP head or for ``requested == 0``; None means the
        model's default (``num_speculative_tokens``); at most MAX_SPECULATIVE_TOKENS. ValueError for non-ints."""
        if requested is not None and (isinstance(requested, bool) or not isinstance(requested, int) or
                                      requested < 0):
            raise ValueError(f"speculative_tokens must be None or an int >= 0, got {requested!r}")
        if requested == 0 or self.drafter is None:
            return 0
        return self.config.resolve_speculative_tokens(requested)

    @staticmethod
    def _check_draft_sampling(draft_sampling: Any) -> None:
        if draft_sampling not in ("greedy", "sample"):
            raise ValueError(f'draft_sampling must be "greedy" or "sample", got {draft_sampling!r}')

    def _check_not_serving(self) -> None:
        if self.serving_engine is not None:
            raise RuntimeError("an InferenceEngine is serving this model; submit requests to it (generate() binds "
                               "the pool exclusively and would evict the engine's requests)")

    def generate(self, prompt: str | Sequence[int], max_new_tokens: int = 256, *, temperature: float = 0.0,
                 top_p: float = 1.0, logprobs: bool = False, seed: int = 0, listener: Any = None,
                 cancel: Callable[[], bool] | None = None, stop: Any = None,
                 speculative_tokens: int | None = None, draft_sampling: str = "greedy") -> Completion:
        """Generate up to ``max_new_tokens`` tokens after ``prompt`` (ids or text). Greedy at temperature 0, else
        nucleus sampling; a nonzero ``seed`` makes the output reproducible. Stops at an EOS or ``stop`` token or
        string (finish_reason "stop") or after ``max_new_tokens`` or at the pool's capacity ("length").
        ``cancel`` is polled before every forward (GenerationCancelled). ValueError for bad input.

        With an MTP head, decoding is speculative: ``speculative_tokens`` drafts per round (None: the model's
        default; 0: plain decoding), verified by one target forward. ``draft_sampling="greedy"`` (default) drafts
        the head's argmax and keeps a draft while the target samples the same token; ``"sample"`` samples drafts
        and uses rejection sampling. Either way the output has the target's distribution, and at temperature 0 it
        equals plain greedy decoding token for token."""
        self._check_not_serving()
        k = self.speculative_tokens_for(speculative_tokens)
        self._check_draft_sampling(draft_sampling)
        ids = self.encode(prompt)
        self._check_sampling(max_new_tokens, temperature, top_p)
        stop_ids, stop_texts = self._stops(stop)
        max_new_tokens = self._clamp_new_tokens(ids, max_new_tokens)
        pool = self.pool
        matched = pool.bind_with_prefix(ids, len(ids) + max_new_tokens)
        seq = SequenceState(self, ids, matched, limit=max_new_tokens, temperature=temperature, top_p=top_p,
                            logprobs=logprobs, seed=seed, listener=listener, stop_ids=stop_ids,
                            stop_texts=stop_texts, speculative_tokens=k, draft_sampling=draft_sampling,
                            request_id=pool.active_request_ids[0], capacity=pool.request_capacity)
        whole = False
        try:
            if k and self.drafter is not None:
                self.drafter.pool.unbind_requests()  # generate() owns the model: no other history is live
                self.drafter.bind(seq)
            notify(listener, "on_input_tokens", len(ids))
            notify(listener, "on_cached_input_tokens", min(matched, len(ids)))
            while seq.remaining > 0:  # each iteration: poll cancel, one forward, one or more tokens
                if cancel is not None and cancel():
                    whole = True
                    raise GenerationCancelled("aborted: cancel() returned True between steps; KV released")
                if seq.prefilled < len(ids):
                    self.decoder.prefill(seq)
                    seq.take_next()
                else:
                    self.decoder.step([seq])
            whole = True
        finally:  # the pool inserts only KV that was written (kv_len), so the sequence may run past it
            if self.drafter is not None:
                self.drafter.release(seq)
            if whole:
                pool.finish_exclusive(ids + seq.tokens)
            else:
                pool.unbind_requests()
        return seq.completion()

    def generate_batch(self, prompts: Iterable[str | Sequence[int]], max_new_tokens: int = 256, *,
                       temperature: float = 0.0, top_p: float = 1.0, logprobs: bool = False, seed: int = 0,
                       stop: Any = None, speculative_tokens: int | None = None,
                       draft_sampling: str = "greedy") -> list[Completion]:
        """Generate for several prompts as one ragged batch. Each is bound with ``bind_request`` (prefix reuse
        included) in order. The first prompt of each group sharing a first page is prefilled and cached
        (``cache_prefix``) at once, so the prompts bound after it match its prefix; every other prompt left with at
        most BATCHED_PREFILL_TOKENS unmatched positions (the user turns after a shared system prompt, or short
        unrelated prompts) is prefilled with the others like it in padded forwards (``Decoder.prefill_together``)
        once all are bound. Then all rows step together (speculative rounds for rows that can draft, plain steps
        for the rest), rows leaving the batch as they finish. Row i samples with seed ``seed + i`` (when seed is
        nonzero). Greedy results equal ``generate`` on each prompt.
        KvCacheExhaustedError if the rows do not fit together."""
        self._check_not_serving()
        k = self.speculative_tokens_for(speculative_tokens)
        self._check_draft_sampling(draft_sampling)
        prompt_ids = [self.encode(p) for p in prompts]
        if not prompt_ids:
            return []
        self._check_sampling(max_new_tokens, temperature, top_p)
        limits = [self._clamp_new_tokens(ids, max_new_tokens) for ids in prompt_ids]
        stop_ids, stop_texts = self._stops(stop)
        pool = self.pool
        seqs: list[SequenceState] = []
        whole = False
        try:
            if self.drafter is not None:
                self.drafter.pool.unbind_requests()
            short: list[SequenceState] = []  # prompts left with a short unmatched part, prefilled together
            first_pages = [tuple(ids[: pool.page_size]) for ids in prompt_ids]
            sharing = {key for key, n in Counter(first_pages).items() if n > 1}  # prompts that may share a prefix
            for i, ids in enumerate(prompt_ids):  # bind, prefill and cache each prompt before binding the next
                rid = pool.bind_request(ids, len(ids) + limits[i])
                row_seed = ((seed + i) or (1 << 62)) if seed else 0  # nonzero seeds stay nonzero per row
                seq = SequenceState(self, ids, pool.matched_prefix_len(rid), limit=limits[i],
                                    temperature=temperature, top_p=top_p, logprobs=logprobs, seed=row_seed,
                                    stop_ids=stop_ids, stop_texts=stop_texts, speculative_tokens=k,
                                    draft_sampling=draft_sampling, request_id=rid,
                                    capacity=len(ids) + limits[i])
                seqs.append(seq)
                if k and self.drafter is not None:
                    self.drafter.bind(seq)
                if seq.remaining > 0:
                    leader = first_pages[i] in sharing  # the first of its group: computed and cached first
                    sharing.discard(first_pages[i])
                    if not leader and len(ids) - seq.prefilled <= BATCHED_PREFILL_TOKENS:
                        short.append(seq)
                        continue
                    self.decoder.prefill(seq)
                    seq.take_next()
                    pool.cache_prefix(rid, ids)  # later prompts sharing a prefix (a system prompt) match it
            self.decoder.prefill_together(short)
            for seq in short:
                seq.take_next()
                pool.cache_prefix(seq.request_id, seq.prompt)
            alive = [s for s in seqs if s.remaining > 0]
            while alive:
                self.decoder.step(alive)
                alive = [s for s in alive if s.remaining > 0]
            whole = True
        finally:
            for seq in seqs:
                if self.drafter is not None:
                    self.drafter.release(seq)
                if whole:
                    pool.finish_request(seq.request_id, seq.prompt + seq.tokens)
                else:
                    pool.unbind_request(seq.request_id)
        return [seq.completion() for seq in seqs]

    def close(self) -> None:
        """Release the model's KV pools (the main pool and the MTP draft pool); later generate calls raise RuntimeError.
        Idempotent."""
        self.pool.close()
        if self.drafter is not None:
            self.drafter.pool.close()
