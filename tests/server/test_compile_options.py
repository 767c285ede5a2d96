"""Whether the server compiles its model: ``--no-compile`` and ``SMILE_COMPILE`` against the server's default
(compiled and warmed up before it listens where that measured faster: models without DeltaNet layers), and the compile gauges of ``/metrics`` read from the model's
``compile_stats``."""

from __future__ import annotations

import pytest

from smile_llm.cli import build_parser
from smile_llm.language_model import LanguageModel
from smile_llm.server.metrics import GAUGES
from smile_llm.server.model_options import ModelOptions


def test_the_server_compiles_unless_told_not_to(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SMILE_COMPILE", raising=False)
    assert ModelOptions().compiles  # the dense model: compiled where it wins
    assert not ModelOptions(kind="hybrid").compiles  # DeltaNet outside the graph: measured no faster
    assert ModelOptions(kind="hybrid", compile=True).compiles
    assert not ModelOptions(compile=False).compiles
    monkeypatch.setenv("SMILE_COMPILE", "0")
    assert not ModelOptions().compiles
    assert ModelOptions(compile=True).compiles  # an explicit choice wins over the environment
    monkeypatch.setenv("SMILE_COMPILE", "1")
    assert ModelOptions().compiles and not ModelOptions(compile=False).compiles
    assert build_parser().parse_args(["serve", "--no-compile"]).compile is False
    assert build_parser().parse_args(["serve"]).compile is None


def test_the_compile_gauges_read_the_models_stats() -> None:
    eager = LanguageModel.default("dense", compile=False, max_batch_size=2, max_seq_len=64)
    compiled = LanguageModel.default("dense", compile=True, max_batch_size=2, max_seq_len=64)
    try:
        assert GAUGES["compile_seconds"](eager) == 0.0 and GAUGES["compiled_variants"](eager) == 0.0
        assert GAUGES["compile_seconds"](compiled) == 0.0  # this model compiled nothing before its first forward
        stats = compiled.warm_up()
        # windows of one token (plain decode steps) and of more (prefills, verify windows); the variants are those of
        # the structure, which an earlier model in this process may have made
        assert stats["compiled"] and stats["compiled_variants"] == 2
        assert GAUGES["compiled_variants"](compiled) == 2.0
        assert GAUGES["compile_seconds"](compiled) == stats["compile_seconds"] >= 0
        pool = compiled.pool  # the warm-up's pages evicted again
        assert pool.bound_request_count == 0 and pool.free_pages == pool.num_slots // pool.page_size
    finally:
        eager.close()
        compiled.close()
