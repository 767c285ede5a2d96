"""``benchmarks/gpu_vs_hf.py`` on the CPU at its ``--small`` size, so the GPU benchmark cannot rot before a GPU runs
it: every figure lands in the JSON with sane values, the two engines' outputs have the lengths asked for and agree
where the logits decide, and ``--budget`` skips what does not fit, cleanly."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import statistics
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
FIGURES = ("single", "batch", "ttft")
MARGIN = 1e-3  # top-1 minus top-2 logit at which the suite trusts a greedy choice (tests/conftest.py)


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    pytest.importorskip("transformers")
    spec = importlib.util.spec_from_file_location("gpu_vs_hf", ROOT / "benchmarks" / "gpu_vs_hf.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the script is executed
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[spec.name]
    return module


def run(bench: ModuleType, *args: str) -> tuple[int, dict[str, Any], str]:
    out = Path(args[args.index("--out") + 1])
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        rc = bench.main(["--small", "--device", "cpu", *args])
    return rc, json.loads(out.read_text()), printed.getvalue()


@pytest.fixture(scope="module")
def small(bench: ModuleType, tmp_path_factory: pytest.TempPathFactory) -> tuple[int, dict[str, Any], str, Path]:
    tmp = tmp_path_factory.mktemp("gpu_vs_hf")
    rc, data, printed = run(bench, "--model-dir", str(tmp / "model"), "--out", str(tmp / "figures.json"))
    return rc, data, printed, tmp / "model"


def test_every_figure_is_recorded_with_sane_values(bench: ModuleType, small: Any) -> None:
    rc, data, printed, _ = small
    work, shape = bench.SMALL_WORK, bench.SMALL
    assert rc == 0 and data["status"] == "complete" and data["skipped"] == []
    assert set(data["figures"]) == set(FIGURES)
    for name in FIGURES:
        entry = data["figures"][name]
        for engine in ("ours", "hf"):
            e = entry[engine]
            assert e["first"]["value"] > 0 and e["first"]["wall_s"] > 0
            assert len(e["runs"]) == work.repeats and all(r["value"] > 0 for r in e["runs"])
            assert e["median"] == pytest.approx(statistics.median(r["value"] for r in e["runs"]))
    single, batch, ttft = (data["figures"][n] for n in FIGURES)
    assert single["ours_over_hf"] == pytest.approx(single["ours"]["median"] / single["hf"]["median"])
    assert batch["ours_over_hf"] == pytest.approx(batch["ours"]["median"] / batch["hf"]["median"])
    assert ttft["hf_over_ours"] == pytest.approx(ttft["hf"]["median"] / ttft["ours"]["median"])
    # the floor: every unique weight read once per token (the tied embedding once), at the measured copy rate
    h, q, kv, i = shape.hidden, shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim, shape.intermediate
    params = shape.vocab * h + shape.layers * (2 * h * q + 2 * h * kv + 3 * h * i + 2 * h + 2 * shape.head_dim) + h
    assert data["weights_bytes"] == params * 4  # float32 on the CPU
    assert data["bandwidth"]["copy_bytes_per_s"] > 1e8
    floor = data["bandwidth"]["copy_bytes_per_s"] / data["weights_bytes"]
    assert single["floor_tokens_per_s"] == pytest.approx(floor)
    assert single["floor_fraction"] == pytest.approx(single["ours"]["median"] / floor)
    # min_new_tokens = max_new_tokens: neither engine stops early
    assert len(single["tokens"]["ours"]) == len(single["tokens"]["hf"]) == work.single_new
    assert batch["ours_lens"] == batch["hf_lens"] == [work.batch_new] * work.batch_size
    assert len(ttft["tokens"]["ours"]) == len(ttft["tokens"]["hf"]) == 1
    headline = [line for line in printed.splitlines() if line.startswith("headline:")]
    assert len(headline) == 1 and "ours/HF" in headline[0] and "HBM floor" in headline[0]


def test_greedy_tokens_agree_where_the_logits_decide(bench: ModuleType, small: Any) -> None:
    """The two engines run different kernels in a different order, so their float32 logits differ by rounding
    (under 1e-4 here); a step whose top two logits lie closer than that could go either way, and one different
    token changes every later step. So the tokens are compared up to the first step HF's own logits leave within
    MARGIN of a tie (EOS masked, as ``min_new_tokens`` masks it): that prefix must be identical, and with these
    seeded weights it is the whole output."""
    from transformers import AutoModelForCausalLM

    _, data, _, folder = small
    single = data["figures"]["single"]
    prompt, ours, theirs = single["prompt"], single["tokens"]["ours"], single["tokens"]["hf"]
    hf = AutoModelForCausalLM.from_pretrained(str(folder)).float().eval()
    with torch.no_grad():
        logits = hf(torch.tensor([prompt + theirs[:-1]])).logits[0, len(prompt) - 1 :].double()
    logits[:, bench.SMALL.vocab - 1] = float("-inf")
    top2 = logits.topk(2, dim=-1).values
    assert logits.argmax(-1).tolist() == theirs  # HF's greedy tokens are its own argmax
    margins = (top2[:, 0] - top2[:, 1]).tolist()
    decided = next((j for j, m in enumerate(margins) if m < MARGIN), len(margins))
    assert ours[:decided] == theirs[:decided]
    assert decided == len(theirs), f"step {decided} is within {MARGIN} of a tie: {margins}"
    assert single["agreement"] == {"ours_len": len(ours), "hf_len": len(theirs), "common_prefix": len(theirs)}


def test_the_budget_skips_what_does_not_fit(bench: ModuleType, small: Any, tmp_path: Path) -> None:
    """With no time left every figure is skipped and listed, the JSON says partial and the exit status is 124;
    the checkpoint folder of the first run is reused, not rebuilt."""
    _, _, _, folder = small
    rc, data, printed = run(bench, "--budget", "0", "--model-dir", str(folder), "--out", str(tmp_path / "f.json"))
    assert rc == 124 and data["status"] == "partial" and data["checkpoint_built"] is False
    assert data["figures"] == {} and [s["item"] for s in data["skipped"]] == list(FIGURES)
    assert "partial (budget)" in printed.splitlines()[-1]
