"""Where a lab result came from: the code version, torch, threads, date and model, recorded with
every run."""

from __future__ import annotations

import datetime
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from .config import LabConfig

if TYPE_CHECKING:
    from ..language_model import LanguageModel

PACKAGE_DIR = Path(__file__).resolve().parent.parent  # smile_llm/


def code_version() -> str:
    """The git commit of the checkout holding this package, ``+dirty`` when ``smile_llm/`` has
    uncommitted changes; ``unknown`` outside a git checkout."""
    root = str(PACKAGE_DIR.parent)
    try:
        head = subprocess.run(["git", "-C", root, "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", root, "status", "--porcelain", "--", str(PACKAGE_DIR)],
                               capture_output=True, text=True, timeout=10,
                               check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head + ("+dirty" if dirty else "") if head else "unknown"


def describe_model(lm: LanguageModel) -> str:
    """One line: architecture, layers, hidden size, MTP layers, vocabulary."""
    c = lm.config
    mtp = (f", {c.mtp_num_hidden_layers}-layer MTP head" if c.mtp_num_hidden_layers
           else ", no MTP head")
    return (f"{c.model_type}, {c.num_hidden_layers} layers x {c.hidden_size}{mtp}, "
            f"vocab {c.vocab_size}")


def environment(lm: LanguageModel, config: LabConfig) -> dict[str, Any]:
    """The facts a result needs to be reproduced and compared: model, code version, torch, threads,
    date."""
    return {"model": config.model or f"shipped default ({config.kind})",
            "model_description": describe_model(lm), "code_version": code_version(),
            "torch": torch.__version__, "torch_threads": torch.get_num_threads(),
            "python": sys.version.split()[0], "platform": platform.platform(),
            "cpus": os.cpu_count(), "device": str(lm.pool.device),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
