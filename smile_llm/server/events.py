"""A generation's answer as server-sent events (``stream``), and the first chunk held until it
carries a token (``first_with_token``).

A stream never ends without its end: every failure after the response started (a sample's error,
a cut at the end of a drain, a reply the tool-call parser cannot take, a bug of ours) becomes an
OpenAI error event, then ``data: [DONE]``. A client that goes away closes the generator, which
cancels every sample (their pages released within one step) off the event loop."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi.responses import StreamingResponse

from .generation import Generation
from .responses import chat_chunk, event, text_chunk, usage
from .state import ServerState
from .tool_calls import ToolCall, ToolCallParser, ToolChoice

log = logging.getLogger("smile_llm.server")


class EventStream(StreamingResponse):
    """The server-sent events of ``gen`` (from ``stream``), which end it however the response
    ends: a response that never started its body (the client left before) still cancels the
    generation and takes it off ``state.generations``."""

    def __init__(self, events: AsyncIterator[bytes], state: ServerState, gen: Generation) -> None:
        super().__init__(events, media_type="text/event-stream")
        self.state, self.gen = state, gen

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            if self.gen in self.state.generations:  # the stream never ran its own end
                self.state.generations.discard(self.gen)
                self.state.metrics.answered("499")
                asyncio.get_running_loop().run_in_executor(None, self.gen.cancel)


async def first_with_token(events: AsyncIterator[bytes], opening: int) -> AsyncIterator[bytes]:
    """``events`` with its ``opening`` events (one per choice: the role, or the echo) sent together
    with the next one, so that the first chunk a client gets carries the first token (a proxy in
    front may retry a request on another replica until then)."""
    held: list[bytes] = []
    try:
        async for chunk in events:
            if len(held) < opening:
                held.append(chunk)
                continue
            if held:
                chunk, held = b"".join(held) + chunk, []
            yield chunk
        if held:
            yield b"".join(held)
    finally:
        await events.aclose()  # type: ignore[attr-defined]


async def stream(state: ServerState, gen: Generation, rid: str, name: str, prompt_tokens: int,
                 chat: bool, include_usage: bool, echo: str,
                 tools: ToolChoice | None = None) -> AsyncIterator[bytes]:
    """The samples' deltas as server-sent events: for chat a first delta with the role, then the
    content, then an empty delta with the finish reason; ``usage`` last when asked for; then
    ``[DONE]``. A sample that fails sends an error object in place of its final chunk. Each
    generated token is counted (``metrics.sent``) as it goes out. With ``tools``, each choice's
    text goes through a ``ToolCallParser``: content as content deltas, each complete call as a
    ``tool_calls`` delta, finish reason "tool_calls" when the reply made calls and ended on its
    own (a reply cut by ``max_tokens`` says "length", its unfinished call dropped)."""
    created = int(time.time())
    ended = False
    parsers = [ToolCallParser(tools.max_calls, bool(tools.stop_texts())) if tools else None
               for _ in gen.samples]
    called = [0] * len(gen.samples)

    def chat_deltas(index: int, parts: list[Any]) -> list[bytes]:
        out = []
        for part in parts:
            if isinstance(part, ToolCall):
                out.append(event(chat_chunk(rid, name, created, index, {
                    "tool_calls": [part.as_openai(called[index])]})))
                called[index] += 1
            else:
                out.append(event(chat_chunk(rid, name, created, index, {"content": part})))
        return out

    try:
        for i in range(len(gen.samples)):
            yield event(chat_chunk(rid, name, created, i, {"role": "assistant", "content": ""})
                        if chat else text_chunk(rid, name, created, i, echo))
        async for d in gen.deltas():
            state.metrics.sent(len(d.token_ids))
            parser = parsers[d.index]
            if d.text and chat:
                for chunk in chat_deltas(d.index, parser.feed(d.text) if parser else [d.text]):
                    yield chunk
            elif d.text:
                yield event(text_chunk(rid, name, created, d.index, d.text))
            if not d.done:
                continue
            try:
                c = gen.handles[d.index].result(0)
            except Exception as exc:  # noqa: BLE001 - this sample's failure, as an object
                yield event(gen.error_of(exc).body())
                continue
            if parser is not None:
                for chunk in chat_deltas(d.index, parser.finish(cut=c.finish_reason == "length")):
                    yield chunk
            reason = "tool_calls" if called[d.index] and c.finish_reason == "stop" else \
                c.finish_reason
            yield event(chat_chunk(rid, name, created, d.index, {}, reason)
                        if chat else text_chunk(rid, name, created, d.index, "", reason))
        outs = [h.result(0) for h in gen.handles if h.exception(0) is None]
        state.metrics.booked(gen, outs)
        if include_usage:
            obj = "chat.completion.chunk" if chat else "text_completion"
            yield event({"id": rid, "object": obj, "created": created, "model": name,
                         "choices": [], "usage": usage(prompt_tokens, outs)})
        ended = True
        yield event("[DONE]")
        state.metrics.answered("200")
    except Exception as exc:  # noqa: BLE001 - after the response started: an error event, the end
        if not ended:
            error = gen.error_of(exc)
            if error.status >= 500:
                log.error("stream %s failed: %s", rid, error.message, exc_info=exc)
            ended = True
            await asyncio.to_thread(gen.cancel)
            yield event(error.body())
            yield event("[DONE]")
            state.metrics.answered(str(error.status))
    finally:
        state.generations.discard(gen)
        if not ended:  # the client went away: cancel off the event loop (within one step)
            asyncio.get_running_loop().run_in_executor(None, gen.cancel)
            state.metrics.answered("499")
