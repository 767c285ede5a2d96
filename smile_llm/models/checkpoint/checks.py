"""The check that a checkpoint agrees with its config, from the safetensors headers alone, before
the model is built.

``check_checkpoint(config, folder)`` reads and checks every header (``weights.checkpoint_headers``),
then compares the tensors with what the config describes, coarse to fine, so that a config field
with a wrong value is named before anything proportional to it is computed or allocated:

1. ``embed_tokens`` is ``[vocab_size, hidden_size]``;
2. the decoder layers present (``layers.N.``) are ``num_hidden_layers``, the MTP layers
   (``mtp.layers.N.``) are ``mtp_num_hidden_layers``, and a MoE model's experts (``mlp.experts.E.``)
   are ``num_experts``;
3. every tensor's name and shape: exactly the dense layout (``expected_dense_tensors``, the
   ``Transformer``'s own parameters) or the hybrid one (``hybrid_layout``).

Since the names and shapes match exactly, the parameters the model allocates are the checkpoint's,
whose size the files bound. Every failure is a ``CheckpointError`` (a ValueError) naming the config
field or the tensor, and the file.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

from .config import ModelConfig
from ...errors import CheckpointError
from .hybrid_layout import check_hybrid_checkpoint
from .weights import checkpoint_headers

Shape = tuple[int, ...]

# what each tensor's shape is made of, for the message of a shape that disagrees
# (longest suffix first)
_SHAPE_FIELDS = (
    ("embed_tokens.weight", "vocab_size, hidden_size"),
    ("lm_head.weight", "vocab_size, hidden_size"),
    ("q_proj.weight", "num_attention_heads * head_dim, hidden_size"),
    ("q_proj.bias", "num_attention_heads * head_dim"),
    ("k_proj.weight", "num_key_value_heads * head_dim, hidden_size"),
    ("k_proj.bias", "num_key_value_heads * head_dim"),
    ("v_proj.weight", "num_key_value_heads * head_dim, hidden_size"),
    ("v_proj.bias", "num_key_value_heads * head_dim"),
    ("o_proj.weight", "hidden_size, num_attention_heads * head_dim"), ("q_norm.weight", "head_dim"),
    ("k_norm.weight", "head_dim"), ("gate_proj.weight", "intermediate_size, hidden_size"),
    ("up_proj.weight", "intermediate_size, hidden_size"),
    ("down_proj.weight", "hidden_size, intermediate_size"),
    ("fc.weight", "hidden_size, 2 * hidden_size"), ("norm.weight", "hidden_size"),
)


def check_checkpoint(config: ModelConfig, folder: Path) -> dict[str, Shape]:
    """Check the checkpoint in ``folder`` against ``config`` (see the module doc) and return
    every tensor's shape by name. FileNotFoundError when there is no checkpoint file;
    CheckpointError otherwise."""
    where: dict[str, Path] = {}
    shapes: dict[str, Shape] = {}
    for header in checkpoint_headers(folder):
        for name, info in header.tensors.items():
            shapes[name], where[name] = info.shape, header.path
    served = {n: s for n, s in shapes.items() if not n.startswith(config.ignored_weight_prefixes)}
    _check_embedding(config, served, where, folder)
    _check_counts(config, served, folder)
    if config.linear_attention is not None:  # a hybrid family, even with every layer full attention
        try:
            check_hybrid_checkpoint(config, served)
        except ValueError as exc:
            raise CheckpointError(f"{exc} (config.json against the checkpoint)",
                                  path=folder) from None
    else:
        _check_dense(config, served, where, folder)
    return shapes


def expected_dense_tensors(config: ModelConfig) -> dict[str, Shape]:
    """Every tensor a dense (Llama / Qwen2 / Qwen3) checkpoint of ``config`` holds, by name, as
    ``Transformer`` names its parameters; ``lm_head.weight`` is left out when the embeddings are
    tied (the checkpoint may still carry it)."""
    d, p = config.hidden_size, config.weight_prefix
    out: dict[str, Shape] = {f"{p}embed_tokens.weight": (config.vocab_size, d)}
    for i in range(config.num_hidden_layers):
        out.update(_dense_layer(config, f"{p}layers.{i}."))
    out[f"{p}norm.weight"] = (d,)
    if not config.tie_word_embeddings:
        out["lm_head.weight"] = (config.vocab_size, d)
    if config.mtp_num_hidden_layers:
        out.update({"mtp.pre_fc_norm_embedding.weight": (d,), "mtp.pre_fc_norm_hidden.weight": (d,),
                    "mtp.fc.weight": (d, 2 * d)})
        for i in range(config.mtp_num_hidden_layers):
            out.update(_dense_layer(config, f"mtp.layers.{i}."))
        out["mtp.norm.weight"] = (d,)
    return out


def _dense_layer(c: ModelConfig, lp: str) -> dict[str, Shape]:
    d, hd, a = c.hidden_size, c.head_dim, f"{lp}self_attn."
    q, kv, inner = c.num_attention_heads * hd, c.num_key_value_heads * hd, c.intermediate_size
    out: dict[str, Shape] = {f"{lp}input_layernorm.weight": (d,), f"{a}q_proj.weight": (q, d),
                             f"{a}k_proj.weight": (kv, d), f"{a}v_proj.weight": (kv, d),
                             f"{a}o_proj.weight": (d, q)}
    if c.attention_bias:
        out.update({f"{a}q_proj.bias": (q,), f"{a}k_proj.bias": (kv,), f"{a}v_proj.bias": (kv,)})
    if c.qk_norm:
        out.update({f"{a}q_norm.weight": (hd,), f"{a}k_norm.weight": (hd,)})
    out.update({f"{lp}post_attention_layernorm.weight": (d,),
                f"{lp}mlp.gate_proj.weight": (inner, d),
                f"{lp}mlp.up_proj.weight": (inner, d), f"{lp}mlp.down_proj.weight": (d, inner)})
    return out


def _check_embedding(config: ModelConfig, shapes: Mapping[str, Shape], where: Mapping[str, Path],
                     folder: Path) -> None:
    name = f"{config.weight_prefix}embed_tokens.weight"
    shape = shapes.get(name)
    if shape is None:
        return  # reported as a missing tensor by the layout check
    want = (config.vocab_size, config.hidden_size)
    if len(shape) != 2:
        raise CheckpointError(f"tensor {name!r} has shape {shape}; it must be [vocab_size, "
                              f"hidden_size] = {want}", path=where.get(name, folder), field=name)
    for value, field, dim in ((config.vocab_size, "vocab_size", 0),
                              (config.hidden_size, "hidden_size", 1)):
        if shape[dim] != value:
            raise CheckpointError(f"config.json gives {field} {value} but tensor {name!r} has "
                                  f"shape {shape} ([vocab_size, hidden_size])",
                                  path=where.get(name, folder), field=field)


def _indices(shapes: Mapping[str, Shape], pattern: str) -> set[int]:
    found = re.compile(pattern)
    out = set()
    for name in shapes:
        m = found.match(name)
        if m:
            out.add(int(m.group(1)))
    return out


def _count_message(field: str, value: int, what: str, indices: set[int]) -> str:
    held = f"{what} 0-{max(indices)} ({max(indices) + 1})" if indices else f"no {what}"
    return f"config.json gives {field} {value} but the checkpoint holds {held}"


def _check_counts(config: ModelConfig, shapes: Mapping[str, Shape], folder: Path) -> None:
    prefix = re.escape(config.weight_prefix)
    layers = _indices(shapes, rf"{prefix}layers\.(\d+)\.")
    if (max(layers) + 1 if layers else 0) != config.num_hidden_layers:
        raise CheckpointError(_count_message("num_hidden_layers", config.num_hidden_layers,
                                             "decoder layers", layers),
                              path=folder, field="num_hidden_layers")
    mtp = _indices(shapes, r"mtp\.layers\.(\d+)\.")
    if (max(mtp) + 1 if mtp else 0) != config.mtp_num_hidden_layers:
        raise CheckpointError(_count_message("mtp_num_hidden_layers", config.mtp_num_hidden_layers,
                                             "MTP layers", mtp),
                              path=folder, field="mtp_num_hidden_layers")
    moe = config.moe
    if moe is None:
        return
    sparse = sum(moe.is_sparse(i) for i in range(config.num_hidden_layers)) + \
        sum(moe.is_sparse(i) for i in range(config.mtp_num_hidden_layers))
    if not sparse:
        return
    experts = _indices(shapes, rf"(?:{prefix}|mtp\.)layers\.\d+\.mlp\.experts\.(\d+)\.")
    if (max(experts) + 1 if experts else 0) != moe.num_experts:
        raise CheckpointError(_count_message("num_experts", moe.num_experts, "experts", experts),
                              path=folder, field="num_experts")
    described = 3 * moe.num_experts * sparse
    if described > len(shapes):
        raise CheckpointError(f"config.json describes {described} expert tensors (num_experts "
                              f"{moe.num_experts} x {sparse} sparse layers x 3) but the checkpoint "
                              f"holds {len(shapes)} tensors in all",
                              path=folder, field="num_experts")


def _check_dense(config: ModelConfig, shapes: Mapping[str, Shape], where: Mapping[str, Path],
                 folder: Path) -> None:
    want = expected_dense_tensors(config)
    lm_head = "lm_head.weight"
    if config.tie_word_embeddings and lm_head in shapes:
        want[lm_head] = (config.vocab_size, config.hidden_size)
    missing = [n for n in want if n not in shapes]
    if missing:
        n = missing[0]
        raise CheckpointError(f"checkpoint lacks {len(missing)} tensors config.json needs, first "
                              f"{n!r} (shape {want[n]})", path=folder, field=n)
    unexpected = [n for n in shapes if n not in want]
    if unexpected:
        n = unexpected[0]
        raise CheckpointError(f"checkpoint has {len(unexpected)} tensors config.json does not "
                              f"describe, first {n!r} (shape {shapes[n]})",
                              path=where.get(n, folder), field=n)
    for n, shape in want.items():
        if shapes[n] != shape:
            made_of = next((f for suffix, f in _SHAPE_FIELDS if n.endswith(suffix)), "")
            raise CheckpointError(f"tensor {n!r} has shape {shapes[n]} in the checkpoint but "
                                  f"config.json gives {shape}"
                                  + (f" ([{made_of}])" if made_of else ""),
                                  path=where.get(n, folder), field=n)
