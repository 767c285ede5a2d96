"""A replica runs each request through its own copy of the app (``call_app``): the answer equals the app's answer
over HTTP in process, a stream's first body chunk already carries the first token (so the ingress may retry until
then), heartbeats fill silences, and an answer closed early tells the app its client left (the generation is
cancelled and its pages released)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

pytest.importorskip("fastapi")

from smile_llm import LanguageModel  # noqa: E402
from smile_llm.server import ServerSettings, create_app  # noqa: E402
from smile_llm.server.replicas.proxied import HEARTBEAT, ProxiedRequest, ResponseHead, call_app  # noqa: E402


@pytest.fixture(scope="module")
def app() -> Iterator[Any]:
    model = LanguageModel.default(max_batch_size=4, max_seq_len=1024)
    yield create_app(model, ServerSettings())
    model.close()


def proxied(path: str, body: dict[str, Any]) -> ProxiedRequest:
    return ProxiedRequest("POST", path, b"", [(b"content-type", b"application/json")], json.dumps(body).encode(), "")


async def collect(app: Any, request: ProxiedRequest, heartbeat_s: float = 2.0) -> list[Any]:
    return [part async for part in call_app(app, request, heartbeat_s)]


def drop_ids(payload: dict[str, Any]) -> dict[str, Any]:
    """Without the request id, the time and the cached-token count (the second run finds the first's prefix)."""
    payload["usage"].pop("prompt_tokens_details")
    return {k: v for k, v in payload.items() if k not in ("id", "created")}


def test_the_answer_is_the_apps_answer_over_http(app: Any) -> None:
    body = {"messages": [{"role": "user", "content": "count to three"}], "max_tokens": 12, "temperature": 0}
    parts = asyncio.run(collect(app, proxied("/v1/chat/completions", body)))
    head, chunks = parts[0], [p for p in parts[1:] if p != HEARTBEAT]
    assert isinstance(head, ResponseHead) and head.status == 200

    async def direct() -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://x") as c:
            return await c.post("/v1/chat/completions", json=body)
    want = asyncio.run(direct())
    assert drop_ids(json.loads(b"".join(chunks))) == drop_ids(want.json())
    bad = asyncio.run(collect(app, proxied("/v1/chat/completions", {"messages": "x"})))
    assert bad[0].status == 400 and json.loads(bad[1])["error"]["param"] == "messages"


def test_a_streams_first_chunk_carries_the_first_token(app: Any) -> None:
    body = {"prompt": "def main(", "max_tokens": 6, "temperature": 0, "stream": True, "n": 2}
    parts = asyncio.run(collect(app, proxied("/v1/completions", body)))
    chunks = [p for p in parts[1:] if p != HEARTBEAT]
    first = [json.loads(line[6:]) for line in chunks[0].decode().splitlines() if line.startswith("data: ")]
    # the opening event of each of the 2 choices, then the first text of one or both (both samples make their first
    # token in the same step; whether the reader woke between the two hand-offs is timing)
    assert [(e["choices"][0]["index"], e["choices"][0]["text"]) for e in first[:2]] == [(0, ""), (1, "")]
    texts = [(e["choices"][0]["index"], e["choices"][0]["text"]) for e in first[2:]]
    assert 1 <= len(texts) <= 2 and len({i for i, _ in texts}) == len(texts) and all(t for _, t in texts)
    assert chunks[-1].endswith(b"data: [DONE]\n\n")


def test_heartbeats_fill_silences_and_closing_early_cancels_the_generation(app: Any) -> None:
    model = app.state.smile.model
    body = {"prompt": "x", "max_tokens": 400, "ignore_eos": True, "stream": True}

    async def go() -> list[Any]:
        seen: list[Any] = []
        answer = call_app(app, proxied("/v1/completions", body), heartbeat_s=0.001)
        async for part in answer:
            seen.append(part)
            if sum(1 for p in seen if isinstance(p, bytes) and p) >= 2:
                break
        await answer.aclose()  # type: ignore[attr-defined]
        return seen
    seen = asyncio.run(go())
    assert isinstance([p for p in seen if p != HEARTBEAT][0], ResponseHead) and HEARTBEAT in seen
    deadline = time.monotonic() + 20
    while model.pool.bound_request_count and time.monotonic() < deadline:
        time.sleep(0.02)
    assert model.pool.bound_request_count == 0
