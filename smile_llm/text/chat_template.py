"""Chat templates: a checkpoint's own Jinja template, rendered the way Hugging Face's
``apply_chat_template`` does.

The template comes from the model folder: ``chat_template.jinja`` if present, else ``chat_template``
in ``tokenizer_config.json`` (a string, or a list of ``{"name", "template"}`` of which ``"default"``
is used). It is rendered in jinja2's immutable sandbox with HF's settings (``trim_blocks``,
``lstrip_blocks``, the ``loopcontrols`` extension and a ``{% generation %}`` block that renders its
body) and HF's variables and helpers: ``messages``, ``add_generation_prompt``, ``tools``, the
tokenizer's special tokens (``bos_token``, ``eos_token``, ``pad_token``, ``unk_token``),
``raise_exception(message)``, ``strftime_now(format)``, a ``tojson`` filter that keeps non-ASCII
text, and any extra variables (e.g. ``enable_thinking``). The rendered text is tokenized without
adding special tokens, as HF does, so the ids equal ``apply_chat_template(..., tokenize=True)``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from .limits import RenderLimits
from ..errors import ChatTemplateError, RenderBudgetError, RequestError, RequestTypeError
from ..json_file import read_json

TEMPLATE_FILE = "chat_template.jinja"
CONFIG_FILE = "tokenizer_config.json"
SPECIAL_TOKENS = ("bos_token", "eos_token", "pad_token", "unk_token")
# set by chat itself, not by chat_template_kwargs
RESERVED_VARIABLES = ("messages", "add_generation_prompt")
# a tokenizer_config.json larger than this is refused before it is parsed
MAX_CONFIG_BYTES = 64 << 20
# a template longer than this is refused before it is compiled (compiling takes about 20 us per
# character of dense template on a slow core; real templates are at most a few tens of KiB)
MAX_TEMPLATE_BYTES = 256 << 10


class ChatTemplate:
    """One compiled chat template (``source``) with the tokenizer's special tokens (``special``),
    rendered in a ``sandbox.BoundedSandbox`` under ``limits`` (default: ``MAX_RENDER_SECONDS``,
    ``MAX_RENDER_CHARS``, ``MAX_RANGE``, ``MAX_CALL_DEPTH`` of ``limits``). ChatTemplateError
    (a ValueError) naming ``origin`` when it does not compile."""

    def __init__(self, source: str, special: Mapping[str, str] | None = None,
                 origin: str = "<string>", *, limits: RenderLimits | None = None) -> None:
        import jinja2
        from jinja2 import ext, nodes

        from .guards import check_strftime
        from .sandbox import BoundedSandbox

        # HF's {% generation %} ... {% endgeneration %}: the body, rendered
        class Generation(ext.Extension):
            tags = {"generation"}

            def parse(self, parser: Any) -> Any:
                lineno = next(parser.stream).lineno
                body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
                return nodes.Scope(body, lineno=lineno)

        def raise_exception(message: str) -> None:
            raise jinja2.exceptions.TemplateError(message)

        def tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None,
                   separators: Any = None, sort_keys: bool = False) -> str:
            return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                              sort_keys=sort_keys)

        def strftime_now(fmt: str) -> str:
            check_strftime(self._env.budget(), fmt)
            return datetime.now().strftime(fmt)

        self._env = BoundedSandbox(limits, filters={"tojson": tojson}, trim_blocks=True,
                                   lstrip_blocks=True, extensions=[Generation, ext.loopcontrols])
        self._env.globals["raise_exception"] = raise_exception
        self._env.globals["strftime_now"] = strftime_now
        self.source, self.origin = source, origin
        self.special = dict(special or {})
        try:
            self._template = self._env.compile_template(source)
        except jinja2.exceptions.TemplateSyntaxError as exc:
            raise ChatTemplateError(f"the chat template in {origin} does not parse: "
                                    f"{exc}") from None
        except Exception as exc:  # e.g. RecursionError for absurdly nested source
            raise ChatTemplateError(f"the chat template in {origin} does not compile: "
                                    f"{type(exc).__name__}: {exc}") from exc
        self._refusals = (jinja2.exceptions.TemplateError,)

    @property
    def limits(self) -> RenderLimits:
        """The render budget (see ``limits.RenderLimits``)."""
        return self._env.limits

    @classmethod
    def from_folder(cls, folder: Path) -> ChatTemplate | None:
        """The folder's template (see the module docstring), or None when it has none.
        ChatTemplateError naming the file when ``tokenizer_config.json`` is not a JSON object (or
        not JSON: nested too deeply, an integer too long), a special token in it is not a string,
        the template is not UTF-8 text, is longer than ``MAX_TEMPLATE_BYTES`` or does not
        compile."""
        config: dict[str, Any] = {}
        if (folder / CONFIG_FILE).is_file():
            config = _read_json_object(folder / CONFIG_FILE)
        special = {name: _token_text(config[name], folder / CONFIG_FILE, name)
                   for name in SPECIAL_TOKENS if config.get(name) is not None}
        path = folder / TEMPLATE_FILE
        if path.is_file():
            _check_template_size(path.stat().st_size, path)
            try:
                text = path.read_bytes().decode("utf-8")
            except UnicodeDecodeError as exc:
                raise ChatTemplateError(f"{path} is not UTF-8 text: {exc}") from None
            return cls(text, special, str(path))
        source = config.get("chat_template")
        if isinstance(source, list):  # named templates: the (last) default one, as HF reads them
            named = [t.get("template") for t in source
                     if isinstance(t, dict) and t.get("name") == "default"]
            source = named[-1] if named else None
        if isinstance(source, str) and source:
            _check_template_size(len(source.encode("utf-8", "surrogatepass")),
                                 folder / CONFIG_FILE)
            return cls(source, special, str(folder / CONFIG_FILE))
        return None

    def render(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True,
               tools: Sequence[Mapping[str, Any]] | None = None, **variables: Any) -> str:
        """The prompt text of ``messages`` (checked by ``check_messages``); ``variables`` (e.g.
        ``enable_thinking``) may also override the special tokens, as in transformers.
        ChatTemplateError (a ValueError) naming the template: with the template's message when it
        rejects the conversation (``raise_exception``), with the limit when the render exceeds its
        budget (``limits``), and with the error for any other failure (``{{ 1 // 0 }}``,
        ``{% include %}``, an unknown filter at render time, ...)."""
        checked = check_messages(messages)
        context = {**self.special, **variables, "messages": checked,
                   "add_generation_prompt": bool(add_generation_prompt), "tools": tools}
        try:
            return self._env.render(self._template, context)
        except RenderBudgetError as exc:
            raise RenderBudgetError(f"the chat template ({self.origin}) {exc}") from None
        except self._refusals as exc:
            raise ChatTemplateError(f"the chat template ({self.origin}) refused the conversation: "
                                    f"{exc}") from None
        except Exception as exc:
            raise ChatTemplateError(f"the chat template ({self.origin}) failed to render: "
                                    f"{type(exc).__name__}: {exc}") from exc


def check_template_kwargs(value: Any) -> dict[str, Any]:
    """``chat_template_kwargs`` as a dict of template variables: None -> {}; else a mapping whose
    keys are strings other than ``messages`` and ``add_generation_prompt`` (``tools`` is allowed:
    ``chat`` takes it out). RequestTypeError (a TypeError and a ValueError) naming
    ``chat_template_kwargs`` otherwise."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise RequestTypeError("chat_template_kwargs must be a dict of template variables (or "
                               f"None), got {type(value).__name__} {value!r:.80}",
                               field="chat_template_kwargs")
    for key in value:
        if not isinstance(key, str):
            raise RequestTypeError("chat_template_kwargs keys must be strings (template "
                                   f"variable names), got {key!r}", field="chat_template_kwargs")
        if key in RESERVED_VARIABLES:
            raise RequestTypeError(f"chat_template_kwargs may not set {key!r}: chat passes it "
                                   "itself", field="chat_template_kwargs")
    return dict(value)


def check_messages(messages: Any) -> list[dict[str, Any]]:
    """``messages`` as a list of dicts, each with a non-empty string ``role`` and a ``content`` that
    is a string, a list (multimodal parts) or None (an assistant turn with tool calls). ValueError
    naming the message and field."""
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence) or not messages:
        raise RequestError("messages must be a non-empty list of {'role': ..., 'content': ...} "
                           "dicts", field="messages")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping):
            raise RequestError(f"messages[{i}] must be a dict with 'role' and 'content', got "
                               f"{type(m).__name__}", field="messages")
        role = m.get("role")
        if not isinstance(role, str) or not role:
            raise RequestError(f"messages[{i}]['role'] must be a non-empty string, got {role!r}",
                               field="messages")
        content = m.get("content")
        if content is not None and not isinstance(content, (str, list)):
            raise RequestError(f"messages[{i}]['content'] must be a string (or a list of parts, or "
                               f"None), got {type(content).__name__}", field="messages")
        out.append(dict(m))
    return out


def _token_text(token: Any, path: Path, name: str) -> str:
    """A special token from ``tokenizer_config.json``: a string, or an AddedToken dict whose
    ``content`` is one. ChatTemplateError naming the file and the field otherwise."""
    text = token.get("content", "") if isinstance(token, dict) else token
    if not isinstance(text, str):
        raise ChatTemplateError(f"{path}: {name} must be a string or an AddedToken object with "
                                f"a string 'content', got {type(text).__name__}")
    return text


def _check_template_size(size: int, path: Path) -> None:
    """ChatTemplateError naming ``path`` when its template has more than ``MAX_TEMPLATE_BYTES``
    bytes."""
    if size > MAX_TEMPLATE_BYTES:
        raise ChatTemplateError(f"{path} holds a chat template of {size} bytes; at most "
                                f"{MAX_TEMPLATE_BYTES} are compiled (MAX_TEMPLATE_BYTES)")


def _read_json_object(path: Path) -> dict[str, Any]:
    """The JSON object in ``path``; ChatTemplateError naming the file otherwise."""
    data = read_json(path, MAX_CONFIG_BYTES, lambda message: ChatTemplateError(f"{path} {message}"))
    if not isinstance(data, dict):
        raise ChatTemplateError(f"{path} must hold a JSON object, got {type(data).__name__}")
    return data
