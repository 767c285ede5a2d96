"""Loading safetensors checkpoints (single file or sharded with ``model.safetensors.index.json``)
into a module, by Hugging Face parameter name, with errors that name the tensor and the shapes.

Nothing in the folder is trusted: the index must be JSON naming shards inside the folder (no
absolute path, no ``..``, no symlink that leads out of it, except the Hugging Face hub cache's links
from ``snapshots/<rev>/`` to ``blobs/``), and every file's header is checked
(``safetensors_header``) before a tensor is read. Failures are ``CheckpointError`` (a ValueError)
naming the file and the tensor or entry.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from ...errors import CheckpointError
from ...json_file import read_json
from .safetensors_header import SafetensorsHeader, read_header

INDEX_FILE = "model.safetensors.index.json"
MAX_INDEX_BYTES = 64 << 20  # a shard index larger than this is refused before it is parsed


def checkpoint_files(folder: Path) -> list[Path]:
    """The safetensors files of ``folder``: the shards named in ``model.safetensors.index.json`` if
    present, else every ``*.safetensors`` (sorted). FileNotFoundError when there are none;
    CheckpointError naming the index and the entry when the index is not JSON, has no ``weight_map``
    of names to shard files, or names a shard that is missing or lies outside the folder."""
    index = folder / INDEX_FILE
    if index.is_file():
        return [_shard(folder, index, name) for name in _index_shards(index)]
    files = sorted(f for f in folder.glob("*.safetensors") if f.is_file())
    if not files:
        raise FileNotFoundError(f"no *.safetensors in {folder}")
    for f in files:
        if not _inside(folder, f):
            raise CheckpointError(f"is a link to {f.resolve()}, outside the checkpoint folder "
                                  f"{folder}", path=f)
    return files


def _index_shards(index: Path) -> list[str]:
    """The distinct shard names of the index's ``weight_map`` (sorted)."""
    data = read_json(index, MAX_INDEX_BYTES, lambda message: CheckpointError(message, path=index))
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise CheckpointError("has no 'weight_map' object of tensor names to shard files",
                              path=index, field="weight_map")
    for tensor, shard in weight_map.items():
        if not isinstance(shard, str) or not shard:
            raise CheckpointError(f"weight_map[{tensor!r}] is {shard!r}, not a shard file name",
                                  path=index, field=f"weight_map[{tensor!r}]")
    return sorted(set(weight_map.values()))


def _shard(folder: Path, index: Path, name: str) -> Path:
    """``folder / name`` when ``name`` is a relative path that stays in the folder and is a file."""
    if Path(name).is_absolute() or ".." in Path(name).parts or "\\" in name:
        raise CheckpointError(f"names shard {name!r}, which is not a file name inside the "
                              "checkpoint folder", path=index, field=name)
    path = folder / name
    if not _inside(folder, path):
        raise CheckpointError(f"names shard {name!r}, a link to {path.resolve()} outside the "
                              "checkpoint folder", path=index, field=name)
    if not path.is_file():
        raise CheckpointError(f"names shard {name!r}, which is not a file in {folder}", path=index,
                              field=name)
    return path


def _inside(folder: Path, path: Path) -> bool:
    """Whether ``path``, links followed, is inside ``folder``; or ``folder`` is a Hugging Face hub
    cache snapshot (``.../snapshots/<rev>``) and ``path`` leads to its repository's ``blobs/``."""
    root, target = folder.resolve(), path.resolve()
    if target.is_relative_to(root):
        return True
    return root.parent.name == "snapshots" and target.parent == root.parent.parent / "blobs"


def checkpoint_headers(folder: Path) -> list[SafetensorsHeader]:
    """The checked header of every file of the checkpoint (``checkpoint_files``,
    ``safetensors_header``); CheckpointError also when two files hold a tensor of the same name."""
    headers = [read_header(f) for f in checkpoint_files(folder)]
    seen: dict[str, Path] = {}
    for h in headers:
        for name in h.tensors:
            if name in seen:
                raise CheckpointError(f"holds tensor {name!r}, which {seen[name].name} holds too",
                                      path=h.path, field=name)
            seen[name] = h.path
    return headers


def read_checkpoint(folder: Path) -> dict[str, torch.Tensor]:
    """Every tensor of the checkpoint in ``folder`` by name, on the CPU, after every header is
    checked (``checkpoint_headers``; FileNotFoundError when there are no files; CheckpointError
    naming the file for a bad header or a read that fails; ImportError without ``safetensors``)."""
    from safetensors.torch import load_file

    tensors: dict[str, torch.Tensor] = {}
    for header in checkpoint_headers(folder):
        try:
            tensors.update(load_file(str(header.path)))
        except Exception as exc:
            # the header was checked: a file changed meanwhile, or an I/O error
            raise CheckpointError(f"could not be read: {type(exc).__name__}: {exc}",
                                  path=header.path) from exc
    return tensors


def load_into(module: nn.Module, tensors: dict[str, torch.Tensor], dtype: torch.dtype,
              prefixes_ignored: tuple[str, ...] = (), tied: tuple[str, ...] = ()) -> None:
    """Copy ``tensors`` into ``module``'s parameters by name, cast to ``dtype``. ValueError naming
    the first tensor that is missing (except ``tied`` ones and parameters of no elements: a
    pipeline stage's placeholders for the parts it does not hold), unexpected (except under
    ``prefixes_ignored``) or of the wrong shape."""
    params = dict(module.named_parameters(remove_duplicate=False))
    missing = [n for n, p in params.items() if n not in tensors and n not in tied and p.numel()]
    if missing:
        raise ValueError(f"checkpoint lacks {len(missing)} tensors, first {missing[0]!r} "
                         f"(shape {tuple(params[missing[0]].shape)})")
    unexpected = [n for n in tensors if n not in params and not n.startswith(prefixes_ignored)]
    if unexpected:
        raise ValueError(f"checkpoint has {len(unexpected)} tensors the model does not, first "
                         f"{unexpected[0]!r}")
    with torch.no_grad():
        for name, param in params.items():
            if name not in tensors:
                continue
            src = tensors[name]
            if src.shape != param.shape:
                raise ValueError(f"tensor {name!r} has shape {tuple(src.shape)} in the checkpoint "
                                 f"but the config gives {tuple(param.shape)}")
            param.copy_(src.to(dtype))


def checkpoint_shapes(folder: Path) -> dict[str, tuple[int, ...]]:
    """Every tensor's shape by name, read from the checked safetensors headers only (no tensor data;
    cheap for a large checkpoint). Same files and errors as ``checkpoint_headers``."""
    shapes: dict[str, tuple[int, ...]] = {}
    for header in checkpoint_headers(folder):
        shapes.update(header.shapes())
    return shapes
