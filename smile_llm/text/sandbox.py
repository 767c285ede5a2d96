"""A Jinja sandbox that enforces ``limits``' time and size budget, for rendering
untrusted chat templates.

jinja2's ``ImmutableSandboxedEnvironment`` stops a template from reaching Python internals or
mutating its arguments, but not from running for minutes (nested ``range`` loops, ``wordwrap(1)`` of
a long word, ``urlize`` of a run of dots, ``sort`` of millions of items, comparing two shared
nested lists) or allocating gigabytes (``'x' * 10**10``). ``BoundedSandbox`` adds, per render
(``render``), under ``limits.RenderLimits``:

- a deadline (``MAX_RENDER_SECONDS``) that no single step outlives. Template code checks it at every
  loop iteration, call, intercepted operator, ``~``, output value and output chunk; library code
  (every filter, every method or global called, every item a lazy filter result yields) runs with
  the thread's profile function set (``sys.setprofile``, ``RenderBudget.watch``), which checks it
  at every Python and C function call and return and raises into whatever runs past it
  (``textwrap`` in ``wordwrap``, ``pprint``, ``urlize``'s loop, ``title``, ``sort``'s keys, ...).
  What neither can interrupt is one call into C; each of those is linear in values of at most
  ``MAX_RENDER_CHARS`` (below) or is checked first by ``guards`` (its result's size where
  known ahead, its estimated time where superlinear: refused when it exceeds the time left);
- a size budget (``MAX_RENDER_CHARS``): the rendered text (rendered with ``Template.generate``,
  counted chunk by chunk); every value the template makes (a filter's, call's or operator's result,
  a list, tuple or dict display, a call's arguments, the items a lazy filter result yields): a
  string, bytes or container of at most that many characters (``limits.footprint``, which
  counts each reference to a shared object, so no value expands past it when printed, compared,
  hashed or serialised) and integers of at most ``MAX_INT_BITS`` bits; the widths, repeats and
  formats ``guards`` checks before the string is built; and ``PRODUCED_CHARS_FACTOR`` times it
  for all the characters its expressions produce wherever they go (output, macro results,
  ``{% set %}`` blocks);
- ``range()`` of at most ``MAX_RANGE`` items and calls (macros, recursive loops) nested at most
  ``MAX_CALL_DEPTH`` deep.

Exceeding any of them raises ``RenderBudgetError`` (a ``ChatTemplateError``, so a ValueError) saying
which limit; filters are never evaluated at compile time. Templates within the limits render exactly
as in the plain sandbox. A render therefore ends within its time budget plus the longest single C
step on values at the size limit (about 0.5 s on a slow core: ``wordcount`` of 4 M words), or sooner
with RenderBudgetError.

Measured on a slow, loaded 2-core machine at the size limit (8 MiB strings, lists of 2.8 M items,
4 MiB messages), before these checks: ``wordwrap(1)`` of one long word, ``urlize`` of a run of
dots, ``strip`` with a long set, ``pprint`` of nested lists, ``round`` to -10**9 digits and a
comparison of shared nested lists ran for minutes to forever; ``sort``, ``sum`` of lists, ``map``,
``reject``, ``title``, ``batch(1)`` for 2-11 s; ``bytes * n``, ``bytes.center``, ``int.to_bytes``
and ``translate`` allocated gigabytes. After: each is refused at once or stopped at the deadline;
the longest overrun past it was 0.15 s (one C step: a sort the estimate let start, ``title``'s
regex split of 4 M words). Python-heavy filters run about 2.5 times slower under the profile
function, so a few that finished in 2-4 s on such inputs now reach the deadline.

Why in process rather than in a worker process killed at the deadline (which would stop C steps
too): with these checks a Qwen-style template renders five messages in 0.6 ms (0.25 ms before) and
needs nothing else to run; workers would need a pool sized to the server's threads, restarted
(about 0.1 s each: spawn, import, compile the template) after every kill a hostile client can cause
on each request, 5 ms of pickling each way for a 4 MiB message, picklable template variables, and
their own life cycle under the server, Ray replicas and the JVM launcher. Why the profile function
only around library code: it costs about 0.1 us per call, 3.5 times a plain render if set for the
whole render; template code keeps its own cheaper checks. While set, it replaces any profiler the
calling thread had (restored after).
"""

from __future__ import annotations

import functools
import inspect
import types
from collections.abc import Callable, Iterator, Mapping
from contextvars import ContextVar
from typing import Any

from jinja2 import nodes, pass_context
from jinja2.runtime import Context, LoopContext, Macro
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import generate_lorem_ipsum
from jinja2.visitor import NodeTransformer

from .guards import (FILTER_CHECKS, CountedIterator, FilterCall, check_binop, check_call,
                     check_format_spec)
from .limits import Overrun, RenderBudget, RenderLimits
from ..errors import RenderBudgetError

# added by the compiler, not for templates: every {% for %} iterable, every ~ concatenation and
# every list, tuple and dict display goes through one of these
ITER_FILTER = "_bounded_iter"
CONCAT_FILTER = "_bounded_concat"
MADE_FILTER = "_bounded_display"

_C_CALLABLES = (types.BuiltinFunctionType, types.BuiltinMethodType, types.MethodWrapperType,
                types.WrapperDescriptorType, types.MethodDescriptorType)
_PYTHON_BEHIND = ("encode", "decode")  # a codec may be Python (punycode's encoder is quadratic)


def _plain_c(obj: Any) -> bool:
    """Whether calling ``obj`` runs no Python of its own worth stopping: a function or method
    implemented in C (``check_call`` bounds the costly ones; a lazy argument it consumes checks
    the deadline as it yields), other than ``encode`` and ``decode``."""
    return isinstance(obj, _C_CALLABLES) and getattr(obj, "__name__", "") not in _PYTHON_BEHIND


_ACTIVE: ContextVar[RenderBudget | None] = ContextVar("smile_llm_render_budget", default=None)


class BoundedSandbox(ImmutableSandboxedEnvironment):
    """``ImmutableSandboxedEnvironment`` with a per-render budget (see the module doc). Compile
    templates with ``compile_template`` (which adds the loop, concatenation and display checks) and
    render them with ``render``."""

    intercepted_binops = frozenset({"*", "**", "+", "-", "%"})

    def __init__(self, limits: RenderLimits | None = None, *,
                 filters: Mapping[str, Callable[..., Any]] | None = None, **options: Any) -> None:
        """``options`` as jinja2's ``Environment``; ``filters`` are added (or replace jinja's)
        before every filter is wrapped in its checks."""
        super().__init__(**options)
        self.limits = limits or RenderLimits()
        self.finalize = self._finalize
        self.globals["range"] = self._range
        self.globals["lipsum"] = self._lipsum(generate_lorem_ipsum)
        self.filters.update(filters or {})
        for name, f in list(self.filters.items()):
            self.filters[name] = self._guard(name, f)
        self.filters[ITER_FILTER] = self._bounded_iter
        self.filters[CONCAT_FILTER] = self._concat
        self.filters[MADE_FILTER] = self._display

    # ------------------------------------------------------------------ compiling and rendering
    def compile_template(self, source: str) -> Any:
        """``source`` parsed, with every ``{% for %}`` iterable, ``~`` concatenation and list,
        tuple and dict display routed through the budget checks, and compiled.
        TemplateSyntaxError as ``from_string``."""
        tree = _BoundLoops().visit(self.parse(source))
        return self.from_string(tree)

    def render(self, template: Any, variables: Mapping[str, Any]) -> str:
        """``template`` rendered with ``variables`` within this sandbox's limits (streamed with
        ``generate``, its output counted as it comes; see the module doc). RenderBudgetError when
        a limit is exceeded; the template's own errors as they are."""
        budget = RenderBudget(self.limits)
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
        except Overrun:
            raise budget.overrun() from None
        finally:
            chunks.close()
            _ACTIVE.reset(token)

    def budget(self) -> RenderBudget:
        """The running render's budget; outside a render a fresh one."""
        return _ACTIVE.get() or RenderBudget(self.limits)

    # ------------------------------------------------------------------ the sandbox's hooks
    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        """``*``, ``**``, ``+``, ``-`` and ``%`` with their results' sizes checked first (where
        known ahead) and after."""
        budget = self.budget()
        budget.tick()
        check_binop(budget, operator, left, right)
        result = super().call_binop(context, operator, left, right)
        budget.made(result, f"the result of {operator}")
        return result

    def call(__self, __context: Any, __obj: Any,  # noqa: N805 (jinja's names)
             *args: Any, **kwargs: Any) -> Any:
        """Every call: the deadline, the nesting depth of macros and recursive loops, the size of
        its arguments, what a string method would produce or cost, and the size of its result."""
        budget = __self.budget()
        budget.tick()
        budget.footprint([args, kwargs], "a call's arguments")
        nested = isinstance(__obj, (Macro, LoopContext))
        if nested:
            if budget.depth >= budget.limits.depth:
                raise RenderBudgetError("nests macro or recursive loop calls deeper than "
                                        f"{budget.limits.depth} (MAX_CALL_DEPTH)")
            budget.depth += 1
        else:
            checked = list(args)
            check_call(budget, __obj, checked, kwargs)
            args = tuple(checked)
        try:
            if nested or _plain_c(__obj):  # template code checks the deadline itself
                result = super().call(__context, __obj, *args, **kwargs)
            else:
                result = budget.watch(super().call, __context, __obj, *args, **kwargs)
        finally:
            if nested:
                budget.depth -= 1
        budget.made(result, "a call's result")
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
            check_format_spec(budget, template)
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
        budget.size(sum(budget.measure(p) for p in parts), "the result of ~")
        return "".join(map(str, parts))

    def _display(self, value: Any) -> Any:
        """A list, tuple or dict display's value, measured."""
        self.budget().made(value, f"a {type(value).__name__} the template builds")
        return value

    def _guard(self, name: str, f: Callable[..., Any]) -> Callable[..., Any]:
        """``f`` as the filter ``name``: the deadline; its ``guards.FILTER_CHECKS`` check
        (arguments bound by name to its signature) before; its result measured after, a lazy one
        counted as it yields. Takes the context, so that it is never run at compile time."""
        check = FILTER_CHECKS.get(name)
        lead_kind = _pass_kind(f)
        # an async variant's signature is its sync function's, which may take another lead argument
        target = inspect.unwrap(f)
        bind_kind = _pass_kind(target)
        signature = inspect.signature(target) if check is not None else None
        what = f"the result of the {name} filter"

        @pass_context
        @functools.wraps(f)
        def run(context: Context, *args: Any, **kwargs: Any) -> Any:
            budget = self.budget()
            budget.tick()
            if check is not None and signature is not None:
                call = _bind(signature, _lead(bind_kind, context), args, kwargs)
                if call is not None:  # else f raises its own TypeError
                    check(budget, context.environment, call)
                    args, kwargs = call.bound.args[call.lead:], call.bound.kwargs
            result = budget.watch(f, *_lead(lead_kind, context), *args, **kwargs)
            budget.made(result, what)
            if isinstance(result, Iterator):
                return CountedIterator(result, budget, f"the {name} filter")
            return result

        return run


def _pass_kind(f: Any) -> str | None:
    """Which argument jinja passes first to the filter ``f``: ``"context"``, ``"eval_context"``,
    ``"environment"`` or None."""
    return getattr(getattr(f, "jinja_pass_arg", None), "name", None)


def _lead(kind: str | None, context: Context) -> tuple[Any, ...]:
    """The first argument jinja passes to a filter of pass ``kind``, from ``context``."""
    if kind == "context":
        return (context,)
    if kind == "eval_context":
        return (context.eval_ctx,)
    return (context.environment,) if kind == "environment" else ()


def _bind(signature: inspect.Signature, lead: tuple[Any, ...], args: tuple[Any, ...],
          kwargs: dict[str, Any]) -> FilterCall | None:
    """The filter call's arguments bound by name (defaults applied), or None when they do not fit
    its signature."""
    try:
        bound = signature.bind(*lead, *args, **kwargs)
    except TypeError:
        return None
    bound.apply_defaults()
    names = list(signature.parameters)
    return FilterCall(bound, names[len(lead)], len(lead)) if len(names) > len(lead) else None


class _BudgetIterable:
    """A ``{% for %}`` iterable that checks the deadline at every item (``len`` passes through for
    ``loop.length``)."""

    def __init__(self, value: Any, budget: RenderBudget) -> None:
        self.value, self.budget = value, budget

    def __iter__(self) -> Iterator[Any]:
        for item in self.value:
            self.budget.tick()
            yield item

    def __len__(self) -> int:
        return len(self.value)


class _BoundLoops(NodeTransformer):
    """Routes every ``{% for %}`` iterable through ``ITER_FILTER``, every ``~`` through
    ``CONCAT_FILTER`` and every list, tuple (read, not assigned to) and dict display through
    ``MADE_FILTER``."""

    def visit_For(self, node: nodes.For) -> nodes.Node:
        self.generic_visit(node)
        node.iter = nodes.Filter(node.iter, ITER_FILTER, [], [], None, None, lineno=node.lineno)
        return node

    def visit_Concat(self, node: nodes.Concat) -> nodes.Node:
        self.generic_visit(node)
        return nodes.Filter(nodes.List(node.nodes, lineno=node.lineno), CONCAT_FILTER, [], [], None,
                            None, lineno=node.lineno)

    def visit_List(self, node: nodes.List) -> nodes.Node:
        return self._display(node)

    def visit_Dict(self, node: nodes.Dict) -> nodes.Node:
        return self._display(node)

    def visit_Tuple(self, node: nodes.Tuple) -> nodes.Node:
        return self._display(node) if node.ctx == "load" else self.generic_visit(node)

    def _display(self, node: nodes.Expr) -> nodes.Node:
        self.generic_visit(node)
        return nodes.Filter(node, MADE_FILTER, [], [], None, None, lineno=node.lineno)
