"""Megatron-style sharding of a dense model across ``size`` ranks, and reading each rank's slices
of a checkpoint.

| parameter (HF name) | split | rank r holds |
|---|---|---|
| ``*.q_proj.weight`` / ``.bias`` | rows (column-parallel) | query heads ``[r H/N, (r+1) H/N)`` |
| ``*.k_proj.*``, ``*.v_proj.*`` | rows | KV heads ``[r Hkv/N, (r+1) Hkv/N)``; with fewer KV heads
  than ranks, the one KV head its query heads read (replicated) |
| ``*.o_proj.weight`` | columns (row-parallel)
  | its query heads' inputs; the outputs are summed by one all-reduce |
| ``*.gate_proj.weight``, ``*.up_proj.weight`` | rows
  | ``[r I/N, (r+1) I/N)`` of the MLP's inner dim |
| ``*.down_proj.weight`` | columns | the same inner slice; summed by one all-reduce |
| ``model.embed_tokens.weight``, ``lm_head.weight`` | rows (vocabulary-parallel)
  | ``[r P, (r+1) P)`` with ``P = ceil(V/N)``, zero rows past V |
| MoE experts' and the shared expert's ``gate/up/down_proj`` | like the MLP
  | its slice of each expert's inner dim |
| DeltaNet ``in_proj_qkv`` and ``conv1d.weight`` (channels ``[q | k | v]``) | three row blocks
  | its key heads' q and k, its value heads' v |
| DeltaNet ``in_proj_z``, ``in_proj_b``, ``in_proj_a``, ``dt_bias``, ``A_log`` | rows
  | its value heads |
| Qwen3-Next ``in_proj_qkvz``, ``in_proj_ba`` (grouped per key head) | rows
  | its key heads' groups |
| DeltaNet ``out_proj`` | columns | its value heads' inputs; one all-reduce |
| the bias of a row-parallel output (``o_proj.bias`` with ``attention_bias``) | rank 0 only
  | the bias (zeros on the others, so the sum adds it once) |
| everything else (norms, routers, the shared expert's gate, ``mtp.fc``, MTP norms) | replicated
  | the whole tensor |

The MTP head's decoder layers are split like the main model's. Gated attention's ``q_proj`` holds
``[q | gate]`` per head, so its row blocks split by head like plain attention's. Each rank builds
its modules from ``local_config`` (its head counts, inner sizes and vocabulary partition; a hybrid
model's DeltaNet heads, so its state pool holds only its heads' state) and reads only its slices
from the safetensors files (``safe_open(...).get_slice``). The local config's ``vocab_size`` is the
partition; the whole vocabulary stays ``Transformer.vocab_size``.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from ..distributed.group import TensorParallel
from .checkpoint.config import ModelConfig
from .stages import PipelineStage
from .checkpoint.weights import checkpoint_files

DELTANET_VALUE_ROWS = ("in_proj_z.weight", "in_proj_b.weight", "in_proj_a.weight", "dt_bias",
                       "A_log")
# Qwen3-Next: rows grouped per key head
DELTANET_GROUPED = ("in_proj_qkvz.weight", "in_proj_ba.weight")
DELTANET_QKV = ("in_proj_qkv.weight", "linear_attn.conv1d.weight")  # channels [q | k | v]
ROW_SPLIT = ("q_proj.weight", "q_proj.bias", "k_proj.weight", "k_proj.bias", "v_proj.weight",
             "v_proj.bias", "gate_proj.weight", "up_proj.weight")
# of a row-parallel (all-reduced) output
ROW_PARALLEL_BIAS = ("o_proj.bias", "down_proj.bias", "out_proj.bias")
COLUMN_SPLIT = ("o_proj.weight", "down_proj.weight", "out_proj.weight")
VOCAB_SPLIT = ("model.embed_tokens.weight", "lm_head.weight")


def check_shardable(config: ModelConfig, size: int) -> None:
    """ValueError naming the reason unless ``config`` splits evenly over ``size`` ranks: query
    heads, the MLP's (and each expert's) inner size and the DeltaNet key and value heads divisible
    by ``size``; KV heads divisible by it or dividing it."""
    if size == 1:
        return
    h, kv, inner = config.num_attention_heads, config.num_key_value_heads, config.intermediate_size
    if h % size:
        raise ValueError(f"tensor_parallel={size} does not divide the {h} attention heads")
    if kv % size and size % kv:
        raise ValueError(f"tensor_parallel={size} neither divides nor is a multiple of the {kv} KV "
                         "heads")
    if inner % size:
        raise ValueError(f"tensor_parallel={size} does not divide the MLP's intermediate size "
                         f"{inner}")
    la, moe = config.linear_attention, config.moe
    if la is not None and (la.num_key_heads % size or la.num_value_heads % size):
        raise ValueError(f"tensor_parallel={size} does not divide the DeltaNet's "
                         f"{la.num_key_heads} key and {la.num_value_heads} value heads")
    if moe is not None and (moe.moe_intermediate_size % size
                            or moe.shared_expert_intermediate_size % size):
        raise ValueError(f"tensor_parallel={size} does not divide the experts' intermediate sizes "
                         f"{moe.moe_intermediate_size} and {moe.shared_expert_intermediate_size}")


def vocab_partition(vocab_size: int, size: int) -> int:
    """Rows of the vocabulary each rank holds: ``ceil(V / size)`` (the last rank's
    tail is zero rows)."""
    return -(-vocab_size // size)


def local_config(config: ModelConfig, tp: TensorParallel) -> ModelConfig:
    """The geometry of rank ``tp.rank``'s modules: its query and KV heads, its MLP slice, its
    vocabulary partition (``check_shardable`` first). Its ``vocab_size`` is the partition's rows
    (``vocab_partition``), not the vocabulary: token ids, drafts, logits and anything checked
    against the vocabulary use the whole one, ``config``'s, which the model keeps as
    ``Transformer.vocab_size`` (the width of the gathered logits)."""
    if tp.size == 1:
        return config
    check_shardable(config, tp.size)
    n, la, moe = tp.size, config.linear_attention, config.moe
    return dataclasses.replace(
        config, num_attention_heads=config.num_attention_heads // n,
        num_key_value_heads=max(1, config.num_key_value_heads // n),
        intermediate_size=config.intermediate_size // n,
        vocab_size=vocab_partition(config.vocab_size, n),
        linear_attention=None if la is None else dataclasses.replace(
            la, num_key_heads=la.num_key_heads // n, num_value_heads=la.num_value_heads // n),
        moe=None if moe is None else dataclasses.replace(
            moe, moe_intermediate_size=moe.moe_intermediate_size // n,
            shared_expert_intermediate_size=moe.shared_expert_intermediate_size // n))


def shard_ranges(name: str, shape: tuple[int, ...], config: ModelConfig,
                 tp: TensorParallel) -> tuple[int, list[tuple[int, int]]] | None:
    """``(dim, [(start, stop), ...])``: the blocks of the full checkpoint tensor ``name`` (of
    ``shape``) that rank ``tp.rank`` holds, concatenated in order along ``dim``; None for a
    replicated tensor (see the module table)."""
    la = config.linear_attention
    if la is not None and name.endswith(DELTANET_QKV):  # [q | k | v] channels: three blocks
        r, n = tp.rank, tp.size
        qk, v = la.key_dim // n, la.value_dim // n
        return 0, [(r * qk, (r + 1) * qk), (la.key_dim + r * qk, la.key_dim + (r + 1) * qk),
                   (2 * la.key_dim + r * v, 2 * la.key_dim + (r + 1) * v)]
    if la is not None and name.endswith(DELTANET_VALUE_ROWS + DELTANET_GROUPED):
        per = shape[0] // tp.size
        return 0, [(tp.rank * per, (tp.rank + 1) * per)]
    one = shard_range(name, shape, config, tp)
    return None if one is None else (one[0], [one[1:]])


def shard_range(name: str, shape: tuple[int, ...], config: ModelConfig,
                tp: TensorParallel) -> tuple[int, int, int] | None:
    """``(dim, start, stop)`` of the full checkpoint tensor ``name`` (of ``shape``) that rank
    ``tp.rank`` holds, or None for a replicated tensor (see the module table; the DeltaNet
    projections are in ``shard_ranges``)."""
    r, n, hd = tp.rank, tp.size, config.head_dim
    if name.endswith(VOCAB_SPLIT):
        part = vocab_partition(config.vocab_size, n)
        return 0, min(r * part, shape[0]), min((r + 1) * part, shape[0])
    if name.endswith(("k_proj.weight", "k_proj.bias", "v_proj.weight", "v_proj.bias")):
        kv = config.num_key_value_heads
        if kv >= n:
            per = kv // n
            return 0, r * per * hd, (r + 1) * per * hd
        head = r // (n // kv)  # the KV head this rank's query heads read
        return 0, head * hd, (head + 1) * hd
    if name.endswith(ROW_SPLIT):
        per = shape[0] // n
        return 0, r * per, (r + 1) * per
    if name.endswith(COLUMN_SPLIT):
        per = shape[1] // n
        return 1, r * per, (r + 1) * per
    return None


def read_sharded_checkpoint(folder: Path, config: ModelConfig, tp: TensorParallel,
                            stage: PipelineStage | None = None) -> dict[str, torch.Tensor]:
    """Rank ``tp.rank``'s slice of every tensor in the checkpoint (only those bytes are read),
    vocabulary partitions padded with zero rows to ``vocab_partition``; with a pipeline ``stage``,
    only the tensors that stage holds, under its names (``PipelineStage.checkpoint_name``)."""
    from safetensors import safe_open

    part = vocab_partition(config.vocab_size, tp.size)
    tensors: dict[str, torch.Tensor] = {}
    for f in checkpoint_files(folder):
        with safe_open(str(f), framework="pt") as handle:
            for key in handle.keys():
                name = key if stage is None else stage.checkpoint_name(key, config)
                if name is None:  # another pipeline stage's
                    continue
                sl = handle.get_slice(key)
                shape = tuple(int(x) for x in sl.get_shape())
                where = shard_ranges(name, shape, config, tp)
                # added once to the summed output: rank 0's, zeros elsewhere
                if name.endswith(ROW_PARALLEL_BIAS):
                    t = handle.get_tensor(key)
                    tensors[name] = t if tp.rank == 0 else torch.zeros_like(t)
                    continue
                if where is None:
                    tensors[name] = handle.get_tensor(key)
                    continue
                dim, blocks = where
                parts = [sl[a:b] if dim == 0 else sl[:, a:b] for a, b in blocks]
                t = parts[0] if len(parts) == 1 else torch.cat(parts, dim=dim)
                if name.endswith(VOCAB_SPLIT) and t.shape[0] < part:
                    t = torch.cat([t, t.new_zeros(part - t.shape[0], *t.shape[1:])])
                tensors[name] = t
    return tensors
