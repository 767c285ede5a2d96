"""A generation's answer as server-sent events (``stream``): one piece per wake-up of the reader,
the first held until it carries a token.

A stream never ends without its end: every failure after the response started (a sample's error,
a cut at the end of a drain, a reply the tool-call parser cannot take, a bug of ours) becomes an
OpenAI error event, then ``data: [DONE]``. A client that goes away closes the generator, which
cancels every sample (their pages released within one step) off the event loop."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi.responses import StreamingResponse

from .generation import Generation
from .responses import ChunkEncoder, chat_chunk, event, text_chunk, usage
from .state import ServerState
from .tool_calls import ToolCall, ToolCallParser, ToolChoice


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


async def stream(state: ServerState, gen: Generation, rid: str, name: str, prompt_tokens: int,
                 chat: bool, include_usage: bool, echo: str,
                 tools: ToolChoice | None = None) -> AsyncIterator[bytes]:
    """The samples' output as server-sent events: for chat a first delta with the role, then the
    content, then an empty delta with the finish reason; ``usage`` last when asked for; then
    ``[DONE]``. A sample that fails sends an error object in place of its final chunk. The events
    of one wake-up (every sample's new output since the last) go out as one piece, and the opening
    events (one per choice: the role, or the echo) go out with the first piece after them, so the
    first chunk a client gets carries the first token (a proxy in front may retry a request on
    another replica until then). Each generated token is counted (``metrics.sent``) as it goes
    out. With ``tools``, each choice's text goes through a ``ToolCallParser``: content as content
    deltas, each complete call as a ``tool_calls`` delta, finish reason "tool_calls" when the reply
    made calls and ended on its own (a reply cut by ``max_tokens`` says "length", its unfinished
    call dropped)."""
    created = int(time.time())
    ended = False
    count = len(gen.samples)
    parsers = [ToolCallParser(tools.max_calls, bool(tools.stop_texts())) if tools else None
               for _ in range(count)]
    called = [0] * count
    encoder = ChunkEncoder(rid, name, created, chat)
    held = b"".join(event(chat_chunk(rid, name, created, i, {"role": "assistant", "content": ""})
                          if chat else text_chunk(rid, name, created, i, echo))
                    for i in range(count))

    def chat_parts(index: int, parts: list[Any], out: list[bytes]) -> None:
        for part in parts:
            if isinstance(part, ToolCall):
                out.append(event(chat_chunk(rid, name, created, index, {
                    "tool_calls": [part.as_openai(called[index])]})))
                called[index] += 1
            else:
                out.append(encoder.text(index, part))

    def opened(out: list[bytes]) -> bytes:
        """``out`` as one piece, after the opening events while they are held."""
        nonlocal held
        if held:
            out.insert(0, held)
            held = b""
        return b"".join(out)

    try:
        async for batch in gen.batches():
            out: list[bytes] = []
            tokens = 0
            for d in batch:
                tokens += len(d.token_ids)
                parser = parsers[d.index]
                if d.text and parser is not None:
                    chat_parts(d.index, parser.feed(d.text), out)
                elif d.text:
                    out.append(encoder.text(d.index, d.text))
                if not d.done:
                    continue
                try:
                    c = gen.handles[d.index].result(0)
                except Exception as exc:  # noqa: BLE001 - this sample's failure, as an object
                    out.append(event(gen.error_of(exc).body()))
                    continue
                if parser is not None:
                    chat_parts(d.index, parser.finish(cut=c.finish_reason == "length"), out)
                reason = "tool_calls" if called[d.index] and c.finish_reason == "stop" else \
                    c.finish_reason
                out.append(event(chat_chunk(rid, name, created, d.index, {}, reason)
                                 if chat else text_chunk(rid, name, created, d.index, "", reason)))
            state.metrics.sent(tokens)
            if out:
                yield opened(out)
        outs = [h.result(0) for h in gen.handles if h.exception(0) is None]
        state.metrics.booked(gen)
        tail = []
        if include_usage:
            obj = "chat.completion.chunk" if chat else "text_completion"
            tail.append(event({"id": rid, "object": obj, "created": created, "model": name,
                               "choices": [], "usage": usage(prompt_tokens, outs)}))
        tail.append(event("[DONE]"))
        ended = True
        yield opened(tail)
        state.metrics.answered("200")
    except Exception as exc:  # noqa: BLE001 - after the response started: an error event, the end
        if not ended:
            error = gen.error_of(exc)  # a 500 is logged where it is made
            ended = True
            await asyncio.to_thread(gen.cancel)
            yield opened([event(error.body()), event("[DONE]")])
            state.metrics.answered(str(error.status))
    finally:
        state.generations.discard(gen)
        if not ended:  # the client went away: cancel off the event loop (within one step)
            asyncio.get_running_loop().run_in_executor(None, gen.cancel)
            state.metrics.answered("499")
