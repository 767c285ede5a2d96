"""The small byte-level models shipped in the package (each folder's README.md: architecture,
training, loss)."""

from __future__ import annotations

from pathlib import Path

# the dense Qwen3-architecture model, with an MTP head
DEFAULT_MODEL_DIR = Path(__file__).parent / "default"
DEFAULT_MODEL_DIRS = {"dense": DEFAULT_MODEL_DIR,
                      "hybrid": Path(__file__).parent / "default_hybrid"}
# a 2-layer draft model for the dense default model
DEFAULT_DRAFT_DIR = Path(__file__).parent / "default_draft"
