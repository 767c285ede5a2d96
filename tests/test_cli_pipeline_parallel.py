"""``--pipeline-parallel`` on the command line: under torchrun ``--tensor-parallel`` defaults to the world size over
the stages, and ``torchrun --nproc-per-node 2 -m smile_llm generate --pipeline-parallel 2`` prints one completion,
rank 0's, the one a single process prints."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from smile_llm import cli


def test_tensor_parallel_defaults_to_the_world_size_over_the_stages(monkeypatch: pytest.MonkeyPatch) -> None:
    parser = cli.build_parser()
    monkeypatch.setenv("WORLD_SIZE", "4")
    for command in ("generate", "demo", "chat"):
        extra = ["--prompt", "x"] if command == "generate" else []
        assert parser.parse_args([command, *extra]).pipeline_parallel == 1
        assert cli._tensor_parallel(parser.parse_args([command, *extra, "--pipeline-parallel", "2"])) == 2
        assert cli._tensor_parallel(parser.parse_args([command, *extra, "--pipeline-parallel", "4"])) == 1
    with pytest.raises(SystemExit):
        parser.parse_args(["generate", "--prompt", "x", "--pipeline-parallel", "0"])


def test_torchrun_with_two_stages_prints_what_one_process_prints() -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "LOCAL_WORLD_SIZE", "RANK")}
    command = ["-m", "smile_llm", "generate", "--prompt", "def ", "--max-new-tokens", "12", "--temperature", "0",
               "--threads", "1"]
    staged = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", *command,
                             "--pipeline-parallel", "2"], capture_output=True, text=True, timeout=300, env=env)
    alone = subprocess.run([sys.executable, *command], capture_output=True, text=True, timeout=300, env=env)
    assert staged.returncode == 0 and alone.returncode == 0, staged.stderr[-3000:] + alone.stderr[-3000:]
    assert staged.stdout.count("prompt tokens") == 1, staged.stdout
    assert staged.stdout.split("[")[0] == alone.stdout.split("[")[0]  # the completion, before the stats lines
