"""The model folder a command or launcher names: checked before anything is loaded, and the one line
that says why loading it failed."""

from __future__ import annotations

import json
from pathlib import Path

from .config import MAX_CONFIG_BYTES
from ...json_file import json_error_reason

MODEL_FOLDER = "a Hugging Face model folder (config.json, *.safetensors and the tokenizer)"


def model_folder_problem(path: str | Path, option: str = "--model") -> str | None:
    """What is wrong with ``path`` (given as ``option``) as a model folder, checked before anything
    is loaded: one line, ``--model PATH: ...``, saying what is wrong (no such path, a file rather
    than a folder, no ``config.json``, a ``config.json`` that cannot be read, is not JSON (nesting
    too deep and integers too long included) or is not a JSON object); None when it looks like a
    model folder."""
    p = Path(path)
    where = f"{option} {path}" if option else str(path)
    if not p.exists():
        return f"{where}: no such folder; pass {MODEL_FOLDER}"
    if not p.is_dir():
        return f"{where} is a file, not a model folder; pass {MODEL_FOLDER}"
    config = p / "config.json"
    if not config.is_file():
        return f"{where}: no config.json in this folder; pass {MODEL_FOLDER}"
    size = config.stat().st_size
    if size > MAX_CONFIG_BYTES:
        return f"{where}: config.json is {size} bytes; at most {MAX_CONFIG_BYTES} are read"
    try:
        data = json.loads(config.read_text(encoding="utf-8"))
    except UnicodeDecodeError as exc:
        return f"{where}: config.json is not UTF-8 text ({exc.reason} at byte {exc.start})"
    except json.JSONDecodeError as exc:
        return f"{where}: config.json is not valid JSON ({exc})"
    except (ValueError, RecursionError) as exc:  # nested too deeply, an integer too long
        return f"{where}: config.json is not valid JSON ({json_error_reason(exc)})"
    except OSError as exc:
        return f"{where}: cannot read config.json ({exc.strerror or exc})"
    if not isinstance(data, dict):
        return f"{where}: config.json holds a JSON {type(data).__name__}, not an object"
    return None


def load_error(model: str | Path | None, exc: BaseException, kind: str = "dense") -> str:
    """One line for a model that failed to load from the folder ``model`` (None: the shipped model
    of ``kind``): the folder and the error's message, with its type unless it is a ``ValueError`` or
    ``OSError`` (whose messages name the problem themselves)."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    if not isinstance(exc, (ValueError, OSError)) and type(exc).__name__ not in text:
        text = f"{type(exc).__name__}: {text}"
    where = f"the model from {model}" if model is not None else f"the shipped {kind} model"
    return f"cannot load {where}: {text}"
