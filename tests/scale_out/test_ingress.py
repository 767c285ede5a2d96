"""The ingress in front of the replicas, against scripted replica answers (no Ray cluster): a request whose replica
dies or stalls before the first token is retried on another and the client sees one clean answer; after the retries
it is a 503 error object; heartbeats keep a slow answer alive; a replica lost mid-stream ends the stream with an
error event; the summary that ends an answer reaches the router's board; a client that leaves cancels the replica's
work; the key and the body limit are checked before anything is sent; routing fields come from the body."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest

ray_exceptions = pytest.importorskip("ray.exceptions", reason="needs the ray extra")

from smile_llm.server.replicas.cache_summaries import CacheSummary, board  # noqa: E402
from smile_llm.server.model_options import ModelOptions  # noqa: E402
from smile_llm.server.replicas.proxied import HEARTBEAT, ProxiedRequest, ResponseHead  # noqa: E402
from smile_llm.server.settings import ServerSettings  # noqa: E402

JSON = [(b"content-type", b"application/json")]
SSE = [(b"content-type", b"text/event-stream")]
Script = list[Any]  # parts to yield; an exception instance is raised; ("sleep", s) waits


class Answer:
    """A scripted replica answer (Ray's DeploymentResponseGenerator's part the ingress uses)."""

    def __init__(self, script: Script) -> None:
        self.script, self.cancelled = list(script), False

    def __aiter__(self) -> Answer:
        return self

    async def __anext__(self) -> Any:
        while self.script:
            part = self.script.pop(0)
            if isinstance(part, tuple) and part[0] == "sleep":
                await asyncio.sleep(part[1])
                continue
            if isinstance(part, BaseException):
                raise part
            return part
        raise StopAsyncIteration

    def cancel(self) -> None:
        self.cancelled = True


class Replicas:
    """A deployment handle whose calls answer the given scripts in turn."""

    def __init__(self, *scripts: Script) -> None:
        self.scripts, self.sent, self.answers = list(scripts), [], []

    def options(self, **_: Any) -> Replicas:
        return self

    def remote(self, request: ProxiedRequest) -> Answer:
        self.sent.append(request)
        answer = Answer(self.scripts.pop(0))
        self.answers.append(answer)
        return answer


def client(replicas: Replicas, **kw: Any) -> httpx.AsyncClient:
    from starlette.requests import Request

    from smile_llm.server.replicas.ingress import Ingress

    ingress = Ingress(replicas, ModelOptions(), ServerSettings(**kw.pop("settings", {})), **kw)

    async def app(scope: dict[str, Any], receive: Callable[..., Any], send: Callable[..., Any]) -> None:
        response = await ingress(Request(scope, receive))
        await response(scope, receive, send)

    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://ingress")


def ok(body: bytes = b'{"ok": true}', headers: list[tuple[bytes, bytes]] = JSON) -> Script:
    return [ResponseHead(200, headers), body]


def died() -> BaseException:
    return ray_exceptions.ActorDiedError()


CHAT = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}


def run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 60))


def test_a_replica_lost_before_the_first_token_is_retried_and_the_client_sees_one_answer() -> None:
    replicas = Replicas([died()], [ResponseHead(200, JSON), ray_exceptions.ActorUnavailableError("gone", None)],
                        ok())

    async def go() -> httpx.Response:
        async with client(replicas) as c:
            return await c.post("/v1/chat/completions", json=CHAT)
    r = run(go())
    assert r.status_code == 200 and r.json() == {"ok": True}
    assert len(replicas.sent) == 3 and replicas.answers[0].cancelled and replicas.answers[1].cancelled
    # the same request each time, with the prompt's token ids as the replica's app will see them
    assert all(s is replicas.sent[0] for s in replicas.sent)
    from smile_llm.language_model import LanguageModel

    lm = LanguageModel.default(drafter=None, max_batch_size=1)
    try:
        assert replicas.sent[0].prompt_token_ids == lm.encode_chat(CHAT["messages"], True)
    finally:
        lm.close()


def test_after_the_retries_it_is_a_503_error_object() -> None:
    replicas = Replicas([died()], [died()])

    async def go() -> httpx.Response:
        async with client(replicas, retries=1) as c:
            return await c.post("/v1/completions", json={"prompt": "x"})
    r = run(go())
    assert r.status_code == 503 and r.headers["retry-after"] == "1"
    assert r.json()["error"]["message"].startswith("no replica answered")


def test_a_silent_replica_is_given_up_on_but_heartbeats_keep_a_slow_one() -> None:
    replicas = Replicas([("sleep", 5.0)], [ResponseHead(200, JSON)] + [HEARTBEAT, ("sleep", 0.1)] * 6 + [b"{}"])

    async def go() -> httpx.Response:
        async with client(replicas, stall_timeout_s=0.3) as c:
            return await c.post("/v1/completions", json={"prompt": "x"})
    r = run(go())
    assert r.status_code == 200 and r.json() == {} and len(replicas.sent) == 2


def test_a_replica_lost_mid_stream_ends_the_stream_with_an_error_event() -> None:
    first = b'data: {"choices": [{"text": "a"}]}\n\n'
    replicas = Replicas([ResponseHead(200, SSE), first, died()])

    async def go() -> httpx.Response:
        async with client(replicas) as c:
            return await c.post("/v1/completions", json={"prompt": "x", "stream": True})
    r = run(go())
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: ")]
    assert events[0] == {"choices": [{"text": "a"}]}
    assert events[-1]["error"]["message"].startswith("the replica was lost mid-stream")
    assert len(replicas.sent) == 1  # (a token was sent: no retry)


def test_the_summary_ending_an_answer_reaches_the_board() -> None:
    summary = CacheSummary.of("SERVE_REPLICA::test#ModelReplica#abc", 3, 16, {11, 12}, complete=False)
    replicas = Replicas(ok() + [summary])

    async def go() -> httpx.Response:
        async with client(replicas) as c:
            return await c.post("/v1/completions", json={"prompt": "x"})
    assert run(go()).status_code == 200
    assert board().sizes()[summary.replica] == 2
    board().drop(summary.replica)


def test_a_client_that_leaves_cancels_the_replicas_work() -> None:
    from smile_llm.server.replicas.ingress import Ingress

    answer = Answer([b"more", HEARTBEAT, ("sleep", 30.0)])
    ingress = Ingress(Replicas(), ModelOptions(), ServerSettings())

    async def go() -> None:
        rest: AsyncIterator[bytes] = ingress._rest(answer, b"first", ResponseHead(200, SSE))
        assert await rest.__anext__() == b"first"
        assert await rest.__anext__() == b"more"
        await rest.aclose()  # type: ignore[attr-defined]
    run(go())
    assert answer.cancelled


def test_key_and_body_limit_are_checked_before_anything_is_sent() -> None:
    replicas = Replicas()

    async def go() -> list[httpx.Response]:
        async with client(replicas, settings={"api_key": "k", "max_body_bytes": 100}) as c:
            return [await c.post("/v1/completions", json={"prompt": "x"}),
                    await c.post("/v1/completions", json={"prompt": "x"}, headers={"Authorization": "Bearer no"}),
                    await c.post("/v1/completions", json={"prompt": "x" * 200}, headers={"Authorization": "Bearer k"})]
    r401, r401b, r413 = run(go())
    assert (r401.status_code, r401b.status_code, r413.status_code) == (401, 401, 413)
    assert r401.json()["error"]["code"] == "invalid_api_key" and replicas.sent == []


@pytest.mark.parametrize(("path", "body", "has_ids"), [
    ("/v1/chat/completions", CHAT, True),
    ("/v1/completions", {"prompt": "def f():"}, True),
    ("/v1/completions", {"prompt": [5, 6, 7]}, True),
    ("/v1/completions", {"prompt": 5}, False),  # malformed: no hint, the replica answers the 400
    ("/v1/chat/completions", {"messages": "x"}, False),
    ("/tokenize", {"prompt": "x"}, False),
])
def test_routing_fields(path: str, body: dict[str, Any], has_ids: bool) -> None:
    replicas = Replicas(ok())

    async def go() -> httpx.Response:
        async with client(replicas) as c:
            return await c.post(path, json=body)
    assert run(go()).status_code == 200
    sent = replicas.sent[0]
    assert (sent.prompt_token_ids is not None) == has_ids
    assert sent.path == path and json.loads(sent.body) == body and sent.prompt
    if path == "/v1/completions" and isinstance(body["prompt"], list):
        assert sent.prompt_token_ids == body["prompt"]
