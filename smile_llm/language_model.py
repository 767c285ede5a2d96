"""LanguageModel: a checkpoint, its tokenizer, a KV pool and an attention backend, and
``generate()``.

One request path (docs/serving.md): ``generate`` and ``generate_batch`` turn their arguments into
validated requests (``ServingContext.request``) and hand them to the model's own ``ServingLoop``,
created on first use and shut down by ``close()``. Its scheduler binds (radix match, lock, private
pages), prefills, steps (speculative rounds where the model drafts), finishes (the written KV goes
into the prefix tree) and releases every request, whichever thread called. Concurrent calls are
batched together; a caller waiting alone drives the steps on its own thread."""

from __future__ import annotations

import threading
import warnings
from dataclasses import replace
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, Literal, cast, overload

import torch

from . import env
from .attention.backend import AttentionBackend, AttentionShape, select_backend
from .cache import KvCachePool
from .distributed.group import TensorParallel
from .models.checkpoint.config import ModelConfig
from .sampling.grammar_compiler import GrammarCompiler
from .serving.model_pools import allocate_pools, kv_storage
from .serving.model_runner import ModelRunner
from .serving.parallel_ranks import follow_leader, join_lockstep, lockstep_pools
from .speculative.draft_policy import DraftPolicy
from .speculative.drafters import Drafter, build_drafter
from .errors import GenerationCancelled, RequestError, RequestTypeError
from .serving.request import (BATCH_KEYWORDS, CHAT_KEYWORDS, GENERATE_KEYWORDS, STREAM_KEYWORDS,
                              Request, RequestHandle, SamplingParams, check_keywords, check_prompt,
                              option_fields)
from .serving.segments import Segment
from .serving.sample_group import SampleGroup
from .serving import streaming
from .serving.completion import Completion
from .serving.listener import Listener
from .speculative.acceptance import RoundRecord
from .serving.context import ServingContext
from .serving.streaming import StreamChunk, TokenStream
from .serving.serving_loop import ServingLoop
from .text.tokenizer import Tokenizer, load_tokenizer
from .models.transformer import Transformer
from .text.chat_template import CONFIG_FILE, TEMPLATE_FILE, ChatTemplate, check_template_kwargs
from .models.checkpoint.checks import check_checkpoint
from .models.checkpoint.hybrid_layout import to_module_names
from .models.sharding import check_shardable, local_config, read_sharded_checkpoint
from .models.stages import init_stage
from .models.shipped import DEFAULT_MODEL_DIRS
from .models.checkpoint.weights import load_into, read_checkpoint

__all__ = ["Completion", "GenerationCancelled", "LanguageModel"]



class LanguageModel:
    """A causal LM served from a static paged KV pool with prefix reuse."""

    def __init__(self, config: ModelConfig, transformer: Transformer, tokenizer: Tokenizer,
                 pool: KvCachePool, backend: AttentionBackend, max_seq_len: int | None = None, *,
                 cuda_graphs: bool = True, draft_kv: str = "history",
                 drafter: str | Drafter | None = "mtp") -> None:
        self.config, self.transformer, self.tokenizer = config, transformer, tokenizer
        self.pool, self.backend = pool, backend
        # longest prompt + completion of one request
        self.max_seq_len = max_seq_len or pool.num_slots
        built = build_drafter(drafter, transformer, pool, backend, self.max_seq_len, draft_kv,
                              load_model=type(self).from_pretrained)
        self.runner = ModelRunner(transformer, pool, backend, built)
        # compiled output constraints (json_schema, regex, ...), cached for the model's life
        self.grammars = GrammarCompiler(tokenizer, config.vocab_size,
                                        tuple(config.eos_token_ids))
        if cuda_graphs and pool.device.type == "cuda":
            from .serving.cuda_graphs import (
                DecodeGraphRunner,
                VerifyGraphRunner,
                cuda_graphs_supported,
            )

            if cuda_graphs_supported(pool):
                self.runner.decode_graphs = DecodeGraphRunner(transformer, pool)
                self.runner.verify_graphs = VerifyGraphRunner(transformer, pool)
        self.tp = TensorParallel(0, 1)  # this process's rank (tensor_parallel in from_pretrained)
        # the checkpoint's (from_pretrained), for chat / encode_chat
        self.chat_template: ChatTemplate | None = None
        self.folder: Path | None = None  # the checkpoint folder (from_pretrained)
        self._serving_loop: ServingLoop | None = None
        self._serving_loop_lock = threading.Lock()

    # ------------------------------------------------------------------ loading
    @classmethod
    def from_pretrained(cls, path: str | Path, device: str | torch.device = "cpu",
                        dtype: torch.dtype | None = None, mem_fraction: float | None = None,
                        page_size: int = 16, *, max_batch_size: int = 4,
                        max_seq_len: int | None = None, cuda_graphs: bool = True,
                        draft_kv: str = "history", speculative_max_batch: int | None = None,
                        drafter: str | Drafter | None = "mtp", state_snapshots: int | None = None,
                        tensor_parallel: int = 1, lockstep_check: bool | None = None,
                        pipeline_parallel: int = 1,
                        kv_dtype: str | torch.dtype | None = None,
                        kv_scales: tuple[float, float] | None = None,
                        compile: bool | None = None) -> LanguageModel:
        """Load ``config.json``, ``*.safetensors`` (sharded too) and the tokenizer from ``path``;
        size a KV pool for ``max_batch_size`` rows of ``max_seq_len`` tokens (default: the model's
        context, at most 4096). Nothing in ``path`` is trusted: every config field, the shard index
        and every safetensors header are checked, and the tensors' names and shapes compared with
        the config, before anything is allocated (``models.checkpoint.checks``); ConfigError,
        CheckpointError or TokenizerError (ValueErrors of ``errors``) name the file and the field or
        tensor otherwise. ``cuda_graphs``: replay decode and verify forwards from CUDA graphs on
        CUDA with FlashInfer (no effect elsewhere; ``SMILE_CUDA_GRAPHS=0`` also turns them off).
        ``draft_kv`` (MTP models): "history" keeps each request's draft KV over its whole context
        (the default), "per_round" drafts context-free each round. ``drafter``: "mtp" (the MTP head,
        when the checkpoint has one), "ngram" (prompt lookup, any model), "draft:PATH" (a smaller
        checkpoint of the same vocabulary), a name given to ``register_drafter``, a
        "package.module:callable" factory, None or "none" (plain decoding), or your own
        ``smile_llm.speculative.drafters.Drafter`` (docs/speculative.md). ``speculative_max_batch``:
        see the property of that name. ``state_snapshots`` (hybrid models): prefix snapshots of the
        DeltaNet state kept for the prefix tree (default ``2 * max_batch_size``; each costs one
        request's state, ``StatePool.bytes_per_request``); a prefix hit needs one at the prefix's
        end, so 0 turns prefix reuse off for the model.

        ``tensor_parallel=N`` (under ``torchrun --nproc-per-node N``, one process per rank;
        docs/tensor_parallel.md): every rank loads only its slices of the weights and keeps its own
        KV heads' pool; rank 0 returns a model that serves exactly as on one device, the other ranks
        a model whose ``follow()`` replays rank 0's plan until rank 0 closes. ValueError at load,
        with the reason, when N does not split the heads or the MLP or differs from the number of
        processes. ``lockstep_check`` (default: ``SMILE_TP_CHECK=1``) compares every rank's pool
        digest with rank 0's before each forward. ``pipeline_parallel=N`` (``N * tensor_parallel``
        processes; docs/pipeline_parallel.md): each rank holds a range of the decoder layers and
        their KV, in lockstep as above; ValueError before anything is allocated for more stages
        than layers or another number of processes.

        ``kv_dtype``: the KV pool's storage (default: the model's ``dtype``): dense
        ``"float32"``, ``"bfloat16"``, ``"float16"``, ``"fp8_e4m3"``, ``"fp8_e5m2"`` (or a torch
        dtype), or packed low-bit ``"nvfp4"``, ``"int4"``, ``"int3"``, ``"int2"`` (a page quantized
        once it is complete, in groups along a token or, integer keys, a channel;
        docs/kv_storage.md); one name
        for every layer, a list of one per KV layer, a mapping ``{"k": ..., "v": ...}`` of either,
        or a list of such mappings. FP8 stores ``K / k_scale`` and ``V / v_scale`` (``kv_scales``,
        default 1.0 each). Reads come back in the compute dtype (quality cost measured in
        ``benchmarks/kv_dtype.py``). A pool whose layers are not stored alike in one dense dtype
        is read through per-forward views: no CUDA graphs and no token trees then. ValueError for
        another name, a list of the wrong length, a packed format the geometry does not fit (a
        page_size that is not a multiple of its group), or scales without FP8."""
        folder = Path(path)
        config = ModelConfig.from_pretrained(folder)
        # every header checked and every tensor's name and shape against the config, before anything
        # is allocated
        check_checkpoint(config, folder)
        device = torch.device(device)
        if (isinstance(tensor_parallel, int) and not isinstance(tensor_parallel, bool)
                and tensor_parallel > 1):
            check_shardable(config, tensor_parallel)  # before joining any process group
        dtype = dtype or (torch.bfloat16 if device.type == "cuda" else torch.float32)
        formats = kv_storage(config, kv_dtype, kv_scales, dtype, page_size)  # on every rank alike
        # this rank's tensor-parallel group and pipeline stage (the whole model on one stage)
        tp, stage = init_stage(config, tensor_parallel, pipeline_parallel, device, drafter)
        local = local_config(config, tp)
        hybrid = config.is_hybrid
        for note in config.notes:
            warnings.warn(note, stacklevel=2)
        transformer = Transformer(local, tp, vocab_size=config.vocab_size, stage=stage)
        raw = (read_checkpoint(folder) if tp.size == 1 and stage.count == 1
               else read_sharded_checkpoint(folder, config, tp, stage))
        tensors = to_module_names(raw, config)  # a multimodal checkpoint: its text model's
        load_into(transformer, tensors, dtype,
                  tied=("lm_head.weight",) if config.tie_word_embeddings else ())
        transformer.to(device=device, dtype=dtype).eval()
        if compile if compile is not None else bool(env.compile_setting()):
            transformer.compile_layers()
        tokenizer = load_tokenizer(folder, config.eos_token_ids, config.vocab_size)
        chat_template = ChatTemplate.from_folder(folder)
        seq = max_seq_len or min(config.max_position_embeddings, 4096)
        pool = allocate_pools(config, local, stage, device, dtype, max_batch_size=max_batch_size,
                              max_seq_len=seq, page_size=page_size, mem_fraction=mem_fraction,
                              formats=formats, kv_scales=kv_scales,
                              state_snapshots=state_snapshots)
        # per model: the reference (one warning naming the reason) where FlashInfer's kernels cannot
        # serve it
        backend = select_backend(device,
                                 shape=AttentionShape(config.head_dim, local.num_attention_heads,
                                                      local.num_key_value_heads, dtype, pool.dtype))
        lm = cls(config, transformer, tokenizer, pool, backend, seq,
                 cuda_graphs=cuda_graphs and not hybrid and stage.world.size == 1
                             and pool.direct and backend.name == "flashinfer",
                 draft_kv=draft_kv, drafter=drafter)
        lm.speculative_max_batch = speculative_max_batch
        lm.chat_template, lm.folder = chat_template, folder
        if stage.world.size > 1:  # every rank of the job: tensor and pipeline parallel
            check = env.tp_check() if lockstep_check is None else bool(lockstep_check)
            lm._lockstep(stage.world, check)
        return lm

    @property
    def compile_stats(self) -> dict[str, Any]:
        """Whether the model runs compiled, and its variants and seconds (``Transformer``'s)."""
        return self.transformer.compile_stats()

    def warm_up(self) -> dict[str, Any]:
        """Run the forwards a server's first requests would: prefills, decode steps of one row and
        of two and, when the model drafts, verify windows and draft steps, so a compiled model makes
        its variants before it serves. What they cached is evicted again. Returns
        ``compile_stats``."""
        prompts = ["def warm_up(self):\n", "Warm up the model.\n"]
        for drafts in (None, 0):  # the model's own draft count, then plain decode steps
            self.generate_batch(prompts, max_new_tokens=8, speculative_tokens=drafts)
            self.generate(prompts[0], max_new_tokens=8, speculative_tokens=drafts)
        self.pool.evict(self.pool.num_slots)
        return self.compile_stats

    # ------------------------------------------------------------------ tensor parallelism
    def _tp_pools(self) -> dict[str, KvCachePool]:
        """The pools every rank keeps in lockstep (``parallel_ranks.lockstep_pools``)."""
        return lockstep_pools(self.pool, self.drafter)

    def _lockstep(self, tp: TensorParallel, check: bool) -> None:
        """Every rank of the job ``tp``: the same pools, then rank 0 leads (``join_lockstep``)."""
        self.tp = tp
        join_lockstep(tp, self._tp_pools(), self.transformer, check)

    @property
    def drafter(self) -> Drafter | None:
        """The model's drafter (``from_pretrained``'s ``drafter``; None: plain decoding only)."""
        return self.runner.drafter

    @property
    def serving_context(self) -> ServingContext:
        """What the serving layer needs of this model (``ServingContext``): the runner, tokenizer,
        vocabulary, stop ids, longest request and whether rounds may be token trees."""
        return ServingContext(self.runner, self.tokenizer, self.config.vocab_size,
                              tuple(self.config.eos_token_ids), self.max_seq_len, self.tree_rounds,
                              self.grammars)

    def request(self, prompt: str | Sequence[int], params: SamplingParams | None = None, *,
                listener: Listener = None, cancel: Callable[[], bool] | None = None,
                on_round: Callable[[RoundRecord], None] | None = None) -> Request:
        """Validate one request without queuing it (``ServingContext.request``: ``RequestError``
        with the field in ``field``, nothing bound); ``serving_loop.submit`` queues it."""
        return self.serving_context.request(prompt, params, listener=listener, cancel=cancel,
                                            on_round=on_round)

    @property
    def tree_rounds(self) -> bool:
        """Whether speculative rounds may be token trees: the drafter proposes them
        (``propose_tree``) and the model verifies them (a dense model on one rank)."""
        return callable(getattr(self.drafter, "propose_tree", None)) and \
            not self.pool.state_pools and self.tp.size == 1 and self.pool.direct

    @property
    def is_follower(self) -> bool:
        """True on ranks > 0 of a tensor- or pipeline-parallel model: call ``follow()`` instead of
        generating."""
        return self.tp.size > 1 and not self.tp.is_leader

    def follow(self) -> int:
        """A rank > 0's serving loop: replay rank 0's plans (its pools' calls, then each forward,
        joining rank 0's collectives) until rank 0 closes its model, then close this rank's pools;
        returns the plans replayed. RuntimeError on rank 0 or without tensor or pipeline
        parallelism; LockstepError when this rank's pools diverge, its forward fails (a pipeline
        peer died: PipelineError) or rank 0 dies or hangs past the group's timeout (the pools are
        closed either way)."""
        if not self.is_follower:
            raise RuntimeError("follow() runs on ranks > 0 of a tensor-parallel model; rank 0 "
                               "generates")
        try:
            return follow_leader(self.tp, self._tp_pools(), self.transformer, self.backend)
        finally:
            self._close_pools()

    @property
    def draft_policy(self) -> DraftPolicy:
        """The policy that chooses each round's drafts for requests with
        ``speculative_tokens="auto"`` (``draft_policy`` module; default ``ThroughputPolicy``,
        maximising expected tokens per second)."""
        return self.runner.draft_policy

    @draft_policy.setter
    def draft_policy(self, policy: DraftPolicy) -> None:
        if not isinstance(policy, DraftPolicy):
            raise ValueError("draft_policy must have choose, observe_round and observe_plain "
                             f"(DraftPolicy), got {policy!r}")
        self.runner.draft_policy = policy

    @property
    def speculative_max_batch(self) -> int | None:
        """The most rows a decoding step may hold and still speculate (None, the default: no limit).
        A step with more rows decodes plainly, in ``generate_batch`` and in the engine alike (vLLM's
        ``speculative_disable_by_batch_size``): a large batch already amortises each forward, and
        its verify windows multiply the attention work. Rows keep their draft history, so they
        speculate again once the batch shrinks. ValueError unless None or an int >= 0."""
        return self.runner.speculative_max_batch

    @speculative_max_batch.setter
    def speculative_max_batch(self, value: int | None) -> None:
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or
                                  value < 0):
            raise ValueError(f"speculative_max_batch must be None or an int >= 0, got {value!r}")
        self.runner.speculative_max_batch = value

    @property
    def jump_forward(self) -> bool:
        """Whether constrained requests append the tokens their grammar forces without sampling
        them (True, the default): where the grammar allows exactly one next token, and one after
        that, and so on (up to 16), those tokens go through one verify forward as forced drafts.
        The output is the same token for token either way; only the forwards differ
        (``stats["forced_tokens"]``). TypeError unless a bool."""
        return self.runner.jump_forward

    @jump_forward.setter
    def jump_forward(self, value: bool) -> None:
        if not isinstance(value, bool):
            raise RequestTypeError(f"jump_forward must be a bool, got {value!r}",
                                   field="jump_forward")
        self.runner.jump_forward = value

    @classmethod
    def default(cls, kind: str = "dense", **kwargs: Any) -> LanguageModel:
        """A small byte-level model shipped in the package (see each folder's README.md):
        ``kind="dense"`` the Qwen3-architecture model, ``kind="hybrid"`` the hybrid Qwen3.5 one
        (Gated DeltaNet + gated attention); both have an MTP head. ``kwargs`` go to
        ``from_pretrained``. ValueError for another kind."""
        if kind not in DEFAULT_MODEL_DIRS:
            raise ValueError(f"kind must be one of {sorted(DEFAULT_MODEL_DIRS)}, got {kind!r}")
        return cls.from_pretrained(DEFAULT_MODEL_DIRS[kind], **kwargs)

    # ------------------------------------------------------------------ input checks
    def encode(self, prompt: str | Sequence[int]) -> list[int]:
        """Token ids of ``prompt`` (text through the tokenizer, or ids checked against the
        vocabulary like ``decode``). ValueError for an empty prompt or an id outside the
        vocabulary."""
        return self.serving_context.encode(prompt)

    def decode(self, tokens: Sequence[int]) -> str:
        """Text of token ids (special tokens dropped). ValueError naming the first id outside the
        vocabulary."""
        return self.tokenizer.decode(self.serving_context.token_ids(tokens, "tokens"))

    def register_segment(self, segment: str | Sequence[int]) -> Segment:
        """Keep the KV of ``segment`` (text or ids), computed once at position 0, until
        ``release_segment``; requests splice it (``segments=[...]``, docs/segments.md). Errors of
        ``ServingContext.segment_tokens`` and ``SegmentRegistry.register``."""
        ids = self.serving_context.segment_tokens(segment)
        return self.serving_loop.run_between_steps(lambda: self.runner.segments.register(ids))

    def release_segment(self, segment: Segment) -> bool:
        """Free a segment's KV (``SegmentRegistry.release``); False when already released."""
        return self.serving_loop.run_between_steps(lambda: self.runner.segments.release(segment))

    # ------------------------------------------------------------------ generation
    @property
    def serving_loop(self) -> ServingLoop:
        """The model's serving loop (created on first use): the one scheduler of every request of
        this model."""
        loop = self._serving_loop
        if loop is None:
            with self._serving_loop_lock:
                if self.pool.closed:
                    raise RuntimeError("the model is closed; load it again to generate")
                if self._serving_loop is None:
                    self._serving_loop = ServingLoop(self.serving_context)
                loop = self._serving_loop
        return loop

    def submit(self, prompt: str | Sequence[int], params: SamplingParams | None = None, *,
               listener: Listener = None, cancel: Callable[[], bool] | None = None,
               on_round: Callable[[RoundRecord], None] | None = None
               ) -> RequestHandle | SampleGroup:
        """Validate one request (``request``: ``RequestError`` naming the field, nothing bound)
        and queue it on the model's serving loop; returns its handle at once: a ``RequestHandle``,
        or for ``params.n > 1`` a ``SampleGroup`` whose ``result()`` is the list of the n samples.
        ``result()`` waits, advancing the model itself when no other thread does. Safe from any
        thread."""
        request = self.request(prompt, params, listener=listener, cancel=cancel, on_round=on_round)
        return self.serving_loop.submit(request)

    def submit_samples(self, prompt: str | Sequence[int], params: SamplingParams | None,
                       listeners: Sequence[object], *,
                       cancel: Callable[[], bool] | None = None) -> SampleGroup:
        """Validate one request for ``len(listeners)`` samples of ``prompt`` (``params`` with that
        ``n``; sample i draws with ``params.sample(i)``), each sample with its own listener
        (anything with any of GenerationListener's methods, a callable of text chunks, or None;
        ``as_listener``), and queue the samples together;
        returns their ``SampleGroup`` at once: one handle per sample, in order, for any count.
        Validated once for all samples, with ``submit``'s errors. Safe from any thread."""
        if not listeners:
            raise RequestError("listeners: give one per sample, at least one", field="listeners")
        params = replace(params or SamplingParams(), n=len(listeners))
        request = self.serving_context.request(prompt, params, cancel=cancel, listeners=listeners)
        queued = self.serving_loop.submit(request)
        return queued if isinstance(queued, SampleGroup) else SampleGroup(request, [queued])

    @overload
    def generate(self, prompt: str | Sequence[int], max_new_tokens: int = 256, *, n: Literal[1] = 1,
                 **kwargs: Any) -> Completion: ...

    @overload
    def generate(self, prompt: str | Sequence[int], max_new_tokens: int = 256, *, n: int,
                 **kwargs: Any) -> list[Completion]: ...

    def generate(self, prompt: str | Sequence[int], max_new_tokens: int = 256, *,
                 temperature: float = 0.0, top_p: float = 1.0, logprobs: bool | int = False,
                 seed: int = 0, listener: Listener = None, cancel: Callable[[], bool] | None = None,
                 stop: Any = None, speculative_tokens: int | None = None,
                 draft_sampling: str = "greedy",
                 on_round: Callable[[RoundRecord], None] | None = None, n: int = 1,
                 **options: Any) -> Completion | list[Completion]:
        """Generate up to ``max_new_tokens`` tokens after ``prompt`` (ids or text). Greedy at
        temperature 0, else nucleus sampling; a nonzero ``seed`` makes the output reproducible.
        Stops at an EOS or ``stop`` token or string (finish_reason "stop") or after
        ``max_new_tokens`` or at ``max_seq_len`` ("length"). ``cancel`` is polled before every
        forward (GenerationCancelled, KV released). ``RequestError`` for bad input, naming the
        field. Safe from any number of threads at once: concurrent calls are batched together, and
        each returns what it would return alone (greedy).

        With a drafter (the MTP head, n-gram lookup or your own), decoding is speculative:
        ``speculative_tokens`` drafts per round (None: the drafter's default; 0: plain decoding),
        verified by one target forward; ``on_round`` receives each round's ``RoundRecord``.
        ``draft_sampling="greedy"`` (default) drafts the head's argmax and keeps a draft while the
        target samples the same token; ``"sample"`` samples MTP drafts and uses rejection sampling.
        Either way the output has the target's distribution, and at temperature 0 it equals plain
        greedy decoding token for token.

        ``n > 1``: a list of ``n`` samples of the prompt (its KV computed once; see
        ``SampleGroup``), no ``listener``. ``logprobs``: True for the chosen tokens' logprobs, an
        int k in [1, 20] for the k most likely alternatives too (``Completion.top_logprobs``).
        ``options``: ``top_k``, ``min_p``, ``repetition_penalty``, ``presence_penalty``,
        ``frequency_penalty``, ``logit_bias``, ``min_new_tokens``, ``prompt_logprobs``,
        ``draft_tree`` (see ``SamplingParams``); speculation stays lossless with them.

        ``prompt``: a str or a sequence of int token ids (RequestTypeError, naming ``prompt``, for
        bytes, a lone int or a nested list). ``listener``: a ``GenerationListener``, or a plain
        callable (``print``, a lambda) that receives each text chunk. A misspelled keyword raises
        RequestTypeError (a TypeError) suggesting the closest name and listing every accepted one. A
        temperature below 1e-5 is greedy (``sampling.GREEDY_TEMPERATURE``)."""
        params = SamplingParams(max_new_tokens, temperature, top_p, seed, logprobs, stop,
                                speculative_tokens, draft_sampling, n=n,
                                **option_fields(options, "generate()", GENERATE_KEYWORDS))
        return self.submit(prompt, params, listener=listener, cancel=cancel,
                           on_round=on_round).result()

    def encode_chat(self, messages: Sequence[Any], add_generation_prompt: bool = True,
                    tools: Sequence[Any] | None = None, **template_vars: Any) -> list[int]:
        """Token ids of a conversation rendered by the checkpoint's own chat template, exactly as
        transformers' ``apply_chat_template(messages, add_generation_prompt=..., tools=...,
        tokenize=True, **template_vars)`` (e.g. ``enable_thinking=False``; see
        ``smile_llm.text.chat_template``). ValueError naming the message and field for a malformed
        message, with the template's message when it rejects the conversation, or naming the files
        looked for when the checkpoint has no template."""
        if self.chat_template is None:
            where = self.folder if self.folder is not None else "this model"
            raise ValueError(f"{where} has no chat template: looked for {TEMPLATE_FILE} and "
                             f"'chat_template' in {CONFIG_FILE}; chat needs an instruct "
                             "checkpoint's template")
        return self.encode(self.chat_template.render(messages, add_generation_prompt, tools,
                                                     **template_vars))

    @overload
    def chat(self, messages: Sequence[Any], max_new_tokens: int = 256, *, n: Literal[1] = 1,
             **kwargs: Any) -> Completion: ...

    @overload
    def chat(self, messages: Sequence[Any], max_new_tokens: int = 256, *, n: int, **kwargs: Any
             ) -> list[Completion]: ...

    def chat(self, messages: Sequence[Any], max_new_tokens: int = 256, *,
             tools: Sequence[Any] | None = None, chat_template_kwargs: dict[str, Any] | None = None,
             n: int = 1, **generate_kwargs: Any) -> Completion | list[Completion]:
        """``generate`` on ``encode_chat(messages, add_generation_prompt=True, tools=tools,
        **chat_template_kwargs)``: the assistant's next turn (a list of ``n`` candidate turns for
        ``n > 1``). ``chat_template_kwargs``: a dict of template variables (RequestTypeError naming
        it otherwise). ``generate_kwargs`` are ``generate``'s (sampling, listener, stop,
        speculative_tokens, ...). A conversation that grows turn by turn reuses the earlier turns'
        KV through the prefix cache. Errors as ``encode_chat`` and ``generate`` (a misspelled
        keyword is refused before the conversation is rendered)."""
        check_keywords(generate_kwargs, CHAT_KEYWORDS, "chat()")
        template_vars = check_template_kwargs(chat_template_kwargs)
        if "tools" in template_vars:  # given among the template's variables, as transformers allows
            if tools is not None:
                raise RequestError("tools given twice: as chat(tools=...) and in "
                                   "chat_template_kwargs; give it once", field="tools")
            tools = template_vars.pop("tools")
        ids = self.encode_chat(messages, True, tools, **template_vars)
        return self.generate(ids, max_new_tokens, n=n, **generate_kwargs)

    def stream(self, prompt: str | Sequence[int], max_new_tokens: int = 256, **generate_kwargs: Any
               ) -> TokenStream:
        """``generate`` as an iterator of ``StreamChunk`` (new text and token ids) while the tokens
        are accepted; the model advances on a background driver meanwhile (``streaming`` module).
        ``generate_kwargs`` as ``generate``'s (not ``listener`` or ``on_round``); bad input raises
        at the call, before anything is queued; the request's own error is raised by the iteration,
        and every stream ends in bounded time (after an engine's shutdown too). ``close()`` (or
        leaving ``with lm.stream(...) as chunks:``) cancels the request and releases its KV; so does
        leaving a loop over an iterator nothing else holds, dropping the iterator, or interpreter
        exit. A ``break`` out of a loop over a held iterator leaves the request running until it
        finishes or the iterator is closed or dropped."""
        submit = self._stream_submit(prompt, max_new_tokens, generate_kwargs)
        return streaming.stream(submit, self.serving_loop.serve_until_idle)

    def astream(self, prompt: str | Sequence[int], max_new_tokens: int = 256, **generate_kwargs: Any
                ) -> AsyncIterator[StreamChunk]:
        """``stream`` for asyncio (``async for chunk in lm.astream(...)``); cancelling the task or
        leaving the loop cancels the request."""
        submit = self._stream_submit(prompt, max_new_tokens, generate_kwargs)
        return streaming.astream(submit, self.serving_loop.serve_until_idle)

    def _stream_submit(self, prompt: str | Sequence[int], max_new_tokens: int,
                       kwargs: dict[str, Any]) -> Callable[[Any], RequestHandle]:
        """Validate now (a bad field raises here, nothing queued) and return how to queue that one
        request with the stream's listener."""
        check_keywords(kwargs, STREAM_KEYWORDS, "stream()")
        fields = dict(kwargs)
        cancel = fields.pop("cancel", None)
        request = self.request(prompt, SamplingParams(max_new_tokens, **fields), cancel=cancel)
        if request.params.n != 1:
            raise RequestError(f"n must be 1 to stream (got {request.params.n}): stream one sample "
                               "at a time", field="n")
        return lambda listener: cast(RequestHandle,
                                     self.serving_loop.submit(replace(request, listener=listener)))

    def generate_batch(self, prompts: Iterable[str | Sequence[int]], max_new_tokens: int = 256, *,
                       temperature: float = 0.0, top_p: float = 1.0, logprobs: bool | int = False,
                       seed: int = 0, stop: Any = None, speculative_tokens: int | None = None,
                       draft_sampling: str = "greedy", n: int = 1,
                       **options: Any) -> list[Completion]:
        """Generate for several prompts as one batch on the model's scheduler (prefix reuse
        included: prompts sharing an uncached prefix compute it once; short prompt remainders are
        prefilled together). Row i samples with seed ``seed + i`` (when seed is nonzero). Greedy
        results equal ``generate`` on each prompt. ``n > 1``: ``n`` samples per prompt, prompt after
        prompt (``len(prompts) * n`` Completions, as HF's ``num_return_sequences``). Every prompt is
        validated before any is queued; if one request fails, the others are cancelled and its error
        is raised. ``prompts`` is a list (or other iterable) of prompts, each a str or a sequence of
        token ids; RequestTypeError for a lone str or bytes (not one prompt per character) or a
        prompt of another kind (naming ``prompts[i]``)."""
        if isinstance(prompts, (str, bytes, bytearray)) or not isinstance(prompts, Iterable):
            raise RequestTypeError("prompts must be a list of prompts (each a str or a sequence of "
                                   f"int token ids), got {type(prompts).__name__}: for one prompt "
                                   "give [prompt] or call generate()", field="prompts")
        base = SamplingParams(max_new_tokens, temperature, top_p, seed, logprobs, stop,
                              speculative_tokens, draft_sampling, n=n,
                              **option_fields(options, "generate_batch()", BATCH_KEYWORDS))
        requests = []
        for i, p in enumerate(prompts):
            check_prompt(p, f"prompts[{i}]")
            # nonzero seeds stay nonzero per row
            row_seed = ((seed + i) % (1 << 64) or (1 << 62)) if seed else 0
            requests.append(self.request(p, replace(base, seed=row_seed)))
        handles = [self.serving_loop.submit(r) for r in requests]
        try:
            out: list[Completion] = []
            for h in handles:
                result = h.result()
                out.extend(result if isinstance(result, list) else [result])
            return out
        finally:
            for h in handles:
                h.cancel()

    def close(self) -> None:
        """Cancel every pending request (EngineShutdownError), stop the model's serving loop and
        release its KV pools; with tensor parallelism, stop the followers and destroy the process
        group the model created. Later generate calls raise RuntimeError. Idempotent; safe from any
        thread."""
        with self._serving_loop_lock:
            loop = self._serving_loop
        if loop is not None:
            loop.shutdown()
            if loop.in_step():  # from a listener: the pools close once the step has ended
                loop.defer(self._close_pools)
                return
        self._close_pools()

    def _close_pools(self) -> None:
        leader = self.transformer.leader
        try:
            # rank 0 of a tensor-parallel model: the followers stop and close theirs
            if leader is not None:
                self.transformer.leader = None
                leader.stop()
        finally:
            try:
                self.pool.close()
                if self.drafter is not None:
                    self.drafter.close()
            finally:
                self.tp.leave()  # the process group init_tensor_parallel made, if it did
