"""``java_bridge/examples/http/ChatOverHttp.java``, the JDK-only client of ``smile-llm serve``, compiled with
``javac --release 17`` and run as a process against live servers in this process (a copy of the shipped model with
a ChatML template, as in ``tests/server``): the streamed reply equals the server's non-streamed one and in-process
``chat`` at temperature 0, with the finish reason and usage printed; the request's JSON escaping round-trips; a
wrong key, an unknown model or an unreachable server is exit code 1 with the error's message. Needs ``javac`` and
``java``, not JPype (so it does not call ``require_java``); skipped without them."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
JAVAC = shutil.which("javac")
if JAVAC is None:
    pytest.skip("no javac on PATH: the HTTP example needs a JDK 17 or newer", allow_module_level=True)

from smile_llm import LanguageModel  # noqa: E402
from smile_llm.server import ServerSettings, create_app  # noqa: E402
from tests.server.conftest import KEY, LiveServer, chat_model, free_port, wait_unbound  # noqa: E402,F401

SOURCE = Path(__file__).resolve().parents[2] / "java_bridge" / "examples" / "http" / "ChatOverHttp.java"
JAVA = str(Path(JAVAC).resolve().parent / "java")  # the java of the same JDK
SYSTEM = 'You answer in "one" line \\ briefly.'
PROMPT = 'Name a color: "red"? \\ tab\there\nnew line, caf\u00e9, \u65e5\u672c, \U0001F642, bell \x07.'
TOKENS = 24


@pytest.fixture(scope="module")
def classes(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("http_example")
    done = subprocess.run([str(JAVAC), "--release", "17", "-encoding", "UTF-8", "-Xlint:all", "-Werror", "-d",
                           str(out), str(SOURCE)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return out


@pytest.fixture(scope="module")
def model(chat_model: LanguageModel) -> LanguageModel:  # noqa: F811 - the fixture
    """The shipped model (its ChatML template), shared with the HTTP server tests."""
    return chat_model


@pytest.fixture(scope="module")
def servers(model: LanguageModel) -> Iterator[tuple[LiveServer, LiveServer]]:
    """A server without a key and one with ``KEY``, on the same model."""
    both = (LiveServer(create_app(model, ServerSettings(model_name="smile-test"))),
            LiveServer(create_app(model, ServerSettings(model_name="smile-test", api_key=KEY))))
    yield both
    for server in both:
        server.stop()


def run(classes: Path, *args: str, stdin: str | None = None, key: str | None = None
        ) -> subprocess.CompletedProcess[str]:
    """The example as a process (bounded), its output read as UTF-8; ``key`` as ``SMILE_LLM_API_KEY``."""
    env = {k: v for k, v in os.environ.items() if k != "SMILE_LLM_API_KEY"}
    if key is not None:
        env["SMILE_LLM_API_KEY"] = key
    done = subprocess.run([JAVA, "-cp", str(classes), "ChatOverHttp", *args], env=env, capture_output=True,
                          input=None if stdin is None else stdin.encode(), timeout=60,
                          stdin=subprocess.DEVNULL if stdin is None else None)
    return subprocess.CompletedProcess(done.args, done.returncode, done.stdout.decode(), done.stderr.decode())


def post(url: str, body: dict[str, Any]) -> dict[str, Any]:
    request = urllib.request.Request(f"{url}/v1/chat/completions", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        return dict(json.loads(response.read()))


def test_the_request_body_escapes_the_prompt(classes: Path) -> None:
    """Quotes, backslashes, control characters and non-ASCII (a surrogate pair too) round-trip; the body is ASCII."""
    out = run(classes, "--dry-run", "--system", SYSTEM, "--max-tokens", "7", "--temperature", "0.5", "-",
              stdin=PROMPT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.isascii()
    assert json.loads(out.stdout) == {
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": PROMPT}],
        "max_tokens": 7, "temperature": 0.5, "stream": True, "stream_options": {"include_usage": True}}
    assert json.loads(run(classes, "--dry-run", "--no-stream", "two", "words").stdout) == {
        "messages": [{"role": "user", "content": "two words"}], "max_tokens": 256, "stream": False}


def test_streamed_reply_equals_the_server_and_in_process_chat(classes: Path, model: LanguageModel,
                                                              servers: tuple[LiveServer, LiveServer]) -> None:
    url = servers[0].url
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": PROMPT}]
    expected = model.chat(messages, TOKENS, temperature=0)
    assert expected.text
    direct = post(url, {"messages": messages, "max_tokens": TOKENS, "temperature": 0})
    assert direct["choices"][0]["message"]["content"] == expected.text
    n = len(model.encode_chat(messages))
    args = ("--url", url, "--system", SYSTEM, "--max-tokens", str(TOKENS), "--temperature", "0", "-")
    for mode in ((), ("--no-stream",)):
        out = run(classes, *mode, *args, stdin=PROMPT)
        assert out.returncode == 0, out.stderr
        assert out.stdout == expected.text, mode
        lines = out.stderr.splitlines()
        assert f"finish_reason: {expected.finish_reason}" in lines, out.stderr
        assert any(line.startswith(f"usage: prompt_tokens={n} completion_tokens={len(expected.tokens)} "
                                   f"total_tokens={n + len(expected.tokens)} cached_tokens=") for line in lines), \
            out.stderr
    wait_unbound(model)


def test_errors_are_exit_code_1_with_the_message(classes: Path, model: LanguageModel,
                                                 servers: tuple[LiveServer, LiveServer]) -> None:
    plain, keyed = servers
    for mode in ((), ("--no-stream",)):
        out = run(classes, *mode, "--url", keyed.url, "--max-tokens", "4", "hi", key="sk-wrong")
        assert out.returncode == 1 and out.stdout == "", out.stderr
        assert "error: HTTP 401: a valid API key is required" in out.stderr
        out = run(classes, *mode, "--url", plain.url + "/v1/", "--model", "nope", "hi")
        assert out.returncode == 1 and "error: HTTP 404: the model 'nope' does not exist" in out.stderr, out.stderr
    good = run(classes, "--url", keyed.url, "--max-tokens", "4", "--temperature", "0", "hi", key=KEY)
    assert good.returncode == 0 and "usage: prompt_tokens=" in good.stderr, good.stderr
    flag = run(classes, "--url", keyed.url, "--api-key", KEY, "--max-tokens", "4", "hi", key="sk-wrong")
    assert flag.returncode == 0, flag.stderr
    gone = run(classes, "--url", f"http://127.0.0.1:{free_port()}", "hi")
    assert gone.returncode == 1 and "error: no answer from http://127.0.0.1:" in gone.stderr, gone.stderr
    assert run(classes, "--max-tokens", "x", "hi").returncode == 2
    wait_unbound(model)


def test_the_example_uses_the_jdk_client_at_its_defaults() -> None:
    """What a JVM application gets by default (HTTP/2 preferred: an h2c upgrade offered on every request) is what
    the example uses; the tests above run it against the server."""
    source = SOURCE.read_text(encoding="utf-8")
    assert ".version(" not in source and "HttpClient.newBuilder()" in source
