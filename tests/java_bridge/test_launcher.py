"""The launcher, ``python -m java_bridge``, in fresh processes: exit codes, stack traces, System.exit and the
cleanup hook, launcher errors, and the Bridge's message when an application runs without it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import require_java

require_java()

REPO = Path(__file__).resolve().parents[2]
TIMEOUT = 180

# Runs the real launcher with FactoryAdapter._close_all (what the launcher's shutdown hook calls) wrapped to
# record, in the file named by argv[1], whether every pool the application made is closed. Python's atexit and
# finally blocks do not run after System.exit, so only the Java shutdown hook can write it.
CLEANUP_PROBE = """
import sys
from java_bridge import adapters, launch

marker = sys.argv[1]
close_all = adapters.FactoryAdapter._close_all

def recording_close_all(self):
    close_all(self)
    with open(marker, "w") as f:
        f.write(" ".join(f"closed={p.closed}" for p in self.pools))

adapters.FactoryAdapter._close_all = recording_close_all
sys.exit(launch.run(sys.argv[2:]))
"""


def launch(classes: Path, main: str, *args: str, options: tuple[str, ...] = ("--no-model",),
           classpath: str | None = None) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "java_bridge", "--classpath", str(classes) if classpath is None else classpath,
           "--main", main, *options, "--", *args]
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=TIMEOUT)


def test_main_returns_exit_0(java_classes: Path) -> None:
    done = launch(java_classes, "bridgetest.apps.ReturnsApp", "a b", "c")
    assert done.returncode == 0, done.stderr
    assert "ReturnsApp id=1 bound=1 args=a b|c" in done.stdout


def test_main_throws_exit_1_with_the_java_stack_trace(java_classes: Path) -> None:
    done = launch(java_classes, "bridgetest.apps.ThrowsApp", "x", "y")
    assert done.returncode == 1, done.stderr
    assert "java.lang.IllegalStateException: ThrowsApp failed on purpose with 2 args" in done.stderr
    assert "at bridgetest.apps.ThrowsApp.fail(ThrowsApp.java:" in done.stderr
    assert "at bridgetest.apps.ThrowsApp.main(ThrowsApp.java:" in done.stderr


def test_system_exit_code_and_the_cleanup_hook_closes_pools(java_classes: Path, tmp_path: Path) -> None:
    marker = tmp_path / "cleanup.txt"
    cmd = [sys.executable, "-c", CLEANUP_PROBE, str(marker), "--classpath", str(java_classes),
           "--main", "bridgetest.apps.ExitApp", "--no-model", "--", "7"]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=TIMEOUT)
    assert done.returncode == 7, done.stderr
    assert "ExitApp exiting with 7" in done.stdout
    assert marker.read_text() == "closed=True", "the launcher's shutdown hook did not close the app's pool"


def test_missing_class_exits_2_with_a_clear_message(java_classes: Path) -> None:
    done = launch(java_classes, "bridgetest.apps.NoSuchApp")
    assert done.returncode == 2
    assert f"java_bridge: class bridgetest.apps.NoSuchApp not found on the class path ['{java_classes}']" \
        in done.stderr


def test_nonexistent_class_path_entry_exits_2(java_classes: Path, tmp_path: Path) -> None:
    missing = tmp_path / "nope.jar"
    done = launch(java_classes, "bridgetest.apps.ReturnsApp", classpath=f"{java_classes}{os.pathsep}{missing}")
    assert done.returncode == 2
    assert f"java_bridge: class path entries not found: ['{missing}']" in done.stderr
    assert "Traceback" not in done.stderr


def test_language_model_without_a_model_throws_with_the_launcher_hint(java_classes: Path) -> None:
    done = launch(java_classes, "bridgetest.apps.ModelApp")
    assert done.returncode == 1, done.stderr
    assert "java.lang.IllegalStateException: no Python implementation registered as 'model'" in done.stderr
    assert "python -m java_bridge --classpath <app.jar> --main <class>" in done.stderr
    assert "at bridgetest.apps.ModelApp.main(ModelApp.java:" in done.stderr


@pytest.mark.skipif(shutil.which("java") is None, reason="no java launcher on PATH")
def test_without_the_launcher_the_bridge_says_how_to_start(java_classes: Path) -> None:
    from java_bridge.build import bridge_jar

    cp = os.pathsep.join([str(bridge_jar()), str(java_classes)])
    done = subprocess.run(["java", "-cp", cp, "bridgetest.apps.ReturnsApp"], capture_output=True, text=True,
                          timeout=TIMEOUT)
    assert done.returncode == 1
    assert "java.lang.IllegalStateException: the Python bridge is not running: start the application with " \
           "python -m java_bridge --classpath <app.jar> --main <class>" in done.stderr


def test_language_model_with_the_default_model(java_classes: Path) -> None:
    done = launch(java_classes, "bridgetest.apps.ModelApp", options=())
    assert done.returncode == 0, done.stderr
    assert "ModelApp vocab=" in done.stdout


@pytest.mark.parametrize("example, args, expect", [
    ("GenerateExample", ("def fibonacci(n):\\n", "24"), "checkInvariants: passed"),
    ("ServingExample", ("16",), "pool: 0 bound, invariants hold"),
])
def test_the_examples_compile_against_the_jar_and_run(tmp_path: Path, example: str, args: tuple[str, ...],
                                                      expect: str) -> None:
    """The shipped examples, compiled against the bridge jar alone as their README says, run through the launcher."""
    from java_bridge.build import bridge_jar, compile_java

    out = compile_java([REPO / "java_bridge" / "examples" / f"{example}.java"], tmp_path / "out",
                       classpath=[bridge_jar()])
    done = launch(out, example, *args, options=())
    assert done.returncode == 0, done.stderr
    assert expect in done.stdout


def test_serving_options_reach_the_model(java_classes: Path) -> None:
    """--drafter and --speculative-max-batch configure the model the application gets; a bad value exits 2."""
    def rounds(options: tuple[str, ...]) -> int:
        done = launch(java_classes, "bridgetest.apps.ModelApp", options=options)
        assert done.returncode == 0, done.stderr
        stats = json.loads(done.stdout.split("ModelApp stats=")[1])
        assert stats["generated_tokens"] == 8
        return stats["speculative_rounds"]

    assert rounds(()) > 0  # the default model speculates with its MTP head
    assert rounds(("--drafter", "none")) == 0
    done = launch(java_classes, "bridgetest.apps.ModelApp", options=("--speculative-max-batch", "-1"))
    assert done.returncode == 2
    assert "java_bridge: cannot load the shipped dense model: speculative_max_batch" in done.stderr


def test_a_hybrid_checkpoint_serves_java(java_classes: Path, tmp_path: Path) -> None:
    """A hybrid Qwen3-Next checkpoint (Gated DeltaNet, MoE, MTP) behind Bridge.languageModel(): Java generates
    speculatively through the same request path."""
    pytest.importorskip("transformers")
    from tests.models.hybrid_models import build_hybrid_model

    build_hybrid_model("qwen3_next", tmp_path / "hybrid", seed=7)
    done = launch(java_classes, "bridgetest.apps.ModelApp", options=("--model", str(tmp_path / "hybrid")))
    assert done.returncode == 0, done.stderr
    stats = json.loads(done.stdout.split("ModelApp stats=")[1])
    assert stats["generated_tokens"] == 8 and stats["speculative_rounds"] > 0


def test_threads_is_the_commands_option_and_the_old_spelling_still_works() -> None:
    """``--threads`` as on every ``smile-llm`` command (the launcher keeps 1 by default: torch's threads contend
    with the JVM's); ``--torch-threads`` is still accepted; ``--tensor-parallel`` defaults to torchrun's world
    size (None here, resolved at load)."""
    from java_bridge.launch import parse

    base = ["--classpath", "x.jar", "--main", "App"]
    assert parse(base).threads == 1 and parse(base).tensor_parallel is None
    assert parse(base + ["--threads", "3"]).threads == 3
    assert parse(base + ["--torch-threads", "2"]).threads == 2


def test_a_bad_model_folder_is_one_line_naming_it(java_classes: Path, tmp_path: Path) -> None:
    readme = REPO / "README.md"
    done = launch(java_classes, "bridgetest.apps.ModelApp", options=("--model", str(readme)))
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines() == [
        f"java_bridge: --model {readme} is a file, not a model folder; pass a Hugging Face model folder "
        f"(config.json, *.safetensors and the tokenizer)"]
    (tmp_path / "config.json").write_text("{")
    done = launch(java_classes, "bridgetest.apps.ModelApp", options=("--model", str(tmp_path)))
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"java_bridge: --model {tmp_path}: config.json is not valid JSON (Expecting property name enclosed in "
        f"double quotes: line 1 column 2 (char 1))"]
