"""Pipeline stages: the part of a model one pipeline-parallel rank holds, and its part of each
forward (docs/pipeline_parallel.md).

Stage s of N holds the decoder layers ``split_layers(L, N)[s] = [a_s, b_s)`` (contiguous, the first
``L mod N`` stages one layer longer) and, besides them:

| part | held by |
|---|---|
| ``embed_tokens`` | the first stage; the last one too when the model has an MTP head (its
  input embeds the drafted tokens) or ties its LM head to the embedding |
| ``model.norm``, ``lm_head``, the MTP head (``mtp.*``) | the last stage |

An embedding, final norm or LM head a stage does not hold keeps its module with no rows (a
zero-size placeholder: nothing is read or allocated for it); the MTP head is None there. The
stage's layers are numbered from 0 in its ``ModuleList`` (checkpoint layer ``i`` loads into
``i - a_s``); ``PipelineStage.local_layer`` (and ``Transformer.layer``) translate the model's
numbering and refuse a layer the stage does not hold. The stage's KV pool
holds the full-attention layers among its own (``kv_layers``, ``KvCachePool(...,
first_layer=kv_layers.start)``) and its DeltaNet state pool the DeltaNet ones (``linear_layers``);
a stage without either keeps a pool of zero layers (or one-element state slots): the bookkeeping
that every rank makes alike (pages, slots, snapshots), no K/V.

``run_stage`` is a stage's part of a target forward: the first stage embeds the tokens, the others
receive the previous stage's output; the stage runs its layers and sends their output on; the last
stage computes the logits and returns them with the hidden states to rank 0, which receives them
(``PipelineParallel``). An MTP draft step runs on the last stage alone (``Transformer.draft``); the
other stages book it in their draft pools and rank 0 receives its logits and head output
(``draft_outputs``). Each forward commits its KV step once its part and its transfers succeeded.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import torch
from torch import nn

from ..cache import LayerNotHeldError
from ..distributed.group import TensorParallel, init_tensor_parallel
from ..distributed.pipeline import (PipelineParallel, check_pipeline_parallel, init_pipeline,
                                    split_layers)
from .checkpoint.config import ModelConfig
from .checkpoint.hybrid_config import LINEAR_ATTENTION
from .families import family_of
from .hybrid_layer import layer_indices

if TYPE_CHECKING:
    from .forward_context import LayerContext


class StageModel(Protocol):
    """What a stage's forward needs of the model (``Transformer``)."""

    config: ModelConfig
    vocab_size: int  # the whole vocabulary: the logits' width
    model: Any  # HF's ``model.*``: ``layers`` (this stage's) and ``norm``

    @property
    def dtype(self) -> torch.dtype: ...

    def embed(self, tokens: torch.Tensor) -> torch.Tensor: ...

    def logits(self, x: torch.Tensor) -> torch.Tensor: ...

    def layers_forward(self, x: torch.Tensor, ctx: LayerContext) -> torch.Tensor: ...


@dataclass(frozen=True)
class PipelineStage:
    """Stage ``index`` of ``count``: decoder layers ``layers``, KV layers ``kv_layers`` and DeltaNet
    layers ``linear_layers`` (the model's numbering), whether it holds the embedding, the job's
    ranks ``world`` (the lockstep's group) and ``pipe``, the transfers (None for a model on one
    stage: every layer, nothing sent)."""

    index: int
    count: int
    layers: range
    kv_layers: range
    linear_layers: range
    holds_embedding: bool
    world: TensorParallel
    pipe: PipelineParallel | None = None

    @classmethod
    def of(cls, config: ModelConfig, index: int, count: int, world: TensorParallel,
           pipe: PipelineParallel | None = None) -> PipelineStage:
        """Stage ``index`` of ``count`` of a model of ``config`` (``split_layers``)."""
        layers = split_layers(config.num_hidden_layers, count)[index]
        before = layer_indices(config)  # per layer: the KV and DeltaNet layers before it
        kv_total = sum(1 for t in config.layer_types if t != LINEAR_ATTENTION)
        before.append((kv_total, config.num_hidden_layers - kv_total))
        (kv_a, lin_a), (kv_b, lin_b) = before[layers.start], before[layers.stop]
        last = index == count - 1
        mtp_or_tied = config.mtp_num_hidden_layers > 0 or config.tie_word_embeddings
        return cls(index, count, layers, range(kv_a, kv_b), range(lin_a, lin_b),
                   index == 0 or (last and mtp_or_tied), world, pipe)

    @property
    def is_first(self) -> bool:
        """The stage that embeds the tokens (rank 0's)."""
        return self.index == 0

    @property
    def is_last(self) -> bool:
        """The stage that holds the final norm, the LM head and the MTP head."""
        return self.index == self.count - 1

    def local_layer(self, layer: int) -> int:
        """The index in this stage's layers of the model's decoder layer ``layer``.
        LayerNotHeldError (an IndexError) naming the stage's range for a layer it does not hold;
        ValueError for a non-int."""
        if isinstance(layer, bool) or not isinstance(layer, (int, np.integer)):
            raise ValueError(f"layer must be an int, got {type(layer).__name__} {layer!r}")
        if int(layer) not in self.layers:
            raise LayerNotHeldError(f"decoder layer {layer} is not held by pipeline stage "
                                    f"{self.index} of {self.count}, which holds layers "
                                    f"[{self.layers.start}, {self.layers.stop})")
        return int(layer) - self.layers.start

    def build_layers(self, config: ModelConfig) -> list[nn.Module]:
        """This stage's decoder layers, each over its KV or DeltaNet layer in the stage's pools
        (numbered from the stage's first). ValueError for a family that cannot be split."""
        family = family_of(config)
        if family.layer is None:
            raise ValueError(f"the {family.name} family cannot be split into pipeline stages")
        indices = layer_indices(config)
        kv0, lin0 = self.kv_layers.start, self.linear_layers.start
        return [family.layer(config, i, indices[i][0] - kv0, indices[i][1] - lin0)
                for i in self.layers]

    def checkpoint_name(self, name: str, config: ModelConfig) -> str | None:
        """The name under which this stage loads checkpoint tensor ``name`` (its layers renumbered
        from 0), or None for a tensor of another stage."""
        prefix = f"{config.weight_prefix}layers."
        if name.startswith(prefix):
            index, _, rest = name[len(prefix):].partition(".")
            layer = int(index)
            return f"{prefix}{layer - self.layers.start}.{rest}" if layer in self.layers else None
        if name == f"{config.weight_prefix}embed_tokens.weight":
            return name if self.holds_embedding else None
        if (name in (f"{config.weight_prefix}norm.weight", "lm_head.weight")
                or name.startswith("mtp.")):
            return name if self.is_last else None
        return name


def placeholder_linear(in_features: int) -> nn.Linear:
    """A linear layer of no rows: the LM head of a stage that does not hold it (made without the
    warning torch gives when it initialises an empty weight)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Initializing zero-element tensors")
        return nn.Linear(in_features, 0, bias=False)


def init_stage(config: ModelConfig, tensor_parallel: int, pipeline_parallel: int,
               device: torch.device, drafter: object = None) -> tuple[TensorParallel,
                                                                      PipelineStage]:
    """This process's tensor-parallel group and pipeline stage. ``pipeline_parallel == 1``: the
    whole model, the group of ``init_tensor_parallel`` (its errors). Otherwise
    ``init_pipeline``'s groups, after the checks, which raise ValueError before any group is
    joined: ``pipeline_parallel`` an int in ``[1, num_hidden_layers]``, a family that splits, no
    draft model (``drafter="draft:PATH"``, which runs on one rank), and (``init_pipeline``) a job of
    ``tensor_parallel * pipeline_parallel`` processes."""
    check_pipeline_parallel(pipeline_parallel, config.num_hidden_layers)
    if pipeline_parallel == 1:
        tp = init_tensor_parallel(tensor_parallel, device)
        return tp, PipelineStage.of(config, 0, 1, tp)
    if family_of(config).layer is None:
        raise ValueError(f"the {family_of(config).name} family cannot be split into pipeline "
                         "stages")
    if isinstance(drafter, str) and drafter.startswith("draft:"):
        raise ValueError("a draft model (drafter='draft:PATH') is not supported with "
                         "pipeline_parallel > 1; use the MTP head, 'ngram' or none")
    pipe = init_pipeline(tensor_parallel, pipeline_parallel, device)
    return pipe.tp, PipelineStage.of(config, pipe.stage, pipe.num_stages, pipe.world, pipe)


def run_stage(model: StageModel, stage: PipelineStage, tokens: torch.Tensor, ctx: LayerContext,
              logit_cols: np.ndarray | None) -> tuple[torch.Tensor, torch.Tensor]:
    """A stage's part of a target forward of ``tokens`` ``[B, S]`` (see the module docstring);
    returns (logits, hidden) as ``Transformer.run`` does on rank 0 and on the last stage, empty
    tensors on the other stages. Commits ``ctx`` once the part and its transfers succeeded;
    PipelineError when a transfer fails."""
    pipe = stage.pipe
    assert pipe is not None
    b, s = tokens.shape
    d, dtype, device = model.config.hidden_size, model.dtype, tokens.device
    x = model.embed(tokens) if stage.is_first else pipe.recv_prev((b, s, d), dtype, device)
    x = model.layers_forward(x, ctx)
    if stage.is_last:
        h = x
        if logit_cols is not None:
            cols = torch.from_numpy(np.asarray(logit_cols, dtype=np.int64)).to(device)
            h = x[torch.arange(b, device=device), cols][:, None]
        logits = model.logits(model.model.norm.forward(h))
        pipe.send_outputs(logits, x)
        ctx.commit()
        return logits, x
    pipe.send_next(x)
    width = s if logit_cols is None else 1
    logits, hidden = pipe.recv_outputs([((b, width, model.vocab_size), torch.float32),
                                        ((b, s, d), dtype)], device)
    ctx.commit()
    return logits, hidden


def draft_outputs(model: StageModel, stage: PipelineStage, batch: int, device: torch.device,
                  ctx: LayerContext) -> tuple[torch.Tensor, torch.Tensor]:
    """An MTP draft step on a stage without the head (every stage but the last): rank 0 receives
    the last stage's logits ``[B, V]`` and head output ``[B, D]``, the other ranks get empty
    tensors; ``ctx`` (the draft pool's step) is committed once they came, so every rank books the
    step. PipelineError when the transfer fails."""
    assert stage.pipe is not None
    logits, hidden = stage.pipe.recv_outputs(
        [((batch, model.vocab_size), torch.float32),
         ((batch, model.config.hidden_size), model.dtype)], device)
    ctx.commit()
    return logits, hidden
