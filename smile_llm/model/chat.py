"""Chat templates: a checkpoint's own Jinja template, rendered the way Hugging Face's ``apply_chat_template`` does.

The template comes from the model folder: ``chat_template.jinja`` if present, else ``chat_template`` in
``tokenizer_config.json`` (a string, or a list of ``{"name", "template"}`` of which ``"default"`` is used). It is
rendered in jinja2's immutable sandbox with HF's settings (``trim_blocks``, ``lstrip_blocks``, the ``loopcontrols``
extension and a ``{% generation %}`` block that renders its body) and HF's variables and helpers: ``messages``,
``add_generation_prompt``, ``tools``, the tokenizer's special tokens (``bos_token``, ``eos_token``, ``pad_token``,
``unk_token``), ``raise_exception(message)``, ``strftime_now(format)``, a ``tojson`` filter that keeps non-ASCII
text, and any extra variables (e.g. ``enable_thinking``). The rendered text is tokenized without adding special
tokens, as HF does, so the ids equal ``apply_chat_template(..., tokenize=True)``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

TEMPLATE_FILE = "chat_template.jinja"
CONFIG_FILE = "tokenizer_config.json"
SPECIAL_TOKENS = ("bos_token", "eos_token", "pad_token", "unk_token")


class ChatTemplate:
    """One compiled chat template (``source``) with the tokenizer's special tokens (``special``)."""

    def __init__(self, source: str, special: Mapping[str, str] | None = None, origin: str = "<string>") -> None:
        import jinja2
        from jinja2 import ext, nodes
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        class Generation(ext.Extension):  # HF's {% generation %} ... {% endgeneration %}: the body, rendered
            tags = {"generation"}

            def parse(self, parser: Any) -> Any:
                lineno = next(parser.stream).lineno
                body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
                return nodes.Scope(body, lineno=lineno)

        def raise_exception(message: str) -> None:
            raise jinja2.exceptions.TemplateError(message)

        def tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None,
                   sort_keys: bool = False) -> str:
            return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                            extensions=[Generation, ext.loopcontrols])
        env.filters["tojson"] = tojson
        env.globals["raise_exception"] = raise_exception
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        self.source, self.origin = source, origin
        self.special = dict(special or {})
        try:
            self._template = env.from_string(source)
        except jinja2.exceptions.TemplateSyntaxError as exc:
            raise ValueError(f"the chat template in {origin} does not parse: {exc}") from None
        self._errors = (jinja2.exceptions.TemplateError,)

    @classmethod
    def from_folder(cls, folder: Path) -> ChatTemplate | None:
        """The folder's template (see the module docstring), or None when it has none."""
        config: dict[str, Any] = {}
        if (folder / CONFIG_FILE).is_file():
            config = json.loads((folder / CONFIG_FILE).read_text())
        special = {name: _token_text(config[name]) for name in SPECIAL_TOKENS if config.get(name) is not None}
        if (folder / TEMPLATE_FILE).is_file():
            return cls((folder / TEMPLATE_FILE).read_text(), special, str(folder / TEMPLATE_FILE))
        source = config.get("chat_template")
        if isinstance(source, list):  # named templates: the default one
            named = {t.get("name"): t.get("template") for t in source if isinstance(t, dict)}
            source = named.get("default")
        if isinstance(source, str) and source:
            return cls(source, special, str(folder / CONFIG_FILE))
        return None

    def render(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True,
               tools: Sequence[Mapping[str, Any]] | None = None, **variables: Any) -> str:
        """The prompt text of ``messages`` (checked by ``check_messages``). ValueError with the template's message
        when it rejects the conversation (``raise_exception``) or fails to render."""
        checked = check_messages(messages)
        try:
            return str(self._template.render(messages=checked, add_generation_prompt=bool(add_generation_prompt),
                                             tools=tools, **self.special, **variables))
        except self._errors as exc:
            raise ValueError(f"the chat template ({self.origin}) refused the conversation: {exc}") from None


def check_messages(messages: Any) -> list[dict[str, Any]]:
    """``messages`` as a list of dicts, each with a non-empty string ``role`` and a ``content`` that is a string,
    a list (multimodal parts) or None (an assistant turn with tool calls). ValueError naming the message and field."""
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence) or not messages:
        raise ValueError("messages must be a non-empty list of {'role': ..., 'content': ...} dicts")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping):
            raise ValueError(f"messages[{i}] must be a dict with 'role' and 'content', got {type(m).__name__}")
        role = m.get("role")
        if not isinstance(role, str) or not role:
            raise ValueError(f"messages[{i}]['role'] must be a non-empty string, got {role!r}")
        content = m.get("content")
        if content is not None and not isinstance(content, (str, list)):
            raise ValueError(f"messages[{i}]['content'] must be a string (or a list of parts, or None), got "
                             f"{type(content).__name__}")
        out.append(dict(m))
    return out


def _token_text(token: Any) -> str:
    """A special token from ``tokenizer_config.json``: a string, or an AddedToken dict with ``content``."""
    return str(token.get("content", "")) if isinstance(token, dict) else str(token)
