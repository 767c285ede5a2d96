"""An OpenAI request body as the model's ``SamplingParams``: the field names mapped (``max_tokens``
/ ``max_completion_tokens``, ``min_tokens``, ``logprobs`` / ``top_logprobs``, ``response_format``,
vLLM's ``guided_*``), OpenAI's defaults (temperature 1), and the server's limits (``max_tokens``,
``n``). Every value is then checked by ``SamplingParams``, the one validation; its
``RequestError`` becomes a 400 naming its ``field`` as the API names it."""

from __future__ import annotations

from typing import Any

from ..serving.request import SamplingParams
from ..errors import RequestError
from .errors import ApiError, from_model_error
from .protocol import ChatCompletionRequest, CompletionRequest, SamplingFields
from .settings import ServerSettings
from .tool_calls import ToolChoice

# vLLM's names for structured output, taken as the model's own
GUIDED = {"guided_json": "json_schema", "guided_regex": "regex", "guided_choice": "choice",
          "guided_grammar": "grammar"}
# the model's names of the fields the API names otherwise
API_NAMES = {"max_new_tokens": "max_tokens", "min_new_tokens": "min_tokens"}


def sampling_params(body: SamplingFields, settings: ServerSettings, context_tokens: int,
                    tools: ToolChoice | None = None) -> SamplingParams:
    """The settings of one sample of ``body`` (``n`` is the caller's, checked at admission; the
    samples are one request, ``LanguageModel.submit_samples``). ``context_tokens``: the model's
    longest request (the default ``max_tokens``); ``tools``: the grammar a ``tool_choice`` forces
    (400 with another constraint) and the stop strings it needs."""
    fields: dict[str, Any] = {}
    max_tokens = body.max_tokens
    if isinstance(body, ChatCompletionRequest) and body.max_completion_tokens is not None:
        max_tokens = body.max_completion_tokens
    cap = settings.max_tokens or context_tokens
    if max_tokens is not None and max_tokens > cap:
        raise ApiError(400, f"max_tokens is {max_tokens}, over this server's limit of {cap}",
                       param="max_tokens")
    fields["max_new_tokens"] = cap if max_tokens is None else max_tokens
    fields["temperature"] = 1.0 if body.temperature is None else body.temperature
    for name, target in (("top_p", "top_p"), ("presence_penalty", "presence_penalty"),
                         ("frequency_penalty", "frequency_penalty"), ("top_k", "top_k"),
                         ("min_p", "min_p"), ("repetition_penalty", "repetition_penalty"),
                         ("min_tokens", "min_new_tokens"),
                         ("speculative_tokens", "speculative_tokens"),
                         ("draft_sampling", "draft_sampling"), ("json_schema", "json_schema"),
                         ("regex", "regex"), ("grammar", "grammar"), ("choice", "choice")):
        value = getattr(body, name)
        if value is not None:
            fields[target] = value
    extra = body.model_extra or {}
    for name, target in GUIDED.items():
        if extra.get(name) is not None:
            fields[target] = extra[name]
    if body.ignore_eos:  # vLLM's: EOS masked until the limit (an explicit stop still ends it)
        fields["min_new_tokens"] = fields["max_new_tokens"]
    if body.draft_tree is not None:
        fields["draft_tree"] = tuple(body.draft_tree)
    stops = [] if body.stop is None else [body.stop] if isinstance(body.stop, str) else \
        list(body.stop)
    stops += tools.stop_texts() if tools is not None else []
    if stops:
        fields["stop"] = stops
    if body.seed is not None:
        fields["seed"] = body.seed
    if body.logit_bias:
        try:
            fields["logit_bias"] = {int(k): v for k, v in body.logit_bias.items()}
        except ValueError:
            raise ApiError(400, "logit_bias keys must be token ids", param="logit_bias") from None
    _logprobs(body, fields)
    _response_format(body, fields)
    tool_grammar = tools.grammar() if tools is not None else None
    if tool_grammar is not None:
        given = [k for k in ("json_schema", "json_object", "regex", "grammar", "choice")
                 if k in fields]
        if given:
            raise ApiError(400, f"tool_choice forces tool calls and cannot be combined with "
                           f"{given[0]}", param="tool_choice")
        fields["grammar"] = tool_grammar
    try:
        return SamplingParams(**fields)
    except RequestError as exc:  # as the API names the field; a tool call's grammar: tool_choice
        renames = API_NAMES | ({"grammar": "tool_choice"} if tool_grammar else {})
        raise from_model_error(exc, renames) from None


def _logprobs(body: SamplingFields, fields: dict[str, Any]) -> None:
    if isinstance(body, ChatCompletionRequest):
        if body.logprobs:
            fields["logprobs"] = body.top_logprobs or True
        elif body.top_logprobs:
            raise ApiError(400, "top_logprobs needs logprobs: true", param="top_logprobs")
    elif isinstance(body, CompletionRequest) and body.logprobs is not None:
        fields["logprobs"] = body.logprobs or True


def _response_format(body: SamplingFields, fields: dict[str, Any]) -> None:
    rf = body.response_format
    if rf is None or rf.type == "text":
        return
    if rf.type == "json_object":
        fields["json_object"] = True
        return
    schema = (rf.json_schema or {}).get("schema")
    if not isinstance(schema, dict):
        raise ApiError(400, 'response_format json_schema needs {"json_schema": {"name": ..., '
                       '"schema": {...}}}', param="response_format")
    fields["json_schema"] = schema
