"""Bounds on a JSON schema, checked before the grammar engine sees it (``check_schema``).

The engine (llguidance) builds a schema's grammar by recursion in native code, and a hostile schema
can ask for more than any stack or budget holds. Measured with the chain
``{"$defs": {"d0": {"$ref": "#/$defs/d1"}, ...}, "$ref": "#/$defs/d0"}``: ~3.2 KB of native stack a
``$ref``; on the 8 MiB main-thread stack 2,456 ``$ref``s compile and ~2,480 crash the process (a
segfault, no exception), on a 64 MiB thread ~20,000 compile. Every compile runs on a compile
thread with a 256 MiB stack (``compile_thread``), and the limits below keep every schema far inside
it:

- ``MAX_REF_CHAIN`` = 128: references followed one inside another from the root (an upper bound:
  every schema of a reference cycle counts once). Each may also nest up to ``MAX_SCHEMA_DEPTH``
  (32) levels: the deepest schemas within the limits (128 references, each under 29 levels of
  ``items`` or ``additionalProperties``) need 16-24 MiB of stack, a tenth of the compile thread's
  (and crash the 8 MiB main thread: the compile thread is what makes them safe).
- ``MAX_SCHEMA_NODES`` = 10,000 subschemas (OpenAI's structured outputs allow 5,000 properties).
- ``MAX_DEFINITIONS`` = 1,000 entries of ``$defs`` / ``definitions``, each a grammar rule.
- ``MAX_SCHEMA_ALTERNATIVES`` = 1,000: the alternatives one subschema expands to (``anyOf`` and
  ``oneOf`` add theirs, ``allOf`` and a list of ``type``s multiply, as the engine distributes
  them). The engine's parser holds at most 2,000 items a row (``max_items_in_row``): an ``allOf``
  of four ``anyOf``s of eight objects (4,096 alternatives) compiled and then failed generating
  ("Current row has 4096 items"); three of them (512) work.

Besides the bounds, a schema is refused when a subschema the root reaches (itself or a ``$ref``
target) has no finite value: a ``$ref`` to itself, or a recursion with no way out (a required
property that refers back to its object). The engine would compile it and then chase the
recursion while generating ("Too many items"). Patterns are checked by
``regex_limits.check_regex``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any
from urllib.parse import unquote

from ..errors import ConstraintError
from .reference_graph import longest_chain
from .regex_limits import check_regex

MAX_SCHEMA_DEPTH = 32  # nesting of objects and arrays in a schema
MAX_REF_CHAIN = 128
MAX_SCHEMA_NODES = 10_000
MAX_DEFINITIONS = 1_000
MAX_SCHEMA_ALTERNATIVES = 1_000

# keywords whose values are subschemas: a map of them, a list of them, or one (``items`` may also
# be a list, as in draft 4)
SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
SCHEMA_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems")
SCHEMA_ONES = ("additionalProperties", "unevaluatedProperties", "items", "additionalItems",
               "contains", "unevaluatedItems", "propertyNames", "not", "if", "then", "else")


def subschemas(node: dict[str, Any]) -> Iterator[tuple[str, Any]]:
    """The direct subschemas of a schema ``node``: (the JSON-pointer segments from ``node``, as
    one string "/a/b", the subschema), in key order. A subschema is a dict or a bool."""
    for key, value in node.items():
        if key in SCHEMA_MAPS and isinstance(value, dict):
            for name, sub in value.items():
                if isinstance(sub, (dict, bool)):
                    yield f"/{_escape(key)}/{_escape(str(name))}", sub
        elif key in SCHEMA_LISTS and isinstance(value, list) or \
                key == "items" and isinstance(value, list):
            for i, sub in enumerate(value):
                if isinstance(sub, (dict, bool)):
                    yield f"/{_escape(key)}/{i}", sub
        elif key in SCHEMA_ONES and isinstance(value, (dict, bool)):
            yield f"/{_escape(key)}", value


def nesting(value: Any, limit: int) -> int:
    """How deeply dicts and lists nest in ``value``, counted up to ``limit`` (no deeper walk;
    iterative)."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if not isinstance(node, (dict, list)):
            continue
        deepest = max(deepest, depth)
        if depth < limit:
            items = node.values() if isinstance(node, dict) else node
            stack.extend((v, depth + 1) for v in items)
    return deepest


def _escape(segment: str) -> str:
    return segment.replace("~", "~0").replace("/", "~1")


def resolve(root: Any, ref: Any) -> Any:
    """The value a local ``$ref`` (``"#"``, ``"#/$defs/x"``: a JSON pointer into ``root``) points
    at; None when ``ref`` is not a local pointer or points nowhere."""
    if not isinstance(ref, str) or not ref.startswith("#") or (len(ref) > 1 and ref[1] != "/"):
        return None
    node = root
    for raw in ref[2:].split("/") if len(ref) > 1 else []:
        segment = unquote(raw).replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and segment in node:
            node = node[segment]
        elif isinstance(node, list) and segment.isdigit() and int(segment) < len(node):
            node = node[int(segment)]
        else:
            return None
    return node


def check_schema(schema: dict[str, Any], field: str) -> None:
    """ConstraintError naming ``field`` when ``schema`` (its nesting already bounded by
    ``constraint.MAX_SCHEMA_DEPTH``) is over one of the limits of this module, holds a pattern
    over ``regex_limits.MAX_REGEX_NESTING``, or has a reachable subschema with no finite value."""
    nodes: list[tuple[str, dict[str, Any]]] = []  # (pointer, node): every dict subschema
    count = definitions = 0
    stack: list[tuple[str, Any]] = [("#", schema)]
    while stack:
        pointer, node = stack.pop()
        count += 1
        if count > MAX_SCHEMA_NODES:
            raise ConstraintError(f"has over {MAX_SCHEMA_NODES} subschemas, over the limit "
                                  "(MAX_SCHEMA_NODES)", field=field)
        if not isinstance(node, dict):
            continue
        nodes.append((pointer, node))
        for key in ("$defs", "definitions"):
            if isinstance(node.get(key), dict):
                definitions += len(node[key])
        if definitions > MAX_DEFINITIONS:
            raise ConstraintError(f"has {definitions} definitions ($defs, definitions), over the "
                                  f"limit of {MAX_DEFINITIONS} (MAX_DEFINITIONS)", field=field)
        if isinstance(node.get("pattern"), str):
            check_regex(node["pattern"], field, f"{pointer}/pattern")
        if isinstance(node.get("patternProperties"), dict):
            for key in node["patternProperties"]:
                check_regex(str(key), field, f"{pointer}/patternProperties")
        for path, sub in reversed(list(subschemas(node))):
            stack.append((pointer + path, sub))
    graph = _RefGraph(schema, nodes)
    chain = graph.longest_chain()
    if chain > MAX_REF_CHAIN:
        raise ConstraintError(f"follows $ref inside $ref {chain} deep, over the limit of "
                              f"{MAX_REF_CHAIN} (MAX_REF_CHAIN)", field=field)
    widest, where = _alternatives(schema, nodes)
    if widest > MAX_SCHEMA_ALTERNATIVES:
        raise ConstraintError(f"{_where(where)} expands to over {MAX_SCHEMA_ALTERNATIVES} "
                              "alternatives (anyOf/oneOf add theirs, allOf and type lists "
                              "multiply), over the limit (MAX_SCHEMA_ALTERNATIVES)", field=field)
    endless = _first_without_finite_value(schema, nodes, graph)
    if endless is not None:
        raise ConstraintError(f"{_where(endless)} has no finite value: it refers back to itself "
                              "with no way out (a $ref to itself, or a required property, item or "
                              "allOf member that leads back to it)", field=field)


def _where(pointer: str) -> str:
    return "the schema" if pointer == "#" else f"its subschema {pointer}"


class _RefGraph:
    """The reference graph of a schema: its vertices are the root and every subschema a ``$ref``
    points at; an edge leads from a vertex to each vertex its subtree refers to or holds."""

    def __init__(self, root: dict[str, Any], nodes: list[tuple[str, dict[str, Any]]]) -> None:
        self.root = root
        self.pointers = {id(node): pointer for pointer, node in nodes}
        self.targets: dict[int, Any] = {id(root): root}
        self.refs: dict[int, int] = {}  # id(node with a $ref) -> id(its target)
        for _, node in nodes:
            target = resolve(root, node.get("$ref"))
            if isinstance(target, dict):
                self.targets[id(target)] = target
                self.refs[id(node)] = id(target)
        self.edges: dict[int, list[int]] = {t: [] for t in self.targets}
        stack: list[tuple[Any, int]] = [(root, id(root))]
        while stack:  # each node under its innermost enclosing vertex
            node, owner = stack.pop()
            if not isinstance(node, dict):
                continue
            if id(node) in self.targets and id(node) != owner:
                self.edges[owner].append(id(node))
                owner = id(node)
            if id(node) in self.refs:
                self.edges[owner].append(self.refs[id(node)])
            stack.extend((sub, owner) for _, sub in subschemas(node))

    def reachable(self) -> set[int]:
        """The vertices the root leads to (itself included)."""
        seen, stack = {id(self.root)}, [id(self.root)]
        while stack:
            for nxt in self.edges[stack.pop()]:
                if nxt not in seen:
                    seen.add(nxt)
                    stack.append(nxt)
        return seen

    def longest_chain(self) -> int:
        """References followed on the longest path from the root (its vertices but the root; see
        ``reference_graph.longest_chain``)."""
        return longest_chain(self.edges, id(self.root)) - 1


def _alternatives(root: dict[str, Any], nodes: list[tuple[str, dict[str, Any]]]
                  ) -> tuple[int, str]:
    """The most alternatives any subschema expands to (capped just past the limit), and its
    pointer. Computed children first, without recursion; a reference cycle counts 1."""
    cap = MAX_SCHEMA_ALTERNATIVES + 1
    value: dict[int, int] = {}
    pointers = {id(node): pointer for pointer, node in nodes}

    def members(node: dict[str, Any]) -> list[Any]:
        out = [m for key in ("anyOf", "oneOf", "allOf") if isinstance(node.get(key), list)
               for m in node[key] if isinstance(m, dict)]
        target = resolve(root, node.get("$ref"))
        return out + ([target] if isinstance(target, dict) else [])

    def own(node: dict[str, Any]) -> int:
        total = 1
        for key in ("anyOf", "oneOf"):
            if isinstance(node.get(key), list) and node[key]:
                total *= min(cap, sum(value.get(id(m), 1) for m in node[key]))
        for m in node.get("allOf", []) if isinstance(node.get("allOf"), list) else []:
            total = min(cap, total * value.get(id(m), 1))
        target = resolve(root, node.get("$ref"))
        if isinstance(target, dict):
            total *= value.get(id(target), 1)
        if isinstance(node.get("type"), list):
            total *= max(1, len(node["type"]))
        return min(cap, total)

    widest, where = 1, "#"
    state: dict[int, int] = {}  # 1: on the path, 2: done
    for _, start in nodes:
        if id(start) in state:
            continue
        work: list[tuple[dict[str, Any], bool]] = [(start, False)]
        while work:
            node, expanded = work.pop()
            key = id(node)
            if expanded:
                value[key] = own(node)
                state[key] = 2
                if value[key] > widest:
                    widest, where = value[key], pointers.get(key, "#")
                continue
            if key in state:
                continue
            state[key] = 1
            work.append((node, True))
            work.extend((m, False) for m in members(node) if id(m) not in state)
    return widest, where


def _first_without_finite_value(root: dict[str, Any], nodes: list[tuple[str, dict[str, Any]]],
                                graph: _RefGraph) -> str | None:
    """The pointer of the first subschema the root reaches (the root or a ``$ref`` target) that
    has no finite value, None when each has one. Each subschema is a monotone formula (AND of its
    ``$ref`` target, its ``allOf`` members, OR of its ``anyOf`` / ``oneOf`` members, and of its
    own types: an object needs its required properties, an array with ``minItems`` its first
    items; any other type, ``const``, ``enum`` or no ``type`` is finite), solved by propagation
    from the finite leaves (linear: each edge is taken once). Errs towards "finite"."""
    kind: list[bool] = []  # True: AND (true once every child is), False: OR (once any is)
    pending: list[int] = []
    parents: list[list[int]] = []
    finite: list[bool] = []
    of_node: dict[int, int] = {}

    def new(is_and: bool) -> int:
        kind.append(is_and)
        pending.append(0)
        parents.append([])
        finite.append(False)
        return len(kind) - 1

    def link(parent: int, child: int) -> None:
        parents[child].append(parent)
        pending[parent] += 1

    def vertex(sub: Any) -> int:
        if isinstance(sub, dict) and id(sub) in of_node:
            return of_node[id(sub)]
        return new(sub is not False)  # an empty AND (finite); ``false``: an empty OR (never)

    for _, node in nodes:
        of_node[id(node)] = new(True)
    for _, node in nodes:
        me = of_node[id(node)]
        target = resolve(root, node.get("$ref"))
        if isinstance(target, dict):
            link(me, vertex(target))
        for m in node.get("allOf", []) if isinstance(node.get("allOf"), list) else []:
            link(me, vertex(m))
        for key in ("anyOf", "oneOf"):
            if isinstance(node.get(key), list) and node[key]:
                either = new(False)
                link(me, either)
                for m in node[key]:
                    link(either, vertex(m))
        types = node.get("type")
        if "const" in node or "enum" in node or not isinstance(types, (str, list)):
            continue
        needs = _needs_for_types(node, [types] if isinstance(types, str) else types)
        if needs is None:
            continue  # a type with a finite value of its own
        either = new(False)
        link(me, either)
        for need in needs:  # one list of required subschemas per object or array type
            both = new(True)
            link(either, both)
            for sub in need:
                link(both, vertex(sub))
    queue = [v for v in range(len(kind)) if kind[v] and pending[v] == 0]
    for v in queue:
        finite[v] = True
    while queue:
        v = queue.pop()
        for p in parents[v]:
            if finite[p]:
                continue
            pending[p] -= 1
            if not kind[p] or pending[p] == 0:
                finite[p] = True
                queue.append(p)
    reached = graph.reachable()
    for pointer, node in nodes:
        if id(node) in reached and not finite[of_node[id(node)]]:
            return pointer
    return None


def _needs_for_types(node: dict[str, Any], types: list[Any]) -> list[list[Any]] | None:
    """For a schema whose ``type`` allows only ``types``: per object or array type, the
    subschemas a value of that type must hold; None when a type needs nothing (a string, number,
    boolean or null, or an unknown type)."""
    needs: list[list[Any]] = []
    for t in types:
        if t == "object":
            props = _of_type(node.get("properties"), dict)
            extra = node.get("additionalProperties", True)
            required = _of_type(node.get("required"), list)
            needs.append([props[r] if r in props else extra for r in required
                          if isinstance(r, str) and isinstance(props.get(r, extra), (dict, bool))])
        elif t == "array":
            least = node.get("minItems", 0)
            least = least if isinstance(least, int) and not isinstance(least, bool) else 0
            prefix = _of_type(node.get("prefixItems"), list)
            items = node.get("items", True)
            need = [s for s in prefix[:least] if isinstance(s, (dict, bool))]
            if least > len(prefix) and isinstance(items, (dict, bool)):
                need.append(items)
            needs.append(need)
        else:
            return None
    return needs


def _of_type(value: Any, kind: type) -> Any:
    """``value`` when it is a ``kind`` (dict or list), else an empty one."""
    return value if isinstance(value, kind) else kind()
