"""A Jinja sandbox that enforces ``chat_limits``' time and size budget, for rendering
untrusted chat templates.

jinja2's ``ImmutableSandboxedEnvironment`` stops a template from reaching Python internals or
mutating its arguments, but not from running for minutes (nested ``range`` loops) or allocating
gigabytes (``'x' * 10**10``). ``BoundedSandbox`` adds, per render (``render``), under
``chat_limits.RenderLimits``:

- a deadline (``MAX_RENDER_SECONDS``), checked at every loop iteration (each ``{% for %}`` iterates
  through a checking wrapper), call, intercepted operator, ``~`` concatenation, expression output
  and output chunk (every way a template can run long goes through a loop or a call);
- a size budget (``MAX_RENDER_CHARS``): the rendered text (rendered with ``Template.generate``,
  counted chunk by chunk), any one string or list the template builds with ``*``, ``+``, ``~``,
  ``%`` or ``str.format``, the width-taking string methods and filters (``center``, ``ljust``,
  ``rjust``, ``zfill``, ``expandtabs``, ``indent``, ``join``, ``replace``, ``batch``, ``slice``,
  ``tojson``, ``lipsum``), a macro's result, and ``PRODUCED_CHARS_FACTOR`` times it for all the
  characters its expressions produce wherever they go (output, macro results, ``{% set %}`` blocks),
  each checked *before* the string is built where its size is known ahead;
- ``range()`` of at most ``MAX_RANGE`` items, calls (macros, recursive loops) nested at most
  ``MAX_CALL_DEPTH`` deep, and integers of at most ``MAX_INT_BITS`` bits from ``*`` and ``**``.

Exceeding any of them raises ``RenderBudgetError`` (a ``ChatTemplateError``, so a ValueError) saying
which limit. Templates within the limits render exactly as in the plain sandbox.
"""

from __future__ import annotations

import functools
import re
import string
import time
import types
from collections.abc import Callable, Iterator, Mapping
from contextvars import ContextVar
from typing import Any

from jinja2 import nodes
from jinja2.runtime import LoopContext, Macro
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import Namespace, generate_lorem_ipsum
from jinja2.visitor import NodeTransformer

from .chat_limits import MAX_INT_BITS, PRODUCED_CHARS_FACTOR, RenderLimits
from ..errors import RenderBudgetError

# wraps every {% for %} iterable (added by the compiler, not for templates)
ITER_FILTER = "_bounded_iter"
CONCAT_FILTER = "_bounded_concat"  # replaces every ~ concatenation
_WIDTH_METHODS = ("center", "ljust", "rjust", "zfill")
_PERCENT_SPEC = re.compile(r"%(?:\([^)]*\))?[#0 +\-]*(\*|\d+)?(?:\.(\*|\d+))?")


class _Budget:
    """One render's running account: its deadline, call depth and characters produced."""

    def __init__(self, limits: RenderLimits) -> None:
        self.limits = limits
        self.deadline = time.monotonic() + limits.seconds
        self.depth = 0
        self.produced = 0

    def tick(self) -> None:
        if time.monotonic() > self.deadline:
            raise RenderBudgetError("took longer than its time budget of "
                                    f"{self.limits.seconds:g} s (MAX_RENDER_SECONDS); a chat "
                                    "template renders in milliseconds")

    def size(self, n: int, what: str) -> None:
        if n > self.limits.chars:
            raise RenderBudgetError(f"{what} would be {n} characters, over the budget of "
                                    f"{self.limits.chars} (MAX_RENDER_CHARS)")

    def width(self, value: Any, what: str) -> None:
        if isinstance(value, int) and value > self.limits.chars:
            raise RenderBudgetError(f"{what} of {value} is over the budget of {self.limits.chars} "
                                    "characters (MAX_RENDER_CHARS)")

    def produce(self, n: int) -> None:
        self.produced += n
        cap = self.limits.chars * PRODUCED_CHARS_FACTOR
        if self.produced > cap:
            raise RenderBudgetError(f"produced more than {cap} characters of output, macro results "
                                    "and set blocks (PRODUCED_CHARS_FACTOR x MAX_RENDER_CHARS)")

    def footprint(self, value: Any, what: str) -> None:
        self.size(footprint(value, self.limits.chars), what)


_ACTIVE: ContextVar[_Budget | None] = ContextVar("smile_llm_render_budget", default=None)


def footprint(value: Any, limit: int) -> int:
    """An upper estimate of ``len(str(value))`` for strings, numbers and nested lists,
    tuples, dicts and namespaces (each shared object sized once), which stops counting once
    it passes ``limit``."""
    if isinstance(value, str):
        return len(value)
    sizes: dict[int, int] = {}

    def size(v: Any) -> int:
        if isinstance(v, str):
            return len(v)
        if isinstance(v, bool) or v is None:
            return 5
        if isinstance(v, int):
            return v.bit_length() // 3 + 2
        if isinstance(v, Namespace):
            v = v._Namespace__attrs  # type: ignore[attr-defined]  # its repr shows them
        if not isinstance(v, (list, tuple, dict)):
            return 64
        key = id(v)
        if key in sizes:
            return sizes[key]
        sizes[key] = 8  # in progress: a cycle prints as "[...]"
        total = 2
        for item in (v.items() if isinstance(v, dict) else v):
            total += 2 + (size(item[0]) + size(item[1]) + 2 if isinstance(v, dict) else size(item))
            if total > limit:
                break
        sizes[key] = total
        return total

    return size(value)


class BoundedSandbox(ImmutableSandboxedEnvironment):
    """``ImmutableSandboxedEnvironment`` with a per-render budget (see the module doc). Compile
    templates with ``compile_template`` (which adds the loop and concatenation checks) and render
    them with ``render``."""

    intercepted_binops = frozenset({"*", "**", "+", "%"})

    def __init__(self, limits: RenderLimits | None = None, *,
                 filters: Mapping[str, Callable[..., Any]] | None = None, **options: Any) -> None:
        """``options`` as jinja2's ``Environment``; ``filters`` are added (or replace jinja's)
        before the size-taking ones are wrapped in their checks."""
        super().__init__(**options)
        self.limits = limits or RenderLimits()
        self.finalize = self._finalize
        self.globals["range"] = self._range
        self.globals["lipsum"] = self._lipsum(generate_lorem_ipsum)
        self.filters.update(filters or {})
        self.filters[ITER_FILTER] = self._bounded_iter
        self.filters[CONCAT_FILTER] = self._concat
        self._guard_filters()

    # ------------------------------------------------------------------ compiling and rendering
    def compile_template(self, source: str) -> Any:
        """``source`` parsed, with every ``{% for %}`` iterable and ``~`` concatenation routed
        through the budget checks, and compiled. TemplateSyntaxError as ``from_string``."""
        tree = _BoundLoops().visit(self.parse(source))
        return self.from_string(tree)

    def render(self, template: Any, variables: Mapping[str, Any]) -> str:
        """``template`` rendered with ``variables`` within this sandbox's limits (streamed with
        ``generate``, its output counted as it comes). RenderBudgetError when a limit is exceeded;
        the template's own errors as they are."""
        budget = _Budget(self.limits)
        token = _ACTIVE.set(budget)
        chunks = template.generate(**variables)
        try:
            out, n = [], 0
            for chunk in chunks:
                budget.tick()
                n += len(chunk)
                budget.size(n, "the rendered prompt")
                out.append(chunk)
            return "".join(out)
        finally:
            chunks.close()
            _ACTIVE.reset(token)

    def budget(self) -> _Budget:
        """The running render's budget; outside a render (constant folding at compile
        time) a fresh one."""
        return _ACTIVE.get() or _Budget(self.limits)

    # ------------------------------------------------------------------ the sandbox's hooks
    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        """``*``, ``**``, ``+`` and ``%`` with their results' sizes checked first."""
        budget = self.budget()
        budget.tick()
        if operator == "*":
            _check_product(budget, left, right)
        elif operator == "**":
            _check_power(budget, left, right)
        elif (operator == "+" and isinstance(left, (str, list, tuple))
              and isinstance(right, (str, list, tuple))):
            budget.size(footprint(left, budget.limits.chars)
                        + footprint(right, budget.limits.chars), "the result of +")
        elif operator == "%" and isinstance(left, str):
            _check_percent(budget, left)
            budget.footprint(right, "a % argument")
        return super().call_binop(context, operator, left, right)

    def call(__self, __context: Any, __obj: Any,  # noqa: N805 (jinja's names)
             *args: Any, **kwargs: Any) -> Any:
        """Every call: the deadline, the nesting depth of macros and recursive loops, the size a
        string method would produce, and the size of a string result."""
        budget = __self.budget()
        budget.tick()
        _check_method(budget, __obj, args, kwargs)
        nested = isinstance(__obj, (Macro, LoopContext))
        if nested:
            if budget.depth >= budget.limits.depth:
                raise RenderBudgetError("nests macro or recursive loop calls deeper than "
                                        f"{budget.limits.depth} (MAX_CALL_DEPTH)")
            budget.depth += 1
        try:
            result = super().call(__context, __obj, *args, **kwargs)
        finally:
            if nested:
                budget.depth -= 1
        if isinstance(result, str):
            budget.size(len(result), "a call's result")
        return result

    def wrap_str_format(self, value: Any) -> Callable[..., str] | None:
        """``str.format`` / ``format_map`` as the sandbox wraps them, with the format's widths and
        the arguments' sizes checked first."""
        fmt = super().wrap_str_format(value)
        if fmt is None:
            return None
        inner = fmt
        template: str = value.__self__

        def checked(*args: Any, **kwargs: Any) -> str:
            budget = self.budget()
            _check_format_spec(budget, template)
            budget.footprint([args, kwargs], "the arguments of format")
            return inner(*args, **kwargs)

        return functools.update_wrapper(checked, inner)

    def _finalize(self, value: Any) -> str:
        """Every ``{{ expression }}``'s text, counted as produced (its size checked
        before ``str()``)."""
        budget = self.budget()
        budget.tick()
        budget.footprint(value, "an output value")
        text = str(value)
        budget.produce(len(text))
        return text

    # ------------------------------------------------------------------ globals and filters
    def _range(self, *args: Any) -> range:
        budget = self.budget()
        budget.tick()
        items = range(*args)
        if len(items) > budget.limits.range:
            raise RenderBudgetError(f"range() of {len(items)} items is over the limit of "
                                    f"{budget.limits.range} (MAX_RANGE)")
        return items

    def _lipsum(self, lipsum: Callable[..., str]) -> Callable[..., str]:
        def checked(n: int = 5, html: bool = True,
                    min: int = 20, max: int = 100) -> str:  # noqa: A002 (jinja's)
            budget = self.budget()
            budget.width(n * max * 16 if isinstance(n, int) and isinstance(max, int) else 0,
                         "lipsum's size")
            return lipsum(n, html, min, max)

        return checked

    def _bounded_iter(self, value: Any) -> _BudgetIterable:
        return _BudgetIterable(value, self.budget())

    def _concat(self, parts: list[Any]) -> str:
        budget = self.budget()
        budget.tick()
        budget.size(sum(footprint(p, budget.limits.chars) for p in parts), "the result of ~")
        return "".join(map(str, parts))

    def _guard_filters(self) -> None:
        """Replace the size-taking filters with versions that check the size first."""

        def width_arg(name: str, index: int, keyword: str, default: Any) -> Callable[..., None]:
            def check(budget: _Budget, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
                value = args[index] if len(args) > index else kwargs.get(keyword, default)
                budget.width(value, f"the {name} filter's {keyword}")
            return check

        def indent(budget: _Budget, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            text = args[0] if args else ""
            width = args[1] if len(args) > 1 else kwargs.get("width", 4)
            per_line = (len(width) if isinstance(width, str)
                        else width if isinstance(width, int) else 0)
            lines = str(text).count("\n") + 1
            budget.size(len(str(text)) + lines * per_line, "the result of the indent filter")

        def join(budget: _Budget, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            seq = args[0] if args else ()
            sep = args[1] if len(args) > 1 else kwargs.get("d", "")
            _check_join(budget, str(sep), seq)

        def replace(budget: _Budget, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            if len(args) >= 3:
                count = args[3] if len(args) > 3 else kwargs.get("count")
                _check_replace(budget, args[0], args[1], args[2], count)

        def percent(budget: _Budget, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            if args and isinstance(args[0], str):
                _check_percent(budget, args[0])
            budget.footprint([args[1:], kwargs], "the format filter's arguments")

        def tojson(budget: _Budget, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            indent_arg = args[2] if len(args) > 2 else kwargs.get("indent")
            per = (len(indent_arg) if isinstance(indent_arg, str)
                   else indent_arg if isinstance(indent_arg, int) else 0)
            budget.size(footprint(args[0] if args else None, budget.limits.chars)
                        * (2 + max(per, 0)), "the result of tojson")

        checks = {"center": width_arg("center", 1, "width", 80), "indent": indent, "join": join,
                  "replace": replace, "format": percent,
                  "batch": width_arg("batch", 1, "linecount", 0),
                  "slice": width_arg("slice", 1, "slices", 0), "tojson": tojson}
        for name, check in checks.items():
            if name in self.filters:
                self.filters[name] = self._checked_filter(self.filters[name], check)

    def _checked_filter(self, f: Callable[..., Any],
                        check: Callable[..., None]) -> Callable[..., Any]:
        # the context / environment argument
        skip = 1 if getattr(f, "jinja_pass_arg", None) is not None else 0

        @functools.wraps(f)  # keeps jinja_pass_arg
        def run(*args: Any, **kwargs: Any) -> Any:
            budget = self.budget()
            budget.tick()
            check(budget, args[skip:], kwargs)
            return f(*args, **kwargs)

        return run


class _BudgetIterable:
    """A ``{% for %}`` iterable that checks the deadline at every item (``len`` passes through for
    ``loop.length``)."""

    def __init__(self, value: Any, budget: _Budget) -> None:
        self.value, self.budget = value, budget

    def __iter__(self) -> Iterator[Any]:
        for item in self.value:
            self.budget.tick()
            yield item

    def __len__(self) -> int:
        return len(self.value)


class _BoundLoops(NodeTransformer):
    """Routes every ``{% for %}`` iterable through ``ITER_FILTER`` and every ``~`` through
    ``CONCAT_FILTER``."""

    def visit_For(self, node: nodes.For) -> nodes.Node:
        self.generic_visit(node)
        node.iter = nodes.Filter(node.iter, ITER_FILTER, [], [], None, None, lineno=node.lineno)
        return node

    def visit_Concat(self, node: nodes.Concat) -> nodes.Node:
        self.generic_visit(node)
        return nodes.Filter(nodes.List(node.nodes, lineno=node.lineno), CONCAT_FILTER, [], [], None,
                            None, lineno=node.lineno)


def _check_product(budget: _Budget, left: Any, right: Any) -> None:
    for seq, n in ((left, right), (right, left)):
        if isinstance(seq, (str, list, tuple)) and isinstance(n, int) and n > 1:
            budget.size(footprint(seq, budget.limits.chars) * n,
                        f"a {type(seq).__name__} repeated {n} times")
    if (isinstance(left, int) and isinstance(right, int)
            and left.bit_length() + right.bit_length() > MAX_INT_BITS):
        raise RenderBudgetError(f"a product of integers would exceed {MAX_INT_BITS} bits "
                                "(MAX_INT_BITS)")


def _check_power(budget: _Budget, base: Any, exponent: Any) -> None:
    if isinstance(base, int) and isinstance(exponent, int) and exponent > 1 and abs(base) > 1 and \
            (abs(base).bit_length() - 1) * exponent > MAX_INT_BITS:
        raise RenderBudgetError(f"{base} ** {exponent} would exceed {MAX_INT_BITS} bits "
                                "(MAX_INT_BITS)")


def _check_percent(budget: _Budget, fmt: str) -> None:
    for m in _PERCENT_SPEC.finditer(fmt):
        for value in m.groups():
            if value == "*":
                raise RenderBudgetError("a % format with a * width or precision is not allowed in "
                                        "a chat template")
            if value is not None:
                budget.width(int(value), "a % format's width or precision")


def _check_format_spec(budget: _Budget, fmt: str) -> None:
    try:
        fields = list(string.Formatter().parse(fmt))
    except ValueError:
        return  # format() raises its own error
    for _, _, spec, _ in fields:
        if not spec:
            continue
        if "{" in spec:
            raise RenderBudgetError("a format spec with a nested {} width is not allowed in a chat "
                                    "template")
        for digits in re.findall(r"\d+", spec):
            budget.width(int(digits), "a format spec's width or precision")


def _check_join(budget: _Budget, sep: str, seq: Any) -> None:
    if isinstance(seq, (list, tuple, str)):
        budget.size(footprint(seq, budget.limits.chars) + len(sep) * max(len(seq) - 1, 0),
                    "the result of join")


def _check_replace(budget: _Budget, text: Any, old: Any, new: Any, count: Any) -> None:
    if not (isinstance(text, str) and isinstance(old, str) and isinstance(new, str)):
        return
    hits = text.count(old) if old else len(text) + 1
    if isinstance(count, int) and count >= 0:
        hits = min(hits, count)
    budget.size(len(text) + hits * (len(new) - len(old)), "the result of replace")


def _check_method(budget: _Budget, obj: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """The size a ``str`` method call would produce, for the methods whose result can
    outgrow their inputs."""
    if not isinstance(obj, types.BuiltinMethodType) or not isinstance(obj.__self__, str):
        return
    text, name = obj.__self__, obj.__name__
    if name in _WIDTH_METHODS:
        budget.width(args[0] if args else kwargs.get("width"), f"str.{name}'s width")
    elif name == "expandtabs":
        tab = args[0] if args else kwargs.get("tabsize", 8)
        if isinstance(tab, int):
            budget.size(len(text) + text.count("\t") * max(tab, 0), "the result of expandtabs")
    elif name == "join" and args:
        _check_join(budget, text, args[0])
    elif name == "replace" and len(args) >= 2:
        _check_replace(budget, text, args[0], args[1],
                       args[2] if len(args) > 2 else kwargs.get("count"))

