"""The server's per-token path: the serving thread hands a generation's output to the event loop once per
scheduler step (not once per token, nor per sample; a sample's first text at once), nothing is lost or repeated on
the way, a streamed chunk's bytes are those of the OpenAI chunk object, ``n`` samples stream interleaved with their
own ends, and the metrics count every token sent and every gap between tokens."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest

from smile_llm import LanguageModel, SamplingParams
from smile_llm.server.generation import Delta, Generation
from smile_llm.server.responses import ChunkEncoder, chat_chunk, event, text_chunk

from .conftest import LiveServer, wait_unbound

MESSAGES = [{"role": "user", "content": "Name three rivers."}]


def consume(model: LanguageModel, params: SamplingParams, count: int, streamed: bool = True
            ) -> tuple[Generation, list[list[Delta]], int]:
    """A Generation of ``count`` samples read to its end on an event loop: the generation, every batch it gave and
    the serving loop's steps meanwhile."""
    prompt = model.encode_chat(MESSAGES)

    async def run() -> tuple[Generation, list[list[Delta]]]:
        gen = Generation(model, prompt, params, count, asyncio.get_running_loop(), streamed=streamed)
        batches = [batch async for batch in gen.batches()] if streamed else []
        await gen.results()
        return gen, batches

    steps = model.serving_loop.steps
    gen, batches = asyncio.run(run())
    return gen, batches, model.serving_loop.steps - steps


@pytest.mark.parametrize("speculative", [0, None])
def test_one_wake_up_per_step_for_all_samples(chat_model: LanguageModel, speculative: int | None) -> None:
    params = SamplingParams(max_new_tokens=40, min_new_tokens=40, temperature=1.0, seed=7,
                            speculative_tokens=speculative)
    gen, batches, steps = consume(chat_model, params, 3)
    tokens = sum(len(h.result(0).tokens) for h in gen.handles)
    assert tokens == 120
    # one hand-off per step that made output (and one at each sample's first text), whatever its tokens
    assert 1 <= gen.wakeups <= steps + 3 < tokens
    assert len(batches) <= gen.wakeups
    for i, h in enumerate(gen.handles):
        mine = [d for batch in batches for d in batch if d.index == i]
        assert [d.done for d in mine] == [False] * (len(mine) - 1) + [True]  # its end last, once
        assert "".join(d.text for d in mine) == h.result(0).text
        assert [t for d in mine for t in d.token_ids] == h.result(0).tokens
    for batch in batches:
        assert [d.index for d in batch] == sorted({d.index for d in batch})  # one Delta per sample, in order
    wait_unbound(chat_model)


def test_a_plain_request_wakes_the_reader_only_at_its_end(chat_model: LanguageModel) -> None:
    params = SamplingParams(max_new_tokens=30, min_new_tokens=30, temperature=1.0, seed=3)
    gen, _, steps = consume(chat_model, params, 2, streamed=False)
    assert steps > 2 and 1 <= gen.wakeups <= 2
    for i, h in enumerate(gen.handles):
        ttft, gaps = gen.latencies(i)
        assert ttft is not None and ttft > 0 and len(gaps) == len(h.result(0).tokens) - 1
    wait_unbound(chat_model)


@pytest.mark.parametrize("chat", [True, False])
def test_a_text_chunk_is_the_bytes_of_its_object(chat: bool) -> None:
    rid, model = 'chatcmpl-"odd\\id"', "mödel"
    encoder = ChunkEncoder(rid, model, 1_700_000_000, chat)
    for index in (0, 1, 15):
        for text in ("hi", ' "quoted" \\ ', "é€😀\n\t\r\x00\x1f\u2028\u2029", "<tool_call>", " "):
            expected = event(chat_chunk(rid, model, 1_700_000_000, index, {"content": text}) if chat else
                             text_chunk(rid, model, 1_700_000_000, index, text))
            assert encoder.text(index, text) == expected


def metric(live: LiveServer, name: str) -> float:
    text = httpx.get(live.url + "/metrics", timeout=30).text
    return float(next(line.split()[-1] for line in text.splitlines() if line.startswith(name + " ")))


def test_n_samples_stream_interleaved_and_every_token_is_counted(live: LiveServer, chat_model: LanguageModel
                                                                 ) -> None:
    names = ("smile_llm_generation_tokens_total", "smile_llm_inter_token_latency_seconds_count",
             "smile_llm_time_to_first_token_seconds_count")
    before = {name: metric(live, name) for name in names}
    body: dict[str, Any] = {"messages": MESSAGES, "max_tokens": 24, "temperature": 1.0, "seed": 9, "n": 3,
                            "ignore_eos": True}
    whole = httpx.post(live.url + "/v1/chat/completions", json=body, timeout=60).json()
    middle = {name: metric(live, name) for name in names}
    pieces: list[bytes] = []
    with httpx.stream("POST", live.url + "/v1/chat/completions", timeout=60,
                      json={**body, "stream": True, "stream_options": {"include_usage": True}}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        pieces = list(r.iter_raw())
    # the first piece the client gets holds every choice's role and a first token
    first = [json.loads(e[6:]) for e in pieces[0].decode().split("\n\n") if e.startswith("data: {")]
    assert sorted(c["choices"][0]["index"] for c in first if "role" in c["choices"][0]["delta"]) == [0, 1, 2]
    assert any(c["choices"][0]["delta"].get("content") for c in first)
    events = [e[6:] for e in b"".join(pieces).decode().split("\n\n") if e.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    usage = chunks[-1]["usage"]
    assert chunks[-1]["choices"] == [] and usage["completion_tokens"] == 72
    texts, finals = ["", "", ""], [[], [], []]
    for c in chunks[:-1]:
        (choice,) = c["choices"]
        assert not finals[choice["index"]], "a chunk after its choice's end"
        texts[choice["index"]] += choice["delta"].get("content") or ""
        if choice["finish_reason"]:
            finals[choice["index"]].append(choice["finish_reason"])
    assert texts == [ch["message"]["content"] for ch in whole["choices"]]
    assert finals == [["length"]] * 3
    order = [c["choices"][0]["index"] for c in chunks[:-1] if c["choices"][0]["delta"].get("content")]
    assert order != sorted(order), "the samples stream interleaved"
    after = {name: metric(live, name) for name in names}
    for got in (middle, after):  # each request: its 72 tokens, 3 first tokens and 3 x 23 gaps
        start = before if got is middle else middle
        assert got["smile_llm_generation_tokens_total"] - start["smile_llm_generation_tokens_total"] == 72
        assert got["smile_llm_time_to_first_token_seconds_count"] - \
            start["smile_llm_time_to_first_token_seconds_count"] == 3
        assert got["smile_llm_inter_token_latency_seconds_count"] - \
            start["smile_llm_inter_token_latency_seconds_count"] == 69
    wait_unbound(chat_model)


def test_the_latencies_booked_are_each_completed_samples_own() -> None:
    """With the first of two samples failed, the second's completion is booked with the second's latencies, not
    the first's (they were paired by position among the completed ones)."""
    from smile_llm.server.metrics import ServerMetrics

    class Handle:
        def __init__(self, error: BaseException | None) -> None:
            self.error = error

        def done(self) -> bool:
            return True

        def exception(self, timeout: float) -> BaseException | None:
            return self.error

        def result(self, timeout: float) -> Any:
            return type("Completion", (), {"stats": {"prompt_tokens": 3}})()

    class Gen:
        t0 = 0.0
        handles = [Handle(RuntimeError("failed")), Handle(None)]

        def latencies(self, index: int) -> tuple[float | None, list[float]]:
            return (0.5, [0.25]) if index == 1 else (9.0, [9.0, 9.0])

    metrics = ServerMetrics(type("State", (), {"model": None})())
    seen: list[tuple[float | None, list[float]]] = []
    metrics.completed = lambda stats, seconds, ttft=None, gaps=(): seen.append((ttft, list(gaps)))  # type: ignore
    metrics.booked(Gen())
    assert seen == [(0.5, [0.25])]
