"""Workloads of the speculative-decoding lab: JSONL files of prompts.

One JSON object per line: ``"prompt"`` (text, required), ``"id"`` (optional, any JSON scalar;
default the line number) and ``"max_new_tokens"`` (optional int >= 1; default the lab's
``new_tokens``). Blank lines are skipped. Two workloads ship in the package (``workloads/``):
``code`` (short Python contexts, what the default model was trained on) and ``prose`` (English
prose, which a byte-level model of Python source drafts worse).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from .errors import LabError

SHIPPED_DIR = Path(__file__).parent / "workloads"
FIELDS = ("prompt", "id", "max_new_tokens")


@dataclass(frozen=True)
class Prompt:
    """One workload entry: ``max_new_tokens`` None means the lab's default."""

    id: str
    prompt: str
    max_new_tokens: int | None = None


def shipped_workloads() -> list[str]:
    """Names of the workloads in the package (``code``, ``prose``)."""
    return sorted(p.stem for p in SHIPPED_DIR.glob("*.jsonl"))


def resolve_workload(name_or_path: str | Path) -> Path:
    """The file a ``--workload`` value names: a shipped workload's name, else a path. LabError when
    neither exists."""
    text = str(name_or_path)
    if text in shipped_workloads():
        return SHIPPED_DIR / f"{text}.jsonl"
    path = Path(text)
    if not path.is_file():
        raise LabError(f"workload {text!r} is neither a file nor a shipped workload "
                       f"({', '.join(shipped_workloads())})")
    return path


def parse_workload(text: str, source: str = "<workload>") -> list[Prompt]:
    """The prompts of JSONL ``text``. LabError naming ``source`` and the 1-based line number for a
    line that is not a JSON object, lacks a non-empty string ``"prompt"``, has an unknown field, a
    bad ``max_new_tokens`` or a duplicate id; also for a workload without prompts."""
    prompts: list[Prompt] = []
    seen: set[str] = set()
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        where = f"{source}, line {number}"
        try:
            entry = json.loads(line)
        except json.JSONDecodeError as exc:
            raise LabError(f"{where}: not valid JSON ({exc.msg})") from None
        if not isinstance(entry, dict):
            raise LabError(f"{where}: expected a JSON object, got {type(entry).__name__}")
        unknown = sorted(set(entry) - set(FIELDS))
        if unknown:
            raise LabError(f"{where}: unknown field {unknown[0]!r}; fields are {', '.join(FIELDS)}")
        prompt = entry.get("prompt")
        if not isinstance(prompt, str) or not prompt:
            raise LabError(f"{where}: \"prompt\" must be a non-empty string")
        new = entry.get("max_new_tokens")
        if new is not None and (isinstance(new, bool) or not isinstance(new, int) or new < 1):
            raise LabError(f"{where}: \"max_new_tokens\" must be an int >= 1, got {new!r}")
        pid = str(entry.get("id", number))
        if pid in seen:
            raise LabError(f"{where}: duplicate id {pid!r}")
        seen.add(pid)
        prompts.append(Prompt(pid, prompt, new))
    if not prompts:
        raise LabError(f"{source}: no prompts")
    return prompts


def load_workload(name_or_path: str | Path) -> list[Prompt]:
    """The prompts of a shipped workload (by name) or a JSONL file (``parse_workload``'s errors)."""
    path = resolve_workload(name_or_path)
    return parse_workload(path.read_text(encoding="utf-8"), str(path))
