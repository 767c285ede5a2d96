"""The main job (``make demo``) runs end to end and reuses the conversation prefix turn after turn."""

from __future__ import annotations

import io
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from smile_llm import cli, env
from smile_llm.demo import run_demo


def test_demo_reuses_prefixes_deterministically() -> None:
    stats = run_demo(turns=6, seed=7)
    assert stats["prefix_match_tokens"] == 1536 and stats["prefix_prompt_tokens"] == 1964
    assert stats["bound_requests"] == 0 and stats["private_pages"] == 0
    assert stats["cached_tokens"] == stats["tree_pages"] * 16 == 736


def test_cli_entry_point_runs_the_demo() -> None:
    out = subprocess.run([sys.executable, "-m", "smile_llm", "cache-demo", "--turns", "2"], capture_output=True,
                         text=True, check=True).stdout
    assert "invariants hold" in out and "alice" in out and "bob" in out


def test_bench_runs_the_benchmark_runner(tmp_path, monkeypatch, capsys) -> None:
    """``smile-llm bench`` hands its arguments to ``python -m benchmarks`` in the checkout; an unknown script name
    is the runner's own usage error (2), and an install without the checkout's benchmarks/ gets a hint (2)."""
    from smile_llm import cli

    out = subprocess.run([sys.executable, "-m", "smile_llm", "bench", "--help"], capture_output=True, text=True)
    assert out.returncode == 0 and "python -m benchmarks" in out.stdout and "--skip" in out.stdout
    bad = subprocess.run([sys.executable, "-m", "smile_llm", "bench", "no_such_script"], capture_output=True,
                         text=True)
    assert bad.returncode == 2 and "unknown scripts ['no_such_script']" in bad.stderr
    monkeypatch.setattr(cli, "__file__", str(tmp_path / "smile_llm" / "cli.py"))
    assert cli.main(["bench", "all"]) == 2
    assert "no benchmarks/ beside the package" in capsys.readouterr().err


def test_serve_jvm_help_names_itself(capsys) -> None:
    from smile_llm.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["serve-jvm", "--help"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.startswith("usage: smile-llm serve-jvm ")


# ---------------------------------------------------------------------------------------------------------------
# errors, Ctrl-C, threads and tensor parallelism of the command line (smile_llm/cli.py)

REPO = Path(__file__).resolve().parents[1]
TEMPLATE = ("{% for m in messages %}<{{ m.role }}>{{ m.content }}\n{% endfor %}"
            "{% if add_generation_prompt %}<assistant>{% endif %}")


def smile(*args: str, timeout: float = 180, **kwargs) -> subprocess.CompletedProcess[str]:
    """``python -m smile_llm ARGS`` in a fresh process (no torchrun variables, no OMP_NUM_THREADS)."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("WORLD_SIZE", "LOCAL_WORLD_SIZE", "RANK", "OMP_NUM_THREADS")}
    return subprocess.run([sys.executable, "-m", "smile_llm", *args], capture_output=True, text=True,
                          timeout=timeout, env=env, **kwargs)


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The shipped default model with a small chat template: a checkpoint ``smile-llm chat`` accepts."""
    from smile_llm.models.shipped import DEFAULT_MODEL_DIRS

    folder = tmp_path_factory.mktemp("chat") / "model"
    shutil.copytree(DEFAULT_MODEL_DIRS["dense"], folder)
    (folder / "chat_template.jinja").write_text(TEMPLATE)
    return folder


@pytest.fixture(scope="module")
def bad_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, str]]:
    """Folders and files that are not model folders, each with the words its one-line error must hold."""
    from smile_llm.models.shipped import DEFAULT_MODEL_DIRS

    root = tmp_path_factory.mktemp("bad_models")
    (root / "empty").mkdir()
    (root / "bad_json").mkdir()
    (root / "bad_json" / "config.json").write_text("{\n  \"model_type\": \"qwen3\",\n")
    (root / "list_json").mkdir()
    (root / "list_json" / "config.json").write_text("[1, 2]")
    broken = root / "broken_weights"
    shutil.copytree(DEFAULT_MODEL_DIRS["dense"], broken)
    (broken / "model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{\"a\": 1}")
    return {"missing": (root / "nope", "no such folder"),
            "file": (REPO / "README.md", "is a file, not a model folder"),
            "empty": (root / "empty", "no config.json in this folder"),
            "bad_json": (root / "bad_json", "config.json is not valid JSON (Expecting"),
            "list_json": (root / "list_json", "config.json holds a JSON list, not an object"),
            "broken_weights": (broken, f"cannot load the model from {broken}: ")}


def assert_one_line(done: subprocess.CompletedProcess[str], command: str, *words: str) -> None:
    """Exit 2 and exactly one line on stderr, ``smile-llm COMMAND: ...`` with ``words``, no traceback."""
    assert done.returncode == 2, (done.returncode, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert lines[0].startswith(f"smile-llm {command}: "), lines[0]
    for word in words:
        assert word in lines[0], (word, lines[0])


@pytest.mark.parametrize("command, case", [
    ("generate", "missing"), ("generate", "file"), ("generate", "bad_json"), ("generate", "broken_weights"),
    ("demo", "missing"), ("demo", "file"), ("chat", "empty"), ("chat", "file"),
    ("serve", "missing"), ("serve", "bad_json"),  # (refused before anything listens or Ray starts)
])
def test_a_bad_model_is_one_line_naming_the_path_and_exit_2(command: str, case: str, bad_models) -> None:
    path, words = bad_models[case]
    extra = ["--prompt", "def "] if command == "generate" else []
    done = smile(command, "--model", str(path), *extra, stdin=subprocess.DEVNULL)
    assert_one_line(done, command, str(path), words)


@pytest.mark.parametrize("case", ["missing", "file", "empty", "bad_json", "list_json", "broken_weights"])
def test_every_bad_model_case_in_process(case: str, bad_models, capsys) -> None:
    """The same messages from ``main`` in this process, for generate and spec-lab alike."""
    path, words = bad_models[case]
    assert cli.main(["generate", "--model", str(path), "--prompt", "x"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("smile-llm generate: ") and str(path) in err and words in err
    assert cli.main(["spec-lab", "--model", str(path), "--out", "unused"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 2 and str(path) in err and words in err  # the loading line, then the error
    assert err.splitlines()[-1].startswith("smile-llm spec-lab: ")


def read_until(stream, needle: str, timeout: float = 120) -> str:
    """What ``stream`` (a subprocess's text pipe) gives until ``needle`` appears (AssertionError on timeout)."""
    got: list[str] = []
    done = threading.Event()

    def pump() -> None:
        while not done.is_set():
            c = stream.read(1)
            if not c:
                break
            got.append(c)
            if "".join(got[-len(needle):]) == needle:
                break
        done.set()

    t = threading.Thread(target=pump, daemon=True)
    t.start()
    t.join(timeout)
    assert needle in "".join(got), f"no {needle!r} within {timeout} s: {''.join(got)[-500:]!r}"
    return "".join(got)


def read_chars(stream, n: int, timeout: float = 120) -> str:
    """The next ``n`` characters of ``stream`` (AssertionError if they do not come within ``timeout`` s)."""
    got: list[str] = []
    t = threading.Thread(target=lambda: got.extend(stream.read(1) for _ in range(n)), daemon=True)
    t.start()
    t.join(timeout)
    assert not t.is_alive(), f"fewer than {n} characters within {timeout} s: {''.join(got)!r}"
    return "".join(got)


def _interactive() -> None:
    """In the child before it runs: SIGINT as a terminal's process gets it (default disposition, not blocked),
    whatever this test process inherited or set (a child inherits an ignored or blocked SIGINT)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def start(*args: str) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "LOCAL_WORLD_SIZE", "RANK")}
    return subprocess.Popen([sys.executable, "-u", "-m", "smile_llm", *args], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=0, env=env,
                            preexec_fn=_interactive)


def test_ctrl_c_in_generate_exits_130_quietly() -> None:
    proc = start("generate", "--prompt", "def main():\\n", "--max-new-tokens", "1900", "--temperature", "0")
    try:
        read_chars(proc.stdout, 3)  # a few tokens streamed: the reply is under way
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert "tokens/s" not in out  # stopped before the end: no stats


def test_ctrl_c_in_chat_stops_the_reply_and_the_chat_goes_on(chat_model: Path) -> None:
    """Ctrl-C during a reply stops that reply and the next turn runs; Ctrl-C at the prompt ends the chat (130),
    all without a traceback."""
    proc = start("chat", "--model", str(chat_model), "--max-new-tokens", "1800", "--temperature", "0")
    try:
        assert proc.stdin is not None
        read_until(proc.stdout, "> ")
        for turn in ("hello", "again"):
            proc.stdin.write(turn + "\n")
            proc.stdin.flush()
            read_chars(proc.stdout, 3)  # a few tokens of the reply
            proc.send_signal(signal.SIGINT)
            read_until(proc.stdout, "[reply stopped]\n> ", timeout=60)
        # at the prompt: the chat ends. stdin stays open (an end of input cannot end the chat first), and the
        # signal is repeated until the process ends: one that lands while the previous reply's handler is being
        # swapped out is not a Ctrl-C at the prompt
        for _ in range(60):
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=1)
                break
            except subprocess.TimeoutExpired:
                continue
        out, err = proc.communicate(timeout=10)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err


def test_an_interrupted_chat_reply_releases_its_request(chat_model: Path, monkeypatch, capsys) -> None:
    """In process: the first Ctrl-C of a reply (the installed SIGINT handler, called from the listener) cancels
    the request at its next forward; the chat goes on with the next line and no request stays bound."""
    from smile_llm.language_model import LanguageModel

    lm = LanguageModel.from_pretrained(chat_model)
    closed: list[bool] = []
    monkeypatch.setattr(lm, "close", lambda: closed.append(True))
    monkeypatch.setattr(cli, "_load", lambda args: lm)
    calls: list[str] = []
    real = cli._Printer.on_text

    def on_text(self, chunk: str) -> None:
        real(self, chunk)
        if not calls:
            calls.append("fired")
            try:
                signal.getsignal(signal.SIGINT)(signal.SIGINT, None)  # what Ctrl-C does
            except KeyboardInterrupt:
                calls.append("raised")

    monkeypatch.setattr(cli._Printer, "on_text", on_text)
    monkeypatch.setattr(sys, "stdin", io.StringIO("hello\nagain\n\n"))
    try:
        code = cli.main(["chat", "--model", str(chat_model), "--max-new-tokens", "40", "--temperature", "0"])
        out = capsys.readouterr().out
        assert calls == ["fired"] and code == 0
        assert out.count("[reply stopped]") == 1 and out.count("prompt tokens cached") == 1
        assert lm.pool.bound_request_count == 0 and closed == [True]
        lm.pool.check_invariants()
    finally:
        LanguageModel.close(lm)


def test_stop_on_interrupt_sets_a_flag_then_raises() -> None:
    before = signal.getsignal(signal.SIGINT)
    with cli.StopOnInterrupt() as stop:
        handler = signal.getsignal(signal.SIGINT)
        assert not stop() and handler is not before
        handler(signal.SIGINT, None)
        assert stop() and stop.requested
        with pytest.raises(KeyboardInterrupt):
            handler(signal.SIGINT, None)
    assert signal.getsignal(signal.SIGINT) is before
    box: list[bool] = []
    t = threading.Thread(target=lambda: box.append(cli.StopOnInterrupt().__enter__()._installed))
    t.start()
    t.join()
    assert box == [False] and signal.getsignal(signal.SIGINT) is before


def test_tensor_parallel_defaults_to_the_torchrun_world_size(monkeypatch) -> None:
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    parser = cli.build_parser()
    for command in ("generate", "demo", "chat"):
        extra = ["--prompt", "x"] if command == "generate" else []
        args = parser.parse_args([command, *extra])
        assert args.tensor_parallel is None and cli._tensor_parallel(args) == 1
        monkeypatch.setenv("WORLD_SIZE", "2")
        assert cli._tensor_parallel(args) == 2
        assert cli._tensor_parallel(parser.parse_args([command, *extra, "--tensor-parallel", "1"])) == 1
        monkeypatch.delenv("WORLD_SIZE")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert cli.main(["spec-lab", "--out", "unused"]) == 2  # several models in one process: not under torchrun


def test_torchrun_without_tensor_parallel_splits_the_model() -> None:
    """``torchrun --nproc-per-node 2 -m smile_llm generate`` without --tensor-parallel: one model split over the two
    ranks, so one completion and one stats line, and both ranks exit 0."""
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "LOCAL_WORLD_SIZE", "RANK")}
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "-m", "smile_llm",
                           "generate", "--prompt", "def ", "--max-new-tokens", "12", "--temperature", "0"],
                          capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("prompt tokens") == 1, done.stdout
    assert "1 thread," in done.stdout  # torchrun's OMP_NUM_THREADS=1 per rank


def test_every_command_takes_threads_defaulting_to_the_usable_cores(monkeypatch) -> None:
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 2, 5}, raising=False)
    parser = cli.build_parser()
    commands = {"generate": ["--prompt", "x"], "demo": [], "chat": [], "cache-demo": [], "spec-lab": []}
    for command, extra in commands.items():
        assert parser.parse_args([command, *extra]).threads == 3, command
        assert parser.parse_args([command, *extra, "--threads", "1"]).threads == 1, command
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert env.default_threads() == 1
    monkeypatch.setenv("OMP_NUM_THREADS", "4")
    assert env.default_threads() == 4
    with pytest.raises(SystemExit):
        parser.parse_args(["demo", "--threads", "0"])


def test_the_stats_line_prints_the_threads_of_the_affinity() -> None:
    pinned = subprocess.run(["taskset", "-c", "0", sys.executable, "-m", "smile_llm", "generate", "--prompt", "def ",
                             "--max-new-tokens", "8"], capture_output=True, text=True, timeout=180,
                            env={k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"})
    assert pinned.returncode == 0, pinned.stderr
    assert re.search(r"tokens/s, 1 thread, finish: ", pinned.stdout), pinned.stdout
    two = smile("generate", "--prompt", "def ", "--max-new-tokens", "8", "--threads", "2")
    assert two.returncode == 0 and re.search(r"tokens/s, 2 threads, finish: ", two.stdout), two.stdout


def test_serve_jvm_without_jpype_is_a_one_line_install_hint() -> None:
    code = ("import sys; sys.modules['jpype'] = None\n"  # import jpype raises ImportError, as when not installed
            "from smile_llm.cli import main\n"
            "sys.exit(main(['serve-jvm', '--classpath', '.', '--main', 'App']))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        "java_bridge: JPype is not installed: pip install JPype1 (or the package's java extra: pip install -e "
        "'.[java]' in the smile-llm checkout)"]


def test_chat_from_a_pipe_ends_its_last_prompt_line(chat_model: Path) -> None:
    """Input that ends (a pipe, a file) ends the chat at the prompt, which then ends its line."""
    done = subprocess.run([sys.executable, "-m", "smile_llm", "chat", "--model", str(chat_model),
                           "--max-new-tokens", "4", "--temperature", "0"], input="hi\n", capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.endswith("> \n") and done.stdout.count("> ") == 2, done.stdout


def test_version_imports_neither_torch_nor_the_server() -> None:
    code = ("import sys\nfrom smile_llm.cli import main\ntry:\n    main(['--version'])\nexcept SystemExit:\n"
            "    pass\nprint(sorted(m for m in ('torch', 'fastapi', 'numpy') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [f"smile-llm {cli.version()}", "[]"], done.stdout
