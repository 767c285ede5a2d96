"""The OpenAI response objects of finished generations and of streamed deltas: chat completions
and text completions, their chunks (server-sent events), logprobs and usage (with the prefix
cache's ``cached_tokens``)."""

from __future__ import annotations

import json
import time
from json.encoder import encode_basestring
from typing import Any

from ..serving.completion import Completion
from .tool_calls import ToolChoice, split_reply


def usage(prompt_tokens: int, completions: list[Completion]) -> dict[str, Any]:
    """``usage`` of one request's samples: its prompt once, every sample's tokens, and the prompt
    tokens the prefix cache held (the most any sample found)."""
    generated = sum(len(c.tokens) for c in completions)
    cached = max((int(c.stats.get("cached_tokens", 0)) for c in completions), default=0)
    return {"prompt_tokens": prompt_tokens, "completion_tokens": generated,
            "total_tokens": prompt_tokens + generated,
            "prompt_tokens_details": {"cached_tokens": min(cached, prompt_tokens)}}


def chat_logprobs(decode: Any, c: Completion) -> dict[str, Any] | None:
    """A chat choice's ``logprobs``: each token, its logprob, its bytes and its alternatives."""
    if c.logprobs is None:
        return None
    content = []
    for i, (token, logprob) in enumerate(zip(c.tokens, c.logprobs)):
        text = decode([token])
        top = (c.top_logprobs or [{}] * len(c.tokens))[i] if c.top_logprobs else {}
        content.append({"token": text, "logprob": logprob, "bytes": list(text.encode()),
                        "top_logprobs": [{"token": decode([t]), "logprob": lp,
                                          "bytes": list(decode([t]).encode())}
                                         for t, lp in top.items()]})
    return {"content": content}


def completion_logprobs(decode: Any, c: Completion) -> dict[str, Any] | None:
    """A text completion choice's legacy ``logprobs``: tokens, token_logprobs, top_logprobs and
    text_offset."""
    if c.logprobs is None:
        return None
    tokens = [decode([t]) for t in c.tokens]
    offsets, at = [], 0
    for t in tokens:
        offsets.append(at)
        at += len(t)
    top = [{decode([t]): lp for t, lp in entry.items()} for entry in c.top_logprobs] \
        if c.top_logprobs else None
    return {"tokens": tokens, "token_logprobs": list(c.logprobs), "top_logprobs": top,
            "text_offset": offsets}


def chat_response(rid: str, model: str, decode: Any, prompt_tokens: int,
                  completions: list[Completion], tools: ToolChoice | None = None
                  ) -> dict[str, Any]:
    """A chat completion; with ``tools`` each reply is split into content and ``tool_calls``
    (finish reason "tool_calls" when it made any and ended on its own; a call the reply was cut
    inside is dropped)."""
    choices = []
    for i, c in enumerate(completions):
        message: dict[str, Any] = {"role": "assistant", "content": c.text}
        reason = c.finish_reason
        if tools is not None:
            content, calls = split_reply(c.text, c.finish_reason, tools.max_calls,
                                         bool(tools.stop_texts()))
            message["content"] = content
            if calls:
                message["tool_calls"] = [call.as_openai() for call in calls]
                reason = "tool_calls" if reason == "stop" else reason
        choices.append({"index": i, "message": message, "logprobs": chat_logprobs(decode, c),
                        "finish_reason": reason})
    return {"id": rid, "object": "chat.completion", "created": int(time.time()), "model": model,
            "choices": choices, "usage": usage(prompt_tokens, completions)}


def text_response(rid: str, model: str, decode: Any, prompt_tokens: int,
                  completions: list[Completion], echo: str) -> dict[str, Any]:
    return {"id": rid, "object": "text_completion", "created": int(time.time()), "model": model,
            "choices": [{"index": i, "text": echo + c.text,
                         "logprobs": completion_logprobs(decode, c),
                         "finish_reason": c.finish_reason} for i, c in enumerate(completions)],
            "usage": usage(prompt_tokens, completions)}


def event(payload: dict[str, Any] | str) -> bytes:
    """One server-sent event."""
    data = payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False)
    return f"data: {data}\n\n".encode()


class ChunkEncoder:
    """The server-sent events of one response's streamed text without a dict per piece: the bytes
    of ``event(chat_chunk(..., {"content": text}))`` (``chat``) or ``event(text_chunk(..., text))``,
    no finish reason, as the JSON string of the text (the characters ``json.dumps(...,
    ensure_ascii=False)`` writes) between a prefix and a suffix cut once per choice from the
    event of a placeholder."""

    PLACEHOLDER = "\x00text\x00"

    def __init__(self, rid: str, model: str, created: int, chat: bool) -> None:
        self.rid, self.model, self.created, self.chat = rid, model, created, chat
        self._parts: dict[int, tuple[str, str]] = {}  # choice -> (prefix, suffix)

    def _cut(self, index: int) -> tuple[str, str]:
        args = (self.rid, self.model, self.created, index)
        whole = event(chat_chunk(*args, {"content": self.PLACEHOLDER}) if self.chat else
                      text_chunk(*args, self.PLACEHOLDER)).decode()
        prefix, _, suffix = whole.rpartition(encode_basestring(self.PLACEHOLDER))
        self._parts[index] = prefix, suffix
        return prefix, suffix

    def text(self, index: int, text: str) -> bytes:
        """The event of choice ``index``'s new ``text``."""
        prefix, suffix = self._parts.get(index) or self._cut(index)
        return (prefix + encode_basestring(text) + suffix).encode()


def chat_chunk(rid: str, model: str, created: int, index: int, delta: dict[str, Any],
               finish_reason: str | None = None) -> dict[str, Any]:
    return {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model,
            "choices": [{"index": index, "delta": delta, "logprobs": None,
                         "finish_reason": finish_reason}]}


def text_chunk(rid: str, model: str, created: int, index: int, text: str,
               finish_reason: str | None = None) -> dict[str, Any]:
    return {"id": rid, "object": "text_completion", "created": created, "model": model,
            "choices": [{"index": index, "text": text, "logprobs": None,
                         "finish_reason": finish_reason}]}
