"""Loading safetensors checkpoints (single file or sharded with ``model.safetensors.index.json``) into a module,
by Hugging Face parameter name, with errors that name the tensor and the shapes."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn


def checkpoint_files(folder: Path) -> list[Path]:
    """The safetensors files of ``folder``: the shards named in ``model.safetensors.index.json`` if present, else every
    ``*.safetensors`` (sorted). FileNotFoundError when there are none."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [folder / s for s in shards]
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors in {folder}")
    return files


def read_checkpoint(folder: Path) -> dict[str, torch.Tensor]:
    """Every tensor of the checkpoint in ``folder`` by name, on the CPU (see ``checkpoint_files``; FileNotFoundError
    when there are none; ImportError without ``safetensors``)."""
    from safetensors.torch import load_file

    tensors: dict[str, torch.Tensor] = {}
    for f in checkpoint_files(folder):
        tensors.update(load_file(str(f)))
    return tensors


def load_into(module: nn.Module, tensors: dict[str, torch.Tensor], dtype: torch.dtype,
              prefixes_ignored: tuple[str, ...] = (), tied: tuple[str, ...] = ()) -> None:
    """Copy ``tensors`` into ``module``'s parameters by name, cast to ``dtype``. ValueError naming the first tensor
    that is missing (except ``tied`` ones), unexpected (except under ``prefixes_ignored``) or of the wrong shape."""
    params = dict(module.named_parameters(remove_duplicate=False))
    missing = [n for n in params if n not in tensors and n not in tied]
    if missing:
        raise ValueError(f"checkpoint lacks {len(missing)} tensors, first {missing[0]!r} "
                         f"(shape {tuple(params[missing[0]].shape)})")
    unexpected = [n for n in tensors if n not in params and not n.startswith(prefixes_ignored)]
    if unexpected:
        raise ValueError(f"checkpoint has {len(unexpected)} tensors the model does not, first {unexpected[0]!r}")
    with torch.no_grad():
        for name, param in params.items():
            if name not in tensors:
                continue
            src = tensors[name]
            if src.shape != param.shape:
                raise ValueError(f"tensor {name!r} has shape {tuple(src.shape)} in the checkpoint but the config "
                                 f"gives {tuple(param.shape)}")
            param.copy_(src.to(dtype))


def checkpoint_shapes(folder: Path) -> dict[str, tuple[int, ...]]:
    """Every tensor's shape by name, read from the safetensors headers only (no tensor data; cheap for a large
    checkpoint). Same files and errors as ``read_checkpoint``."""
    from safetensors import safe_open

    shapes: dict[str, tuple[int, ...]] = {}
    for f in checkpoint_files(folder):
        with safe_open(str(f), framework="pt") as handle:
            for name in handle.keys():
                shapes[name] = tuple(int(x) for x in handle.get_slice(name).get_shape())
    return shapes
