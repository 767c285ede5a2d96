"""Pipeline parallelism on the CPU: processes joined by gloo (``pp_worker.spawn``), each loading one stage (a range of
decoder layers) of a tiny checkpoint, rank 0 scheduling. PP=2 against PP=1 in the same rank-0 process: the dense
Qwen3 with an MTP head (2 layers, tied LM head: one layer per stage, the head and the MTP head on the last) and the
hybrid Qwen3.5 and Qwen3-Next fixtures (layers ``[linear, linear | linear, full]``: stage 0 holds no attention layer,
its KV pools hold none). Each stage runs the same operations on the same inputs as one process does, with one thread
on both sides, and activations travel as exact copies: logits are compared bit for bit, tokens and speculative
counters exactly, with every forward's pool digests compared (lockstep check). PP=2 x TP=2 on four processes equals
PP=1 within TP's rounding. A killed or hung rank fails every rank with a typed error within the timeout; bad
``pipeline_parallel`` values are refused before anything is allocated."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from smile_llm.cache import LayerNotHeldError
from smile_llm.distributed import TensorParallel
from smile_llm.distributed.pipeline import split_layers
from smile_llm.language_model import LanguageModel
from smile_llm.models.checkpoint.config import ModelConfig
from smile_llm.models.stages import PipelineStage

from ..models.hybrid_models import hybrid_hf_config, hybrid_zoo  # noqa: F401 - fixture
from ..models.mtp_models import build_mtp_model
from .pp_worker import run
from .tp_worker import TIMEOUT_S, logit_tolerance

SAME = ("plain", "spec", "spec_stats", "batch", "batch_stats", "sampled", "sampled_stats", "follow_up", "cached",
        "follow_up_stats")


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # the tensor-parallel tests' model: its greedy choices lead by at least 1e-3 over the 16 tokens compared
    return build_mtp_model(tmp_path_factory.mktemp("pp") / "qwen3", "qwen3", seed=3)


def check_reports(reports: list[dict[str, Any]]) -> dict[str, Any]:
    for report in reports:
        assert "error" not in report, report.get("traceback")
    return reports[0]


def check_same(pp: dict[str, Any], one: dict[str, Any], keys: tuple[str, ...]) -> None:
    for key in keys:
        assert pp[key] == one[key], (key, pp[key], one[key])
    for stats in [pp["spec_stats"], *pp["batch_stats"], pp["follow_up_stats"]]:
        assert stats["draft_errors"] == 0, stats
    assert pp["spec"] == pp["plain"] and pp["spec_stats"]["speculative_rounds"] > 0 and pp["cached"] > 0


def test_pp2_equals_pp1_on_a_dense_model(folder: Path, tmp_path: Path) -> None:
    leader = check_reports(reports := run("parity", folder, tmp_path))
    follower = reports[1]
    pp, one = leader["pp"], leader["one"]
    for key in ("prompt_logits", "step_logits"):
        assert np.array(pp[key]).shape == (len(one[key]), 97)
        assert pp[key] == one[key], key  # the same ops on the same inputs: bit for bit
    check_same(pp, one, SAME + ("constrained", "constrained_stats", "engine", "engine_draft_errors"))
    assert pp["engine_draft_errors"] == [0] * 6
    first, last = leader["stage"], follower["stage"]
    assert (first["layers"], first["held"], first["refused"]) == ([0, 1], [0], [1])
    assert (last["layers"], last["held"], last["refused"]) == ([1, 2], [1], [0])
    # each stage's pool holds its own layer's K/V; the MTP head's pool is the last stage's alone
    assert first["kv_range"] == {"main": [0, 1], "draft": [0, 0]}
    assert last["kv_range"] == {"main": [1, 2], "draft": [0, 1]}
    assert first["kv_bytes"]["main"] == last["kv_bytes"]["main"] == leader["one_kv_bytes"] // 2
    assert first["kv_bytes"]["draft"] == 0 < last["kv_bytes"]["draft"]
    # the embedding on both (the MTP head embeds drafts; the LM head is tied to it), the MTP head on the last
    assert (first["mtp"], last["mtp"]) == (False, True) and first["embedding_rows"] == last["embedding_rows"] == 97
    assert first["transfers"]["activations"] > 0 and last["transfers"]["outputs"] > 0
    assert follower["plans"] == leader["plans_sent"]


@pytest.mark.parametrize("family", ["qwen3_5", "qwen3_next"])
def test_hybrid_pp2_equals_pp1(family: str, hybrid_zoo, tmp_path: Path) -> None:  # noqa: F811 - the fixture
    leader = check_reports(reports := run("parity", hybrid_zoo(family).path, tmp_path, hybrid=True))
    pp, one = leader["pp"], leader["one"]
    for key in ("prompt_logits", "step_logits"):
        assert pp[key] == one[key], key
    check_same(pp, one, SAME)
    first, last = leader["stage"], reports[1]["stage"]
    # stage 0: two DeltaNet layers and no attention layer (pools of no layers); stage 1: one of each
    assert first["kv_range"] == {"main": [0, 0], "draft": [0, 0]} and first["kv_bytes"]["main"] == 0
    assert last["kv_range"] == {"main": [0, 1], "draft": [0, 1]} and last["kv_bytes"]["main"] > 0
    assert first["state_bytes"][0] == 2 * last["state_bytes"][0]
    assert first["state_bytes"][0] + last["state_bytes"][0] == leader["one_state_bytes"]
    assert first["lm_head_rows"] == 0 and last["lm_head_rows"] == 257 and not first["mtp"] and last["mtp"]


def test_pp2_by_tp2_equals_pp1(folder: Path, tmp_path: Path) -> None:
    """Four processes: two stages of two tensor-parallel ranks each."""
    leader = check_reports(reports := run("parity", folder, tmp_path, size=4, tp=2))
    pp, one = leader["pp"], leader["one"]
    config = ModelConfig.from_pretrained(folder)
    for key in ("prompt_logits", "step_logits"):
        got, want = np.array(pp[key]), np.array(one[key])
        tol = logit_tolerance(config, want, torch.float32)
        assert np.abs(got - want).max() < tol < 1e-3 * np.abs(want).max(), key
    check_same(pp, one, SAME + ("constrained", "engine"))
    stages = [r["stage"] for r in reports]
    assert [s["layers"] for s in stages] == [[0, 1], [0, 1], [1, 2], [1, 2]]
    # each rank: half the KV heads of its stage's layer
    assert all(4 * s["kv_bytes"]["main"] == leader["one_kv_bytes"] for s in stages)
    assert all(r["plans"] == leader["plans_sent"] for r in reports[1:])


@pytest.fixture(scope="module")
def three_layers(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_mtp_model(tmp_path_factory.mktemp("pp3") / "qwen3", "qwen3", seed=3, layers=3)


@pytest.mark.parametrize(("victim", "size"), [(1, 2), (0, 2), (1, 3), (2, 3)])
def test_a_killed_rank_fails_every_rank_with_a_typed_error(victim: int, size: int, folder: Path, three_layers: Path,
                                                           tmp_path: Path) -> None:
    """A rank dies at its 5th forward: rank 0's request fails with PipelineError (a LockstepError) at once and every
    later request with LockstepError; every surviving follower's ``follow`` ends with a LockstepError."""
    reports = run("killed", folder if size == 2 else three_layers, tmp_path, size=size, victim=victim)
    assert reports[victim] == {"exited": True}
    for rank, report in enumerate(reports):
        if rank == victim:
            continue
        if rank == 0:
            first, second = report["first"], report["second"]
            assert first is not None and first["lockstep_error"] and first["type"] == "PipelineError", first
            assert second is not None and second["type"] == "LockstepError", second
            assert report["first_seconds"] < TIMEOUT_S + 5 and report["second_seconds"] < 1.0
        else:
            assert report["lockstep_error"] and report["raised_type"] == "LockstepError", report
            assert report["seconds"] < 2 * TIMEOUT_S + 5


def test_a_hung_rank_fails_rank_0_within_the_timeout(folder: Path, tmp_path: Path) -> None:
    """The last stage hangs past the group's timeout (2 s here): rank 0's receive gives up then."""
    leader, _ = run("killed", folder, tmp_path, victim=1, hang_s=8.0, timeout_s=2.0)
    first = leader["first"]
    assert first is not None and first["type"] == "PipelineError" and "Timed out" in first["message"], first
    assert 1.5 < leader["first_seconds"] < 10.0


def test_bad_pipeline_parallel_values_are_refused_before_anything_is_allocated(
        folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def allocated(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the model was built before the value was refused")

    monkeypatch.setattr("smile_llm.language_model.Transformer", allocated)
    with pytest.raises(ValueError, match="more stages than the model's 2 decoder layers"):
        LanguageModel.from_pretrained(folder, pipeline_parallel=3)
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="pipeline_parallel must be an int >= 1"):
            LanguageModel.from_pretrained(folder, pipeline_parallel=bad)
    with pytest.raises(ValueError, match="needs 2 processes, one per rank: launch with torchrun"):
        LanguageModel.from_pretrained(folder, pipeline_parallel=2)
    with pytest.raises(ValueError, match="a draft model .* is not supported with pipeline_parallel"):
        LanguageModel.from_pretrained(folder, pipeline_parallel=2, drafter=f"draft:{folder}")
    monkeypatch.undo()
    (alone,) = run("refused", folder, tmp_path, size=1)
    assert "needs 2 processes" in alone["raised"] and "the job has 1 processes" in alone["raised"]
    assert alone["group_works"]
    for report in run("refused", folder, tmp_path, size=2, pp=2, tp=2):  # 2 x 2 in a job of 2
        assert "needs 4 processes" in report["raised"] and report["group_works"]


def test_the_stage_split() -> None:
    assert split_layers(10, 4) == [range(0, 3), range(3, 6), range(6, 8), range(8, 10)]
    assert split_layers(3, 3) == [range(0, 1), range(1, 2), range(2, 3)]
    hf = hybrid_hf_config("qwen3_5", num_hidden_layers=8, layer_types=["linear_attention"] * 3 + ["full_attention"]
                          + ["linear_attention", "full_attention"] * 2)
    config = ModelConfig.from_dict({"model_type": "qwen3_5", **hf})
    world = TensorParallel(0, 1)
    stages = [PipelineStage.of(config, s, 3, world) for s in range(3)]
    assert [s.layers for s in stages] == [range(0, 3), range(3, 6), range(6, 8)]
    assert [s.kv_layers for s in stages] == [range(0, 0), range(0, 2), range(2, 3)]
    assert [s.linear_layers for s in stages] == [range(0, 3), range(3, 4), range(4, 5)]
    assert [s.holds_embedding for s in stages] == [True, False, True]  # the last: the MTP head embeds drafts
    middle = stages[1]
    assert middle.local_layer(4) == 1
    with pytest.raises(LayerNotHeldError, match=r"layer 6 is not held by pipeline stage 1 of 3.*\[3, 6\)"):
        middle.local_layer(6)
    with pytest.raises(IndexError):  # LayerNotHeldError is an IndexError, as an index out of range is
        middle.local_layer(0)
    p = config.weight_prefix
    assert middle.checkpoint_name(f"{p}layers.5.mlp.up_proj.weight", config) == f"{p}layers.2.mlp.up_proj.weight"
    assert middle.checkpoint_name(f"{p}layers.6.mlp.up_proj.weight", config) is None
    assert middle.checkpoint_name(f"{p}embed_tokens.weight", config) is None
    assert [s.checkpoint_name("mtp.fc.weight", config) for s in stages] == [None, None, "mtp.fc.weight"]
    assert [s.checkpoint_name("lm_head.weight", config) for s in stages] == [None, None, "lm_head.weight"]
