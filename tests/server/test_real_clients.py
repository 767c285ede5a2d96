"""The server with the clients people use at their defaults. The JDK's own ``java.net.http.HttpClient`` (what
LangChain4j and Spring AI use) offers an HTTP/2 upgrade (``Connection: Upgrade, HTTP2-Settings``, ``Upgrade: h2c``)
on every plain-http request; the server must decline it and answer the request, body and all, over HTTP/1.1. Tested
on every POST route with the upgrade headers on a raw socket (two requests on one kept-alive connection), and with a
real JVM running ``tests/server/java/DefaultClient.java`` (``HttpClient.newHttpClient()``, nothing set)."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
from pathlib import Path
from typing import Any

import pytest

from smile_llm import LanguageModel

from .conftest import LiveServer

MSG = [{"role": "user", "content": "hi"}]
UPGRADE = (b"Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\n"
           b"HTTP2-Settings: AAEAAEAAAAIAAAABAAMAAABkAAQBAAAAAAUAAEAA\r\n")


def routes(model: LanguageModel) -> list[tuple[str, dict[str, Any], Any]]:
    """Each POST route, a body, and a check of its answer."""
    ids = model.encode("def f():")
    return [
        ("/v1/chat/completions", {"model": "smile-test", "messages": MSG, "max_tokens": 4, "temperature": 0},
         lambda a: a["choices"][0]["message"]["content"] == model.generate(model.encode_chat(MSG), 4).text),
        ("/v1/completions", {"model": "smile-test", "prompt": "def f():", "max_tokens": 4, "temperature": 0},
         lambda a: a["choices"][0]["text"] == model.generate("def f():", 4).text),
        ("/tokenize", {"prompt": "def f():"}, lambda a: a["tokens"] == ids),
        ("/detokenize", {"tokens": ids}, lambda a: a["prompt"] == "def f():"),
    ]


def read_response(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """One HTTP/1.1 response with a Content-Length from ``sock`` (bounded by the socket's timeout)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"the connection closed mid-head: {data!r}"
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    size = int(headers["content-length"])
    while len(rest) < size:
        chunk = sock.recv(65536)
        assert chunk, "the connection closed mid-body"
        rest += chunk
    return status, headers, rest[:size]


def test_every_post_route_answers_a_request_offering_h2c(live: LiveServer, chat_model: LanguageModel) -> None:
    with socket.create_connection(("127.0.0.1", live.port), timeout=60) as sock:
        for path, body, check in routes(chat_model) * 2:  # twice: the connection stays usable
            payload = json.dumps(body).encode()
            sock.sendall(b"POST " + path.encode() + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n" + UPGRADE
                         + b"Content-Type: application/json\r\nContent-Length: " + str(len(payload)).encode()
                         + b"\r\n\r\n" + payload)
            status, headers, answer = read_response(sock)
            assert status == 200, (path, answer)  # not 101: the upgrade is declined, the body read
            assert "upgrade" not in headers and check(json.loads(answer)), (path, answer)


def test_an_unknown_model_offering_h2c_is_404(live: LiveServer) -> None:
    payload = json.dumps({"model": "nope", "messages": MSG, "max_tokens": 4}).encode()
    with socket.create_connection(("127.0.0.1", live.port), timeout=60) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n" + UPGRADE + b"Content-Length: "
                     + str(len(payload)).encode() + b"\r\n\r\n" + payload)
        status, _, answer = read_response(sock)
    assert status == 404 and json.loads(answer)["error"]["code"] == "model_not_found"


JAVAC = shutil.which("javac")


@pytest.mark.skipif(JAVAC is None, reason="no javac on PATH")
def test_the_jdk_http_client_at_its_defaults(live: LiveServer, chat_model: LanguageModel,
                                             tmp_path: Path) -> None:
    assert JAVAC is not None
    source = Path(__file__).parent / "java" / "DefaultClient.java"
    built = subprocess.run([JAVAC, "--release", "17", "-d", str(tmp_path), str(source)], capture_output=True,
                           text=True, timeout=120)
    assert built.returncode == 0, built.stderr
    args = [live.url]
    cases = routes(chat_model)
    for path, body, _ in cases:
        args += ["POST", path, json.dumps(body)]
    args += ["POST", "/v1/chat/completions", json.dumps({"model": "nope", "messages": MSG}), "GET", "/health", "-"]
    java = str(Path(JAVAC).resolve().parent / "java")
    done = subprocess.run([java, "-cp", str(tmp_path), "DefaultClient", *args], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == len(cases) + 2, done.stdout
    for line, (path, _, check) in zip(lines, cases):
        version, status, answer = line.split(" ", 2)
        assert (version, status) == ("HTTP_1_1", "200"), (path, line)
        assert check(json.loads(answer)), (path, line)  # (a JSON answer holds no raw newline)
    assert lines[-2].split(" ", 2)[1] == "404" and lines[-1].split(" ", 2)[:2] == ["HTTP_1_1", "200"]
