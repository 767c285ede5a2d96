"""``create_app(model, settings)``: the OpenAI-compatible HTTP API of one loaded model, a FastAPI
app (run by uvicorn: ``smile-llm serve``).

Endpoints: ``POST /v1/chat/completions`` and ``/v1/completions`` (plain JSON, or server-sent
events ending in ``data: [DONE]``), ``GET /v1/models``, ``POST /tokenize`` and ``/detokenize``,
``GET /health`` (200 when ready, 503 while draining) and ``GET /metrics`` (Prometheus text).

Every generation goes through ``Generation``: ordinary requests on the model's one serving loop.
Bodies are read by ``bodies.read_body`` (size, time, content type, strict JSON fields), so client
input is a 4xx OpenAI error object naming the field, never a 500; unknown fields are logged and
ignored; an unknown path or method is a 404 / 405 error object. A client that disconnects cancels
its request, streamed or not (its pages are released within one step). Each response carries its
request id (``id`` and the ``X-Request-Id`` header), which the access log names too
(``access_log``). Keys are compared in constant time and never logged."""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import time
from typing import TYPE_CHECKING, Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel
from starlette.exceptions import HTTPException

from .access_log import RequestLog
from .bodies import read_body
from ..errors import ChatTemplateError, PromptTooLongError, RequestError
from .errors import ApiError, from_model_error
from .events import EventStream, stream
from .generation import Generation
from .protocol import ChatCompletionRequest, CompletionRequest, SamplingFields
from .request_params import sampling_params
from .responses import chat_response, text_response
from .settings import RETRY_AFTER_S, ServerSettings
from .state import ServerState
from .tool_calls import ToolChoice

if TYPE_CHECKING:
    from ..language_model import LanguageModel

log = logging.getLogger("smile_llm.server")
B = TypeVar("B", bound=BaseModel)
DISCONNECT_POLL_S = 0.05  # how often a non-streaming request checks that its client is still there


def create_app(model: LanguageModel | None, settings: ServerSettings | None = None) -> FastAPI:
    """The API of ``model`` (a loaded ``LanguageModel``, or None until ``app.state.smile.model``
    is set) with ``settings`` (default: no key, the default limits, served as
    ``"smile-llm"``)."""
    state = ServerState(model, settings or ServerSettings())
    app = FastAPI(title="smile-llm", description="OpenAI-compatible API of one smile-llm model")
    app.state.smile = state
    app.add_middleware(RequestLog)

    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> Response:
        state.metrics.answered(str(exc.status))
        return exc.response()

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> Response:
        message = {404: f"no route {request.url.path}", 405: f"{request.method} is not allowed on "
                   f"{request.url.path}"}.get(exc.status_code, str(exc.detail))
        return await api_error(request, ApiError(exc.status_code, message,
                                                 headers=dict(exc.headers or {})))

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
        body = await _read(request, state, TokenizeBody)
        if body.messages is not None:
            messages = [_message(m, i) for i, m in enumerate(body.messages)]
            ids = await asyncio.to_thread(_encode, lambda: model.encode_chat(messages, True),
                                          "messages")
        elif body.prompt is not None:
            ids = await asyncio.to_thread(_encode, lambda: model.encode(body.prompt), "prompt")
        else:
            raise ApiError(400, "give a prompt or messages", param="prompt")
        return JSONResponse({"tokens": ids, "count": len(ids), "max_model_len": model.max_seq_len})

    @app.post("/detokenize", openapi_extra=_body_schema(DetokenizeBody))
    async def detokenize(request: Request) -> Response:
        authorize(state.settings, request)
        model = state.loaded()
        body = await _read(request, state, DetokenizeBody)
        try:
            text = model.decode(body.tokens)
        except ValueError as exc:
            raise ApiError(400, str(exc), param="tokens") from None
        return JSONResponse({"prompt": text})

    @app.post("/v1/chat/completions", openapi_extra=_body_schema(ChatCompletionRequest))
    async def chat_completions(request: Request) -> Response:
        body = await admit(state, request, ChatCompletionRequest)
        tools = ToolChoice.of(body.tools, body.tool_choice, body.parallel_tool_calls)
        messages, given = chat_inputs(body, tools)
        model = state.loaded()
        return await generate(state, request, body,
                              lambda: _encode(lambda: model.encode_chat(messages, True, given),
                                              "messages"),
                              chat=True, tools=tools)

    @app.post("/v1/completions", openapi_extra=_body_schema(CompletionRequest))
    async def completions(request: Request) -> Response:
        body = await admit(state, request, CompletionRequest)
        model = state.loaded()
        return await generate(state, request, body,
                              lambda: _encode(lambda: model.encode(body.prompt), "prompt"),
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


async def _read(request: Request, state: ServerState, kind: type[B]) -> B:
    settings = state.settings
    return await read_body(request, kind, settings.max_body_bytes, settings.body_timeout_s)


async def admit(state: ServerState, request: Request, kind: type[B]) -> B:
    """Key, body, model name, draining and queue checks of a generation request. The queue
    counts samples: a request of ``n`` samples is admitted while the samples waiting and being
    admitted, plus ``n``, stay within ``max_queued`` (else 429); ``n`` over ``max_n`` or
    ``max_queued`` could never be queued (400)."""
    authorize(state.settings, request)
    model = state.loaded()
    if state.draining:
        raise ApiError(503, "the server is draining")
    body = await _read(request, state, kind)
    assert isinstance(body, SamplingFields)
    if body.model is not None and body.model != state.settings.model_name:
        raise ApiError(404, f"the model {body.model!r} does not exist; this server serves "
                       f"{state.settings.model_name!r}", param="model", code="model_not_found")
    unknown = body.unknown_fields()
    if unknown:
        log.warning(json.dumps({"request_id": request.state.rid, "ignored_fields": unknown}))
    queue_cap = state.settings.max_queued
    most = min(state.settings.max_n, queue_cap)
    if not 1 <= body.n <= most:
        raise ApiError(400, f"n must be in [1, {most}], got {body.n}", param="n")
    if model.serving_loop.num_waiting + state.admitting + body.n > queue_cap:
        raise ApiError(429, f"the queue is full ({queue_cap} samples waiting)",
                       headers={"Retry-After": str(RETRY_AFTER_S)})
    if state.draining:  # (SIGTERM while the body was read)
        raise ApiError(503, "the server is draining")
    return body


def chat_inputs(body: ChatCompletionRequest, tools: ToolChoice | None = None
                ) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """What the chat template renders of a chat request: its messages (text content joined) and
    its tools (None for none or ``tool_choice`` "none"); 400 naming the field at fault."""
    if tools is None:
        tools = ToolChoice.of(body.tools, body.tool_choice, body.parallel_tool_calls)
    messages = [_message(m.model_dump(exclude_none=True), i) for i, m in enumerate(body.messages)]
    return messages, body.tools if tools.templated else None


def _message(m: Any, index: int) -> dict[str, Any]:
    """A chat message with list content (``[{"type": "text", "text": ...}]``) joined to text;
    400 naming the part for anything else."""
    where = f"messages.{index}"
    if not isinstance(m, dict):
        raise ApiError(400, f"{where} must be an object", param=where)
    content = m.get("content")
    if isinstance(content, list):
        parts = []
        for j, p in enumerate(content):
            if not isinstance(p, dict) or p.get("type") != "text":
                raise ApiError(400, f"{where}.content.{j}: only text content parts are supported",
                               param=f"{where}.content.{j}")
            if not isinstance(p.get("text"), str):
                raise ApiError(400, f"{where}.content.{j}.text must be a string",
                               param=f"{where}.content.{j}.text")
            parts.append(p["text"])
        m = {**m, "content": "".join(parts)}
    elif content is not None and not isinstance(content, str):
        raise ApiError(400, f"{where}.content must be a string or a list of text parts",
                       param=f"{where}.content")
    return m


def _encode(encode: Any, field: str) -> list[int]:
    """``encode()`` as a list of ids; the model's request error (an empty prompt, an id outside the
    vocabulary, a chat template that refuses the conversation or runs over its budget) as a 400
    naming ``field``; anything else goes on to be the server's own failure."""
    try:
        return list(encode())
    except (RequestError, ChatTemplateError) as exc:
        raise ApiError(400, str(exc), param=field) from None


async def generate(state: ServerState, request: Request, body: Any, prompt: Any, chat: bool,
                   tools: ToolChoice | None = None) -> Response:
    """Encode, validate and submit the request's samples, then answer (plain or streamed).
    ``tools``: what the reply may call (parsed for calls when the tools went to the template;
    "required" or a named function force the calls by grammar)."""
    model, settings = state.loaded(), state.settings
    loop = asyncio.get_running_loop()
    field = "messages" if chat else "prompt"

    renames = {"grammar": "tool_choice"} if tools is not None and tools.grammar() else None

    def start() -> tuple[list[int], Generation]:
        ids = prompt()
        try:
            params = sampling_params(body, settings, model.max_seq_len, tools)
            return ids, Generation(model, ids, params, body.n, loop, renames,
                                   streamed=bool(body.stream))
        except ApiError:
            raise
        except PromptTooLongError as exc:  # the model's one length check
            raise ApiError(413, f"the prompt is {exc.tokens} tokens, over the model's context of "
                           f"{exc.max_seq_len}", param=field) from None
        except Exception as exc:  # the model's validation: a 400 naming the field
            raise from_model_error(exc, renames) from None

    state.admitting += body.n
    try:
        ids, gen = await asyncio.to_thread(start)
    finally:
        state.admitting -= body.n
    state.generations.add(gen)
    if state.cut_reason is not None:  # admitted while the drain ended
        await asyncio.to_thread(gen.cut, state.cut_reason)
    rid = ("chatcmpl-" if chat else "cmpl-") + request.state.rid
    name = settings.model_name
    echo = body.prompt if not chat and body.echo and isinstance(body.prompt, str) else ""
    parsed = tools if tools is not None and tools.templated else None
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        events = stream(state, gen, rid, name, len(ids), chat, include_usage, echo, parsed)
        return EventStream(events, state, gen)
    try:
        outs = await _results(gen, request)
    finally:
        state.generations.discard(gen)
    state.metrics.booked(gen)
    state.metrics.sent(sum(len(c.tokens) for c in outs))
    decode = model.decode
    payload = (chat_response(rid, name, decode, len(ids), outs, parsed) if chat else
               text_response(rid, name, decode, len(ids), outs, echo))
    state.metrics.answered("200")
    return JSONResponse(payload)


async def _results(gen: Generation, request: Request) -> list[Any]:
    """Every sample's Completion; the generation is cancelled (499) when the client leaves, and
    its failure is the request's API error."""
    waiter = asyncio.ensure_future(gen.results())
    try:
        while not waiter.done():
            await asyncio.wait([waiter], timeout=DISCONNECT_POLL_S)
            if not waiter.done() and await request.is_disconnected():
                await asyncio.to_thread(gen.cancel)
                raise ApiError(499, "the client closed the request")
        return waiter.result()
    except ApiError:
        raise
    except Exception as exc:  # the request's own failure (a grammar, a full pool, a cut)
        raise gen.error_of(exc) from None
    finally:
        if not waiter.done():
            waiter.cancel()
