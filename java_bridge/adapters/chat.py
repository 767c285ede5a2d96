"""Java chat arguments as the Python values a chat template reads: Smile's ``Message[]`` dialogs
and ``List``s of ``TemplateMessage`` (``Message``, ``ChatMessage``) as Hugging Face's message
dicts, ``Map<String, Object>`` template variables as keyword arguments, and the Java values inside
them (strings, numbers, booleans, null, lists, arrays and maps, nested) as ``str``,
``int``, ``float``, ``bool``, ``None``, ``list`` and ``dict``. A value of any other type is a
TypeError naming where it sits (``messages[1]['tool_calls'][0]``, ``templateVars['tools']``)."""

from __future__ import annotations

from typing import Any

from jpype import JArray, JClass, JString

MAX_DEPTH = 64  # nesting deeper than this is refused (a map that contains itself would never end)
RESERVED_VARS = ("messages", "add_generation_prompt")  # encodeChat's own arguments

_classes: dict[str, Any] = {}


def _cls(name: str) -> Any:
    c = _classes.get(name)
    if c is None:
        c = _classes[name] = JClass(name)
    return c


def python_value(value: Any, where: str, depth: int = 0) -> Any:
    """``value`` (a Java value, or a Python one passed through JPype) as plain Python data;
    TypeError naming ``where`` for a type a template cannot read, ValueError for nesting deeper than
    ``MAX_DEPTH``."""
    if depth > MAX_DEPTH:
        raise ValueError(f"{where} is nested more than {MAX_DEPTH} levels deep (does a map or list "
                         "contain itself?)")
    if value is None:
        return None
    if isinstance(value, (str, JString, _cls("java.lang.Character"))):
        return str(value)
    # before int: a boxed Boolean is an int in JPype
    if isinstance(value, (bool, _cls("java.lang.Boolean"))):
        return bool(value)
    if isinstance(value, _cls("java.lang.Number")) or isinstance(value, (int, float)):
        if isinstance(value, int):
            return int(value)
        if isinstance(value, _cls("java.math.BigInteger")):
            return int(str(value))
        return float(value) if isinstance(value, float) else float(value.doubleValue())
    if isinstance(value, _cls("java.util.Map")):
        out = {}
        for key in value.keySet():
            k = python_value(key, f"{where} key", depth + 1)
            if not isinstance(k, (str, int, float, bool)):
                raise TypeError(f"{where} has a key {k!r}: map keys must be strings or numbers")
            out[k] = python_value(value.get(key), f"{where}[{k!r}]", depth + 1)
        return out
    if isinstance(value, (_cls("java.util.Collection"), JArray, list, tuple)):
        return [python_value(v, f"{where}[{i}]", depth + 1) for i, v in enumerate(value)]
    if isinstance(value, dict):
        return {k: python_value(v, f"{where}[{k!r}]", depth + 1) for k, v in value.items()}
    name = value.getClass().getName() if hasattr(value, "getClass") else type(value).__name__
    raise TypeError(f"{where} is a {name}, which a chat template cannot read: use String, Number, "
                    f"Boolean, null, List, arrays or Map values")


def python_messages(messages: Any, what: str | None = None) -> list[dict[str, Any]]:
    """A Java dialog as a list of ``{"role", "content", **fields}`` dicts: Smile's ``Message[]``
    (``encodeChat(Message...)``, ``chat(Message[], ...)``) or a ``List`` of any
    ``smile.llm.python.TemplateMessage`` (``Message``, ``ChatMessage``, ...). A ``Message``'s role
    is its ``Role``'s name. ``what`` names the argument in errors (default: ``"dialog"`` for an
    array, ``"messages"`` otherwise). ValueError for a null dialog or turn, an empty ``Message[]``,
    a field named ``role`` or ``content`` or with an empty name; TypeError for an element of another
    type. The role and content checks are the template's (``chat_template.check_messages``)."""
    if what is None:
        what = "dialog" if isinstance(messages, JArray) else "messages"
    if messages is None:
        raise ValueError(f"{what} must not be null")
    if isinstance(messages, JArray) and len(messages) == 0:
        raise ValueError(f"{what} must hold at least one Message")
    message_class = _cls("smile.llm.Message")
    turn_class = _cls("smile.llm.python.TemplateMessage")
    out = []
    for i, m in enumerate(messages):
        if m is None:
            raise ValueError(f"{what}[{i}] must not be null")
        if isinstance(m, message_class):  # Smile's record: role and content, never null
            out.append({"role": str(m.role().name()), "content": str(m.content())})
            continue
        if not isinstance(m, turn_class):
            raise TypeError(f"{what}[{i}] must be a smile.llm.Message or another "
                            f"smile.llm.python.TemplateMessage, got {_type_name(m)}")
        role = m.templateRole()
        d: dict[str, Any] = {"role": None if role is None else str(role),
                             "content": python_value(m.content(), f"{what}[{i}]['content']")}
        fields = m.templateFields()
        for key in [] if fields is None else fields.keySet():
            name = str(key) if key is not None else None
            if not name or name in ("role", "content"):
                raise ValueError(f"{what}[{i}] has a template field named {name!r}: names must be "
                                 "non-empty strings other than 'role' and 'content'")
            d[name] = python_value(fields.get(key), f"{what}[{i}][{name!r}]")
        out.append(d)
    return out


def _type_name(value: Any) -> str:
    return str(value.getClass().getName()) if hasattr(value, "getClass") else type(value).__name__


def python_template_vars(variables: Any) -> dict[str, Any]:
    """A Java ``Map<String, Object>`` of template variables as keyword arguments (null: none).
    ValueError for a key that is not a non-empty string or that names one of encodeChat's own
    arguments."""
    if variables is None:
        return {}
    out = python_value(variables, "templateVars")
    if not isinstance(out, dict):
        raise TypeError("templateVars must be a Map<String, Object>, got "
                        f"{type(variables).__name__}")
    for key in out:
        if not isinstance(key, str) or not key:
            raise ValueError(f"templateVars keys must be non-empty strings, got {key!r}")
        if key in RESERVED_VARS:
            raise ValueError(f"templateVars must not set {key!r}: it is an argument of encodeChat")
    return out
