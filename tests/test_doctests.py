"""Runs the ``>>>`` examples in the docstrings of the modules below (and in the docs that carry them): each module
must have examples, and every example must pass. They need no model and run in well under a second."""

from __future__ import annotations

import doctest
import importlib
from pathlib import Path

import pytest

FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
ROOT = Path(__file__).resolve().parents[1]

MODULES = [
    "smile_llm.cache.layout",
    "smile_llm.cache.radix",
    "smile_llm.cache.pool",
    "smile_llm.distributed.pipeline",
    "smile_llm.speculative.acceptance",
    "smile_llm.text.tokenizer",
]
DOCS = ["docs/contract.md", "docs/cuda.md", "docs/speculative.md"]


@pytest.mark.parametrize("name", MODULES)
def test_module_doctests(name: str) -> None:
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=FLAGS, verbose=False)
    assert result.attempted > 0, f"{name} has no doctest examples"
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples in {name} failed"


@pytest.mark.parametrize("path", DOCS)
def test_doc_examples(path: str) -> None:
    result = doctest.testfile(str(ROOT / path), module_relative=False, optionflags=FLAGS, verbose=False)
    assert result.attempted > 0, f"{path} has no doctest examples"
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples in {path} failed"
