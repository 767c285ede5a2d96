"""``smile-llm kv-diff`` (warm against cold KV fingerprints; exit 0 when they agree, 1 when they differ, 2 for bad
input as one line) and ``SMILE_KV_FINGERPRINT=1`` on the command line (JSON lines on standard error)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from smile_llm import cli
from smile_llm.serving import kv_diff as kv_diff_module

PREFIX = r"import os\nimport sys\n\n\ndef main(argv):\n    "  # escaped as a shell passes it
PROMPT = PREFIX + r"print(argv)\n    return 0\n"


def test_warm_and_cold_agree_exit_0(capsys) -> None:
    assert cli.main(["kv-diff", "--prompt", PROMPT, "--prefix", PREFIX, "--threads", "1"]) == 0
    out = capsys.readouterr().out
    assert "warm reused 32 from the prefix cache (regions split at 32)" in out
    assert "agree: every layer, region and page within tolerance" in out


def test_a_corrupted_cached_page_is_named_and_exits_1(monkeypatch, capsys) -> None:
    real = kv_diff_module.fingerprint_request
    calls: list[bool] = []

    def corrupt_before_the_warm_request(model, prompt, **kwargs):
        calls.append(kwargs["reuse"])
        if len(calls) == 2:  # the prefix is cached; corrupt K of its first page in layer 4
            pool = model.scheduler.context.pool
            slot = int(pool.peek_prefix_slots(prompt)[3])
            pool.key_cache[4, slot, 0, 0] += 8.0
        return real(model, prompt, **kwargs)

    monkeypatch.setattr(kv_diff_module, "fingerprint_request", corrupt_before_the_warm_request)
    assert cli.main(["kv-diff", "--prompt", PROMPT, "--prefix", PREFIX, "--threads", "1"]) == 1
    out = capsys.readouterr().out
    assert calls == [True, True, False]
    assert "differ: layer 4, prefix region, logical page 0 (physical " in out, out


@pytest.mark.parametrize("args, words", [
    (["--prompt", PROMPT, "--prefix", "ab"], "the warm request matched nothing in the prefix cache"),
    (["--prompt", PROMPT, "--slack", "0"], "slack must be a finite number > 0"),
    (["--prompt", ""], "the prompt is empty"),
    (["--prompt", PROMPT, "--model", "/no/such/model"], "/no/such/model"),
])
def test_bad_input_is_one_line_and_exit_2(args, words, capsys) -> None:
    assert cli.main(["kv-diff", *args, "--threads", "1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("smile-llm kv-diff: ") and words in err, err


def test_the_switch_writes_json_lines_to_stderr() -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "LOCAL_WORLD_SIZE", "RANK")}
    args = [sys.executable, "-m", "smile_llm", "generate", "--prompt", "def ", "--max-new-tokens", "2",
            "--threads", "1"]
    on = subprocess.run(args, capture_output=True, text=True, timeout=180,
                        env={**env, "SMILE_KV_FINGERPRINT": "1"})
    assert on.returncode == 0, on.stderr
    records = [json.loads(line) for line in on.stderr.splitlines() if line.startswith("{")]
    assert [r["event"] for r in records] == ["kv_regions"] * 12 + ["kv_pages"]
    assert records[0]["kv_len"] == records[0]["prompt_len"] + 1 and records[0]["boundary"] == 0
    assert "prompt tokens" in on.stdout
