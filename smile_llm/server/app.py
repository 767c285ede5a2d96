"""``create_app(model, settings)``: the OpenAI-compatible HTTP API of one loaded model, a FastAPI
app (run by uvicorn: ``smile-llm serve``).

Endpoints: ``POST /v1/chat/completions`` and ``/v1/completions`` (plain JSON, or server-sent
events ending in ``data: [DONE]``), ``GET /v1/models``, ``POST /tokenize`` and ``/detokenize``,
``GET /health`` (200 when ready, 503 while draining) and ``GET /metrics`` (Prometheus text).

Every generation goes through ``Generation``: ordinary requests on the model's one serving loop.
Bodies are read with a size limit and parsed here, so malformed JSON, a wrong type and an oversized
body are 400 / 413 OpenAI error objects naming the field; unknown fields are logged and ignored.
A client that disconnects cancels its request (its pages are released within one step). Each
response carries its request id (``id`` and the ``X-Request-Id`` header), which the structured
access log (logger ``smile_llm.server``) names too. Keys are compared in constant time and never
logged."""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, ValidationError

from .errors import ApiError, from_model_error
from .generation import Generation
from .metrics import ServerMetrics
from .protocol import ChatCompletionRequest, CompletionRequest, SamplingFields
from .request_params import sampling_params
from .responses import chat_chunk, chat_response, event, text_chunk, text_response, usage
from .settings import RETRY_AFTER_S, ServerSettings
from .tool_calls import ToolCall, ToolCallParser, check_tools, tool_grammar

log = logging.getLogger("smile_llm.server")
B = TypeVar("B", bound=BaseModel)
TYPE_TAGS = {"str", "int", "float", "bool", "list", "dict", "none"}
DISCONNECT_POLL_S = 0.05  # how often a non-streaming request checks that its client is still there


class ServerState:
    """What the routes share: the model (None while it loads: every call but ``/metrics`` gets
    503), the settings, the metrics and whether the server drains (set by the SIGTERM handler of
    ``serve``: new requests and ``/health`` then get 503)."""

    def __init__(self, model: Any, settings: ServerSettings) -> None:
        self.model, self.settings = model, settings
        self.metrics = ServerMetrics(self)
        self.draining = False
        self.created = int(time.time())

    def loaded(self) -> Any:
        """The model; 503 while it loads."""
        if self.model is None:
            raise ApiError(503, "the model is loading", headers={"Retry-After": "5"})
        return self.model


def create_app(model: Any, settings: ServerSettings | None = None) -> FastAPI:
    """The API of ``model`` (a loaded ``LanguageModel``, or None until ``app.state.smile.model``
    is set) with ``settings`` (default: no key, the default limits, served as
    ``"smile-llm"``)."""
    state = ServerState(model, settings or ServerSettings())
    app = FastAPI(title="smile-llm", description="OpenAI-compatible API of one smile-llm model")
    app.state.smile = state

    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> Response:
        state.metrics.answered(str(exc.status))
        return exc.response()

    @app.middleware("http")
    async def access_log(request: Request, call_next: Any) -> Response:
        rid = request.headers.get("x-request-id") or uuid.uuid4().hex
        request.state.rid = rid
        t0 = time.perf_counter()
        try:
            response: Response = await call_next(request)
        except Exception as exc:  # noqa: BLE001 - a bug of ours: a 500 error object, logged
            log.exception("request %s failed", rid)
            response = ApiError(500, f"internal error: {type(exc).__name__}").response()
        response.headers["X-Request-Id"] = rid
        log.info(json.dumps({"request_id": rid, "method": request.method,
                             "path": request.url.path, "status": response.status_code,
                             "seconds": round(time.perf_counter() - t0, 4)}))
        return response

    @app.get("/health")
    async def health() -> Response:
        state.loaded()
        if state.draining:
            raise ApiError(503, "the server is draining")
        return JSONResponse({"status": "ok"})

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(state.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def models(request: Request) -> Response:
        authorize(state.settings, request)
        model = state.loaded()
        return JSONResponse({"object": "list", "data": [{
            "id": state.settings.model_name, "object": "model", "created": state.created,
            "owned_by": "smile-llm", "max_model_len": model.max_seq_len}]})

    @app.post("/tokenize", openapi_extra=_body_schema(TokenizeBody))
    async def tokenize(request: Request) -> Response:
        authorize(state.settings, request)
        model = state.loaded()
        body = await read_body(request, state, TokenizeBody)
        ids = _prompt_ids(model, body.prompt, body.messages)
        return JSONResponse({"tokens": ids, "count": len(ids), "max_model_len": model.max_seq_len})

    @app.post("/detokenize", openapi_extra=_body_schema(DetokenizeBody))
    async def detokenize(request: Request) -> Response:
        authorize(state.settings, request)
        model = state.loaded()
        body = await read_body(request, state, DetokenizeBody)
        try:
            ids = model.serving_context.token_ids(body.tokens, "tokens")
        except ValueError as exc:
            raise ApiError(400, str(exc), param="tokens") from None
        return JSONResponse({"prompt": model.decode(ids)})

    @app.post("/v1/chat/completions", openapi_extra=_body_schema(ChatCompletionRequest))
    async def chat_completions(request: Request) -> Response:
        body = await admit(state, request, ChatCompletionRequest)
        functions = check_tools(body.tools, body.tool_choice)
        model = state.model
        messages, tools = chat_inputs(body)

        def prompt() -> list[int]:
            try:
                return list(model.encode_chat(messages, True, tools))
            except ValueError as exc:
                raise ApiError(400, str(exc), param="messages") from None
        return await generate(state, request, body, prompt, chat=True, tools=tools is not None,
                              grammar=tool_grammar(functions, body.tool_choice))

    @app.post("/v1/completions", openapi_extra=_body_schema(CompletionRequest))
    async def completions(request: Request) -> Response:
        body = await admit(state, request, CompletionRequest)
        model = state.model
        return await generate(state, request, body, lambda: _prompt_ids(model, body.prompt, None),
                              chat=False)

    app.openapi = lambda: _openapi(app)  # type: ignore[method-assign]
    return app


class TokenizeBody(BaseModel):
    model: str | None = None
    prompt: str | None = None
    messages: list[dict[str, Any]] | None = None


class DetokenizeBody(BaseModel):
    model: str | None = None
    tokens: list[int]


REF = "#/components/schemas/{model}"


def _body_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The OpenAPI request body of a route that reads its body itself (its nested models are
    referenced under ``components/schemas``: ``_openapi`` adds them)."""
    schema = model.model_json_schema(ref_template=REF)
    schema.pop("$defs", None)
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}


def _openapi(app: FastAPI) -> dict[str, Any]:
    """FastAPI's OpenAPI document with the nested models of the bodies the routes read
    themselves."""
    if app.openapi_schema is None:
        from fastapi.openapi.utils import get_openapi

        doc = get_openapi(title=app.title, version=app.version, description=app.description,
                          routes=app.routes)
        components = doc.setdefault("components", {}).setdefault("schemas", {})
        for model in (ChatCompletionRequest, CompletionRequest, TokenizeBody, DetokenizeBody):
            components.update(model.model_json_schema(ref_template=REF).get("$defs", {}))
        app.openapi_schema = doc
    return app.openapi_schema


def authorize(settings: ServerSettings, request: Request) -> None:
    """401 unless the request presents the server's key (``Authorization: Bearer KEY``), compared
    in constant time; nothing when the server has no key."""
    key = settings.api_key
    if key is None:
        return
    given = request.headers.get("authorization", "")
    scheme, _, token = given.partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(),
                                                             key.encode()):
        raise ApiError(401, "a valid API key is required (Authorization: Bearer KEY)",
                       code="invalid_api_key")


async def read_raw_body(request: Request, limit: int) -> bytes:
    """The body's bytes: 413 over ``limit`` bytes (read no further)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise ApiError(413, f"the body is {declared} bytes, over the limit of {limit}")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise ApiError(413, f"the body is over the limit of {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


async def read_body(request: Request, state: ServerState, kind: type[B]) -> B:
    """The body as ``kind``: 413 over ``max_body_bytes`` (read no further), 400 for malformed
    JSON or a field of the wrong type (naming it)."""
    raw = await read_raw_body(request, state.settings.max_body_bytes)
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ApiError(400, f"the body is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ApiError(400, f"the body must be a JSON object, got {type(data).__name__}")
    try:
        return kind.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        # the field's path, without pydantic's tags of union members ("stop.str")
        where = ".".join(str(p) for p in first["loc"] if isinstance(p, int) or not (
            p in TYPE_TAGS or "[" in p or p.startswith(("function-", "literal"))))
        raise ApiError(400, f"{where}: {first['msg']}", param=where) from None


async def admit(state: ServerState, request: Request, kind: type[B]) -> B:
    """Key, body, model name, draining and queue checks of a generation request."""
    authorize(state.settings, request)
    model = state.loaded()
    if state.draining:
        raise ApiError(503, "the server is draining")
    body = await read_body(request, state, kind)
    assert isinstance(body, SamplingFields)
    if body.model is not None and body.model != state.settings.model_name:
        raise ApiError(404, f"the model {body.model!r} does not exist; this server serves "
                       f"{state.settings.model_name!r}", param="model", code="model_not_found")
    unknown = body.unknown_fields()
    if unknown:
        log.warning(json.dumps({"request_id": request.state.rid, "ignored_fields": unknown}))
    if model.server.num_waiting >= state.settings.max_queued:
        raise ApiError(429, f"the queue is full ({state.settings.max_queued} requests waiting)",
                       headers={"Retry-After": str(RETRY_AFTER_S)})
    return body


def chat_inputs(body: ChatCompletionRequest) -> tuple[list[dict[str, Any]], Any]:
    """What the chat template renders of a chat request: its messages (text content joined) and
    its tools (None for none or ``tool_choice`` "none")."""
    messages = [_message(m.model_dump(exclude_none=True)) for m in body.messages]
    return messages, body.tools if body.tools and body.tool_choice != "none" else None


def _message(m: dict[str, Any]) -> dict[str, Any]:
    """A chat message with list content (``[{"type": "text", "text": ...}]``) joined to text."""
    content = m.get("content")
    if isinstance(content, list):
        parts = [p.get("text", "") for p in content if p.get("type") == "text"]
        if len(parts) != len(content):
            raise ApiError(400, "only text content parts are supported", param="messages")
        m = {**m, "content": "".join(parts)}
    return m


def _prompt_ids(model: Any, prompt: Any, messages: Any) -> list[int]:
    try:
        if messages is not None:
            return list(model.encode_chat([_message(m) for m in messages], True))
        if prompt is None:
            raise ApiError(400, "give a prompt or messages", param="prompt")
        return list(model.encode(prompt))
    except ValueError as exc:
        raise ApiError(400, str(exc), param="messages" if messages is not None else "prompt") \
            from None


async def generate(state: ServerState, request: Request, body: Any, prompt: Any, chat: bool,
                   tools: bool = False, grammar: str | None = None) -> Response:
    """Encode, validate and submit the request's samples, then answer (plain or streamed).
    ``tools``: replies are parsed for tool calls; ``grammar``: the tool-call grammar the reply must
    follow (``tool_choice`` "required" or a named function)."""
    model, settings = state.model, state.settings
    loop = asyncio.get_running_loop()

    def start() -> tuple[list[int], Generation]:
        ids = prompt()
        if len(ids) > model.max_seq_len:
            raise ApiError(413, f"the prompt is {len(ids)} tokens, over the model's context of "
                           f"{model.max_seq_len}", param="messages" if chat else "prompt")
        try:
            params = sampling_params(body, settings, model.max_seq_len, grammar)
            return ids, Generation(model, ids, params, body.n, loop)
        except ApiError:
            raise
        except Exception as exc:  # the model's validation: a 400 naming the field
            raise from_model_error(exc) from None

    ids, gen = await asyncio.to_thread(start)
    rid = ("chatcmpl-" if chat else "cmpl-") + request.state.rid
    name = settings.model_name
    echo = body.prompt if not chat and body.echo and isinstance(body.prompt, str) else ""
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        events = stream(state, gen, rid, name, len(ids), chat, include_usage, echo, tools)
        return StreamingResponse(_first_with_token(events, len(gen.samples)),
                                 media_type="text/event-stream")
    waiter = asyncio.ensure_future(gen.results())
    try:
        while not waiter.done():
            await asyncio.wait([waiter], timeout=DISCONNECT_POLL_S)
            if not waiter.done() and await request.is_disconnected():
                await asyncio.to_thread(gen.cancel)
                raise ApiError(499, "the client closed the request")
        outs = waiter.result()
    except ApiError:
        raise
    except Exception as exc:  # the request's own failure (a grammar, a full pool)
        raise from_model_error(exc) from None
    finally:
        if not waiter.done():
            waiter.cancel()
    _book(state, gen, outs)
    decode = model.decode
    payload = (chat_response(rid, name, decode, len(ids), outs, tools) if chat else
               text_response(rid, name, decode, len(ids), outs, echo))
    state.metrics.answered("200")
    return JSONResponse(payload)


def _book(state: ServerState, gen: Generation, outs: list[Any]) -> None:
    for i, c in enumerate(outs):
        state.metrics.completed(c.stats, time.perf_counter() - gen.t0, *gen.latencies(i))


async def _first_with_token(events: AsyncIterator[bytes], opening: int) -> AsyncIterator[bytes]:
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
                 tools: bool = False) -> AsyncIterator[bytes]:
    """The samples' deltas as server-sent events: for chat a first delta with the role, then the
    content, then an empty delta with the finish reason; ``usage`` last when asked for; then
    ``[DONE]``. A request that fails sends an error object. Leaving early (the client went away)
    cancels every sample. With ``tools``, each choice's text goes through a ``ToolCallParser``:
    content as content deltas, each call as a ``tool_calls`` delta, finish reason "tool_calls"."""
    created = int(time.time())
    ended = False
    parsers = [ToolCallParser() if tools else None for _ in gen.samples]
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
            parser = parsers[d.index]
            if d.text and chat:
                for chunk in chat_deltas(d.index, parser.feed(d.text) if parser else [d.text]):
                    yield chunk
            elif d.text:
                yield event(text_chunk(rid, name, created, d.index, d.text))
            if d.done and parser is not None:
                for chunk in chat_deltas(d.index, parser.finish()):
                    yield chunk
            if d.done:
                try:
                    c = gen.handles[d.index].result(0)
                except Exception as exc:  # noqa: BLE001 - this sample's failure, as an object
                    yield event(from_model_error(exc).body())
                    continue
                reason = "tool_calls" if called[d.index] and c.finish_reason == "stop" else \
                    c.finish_reason
                yield event(chat_chunk(rid, name, created, d.index, {}, reason)
                            if chat else text_chunk(rid, name, created, d.index, "",
                                                    c.finish_reason))
        ended = True
        outs = [h.result(0) for h in gen.handles if h.exception(0) is None]
        _book(state, gen, outs)
        if include_usage:
            obj = "chat.completion.chunk" if chat else "text_completion"
            yield event({"id": rid, "object": obj, "created": created, "model": name,
                         "choices": [], "usage": usage(prompt_tokens, outs)})
        yield event("[DONE]")
        state.metrics.answered("200")
    finally:
        if not ended:  # the client went away: cancel off the event loop (within one step)
            asyncio.get_running_loop().run_in_executor(None, gen.cancel)
            state.metrics.answered("499")
