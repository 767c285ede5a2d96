"""``smile-llm serve --replicas 2`` and ``serve run deploy/ray_serve.yaml`` as processes: each starts Ray and answers
through two replicas; the command exits 0 on SIGTERM within a bounded time, also while its replicas start; the
config is valid for Ray Serve and names only known arguments; without Ray installed the command says how to install
it, in one line."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from ..server.conftest import free_port

pytestmark = pytest.mark.ray
yaml = pytest.importorskip("yaml")
ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "deploy" / "ray_serve.yaml"


def wait_healthy(url: str, proc: subprocess.Popen[bytes], timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while True:
        assert proc.poll() is None, proc.stdout.read().decode()[-3000:] if proc.stdout else ""
        try:
            if httpx.get(url + "/health", timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, "not healthy in time"
        time.sleep(0.5)


def two_replicas_answer(url: str, timeout: float = 240) -> None:
    """Requests with new prefixes until both replicas have answered (Ray Serve routes to the first replica up before
    the second is; new prefixes then spread over the replicas with the least cached)."""
    seen: set[str] = set()
    deadline = time.monotonic() + timeout
    with httpx.Client(base_url=url, timeout=120) as c:
        k = 0
        while len(seen) < 2:
            assert time.monotonic() < deadline, f"only {seen} answered"
            r = c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": f"tenant {k} " * 20}],
                                                     "max_tokens": 4, "temperature": 0})
            assert r.status_code == 200, r.text
            seen.add(r.headers["x-smile-llm-replica"])
            k += 1


def stop(proc: subprocess.Popen[bytes], timeout: float = 120) -> int:
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout)
    finally:
        if proc.poll() is None:
            proc.kill()


def serve_replicas(port: int) -> subprocess.Popen[bytes]:
    """``smile-llm serve --replicas 2`` on ``port``, half a CPU per replica (two fit any Ray instance it starts)."""
    return subprocess.Popen([sys.executable, "-m", "smile_llm", "serve", "--replicas", "2", "--port", str(port),
                             "--replica-cpus", "0.5", "--log-level", "warning"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def test_serve_replicas_answers_and_exits_zero_on_sigterm() -> None:
    port = free_port()
    proc = serve_replicas(port)
    try:
        wait_healthy(f"http://127.0.0.1:{port}", proc)
        two_replicas_answer(f"http://127.0.0.1:{port}")
    finally:
        code = stop(proc)
    assert code == 0


def test_sigterm_while_the_replicas_start_exits_zero() -> None:
    """SIGTERM as soon as the first replica answers (Serve may still be starting the second) stops cleanly."""
    port = free_port()
    proc = serve_replicas(port)
    try:
        wait_healthy(f"http://127.0.0.1:{port}", proc)
    finally:
        code = stop(proc)
    assert code == 0


def test_the_serve_run_config_deploys(tmp_path: Path) -> None:
    from ray.serve.schema import ServeDeploySchema

    from smile_llm.server.replicas.ray_app import APP_ARGS, MODEL_ARGS, SETTINGS_ARGS

    config = yaml.safe_load(CONFIG.read_text())
    ServeDeploySchema.model_validate(config)  # Ray Serve's own check of the file
    assert set(config["applications"][0]["args"]) <= APP_ARGS | MODEL_ARGS | SETTINGS_ARGS
    port = free_port()
    config["http_options"] = {"host": "127.0.0.1", "port": port}
    config["applications"][0]["args"]["cpus_per_replica"] = 0.5  # (fits a machine of fewer than 2 CPUs too)
    config["applications"][0]["args"]["compile"] = False  # eager replicas, whatever the environment Ray gives them
    local = tmp_path / "serve.yaml"
    local.write_text(yaml.safe_dump(config))
    serve = Path(sys.executable).parent / "serve"
    proc = subprocess.Popen([str(serve), "run", str(local)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            env={**os.environ, "RAY_ADDRESS": "local"})
    try:
        wait_healthy(f"http://127.0.0.1:{port}", proc)
        two_replicas_answer(f"http://127.0.0.1:{port}")
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(240)  # Serve deletes the application, each replica drains, then Ray stops (slow under load)
        finally:
            if proc.poll() is None:
                proc.kill()


def test_without_ray_the_command_says_how_to_install_it(tmp_path: Path) -> None:
    fake = tmp_path / "ray"
    fake.mkdir()
    (fake / "__init__.py").write_text("raise ImportError('No module named ray')\n")
    r = subprocess.run([sys.executable, "-m", "smile_llm", "serve", "--replicas", "2"], capture_output=True, text=True,
                       timeout=120, env={**os.environ, "PYTHONPATH": str(tmp_path)})
    assert r.returncode != 0
    assert "pip install -e '.[ray]' in the smile-llm checkout" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
