"""Typed errors of the model package: what a model folder holds (``config.json``, the safetensors
checkpoint, ``tokenizer.json``, the chat template) and what a request meets (a field of the wrong
type, cancellation, shutdown).

Every model-file error is a ``ValueError`` (callers that catch ValueError for bad input catch them
all) whose message names the file (when there is one) and the field, tensor or template at fault.
``path`` and ``field`` keep both for code that wants them without parsing the message.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

E = TypeVar("E", bound="ModelFileError")


class ModelFileError(ValueError):
    """A file of a model folder is malformed, out of range or disagrees with another file.
    ``str(error)`` is ``"<path>: <message>"`` (just the message when no file is known); ``field``:
    the config field, tensor or entry named by the message, if any."""

    def __init__(self, message: str, *, path: str | Path | None = None,
                 field: str | None = None) -> None:
        self.message, self.field = message, field
        self.path = None if path is None else Path(path)
        super().__init__(message if path is None else f"{path}: {message}")

    def in_file(self: E, path: str | Path) -> E:
        """This error with ``path`` as its file (unchanged when it already names one); same type."""
        if self.path is not None:
            return self
        return type(self)(self.message, path=path, field=self.field)


class ConfigError(ModelFileError):
    """A ``config.json`` field of the wrong type, out of range, or inconsistent with another
    field."""


class CheckpointError(ModelFileError):
    """A safetensors file or shard index that is corrupt or unsafe (a shard outside the folder), or
    a checkpoint whose tensors disagree with the config."""


class TokenizerError(ModelFileError):
    """A ``tokenizer.json`` (or ``smile_tokenizer.json``) that cannot be read."""


class ChatTemplateError(ValueError):
    """A chat template that does not compile, fails while rendering, rejects the conversation, or
    exceeds its time or size budget; the message names the template (its file, or ``<string>``)."""


class RenderBudgetError(ChatTemplateError):
    """A chat template's render exceeded one of its limits (``text.limits``: time, size, range, call
    depth); the message names the limit."""


class GenerationCancelled(RuntimeError):
    """The request was cancelled (``cancel()`` returned True, ``RequestHandle.cancel``, or a
    shutdown that cancels pending work); its KV was released."""


def _rebuilt(cls: type[BaseException], args: tuple[Any, ...],
             state: dict[str, Any]) -> BaseException:
    """A request error rebuilt by pickle or copy without calling its ``__init__``."""
    error = cls.__new__(cls, *args)
    error.args = args
    error.__dict__.update(state)
    return error


class RequestError(ValueError):
    """A request field out of range, inconsistent with another field or with the model, or (as
    ``RequestTypeError``) of the wrong type; nothing was queued or bound. ``field`` names it (the
    Python name: ``max_new_tokens``, ``logit_bias``, ``segments[0]``, ...), and the message leads
    with it wherever it can. The server answers 400 naming the field (its HTTP name where that
    differs), the Java bridge an IllegalArgumentException led by its Java name: both read
    ``field``, never the message's words."""

    def __init__(self, message: str, *, field: str) -> None:
        self.field = field
        super().__init__(message)

    def after_field(self) -> str | None:
        """The message after its leading ``field`` (which a space, ``:`` or ``[`` follows); None
        when the message does not lead with it."""
        message, n = str(self), len(self.field)
        leads = message.startswith(self.field) and message[n:n + 1] in (" ", ":", "[")
        return message[n:] if leads else None

    def renamed(self, name: str) -> str:
        """The message with its leading field called ``name`` (unchanged when it does not lead
        with it)."""
        rest = self.after_field()
        return str(self) if rest is None else name + rest

    def __reduce__(self) -> tuple[Any, ...]:
        return _rebuilt, (type(self), self.args, self.__dict__)


class PromptTooLongError(RequestError):
    """A prompt (with its segments) of ``tokens`` tokens, more than the model's ``max_seq_len``."""

    def __init__(self, tokens: int, max_seq_len: int) -> None:
        super().__init__(f"prompt of {tokens} tokens exceeds max_seq_len {max_seq_len}; shorten it "
                         "or load the model with a larger max_seq_len", field="prompt")
        self.tokens, self.max_seq_len = tokens, max_seq_len


class RequestTypeError(RequestError, TypeError):
    """A request field of the wrong type. Also a ValueError, so callers that catch ValueError for
    bad input catch every invalid request."""


class EngineShutdownError(RuntimeError):
    """The engine or model was shut down before the request completed, or a request
    came after shutdown."""


class ConstraintError(RequestError):
    """A constraint field of a request (``json_schema``, ``json_object``, ``regex``, ``grammar``,
    ``choice``) that is malformed, over its size or nesting limit, or that the grammar engine
    refuses; ``field`` names it and the message quotes the engine's own."""

    def __init__(self, message: str, *, field: str) -> None:
        super().__init__(f"{field}: {message}", field=field)


class GrammarError(RuntimeError):
    """The grammar engine failed while a constrained request was generating (it reached a state
    with no allowed token, or an internal limit). That request alone fails with it; its pages are
    released."""


class GrammarLimitError(ConstraintError, GrammarError):
    """A request's constraint went past what the grammar engine can follow while the request was
    generating: one step's work over ``grammar_compiler.parser_limits`` ("Too many items", the
    lexer's fuel), a state after which no token is allowed, or one where every allowed token would
    repeat a key of the JSON object being written. A ``ConstraintError`` (``field`` names the
    constraint's request field; a server answers it as a bad request naming the field) and a
    ``GrammarError`` (that request alone fails, its pages released)."""


class SegmentError(RequestError):
    """A request or call names a registered segment (``LanguageModel.register_segment``) that this
    model cannot use: one released or registered with another model, a piece of ``segments`` of the
    wrong kind, or a request whose settings need every prompt position computed
    (``prompt_logprobs``). Nothing is queued or bound."""


class SegmentUnsupportedError(SegmentError):
    """This model cannot splice segments at all, and the message says why: a hybrid model's Gated
    DeltaNet layers carry a recurrent state through every earlier token, which moving a segment's KV
    cannot give; a pool with a packed low-bit layer is written a window at a time; with tensor or
    pipeline parallelism the ranks' pools would have to splice in lockstep, which is not
    implemented."""
