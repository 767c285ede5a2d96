"""Hostile input to a live server, each a reproduction of an attack that once crashed, hung or 500ed it: every one
is now a 4xx OpenAI error object naming the field (or a closed connection), and the server keeps serving.

- bodies: JSON nested 100k deep, an integer of 5,000 digits, a content part whose text is not a string, a
  ``/tokenize`` content of ``[5]``, ``max_tokens: true`` or ``"3"``, ``stream: "yes"``, a ``text/plain`` body;
- paths: an unknown path (404) and a wrong method (405) answer OpenAI error objects;
- connections: a head over ``max_header_bytes`` (431), a head that never completes and a silent connection (closed
  after ``header_timeout_s``), a ``Content-Length`` larger than the body (408 after ``body_timeout_s``), more
  connections than ``max_connections`` (503, closed);
- a client that leaves a non-streaming request (n=4, long) cancels it within a step; a client that leaves a stream
  has every token it was sent counted in ``smile_llm_generation_tokens_total``;
- six requests whose content a checkpoint's template wraps with ``wordwrap(1)`` (quadratic, once minutes each, and
  six filled the server's thread pool) each end within the render budget as a 400, while the server answers."""

from __future__ import annotations

import json
import shutil
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from smile_llm import LanguageModel
from smile_llm.server import ServerSettings, create_app

from .conftest import LiveServer, wait_unbound

CHAT = "/v1/chat/completions"
MSG = [{"role": "user", "content": "hi"}]


def post(server: LiveServer, path: str, content: bytes | str, content_type: str = "application/json"
         ) -> httpx.Response:
    return httpx.post(server.url + path, content=content, headers={"content-type": content_type}, timeout=60)


def error_of(r: httpx.Response, status: int) -> dict[str, Any]:
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error"} and {"message", "type", "param", "code"} <= set(body["error"]), body
    return dict(body["error"])


@pytest.mark.parametrize("path, content, param, words", [
    (CHAT, '{"messages": ' + "[" * 100_000 + "]" * 100_000 + "}", None, "nests too deeply"),
    (CHAT, '{"messages": [{"role": "user", "content": "hi"}], "seed": ' + "9" * 5000 + "}", None, "not valid JSON"),
    (CHAT, json.dumps({"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]}),
     "messages.0.content.0.text", "string"),
    (CHAT, json.dumps({"messages": [{"role": "user", "content": [5]}]}), "messages.0.content", None),
    (CHAT, json.dumps({"messages": [{"role": "user", "content": {"text": "hi"}}]}), "messages.0.content", None),
    ("/tokenize", json.dumps({"messages": [{"role": "user", "content": [5]}]}), "messages.0.content.0", "text"),
    ("/tokenize", json.dumps({"messages": [5]}), "messages.0", None),
    (CHAT, json.dumps({"messages": MSG, "max_tokens": True}), "max_tokens", "integer"),
    (CHAT, json.dumps({"messages": MSG, "max_tokens": "3"}), "max_tokens", "integer"),
    (CHAT, json.dumps({"messages": MSG, "stream": "yes"}), "stream", "boolean"),
    ("/v1/completions", json.dumps({"prompt": "x", "n": "2"}), "n", "integer"),
    ("/v1/completions", json.dumps({"prompt": "x", "temperature": True}), "temperature", "number"),
])
def test_malformed_bodies_are_400_naming_the_field(live: LiveServer, path: str, content: str, param: str | None,
                                                  words: str | None) -> None:
    err = error_of(post(live, path, content), 400)
    assert err["param"] == param, err
    assert words is None or words in err["message"], err


def test_a_body_that_is_not_declared_json_is_415(live: LiveServer) -> None:
    body = json.dumps({"messages": MSG, "max_tokens": 2})
    for content_type in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"):
        assert "JSON" in error_of(post(live, CHAT, body, content_type), 415)["message"]
    assert post(live, CHAT, body, "application/json; charset=utf-8").status_code == 200
    r = httpx.post(live.url + CHAT, content=body, timeout=60)  # no Content-Type: taken as JSON
    assert r.status_code == 200, r.text


def test_unknown_paths_and_methods_are_openai_error_objects(live: LiveServer) -> None:
    assert "/v1/nothing" in error_of(httpx.get(live.url + "/v1/nothing", timeout=30), 404)["message"]
    assert "GET" in error_of(httpx.get(live.url + CHAT, timeout=30), 405)["message"]
    error_of(httpx.delete(live.url + "/health", timeout=30), 405)


@pytest.fixture(scope="module")
def strict(chat_model: LanguageModel) -> Iterator[LiveServer]:
    """A server with small connection limits, to reach them quickly."""
    settings = ServerSettings(model_name="smile-test", max_header_bytes=4096, header_timeout_s=0.5,
                              body_timeout_s=0.5, keep_alive_timeout_s=1, max_connections=8)
    server = LiveServer(create_app(chat_model, settings))
    yield server
    server.stop()


def recv_all(sock: socket.socket, limit_s: float = 30.0) -> bytes:
    """What the server sends until it closes the connection (bounded)."""
    sock.settimeout(limit_s)
    data = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except (ConnectionResetError, BrokenPipeError):
            return data
        if not chunk:
            return data
        data += chunk


@pytest.mark.parametrize("pieces", [1, 40])
def test_a_head_over_the_limit_is_431_and_closed(strict: LiveServer, pieces: int) -> None:
    head = b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 64_000 + b"\r\n\r\n"
    with socket.create_connection(("127.0.0.1", strict.port)) as sock:
        step = len(head) // pieces + 1
        try:
            for i in range(0, len(head), step):  # whole, or in pieces (h11's own limit sees only these)
                sock.sendall(head[i:i + step])
        except (BrokenPipeError, ConnectionResetError):
            pass  # refused before it was all sent
        answer = recv_all(sock)
    assert answer.startswith(b"HTTP/1.1 431 ") and b'"error"' in answer, answer[:200]
    small = httpx.get(strict.url + "/health", headers={"x-ok": "a" * 3000}, timeout=30)
    assert small.status_code == 200  # a head within the limit


@pytest.mark.parametrize("sent", [b"", b"GET /health HTTP/1.1\r\nHost: x\r\n"])
def test_a_head_that_does_not_arrive_in_time_closes_the_connection(strict: LiveServer, sent: bytes) -> None:
    t0 = time.monotonic()
    with socket.create_connection(("127.0.0.1", strict.port)) as sock:
        sock.sendall(sent)
        assert recv_all(sock, limit_s=30) == b""  # closed without an answer
    assert time.monotonic() - t0 < 15  # the header timeout (0.5 s), with a wide margin for a loaded machine


def test_a_body_shorter_than_its_length_is_408(strict: LiveServer, chat_model: LanguageModel) -> None:
    body = json.dumps({"messages": MSG}).encode()
    with socket.create_connection(("127.0.0.1", strict.port)) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: " + str(len(body) + 100).encode() + b"\r\n\r\n" + body)
        answer = recv_all(sock)
    assert answer.startswith(b"HTTP/1.1 408 "), answer[:200]
    assert json.loads(answer.partition(b"\r\n\r\n")[2])["error"]["message"].startswith("the body did not arrive")


def test_connections_over_the_limit_are_refused_with_503(strict: LiveServer) -> None:
    held = [socket.create_connection(("127.0.0.1", strict.port)) for _ in range(8)]
    try:
        time.sleep(0.1)
        with socket.create_connection(("127.0.0.1", strict.port)) as extra:
            answer = recv_all(extra)
        assert answer.startswith(b"HTTP/1.1 503 ") and b"connections" in answer, answer[:200]
    finally:
        for sock in held:
            sock.close()
    deadline = time.monotonic() + 30  # the server notices the closed connections
    while True:
        try:
            if httpx.get(strict.url + "/health", timeout=5).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, "the server did not accept connections again"
        time.sleep(0.05)


def test_a_client_leaving_a_plain_request_cancels_it(live: LiveServer, chat_model: LanguageModel) -> None:
    body = json.dumps({"prompt": "def f():\n", "n": 4, "max_tokens": 1500, "temperature": 1.0, "seed": 3,
                       "ignore_eos": True}).encode()
    with socket.create_connection(("127.0.0.1", live.port)) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        deadline = time.monotonic() + 30
        while chat_model.serving_loop.num_running < 4:  # the samples run
            assert time.monotonic() < deadline, "the request never ran"
            time.sleep(0.01)
    wait_unbound(chat_model, timeout=10)  # closed: cancelled within a step, its pages released
    chat_model.pool.check_invariants()


def generated_total(server: LiveServer) -> float:
    text = httpx.get(server.url + "/metrics", timeout=30).text
    return float(next(line.split()[-1] for line in text.splitlines()
                      if line.startswith("smile_llm_generation_tokens_total")))


def test_a_left_stream_counts_the_tokens_it_was_sent(live: LiveServer, chat_model: LanguageModel) -> None:
    before = generated_total(live)
    body = {"prompt": "def f():\n", "max_tokens": 1500, "stream": True, "temperature": 1.0, "seed": 5,
            "ignore_eos": True, "speculative_tokens": 0}
    sent = 0
    with httpx.stream("POST", live.url + "/v1/completions", json=body, timeout=60) as r:
        for line in r.iter_lines():
            if line.startswith("data: "):
                sent += len(chat_model.encode(json.loads(line[6:])["choices"][0]["text"])) \
                    if json.loads(line[6:])["choices"][0]["text"] else 0
            if sent >= 20:
                break
    wait_unbound(chat_model, timeout=10)
    counted = generated_total(live) - before
    assert counted >= sent, (counted, sent)  # every token sent is counted (and those in flight at the close)


def test_hostile_renders_end_within_the_budget_while_the_server_answers(tmp_path: Path) -> None:
    from smile_llm.text.limits import MAX_RENDER_SECONDS
    from smile_llm.models.shipped import DEFAULT_MODEL_DIRS

    folder = tmp_path / "model"
    shutil.copytree(DEFAULT_MODEL_DIRS["dense"], folder)
    (folder / "chat_template.jinja").write_text("{% for m in messages %}{{ m.content|wordwrap(1) }}{% endfor %}")
    model = LanguageModel.from_pretrained(folder, max_batch_size=2, max_seq_len=256)
    server = LiveServer(create_app(model, ServerSettings(model_name="t")))
    try:
        body = json.dumps({"messages": [{"role": "user", "content": "a" * 2_000_000}], "max_tokens": 2})
        answers: list[Any] = []

        def hostile() -> None:
            t0 = time.monotonic()
            r = post(server, CHAT, body)
            answers.append((r.status_code, r.json()["error"]["param"], time.monotonic() - t0))

        threads = [threading.Thread(target=hostile) for _ in range(6)]
        for t in threads:
            t.start()
        time.sleep(0.5)
        assert httpx.get(server.url + "/health", timeout=10).status_code == 200  # the event loop answers
        for t in threads:
            t.join(120)
        assert [a[:2] for a in answers] == [(400, "messages")] * 6, answers
        # each within the budget, with a wide margin for six renders sharing two cores
        assert max(a[2] for a in answers) < 4 * MAX_RENDER_SECONDS, answers
        fine = post(server, "/tokenize", json.dumps({"prompt": "hi"}))
        assert fine.status_code == 200
    finally:
        server.stop()
        model.close()
