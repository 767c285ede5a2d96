"""Closing a JSON schema's objects: an object schema that does not say ``additionalProperties``
(nor ``unevaluatedProperties`` nor ``patternProperties``) admits only the properties it declares,
the default of xgrammar's strict mode (vLLM's and SGLang's default grammar backend). Every
``json_schema`` constraint is closed so before compiling; ``closed_schema`` is public for schemas
embedded elsewhere (the server's tool-call grammar closes each tool's ``parameters``).

Composition keeps its meaning. The engine intersects an object with its ``allOf`` members and with
a ``$ref`` beside other keywords, so those members stay open and the object they compose is closed
over every name declared in it (its own ``properties``, its members', transitively); a member
given by ``$ref`` points at an open twin of its target (added to the root's ``$defs``), as the
target itself is closed where it is used alone. ``anyOf`` / ``oneOf`` branches of a closed object
are each closed over their own names plus the object's. Nothing under ``not``, ``if``, ``then`` or
``else`` changes, nor any object whose composition says ``additionalProperties``,
``unevaluatedProperties`` or ``patternProperties`` anywhere (it keeps JSON Schema's meaning).
"""

from __future__ import annotations

from typing import Any

from .schema_limits import MAX_SCHEMA_DEPTH, MAX_SCHEMA_NODES, SCHEMA_LISTS, SCHEMA_MAPS, \
    SCHEMA_ONES, nesting, resolve, subschemas

# keys by which an object schema says what other keys it admits
OPENING_KEYS = ("additionalProperties", "unevaluatedProperties", "patternProperties")
# keys that make a schema without "type" an object schema
OBJECT_KEYS = ("properties", "required", "minProperties", "maxProperties", "propertyNames",
               "dependentRequired", "dependentSchemas")
_UNTOUCHED = ("not", "if", "then", "else", "propertyNames")  # left exactly as written
# schemas composed into one object past which it is left as written (only a schema over the limits
# of ``schema_limits`` composes that many; this bounds the work on hostile input)
MAX_COMPOSITION = 64


def closed_schema(schema: Any) -> Any:
    """A copy of ``schema`` whose object schemas admit only their declared properties (see the
    module docstring); ``schema`` itself is not changed. A schema that is not a dict, or is over
    ``MAX_SCHEMA_DEPTH`` or ``MAX_SCHEMA_NODES`` (refused later by the constraint's limits), comes
    back as it is. Never raises for JSON data; its work is linear in the schema's size (times
    ``MAX_COMPOSITION`` at most)."""
    if not isinstance(schema, dict) or nesting(schema, MAX_SCHEMA_DEPTH + 1) > MAX_SCHEMA_DEPTH \
            or _count(schema, MAX_SCHEMA_NODES + 1) > MAX_SCHEMA_NODES:
        return schema
    root = _copy(schema)
    _Closer(root).run()
    return root


def _count(schema: dict[str, Any], limit: int) -> int:
    """Subschemas of ``schema``, counted up to ``limit``."""
    count, stack = 0, [schema]
    while stack and count < limit:
        node = stack.pop()
        count += 1
        if isinstance(node, dict):
            stack.extend(sub for _, sub in subschemas(node))
    return count


def _copy(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy(v) for v in value]
    return value


class _Closer:
    """Plans every change on the schema as written, then makes them: twins first (copies of the
    unchanged targets), then redirected references, then closed objects."""

    def __init__(self, root: dict[str, Any]) -> None:
        self.root = root
        self.close: list[tuple[dict[str, Any], list[str]]] = []  # (object, every name it admits)
        self.redirect: list[dict[str, Any]] = []  # nodes whose $ref must point at an open twin
        self.twins: dict[int, str] = {}  # id(target) -> its twin's $ref
        self.copies: list[tuple[str, dict[str, Any]]] = []  # (twin's name, target) to copy
        self.compositions: dict[tuple[int, bool], list[dict[str, Any]] | None] = {}

    def run(self) -> None:
        stack: list[tuple[Any, bool, tuple[str, ...]]] = [(self.root, True, ())]
        while stack:
            node, whole, extra = stack.pop()
            if isinstance(node, dict):
                stack.extend(self._visit(node, whole, extra))
        redirects = [(node, self._twin(resolve(self.root, node["$ref"])))
                     for node in self.redirect]
        made = 0
        while made < len(self.copies):  # (a copy may ask for further twins)
            name, target = self.copies[made]
            self.root["$defs"][name] = self._open_copy(target)
            made += 1
        for node, ref in redirects:
            if ref is not None:
                node["$ref"] = ref
        for node, names in self.close:
            node["additionalProperties"] = False
            props = node.get("properties")
            if not isinstance(props, dict):
                props = node["properties"] = {}
            for name in names:
                props.setdefault(name, True)

    def _visit(self, node: dict[str, Any], whole: bool, extra: tuple[str, ...]
               ) -> list[tuple[Any, bool, tuple[str, ...]]]:
        """Plan ``node``'s change: ``whole`` when it describes a whole value (else it is a member
        of a composition, left open), ``extra``: names its enclosing object declares. Returns its
        subschemas to visit next, each with its role."""
        ref = resolve(self.root, node.get("$ref"))
        composed = isinstance(ref, dict) and (bool(extra) or any(
            k in node for k in OBJECT_KEYS + ("type", "allOf", "anyOf", "oneOf")))
        branches_whole, branch_extra = False, extra
        if not whole:
            if isinstance(ref, dict):
                self.redirect.append(node)
        elif isinstance(ref, dict) and not composed:
            pass  # a reference alone: its target decides
        elif self._explicit(node):
            pass  # JSON Schema's meaning; its branches stay open too
        elif self._objectish(node):
            if composed:
                self.redirect.append(node)
            base = self._names(node, branches=False)
            self.close.append((node, list(dict.fromkeys(
                self._names(node, branches=True) + list(extra)))))
            branches_whole, branch_extra = True, tuple(dict.fromkeys(base + list(extra)))
        else:
            branches_whole = True  # e.g. an anyOf of objects: each branch is a whole value
        out: list[tuple[Any, bool, tuple[str, ...]]] = []
        for key, value in node.items():
            if key in _UNTOUCHED:
                continue
            if key in ("anyOf", "oneOf") and isinstance(value, list):
                out.extend((m, branches_whole, branch_extra if branches_whole else ())
                           for m in value)
            elif key == "allOf" and isinstance(value, list):
                out.extend((m, False, ()) for m in value)
            elif key in SCHEMA_MAPS and isinstance(value, dict):
                out.extend((m, True, ()) for m in value.values())
            elif (key in SCHEMA_LISTS or key == "items") and isinstance(value, list):
                out.extend((m, True, ()) for m in value)
            elif key in SCHEMA_ONES:
                out.append((value, True, ()))
        return out

    def _composition(self, node: dict[str, Any], branches: bool) -> list[dict[str, Any]] | None:
        """``node`` and every schema composed into it: its ``allOf`` members and ``$ref`` target,
        with ``branches`` also its ``anyOf`` / ``oneOf`` branches, transitively (each once); None
        past ``MAX_COMPOSITION`` of them. Kept per node."""
        key = (id(node), branches)
        if key in self.compositions:
            return self.compositions[key]
        out: list[dict[str, Any]] | None = []
        seen, stack = {id(node)}, [node]
        while stack and out is not None:
            current = stack.pop()
            out.append(current)
            parts = list(current.get("allOf", [])) if isinstance(current.get("allOf"), list) else []
            if branches:
                for k in ("anyOf", "oneOf"):
                    if isinstance(current.get(k), list):
                        parts.extend(current[k])
            target = resolve(self.root, current.get("$ref"))
            for part in parts + [target]:
                if isinstance(part, dict) and id(part) not in seen:
                    seen.add(id(part))
                    stack.append(part)
            if len(seen) > MAX_COMPOSITION:
                out = None
        self.compositions[key] = out
        return out

    def _names(self, node: dict[str, Any], branches: bool) -> list[str]:
        names: list[str] = []
        for part in self._composition(node, branches) or []:
            if isinstance(part.get("properties"), dict):
                names.extend(str(k) for k in part["properties"])
        return list(dict.fromkeys(names))

    def _explicit(self, node: dict[str, Any]) -> bool:
        """Whether ``node``'s composition says what other keys it admits (or is too large to
        tell: left as written)."""
        parts = self._composition(node, True)
        return parts is None or any(k in part for part in parts for k in OPENING_KEYS)

    def _objectish(self, node: dict[str, Any]) -> bool:
        types = node.get("type")
        if isinstance(types, str) and types != "object" or \
                isinstance(types, list) and "object" not in types:
            return False
        for part in self._composition(node, False) or []:
            kind = part.get("type")
            if kind == "object" or isinstance(kind, list) and "object" in kind or \
                    any(k in part for k in OBJECT_KEYS):
                return True
        return False

    def _twin(self, target: Any) -> str | None:
        """The ``$ref`` of ``target``'s open twin, named here once and copied by ``run``: a copy
        of it as written, whose own reference and composition members point at open twins too."""
        if not isinstance(target, dict):
            return None
        if id(target) in self.twins:
            return self.twins[id(target)]
        defs = self.root.get("$defs")
        if not isinstance(defs, dict):
            defs = self.root["$defs"] = {}
        number = len(self.twins)
        while f"open-{number}" in defs:
            number += 1
        defs[f"open-{number}"] = {}  # reserved: copied by ``run``
        self.copies.append((f"open-{number}", target))
        ref = self.twins[id(target)] = f"#/$defs/open-{number}"
        return ref

    def _open_copy(self, node: dict[str, Any]) -> dict[str, Any]:
        out = {k: v for k, v in node.items() if k not in ("$defs", "definitions")}
        if isinstance(out.get("properties"), dict):
            out["properties"] = dict(out["properties"])
        twin = self._twin(resolve(self.root, node.get("$ref")))
        if twin is not None:
            out["$ref"] = twin
        for key in ("allOf", "anyOf", "oneOf"):
            if isinstance(out.get(key), list):
                out[key] = [self._open_copy(m) if isinstance(m, dict) else m for m in out[key]]
        return out
