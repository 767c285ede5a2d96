"""The speculative-decoding lab (``smile_llm.lab``, ``smile-llm spec-lab``): a tiny run on the shipped default model
with consistent numbers and every output file, the lossless check catching a lossy decoder, the chi-square test
against known values, workload and drafter validation before anything runs."""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path

import pytest

from smile_llm import cli
from smile_llm.lab import (Configuration, LabConfig, LabError, RoundTally, TimedDrafter, chi2_sf, install_timer,
                           load_workload, parse_ks, parse_names, parse_trees, parse_workload, policy_supported, run_lab,
                           shipped_workloads, trees_supported, two_sample_chi2, write_results)
from smile_llm.language_model import LanguageModel
from smile_llm.speculative.drafters import Drafter
from smile_llm.speculative.acceptance import AcceptResult, RoundRecord

PLOTS = ("acceptance_by_position.png", "speedup_by_k.png", "drafters.png")


@pytest.fixture(scope="module")
def two_prompts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The first two prompts of the shipped code workload, as a JSONL file."""
    path = tmp_path_factory.mktemp("workload") / "two.jsonl"
    path.write_text("".join(json.dumps(p.__dict__) + "\n" for p in load_workload("code")[:2]))
    return path


@pytest.fixture(scope="module")
def tiny(two_prompts: Path, tmp_path_factory: pytest.TempPathFactory):
    """mtp and ngram at k 1-2 on two prompts, 16 new tokens, one repeat, plus a configuration with an extra
    generate argument (sampled MTP drafts, which decode greedily at temperature 0); its results folder."""
    extra = Configuration("mtp k=2 sampled drafts", "mtp", 2, {"draft_sampling": "sample"})
    config = LabConfig(drafters=("mtp", "ngram"), ks=(1, 2), workload=str(two_prompts), new_tokens=16, repeats=1,
                       extra=(extra,))
    result = run_lab(config)
    out = tmp_path_factory.mktemp("lab")
    write_results(result, out, "smile-llm spec-lab --test")
    return result, out


def test_tiny_run_is_lossless_and_writes_every_file(tiny) -> None:
    result, out = tiny
    assert result.passed and not result.failures
    assert [r.configuration.label for r in result.results] == ["mtp k=1", "mtp k=2", "ngram k=1", "ngram k=2",
                                                               "mtp k=2 sampled drafts"]
    for name in ("results.md", "results.json", "command.txt", *PLOTS):
        assert (out / name).stat().st_size > 0, name
    md = (out / "results.md").read_text()
    assert "| mtp k=2 | " in md and "identical" in md and "MISMATCH" not in md
    data = json.loads((out / "results.json").read_text())
    assert data["passed"] is True and len(data["configurations"]) == 5
    assert data["configurations"][1]["rounds"]["rounds"] == result.results[1].tally.rounds
    command = (out / "command.txt").read_text()
    assert command.startswith("smile-llm spec-lab --test\n") and "code_version: " in command
    assert "torch: " in command and "torch_threads: 1" in command and "date: " in command


def test_tiny_run_numbers_are_consistent(tiny) -> None:
    result, _ = tiny
    assert result.plain.wall_total_s > 0 and set(result.plain.wall_s) == {p.id for p in result.prompts}
    for r in result.results:
        t, k = r.tally, r.configuration.k
        assert t.rounds > 0 and r.generated_tokens == 2 * 16
        assert t.tokens_per_round == pytest.approx(1 + t.accepted_drafts / t.rounds)
        assert sum(n * c for n, c in t.accept_lengths.items()) == t.rounds + t.accepted_drafts
        rates = t.acceptance_by_position()
        assert len(rates) == k and all(a is None or 0.0 <= a <= 1.0 for a in rates)
        counts = [t.accepted[j] for j in range(1, k + 1)]
        assert counts == sorted(counts, reverse=True), counts  # draft j accepted only after the ones before it
        assert t.reached[1] == t.rounds and 0.0 <= t.acceptance_rate <= 1.0
        assert r.speedup(result.plain) > 0 and 0.0 <= r.timings.draft_cost_share < 1.0
        assert 0 < r.target_forwards_per_token <= 1.0
        if r.configuration.drafter == "mtp":
            assert r.target_forwards_per_token < 1.0 and r.timings.draft_cost_share > 0
    # the head drafts every round, n-grams rarely match here: fewest target forwards per token (a count, unlike
    # the wall-clock speedup that best() ranks by, which a loaded machine may reorder)
    fewest = min(result.results, key=lambda r: r.target_forwards_per_token)
    assert fewest.configuration.drafter == "mtp"
    assert result.best() in result.results and result.best().check is not None and result.best().check.passed


def test_round_tally_matches_completion_stats_and_the_timer_sees_propose() -> None:
    lm = LanguageModel.default(max_batch_size=1, max_seq_len=256)
    try:
        timer = install_timer(lm)
        assert isinstance(timer, Drafter) and lm.runner.drafter is timer and install_timer(lm) is timer
        tally = RoundTally()
        out = lm.generate("import os\nimport sys\n\n\ndef main(argv):\n    ", 40, speculative_tokens=3,
                          on_round=tally.add)
        s = out.stats
        assert tally.rounds == s["speculative_rounds"] and tally.drafts == s["proposed_drafts"]
        assert tally.accepted_drafts == s["accepted_drafts"]
        assert tally.tokens_per_round == pytest.approx(s["mean_accepted_length"])
        assert dict(tally.accept_lengths) == {int(n): c for n, c in s["accept_length_histogram"].items()}
        seconds, calls = timer.take()
        assert calls == s["speculative_rounds"] and 0 < seconds < s["decode_s"]
        assert timer.take() == (0.0, 0)
        assert callable(getattr(timer, "propose_tree", None)) == callable(getattr(timer.inner, "propose_tree", None))
    finally:
        lm.close()


def test_round_tally_counts_positions() -> None:
    tally = RoundTally()
    for accepted in (3, 1, 0, 2):
        tally.add(RoundRecord(10, 3, (1, 2, 3), accepted, tuple(range(accepted + 1))))
    assert [tally.reached[j] for j in (1, 2, 3)] == [4, 3, 2]
    assert [tally.accepted[j] for j in (1, 2, 3)] == [3, 2, 1]
    assert tally.acceptance_by_position() == [0.75, pytest.approx(2 / 3), 0.5]
    assert tally.tokens_per_round == 2.5 and tally.acceptance_rate == 0.5


def break_acceptance(monkeypatch) -> None:
    """A broken acceptance rule for the verify step: the bonus token off by one."""
    import smile_llm.speculative.row_acceptance as rows

    real = rows.accept_greedy

    def lossy(drafts, targets):
        r = real(drafts, targets)
        return AcceptResult(r.num_accepted, r.tokens[:-1] + ((r.tokens[-1] + 1) % 256,))

    monkeypatch.setattr(rows, "accept_greedy", lossy)


def test_the_lossless_check_catches_a_lossy_decoder(two_prompts: Path, tmp_path: Path, monkeypatch,
                                                    capsys) -> None:
    """A broken acceptance rule (the bonus token off by one) makes speculative outputs differ from plain decoding:
    the lab reports the mismatch in its results and the CLI exits 1."""
    break_acceptance(monkeypatch)
    code = cli.main(["spec-lab", "--drafters", "mtp", "--k", "2", "--workload", str(two_prompts), "--new", "12",
                     "--repeats", "1", "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 1
    assert "LOSSLESS CHECK FAILED for mtp k=2" in err and "prompt 'imports': token" in err
    md = (tmp_path / "results.md").read_text()
    assert "MISMATCH (2 outputs differ)" in md and "LOSSLESS CHECK FAILED" in md
    assert json.loads((tmp_path / "results.json").read_text())["passed"] is False


def test_sampled_runs_are_checked_token_for_token_and_by_distribution(two_prompts: Path) -> None:
    """At temperature > 0 greedy drafts must reproduce plain decoding's seeded outputs token for token (every
    timed run, whole outputs), and every configuration passes the chi-square test; sampled drafts get the
    distribution test alone."""
    extra = Configuration("mtp k=2 sampled drafts", "mtp", 2, {"draft_sampling": "sample"})
    config = LabConfig(drafters=("mtp", "ngram"), ks=(2,), workload=str(two_prompts), new_tokens=24, repeats=1,
                       temperature=0.8, samples=60, sample_prompts=1, sample_tokens=2, extra=(extra,))
    result = run_lab(config)
    assert result.passed
    checks = {r.configuration.label: r.check for r in result.results}
    for label in ("mtp k=2", "ngram k=2"):
        assert checks[label].seeded and checks[label].describe().endswith(", seeded outputs identical"), label
    sampled = checks["mtp k=2 sampled drafts"]
    assert not sampled.seeded and sampled.describe().startswith("same distribution (p = ")
    assert sampled.to_json()["seeded"] is False


def test_a_lossy_decoder_fails_the_seeded_check(two_prompts: Path, tmp_path: Path, monkeypatch, capsys) -> None:
    """The broken acceptance rule of the greedy test, at temperature 0.8: the seeded outputs differ, so the
    configuration fails even when its first tokens' distribution looks right."""
    break_acceptance(monkeypatch)
    code = cli.main(["spec-lab", "--drafters", "mtp", "--k", "2", "--workload", str(two_prompts), "--new", "12",
                     "--repeats", "1", "--temperature", "0.8", "--samples", "30", "--sample-prompts", "1",
                     "--sample-tokens", "1", "--out", str(tmp_path)])
    assert code == 1
    md = (tmp_path / "results.md").read_text()
    assert "MISMATCH (2 seeded outputs differ; p = " in md and "LOSSLESS CHECK FAILED" in md
    capsys.readouterr()


def test_chi2_survival_function_matches_textbook_values() -> None:
    assert chi2_sf(3.841458820694124, 1) == pytest.approx(0.05, rel=1e-9)  # the 95% quantile, 1 df
    assert chi2_sf(18.307038053275146, 10) == pytest.approx(0.05, rel=1e-9)
    assert chi2_sf(10.828, 1) == pytest.approx(1e-3, rel=1e-3)
    assert chi2_sf(0.5, 4) == pytest.approx(0.9735009788392561, rel=1e-12)  # exp(-x/2)(1 + x/2) for 4 df
    assert chi2_sf(2.0, 2) == pytest.approx(0.36787944117144233, rel=1e-12)  # exp(-1) for 2 df
    assert chi2_sf(0.0, 3) == 1.0 and chi2_sf(200.0, 3) < 1e-40
    with pytest.raises(ValueError):
        chi2_sf(1.0, 0)


def test_two_sample_chi2_separates_same_from_different() -> None:
    rng = random.Random(5)
    same = [rng.choice("abcd") for _ in range(400)]
    assert two_sample_chi2(same, same) == (0.0, 3, 1.0)
    other = [rng.choice("abcd") for _ in range(400)]
    assert two_sample_chi2(same, other).p_value > 1e-3
    skewed = [rng.choice("aaab") for _ in range(400)]
    assert two_sample_chi2(same, skewed).p_value < 1e-6
    rare = two_sample_chi2(["x"] * 50 + ["y"] * 3, ["x"] * 50 + ["z"] * 3)
    assert rare.df == 1  # y and z pooled into one cell
    assert two_sample_chi2(["a"] * 10, ["a"] * 10) == (0.0, 0, 1.0)


def test_workloads_parse_and_bad_lines_are_refused_with_their_line_number(tmp_path: Path) -> None:
    assert shipped_workloads() == ["code", "prose"]
    assert [len(load_workload(w)) for w in ("code", "prose")] == [8, 8]
    ok = parse_workload('{"prompt": "a", "id": "x", "max_new_tokens": 4}\n\n{"prompt": "b"}\n')
    assert [(p.id, p.prompt, p.max_new_tokens) for p in ok] == [("x", "a", 4), ("3", "b", None)]
    bad = {'{"prompt": "a"}\n{"prompt": \n': "line 2: not valid JSON",
           '{"prompt": "a"}\n\n["a"]\n': "line 3: expected a JSON object",
           '{"id": 1}\n': 'line 1: "prompt" must be a non-empty string',
           '{"prompt": "a", "max_new": 3}\n': "line 1: unknown field 'max_new'",
           '{"prompt": "a", "max_new_tokens": 0}\n': 'line 1: "max_new_tokens" must be an int >= 1',
           '{"prompt": "a", "id": 1}\n{"prompt": "b", "id": "1"}\n': "line 2: duplicate id '1'",
           "\n": "no prompts"}
    for text, message in bad.items():
        with pytest.raises(LabError, match=message):
            parse_workload(text)
    path = tmp_path / "w.jsonl"
    path.write_text('{"prompt": "a"}\nnot json\n')
    assert cli.main(["spec-lab", "--workload", str(path), "--out", str(tmp_path / "out")]) == 2
    with pytest.raises(LabError, match="neither a file nor a shipped workload"):
        load_workload(tmp_path / "missing.jsonl")


def test_bad_drafters_and_ranges_are_refused_before_anything_runs(two_prompts: Path, tmp_path: Path, monkeypatch,
                                                                  capsys) -> None:
    def never(*args, **kwargs):
        raise AssertionError("generate ran before the input was checked")

    monkeypatch.setattr(LanguageModel, "generate", never)
    with pytest.raises(LabError, match="drafter 'no-such-drafter'"):
        run_lab(LabConfig(drafters=("mtp", "no-such-drafter"), ks=(1,), workload=str(two_prompts)))
    assert cli.main(["spec-lab", "--drafters", "ngram,bogus", "--workload", str(two_prompts),
                     "--out", str(tmp_path)]) == 2
    assert "drafter 'bogus'" in capsys.readouterr().err and not (tmp_path / "results.md").exists()
    assert parse_ks("1-3,6") == (1, 2, 3, 6) and parse_ks("2") == (2,)
    for bad in ("0-2", "1-9", "3-1", "a", "1,,2"):
        with pytest.raises(LabError):
            parse_ks(bad)
    assert parse_trees(["3,2,1;2,2", "4"]) == ((3, 2, 1), (2, 2), (4,))
    with pytest.raises(LabError):
        parse_trees(["3,0"])
    assert parse_names(" mtp, ngram", "--drafters") == ("mtp", "ngram")
    for bad in ("mtp,mtp", "mtp,,ngram"):
        with pytest.raises(LabError):
            parse_names(bad, "--drafters")


def linear_only(ctx) -> Drafter:
    """A drafter factory (``module:callable``): linear n-gram drafts without ``propose_tree``."""
    from tests.speculative.test_draft_tree import LinearOnly

    return LinearOnly()


def test_trees_and_policy_run_or_are_refused_clearly(two_prompts: Path, tmp_path: Path, capsys) -> None:
    """Trees and adaptive k run when this build's SamplingParams takes them, and are refused with a clear message
    (exit 2, nothing run) when it does not."""
    base = ["spec-lab", "--drafters", f"mtp,ngram,{__name__}:linear_only", "--k", "1", "--workload",
            str(two_prompts), "--new", "8", "--repeats", "1", "--out", str(tmp_path)]
    code = cli.main(base + ["--trees", "2,1"])
    err = capsys.readouterr().err
    if trees_supported():
        assert code == 0 and f"{__name__}:linear_only tree=2,1: skipped" in err  # no propose_tree
        table = (tmp_path / "results.md").read_text()
        assert "| mtp tree=2,1 | " in table and "| ngram tree=2,1 | " in table
    else:
        assert code == 2 and "tree drafts are not available in this build" in err
    code = cli.main(base + ["--policy", "auto"])
    err = capsys.readouterr().err
    if policy_supported("auto"):
        assert code == 0 and "| mtp k=auto | " in (tmp_path / "results.md").read_text()
    else:
        assert code == 2 and "adaptive k is not available in this build" in err


def test_timed_drafter_forwards_the_protocol() -> None:
    calls: Counter[str] = Counter()

    class Fake:
        num_speculative_tokens = 2

        def __getattr__(self, name):
            def call(*args):
                calls[name] += 1
                return True
            return call

    proxy = TimedDrafter(Fake())  # type: ignore[arg-type]
    assert proxy.num_speculative_tokens == 2 and isinstance(proxy, Drafter)
    proxy.bind(None, 3)  # type: ignore[arg-type]
    proxy.release(None)  # type: ignore[arg-type]
    proxy.propose([], 2)
    assert calls == {"bind": 1, "release": 1, "propose": 1} and proxy.take()[1] == 1
