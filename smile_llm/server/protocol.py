"""The request bodies of ``/v1/chat/completions`` and ``/v1/completions`` (OpenAI's fields, and
the project's own through ``extra_body``), as pydantic models: a field of the wrong type is a 400
naming it (validated strictly: ``"3"`` is not an integer, ``"yes"`` not a boolean); an unknown
field is kept aside, logged and ignored (``unknown_fields``), as vLLM does, so clients that send
extra fields keep working. Values are checked by ``SamplingParams`` (the one
validation), not here."""

from __future__ import annotations

from typing import Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field

Stop = Union[str, list[str], None]


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")
    include_usage: bool = False


class ResponseFormat(BaseModel):
    """``{"type": "text" | "json_object" | "json_schema", "json_schema": {"name", "schema",
    "strict"}}``."""

    model_config = ConfigDict(extra="allow")
    type: Literal["text", "json_object", "json_schema"]
    json_schema: dict[str, Any] | None = None


class SamplingFields(BaseModel):
    """The fields both endpoints share."""

    model_config = ConfigDict(extra="allow")
    model: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: Stop = None
    seed: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    response_format: ResponseFormat | None = None
    # vLLM's and the project's own, through extra_body
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    min_tokens: int | None = None
    ignore_eos: bool = False
    speculative_tokens: int | Literal["auto"] | None = None
    draft_tree: list[int] | None = None
    draft_sampling: Literal["greedy", "sample"] | None = None
    json_schema: dict[str, Any] | str | None = None
    regex: str | None = None
    grammar: str | None = None
    choice: list[str] | None = None

    def unknown_fields(self) -> list[str]:
        """The body's fields this server does not know (ignored)."""
        return sorted(self.model_extra or {})


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: str
    content: str | list[dict[str, Any]] | None = None


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None


class CompletionRequest(SamplingFields):
    prompt: str | list[int]
    logprobs: int | None = None
    echo: bool = False
