"""The decoder: embeddings, decoder layers over the paged KV pool, final norm and LM head.

``forward`` runs one step for the active rows of a pool: ``tokens[b]`` are the tokens at positions
``[start_b, start_b + S)`` of row b (S the same for every row; the rows' starts may differ, so one
code path serves batched prefill and ragged decode). Each forward's K/V go through one
``pool.kv_step`` handle (validated once, written by every layer, committed to ``kv_len`` only when
the forward succeeded) and attention reads the pool through the backend with the step's shared CSR.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from ..attention.backend import AttentionBackend
from ..cache import KvCachePool
from ..distributed.group import TensorParallel
from ..distributed.lockstep import Leader
from .checkpoint.config import ModelConfig
from .forward_context import ForwardContext, LayerContext, RopeTable
from .families import family_of
from .layers import rope_inv_freq
from .compiled import CompiledLayers
from .mtp_head import MtpHead
from .stages import PipelineStage, draft_outputs, placeholder_linear, run_stage
from .state_step import StateStep


@dataclass(frozen=True)
class ForwardOutput:
    """The target's output for a window: float32 ``logits`` ``[B, S, vocab]`` (``[B, 1, vocab]``
    when the forward asked for one column per row) and ``hidden`` ``[B, S, D]`` (the last layer's
    output before the final norm, the MTP head's input); ``states``: the forward's DeltaNet
    ``StateStep`` on a hybrid model (None otherwise), whose ``rewind`` a verify window needs."""

    logits: torch.Tensor  # float32 [B, S, vocab]
    # [B, S, hidden]: the last decoder layer's output before the final norm (MTP input)
    hidden: torch.Tensor
    states: StateStep | None = None


@dataclass(frozen=True)
class DraftOutput:
    """One MTP draft step's output: float32 ``logits`` ``[B, vocab]`` and the head's ``hidden``
    ``[B, D]`` before its norm (the next chained step's input)."""

    logits: torch.Tensor  # float32 [B, vocab]: at column ``cols[b]`` of each row
    # [B, hidden]: the MTP head's output (before its norm) at that column (chained input)
    hidden: torch.Tensor


class DecoderModel(nn.Module):
    """HF's ``model.*`` part: ``embed_tokens``, ``layers`` and ``norm``, as the config's family
    builds them (``families.family_of``); a pipeline ``stage``'s layers and parts only (the others
    with no rows, see ``stages``)."""

    def __init__(self, config: ModelConfig, stage: PipelineStage | None = None) -> None:
        super().__init__()
        family = family_of(config)
        embed = stage is None or stage.holds_embedding
        self.embed_tokens = nn.Embedding(config.vocab_size if embed else 0, config.hidden_size)
        self.layers = nn.ModuleList(family.layers(config) if stage is None
                                    else stage.build_layers(config))
        self.norm = family.norm(config.hidden_size if stage is None or stage.is_last else 0,
                                config.rms_norm_eps)


class Transformer(nn.Module):
    """A causal LM with HF parameter names (``model.*``, ``lm_head``); with a pipeline ``stage``
    of several, that stage's part (``stages``)."""

    def __init__(self, config: ModelConfig, tp: TensorParallel | None = None,
                 vocab_size: int | None = None, stage: PipelineStage | None = None) -> None:
        super().__init__()
        self.config = config
        # this rank's stage of a pipeline (None: the whole model)
        self.stage = stage if stage is not None and stage.count > 1 else None
        head = self.stage is None or self.stage.is_last  # the final norm, LM head and MTP head
        self.tp = tp if tp is not None and tp.size > 1 else None  # None: one rank
        # the shard's size would silently cut every logits row
        if self.tp is not None and vocab_size is None:
            raise ValueError("a tensor-parallel Transformer needs vocab_size, the whole vocabulary "
                             "(config holds this rank's partition)")
        # the whole vocabulary (config has this rank's partition)
        self.vocab_size = vocab_size or config.vocab_size
        # rank 0 of a tensor-parallel group: sends each forward to the followers
        self.leader: Leader | None = None
        self.model = DecoderModel(config, self.stage)
        self.lm_head = (nn.Linear(config.hidden_size, config.vocab_size, bias=False) if head
                        else placeholder_linear(config.hidden_size))
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.mtp = MtpHead(config) if config.mtp_num_hidden_layers and head else None
        self._rope = RopeTable()
        self.compiled: CompiledLayers | None = None  # ``compile_layers``
        self.register_buffer("inv_freq", rope_inv_freq(config.rotary_dim, config.rope_theta,
                                                       config.rope_scaling),
                             persistent=False)

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        """The token embeddings ``[..., D]`` of int64 ``tokens`` (vocabulary-parallel:
        each rank looks up the tokens of its partition, zeros for the others, and one
        all-reduce sums them)."""
        weight = self.model.embed_tokens.weight
        if self.tp is None:
            return F.embedding(tokens, weight)
        local = tokens - self.tp.rank * weight.shape[0]
        mine = (local >= 0) & (local < weight.shape[0])
        x = (F.embedding(local.clamp(0, weight.shape[0] - 1), weight)
             * mine.unsqueeze(-1).to(weight.dtype))
        return self.tp.all_reduce(x)

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """float32 LM-head logits ``[..., vocab]`` of already-normed hidden states ``x``
        (vocabulary-parallel: the ranks' partitions gathered in rank order, the padding past the
        vocabulary cut)."""
        out = F.linear(x, self.lm_head.weight).float()
        if self.tp is None:
            return out
        return self.tp.all_gather_last(out)[..., : self.vocab_size]

    @property
    def dtype(self) -> torch.dtype:
        """The parameters' dtype."""
        return self.model.embed_tokens.weight.dtype

    def compile_layers(self) -> None:
        """Run the decoder layers as one compiled graph from now on (``compiled``; a pipeline stage
        its own range of layers). The MTP head stays eager: its one layer saves less compiled than
        a compiled call's fixed cost (guards, runtime wrappers), measured in docs/compile.md."""
        self.compiled = CompiledLayers(self.model.layers)

    def compile_stats(self) -> dict[str, Any]:
        """Whether the layers run compiled (``compiled``), the variants their graph has
        (``compiled_variants``: those of every model of this structure in the process) and the
        seconds this model's forwards spent making them (``compile_seconds``: tracing and
        compiling, or loading from inductor's cache)."""
        c = self.compiled
        return {"compiled": c is not None, "compiled_variants": 0 if c is None else c.variants,
                "compile_seconds": 0.0 if c is None else round(c.stats.seconds, 3)}

    @property
    def has_mtp(self) -> bool:
        """Whether the model drafts with an MTP head: this rank holds it, or (a pipeline stage) the
        last stage does."""
        return self.mtp is not None or (self.stage is not None
                                        and self.config.mtp_num_hidden_layers > 0)

    def layer(self, index: int) -> nn.Module:
        """Decoder layer ``index`` in the model's numbering. LayerNotHeldError (an IndexError) on a
        pipeline stage that does not hold it; IndexError past the model's layers."""
        return self.model.layers[index if self.stage is None else self.stage.local_layer(index)]

    def context(self, pool: KvCachePool, backend: AttentionBackend, start: np.ndarray, seqlen: int,
                valid: np.ndarray | None = None, keep_states: bool = False,
                offsets: np.ndarray | None = None,
                mask: torch.Tensor | None = None) -> ForwardContext:
        """A ``ForwardContext`` for a window of ``seqlen`` positions starting at ``start[b]``
        of the pool's active rows, with this model's RoPE tables and head geometry;
        ``valid[b]``: row b's real positions (right padding after); ``keep_states``: keep the
        DeltaNet state after every position (a verify window); ``offsets`` (int64
        ``[B, seqlen]``): column s of row b sits at position ``start[b] + offsets[b, s]``
        instead of ``start[b] + s``; ``mask``: the attention mask in FlashInfer's
        ``custom_mask`` layout (bool, row after row: the ``[seqlen, start[b] + seqlen]`` block
        of which keys each query sees) instead of the causal one."""
        c = self.config
        return ForwardContext(pool, backend, start, seqlen, self.rope(start, seqlen, offsets),
                              c.num_attention_heads, c.num_key_value_heads, c.head_dim, self.dtype,
                              valid, keep_states, self.tp, mask)

    def rope(self, start: np.ndarray, seqlen: int,
             offsets: np.ndarray | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """RoPE cos and sin ``[B, S, 1, head_dim]`` of positions ``start[b] + [0, S)`` (or
        ``start[b] + offsets[b, s]``; from a cached table; sin with its first half negated,
        see ``RopeTable``)."""
        return self._rope.lookup(start, seqlen, self.get_buffer("inv_freq"), self.dtype, offsets)

    @torch.inference_mode()
    def forward(self, tokens: torch.Tensor, start: np.ndarray, pool: KvCachePool,
                backend: AttentionBackend, logit_cols: np.ndarray | None = None,
                keep_states: bool = False, offsets: np.ndarray | None = None,
                mask: torch.Tensor | None = None) -> ForwardOutput:
        """``tokens`` int64 ``[B, S]`` for the pool's active rows at positions
        ``start[b] + [0, S)``. With ``logit_cols`` (int64 ``[B]``) the LM head runs only at column
        ``logit_cols[b]`` of each row and ``logits`` is ``[B, 1, vocab]`` (a prefill needs the last
        prompt position's logits alone); ``hidden`` keeps every position. ``keep_states`` (a verify
        window on a hybrid model): ``ForwardOutput.states`` can ``rewind``. ``offsets`` and ``mask``
        (a token-tree verify window: positions by depth, attention to ancestors) as in ``context``;
        one rank and attention layers only (ValueError otherwise)."""
        # padding follows
        valid = None if logit_cols is None else np.asarray(logit_cols, dtype=np.int64) + 1
        if ((offsets is not None or mask is not None)
                and (self.leader is not None or pool.state_pools)):
            raise ValueError("token-tree verify windows need a dense model on one rank (no tensor "
                             "parallelism, no DeltaNet layers)")
        # checks inputs
        ctx = self.context(pool, backend, start, tokens.shape[1], valid, keep_states, offsets, mask)
        if self.leader is None:
            return self.run(tokens, ctx, logit_cols)
        # the followers run it too
        with self.leader.forward(pool, tokens, start, logit_cols, keep_states):
            return self.run(tokens, ctx, logit_cols)

    def run(self, tokens: torch.Tensor, ctx: LayerContext,
            logit_cols: np.ndarray | None = None) -> ForwardOutput:
        """The forward over a prepared context (CUDA-graph runners capture this with static
        buffers); commits the context's KV write once every layer has run (a forward that raises
        records nothing). ``logit_cols`` as in ``forward``."""
        if self.stage is not None:  # this stage's layers, the activations from and to its peers
            return ForwardOutput(*run_stage(self, self.stage, tokens, ctx, logit_cols), ctx.states)
        x = self.layers_forward(self.embed(tokens), ctx)
        h = x
        if logit_cols is not None:
            rows = torch.arange(x.shape[0], device=x.device)
            h = x[rows,
                  torch.from_numpy(np.asarray(logit_cols, dtype=np.int64)).to(x.device)][:, None]
        out = ForwardOutput(self.logits(self.model.norm.forward(h)), x, ctx.states)
        ctx.commit()
        return out

    def layers_forward(self, x: torch.Tensor, ctx: LayerContext) -> torch.Tensor:
        """This rank's decoder layers over ``x`` ``[B, S, D]``: one compiled graph once
        ``compile_layers`` ran, else layer by layer."""
        if self.compiled is not None and len(self.model.layers):
            return self.compiled(x, ctx, self.tp is not None)  # attention as custom ops
        for layer in self.model.layers:
            x = layer.forward(x, ctx)  # no hooks: skip Module.__call__ (DecoderLayer.forward)
        return x

    def rewind(self, out: ForwardOutput, kept: np.ndarray) -> None:
        """After a verify window (``keep_states``) of a hybrid model: each row's DeltaNet state
        after its last kept position (``StateStep.rewind``; with tensor parallelism every rank's, in
        order with its pool calls). Nothing for a dense model."""
        if out.states is None:
            return
        if self.leader is not None:
            self.leader.record_rewind(kept)
        out.states.rewind(kept)

    @torch.inference_mode()
    def draft(self, tokens: torch.Tensor, hidden: torch.Tensor, start: np.ndarray,
              pool: KvCachePool, backend: AttentionBackend,
              cols: np.ndarray | None = None) -> DraftOutput:
        """One MTP step over the active rows of the MTP ``pool``: ``tokens`` int64 ``[B, S]`` are
        the next tokens and ``hidden`` ``[B, S, D]`` the hidden states of MTP positions
        ``start[b] + [0, S)``; their K/V are written (committed to the MTP pool's ``kv_len`` when
        the step succeeded). Returns logits and head output at column ``cols[b]`` of each row
        (default: the last), so padded columns after a row's real ones are never read. RuntimeError
        without an MTP head."""
        if not self.has_mtp:
            raise RuntimeError("this model has no MTP head (mtp_num_hidden_layers is 0); it cannot "
                               "draft")
        ctx = self.context(pool, backend, start, tokens.shape[1])  # checks every input
        if self.leader is not None:
            with self.leader.draft(pool, tokens, hidden, start, cols):  # the followers run it too
                return self._draft(tokens, hidden, cols, ctx)
        return self._draft(tokens, hidden, cols, ctx)

    @torch.inference_mode()
    def draft_step(self, tokens: torch.Tensor, hidden: torch.Tensor,
                   ctx: LayerContext) -> DraftOutput:
        """One MTP step of ``tokens`` ``[B, S]`` and ``hidden`` ``[B, S, D]`` over a prepared
        context (a ``DraftChain``'s column); logits and head output at the last column."""
        return self._draft(tokens, hidden, None, ctx)

    def _draft(self, tokens: torch.Tensor, hidden: torch.Tensor, cols: np.ndarray | None,
               ctx: LayerContext) -> DraftOutput:
        if self.stage is not None and self.mtp is None:  # the MTP head is the last stage's
            return DraftOutput(*draft_outputs(self, self.stage, tokens.shape[0], tokens.device,
                                              ctx))
        assert self.mtp is not None
        x = self.mtp.forward(self.embed(tokens), hidden, ctx)
        if cols is None or (cols == x.shape[1] - 1).all():
            last = x[:, -1]  # [B, D]
        else:
            last = x[torch.arange(x.shape[0], device=x.device), torch.from_numpy(cols).to(x.device)]
        out = DraftOutput(self.logits(self.mtp.norm.forward(last)), last)
        if self.stage is not None and self.stage.pipe is not None:  # to rank 0
            self.stage.pipe.send_outputs(out.logits, out.hidden)
        ctx.commit()
        return out
