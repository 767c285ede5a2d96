"""The checks that keep each single step of a chat-template render inside its budget, run by
``sandbox.BoundedSandbox`` before (and after) the step.

Template code checks the deadline itself, and library code (filters, methods) runs under
``limits.RenderBudget.watch``, which stops its Python code at the deadline. What neither can
stop is one call into C: a string method, a regex search, ``sorted``, ``sum``, ``json.dumps``, a
comparison of two nested lists. Every such call is either linear in values of at most
``MAX_RENDER_CHARS`` (every value a template makes is measured by ``RenderBudget.made``, so no
nested structure expands past it) or checked here first:

- its result's size where that is known ahead (widths, repeats, joins, replacements, format widths,
  ``translate``, ``wordwrap``'s and ``urlize``'s markup, ``tojson``'s indentation and separators,
  ``pprint``'s indentation, ``strftime``): over ``MAX_RENDER_CHARS`` or, for a loose bound,
  over ``PRODUCED_CHARS_FACTOR`` times it, refused;
- its worst-case time where it is superlinear (sorting, ``sum`` of lists, ``strip`` with a long
  set of characters, ``urlize``'s trailing-punctuation regex, ``tojson``'s ``sort_keys``),
  estimated with the constants below (measured on a slow, loaded core, then doubled) and refused
  when it exceeds the time left (``RenderBudget.afford``), or, for one step among many in a
  filter's Python loop (a word of ``urlize``), when it exceeds ``MAX_STEP_FRACTION`` of the budget
  (``RenderBudget.step``).

A filter's lazy result (``map``, ``select``, ``unique``, ``batch``, ...) is handed out as a
``CountedIterator``, so that whatever collects it (``list``, ``join``, a call's ``*args``) collects
at most ``MAX_RENDER_CHARS``; the filters that must see a lazy input whole to check it (``join``,
``sort``, ``groupby``, ``sum``) get it as a list, which they would have built anyway.
"""

from __future__ import annotations

import inspect
import math
import re
import string
import time
from collections.abc import Callable, Iterable, Iterator, Sized
from itertools import compress, repeat
from typing import Any

import markupsafe
from jinja2.filters import ignore_case, make_attrgetter, make_multi_attrgetter

from .limits import MAX_INT_BITS, RenderBudget
from ..errors import RenderBudgetError

# the cost model: seconds per unit of work on a slow core (measured, then doubled)
KEY_SECONDS = 6e-6  # per item of a sort's key phase in Python (under the profile function)
SORT_SECONDS = 150e-9  # per n * log2(n) of sorting n keys
COMPARE_SECONDS = 1e-9  # per character of the keys compared, times log2(n)
JSON_SORT_SECONDS = 250e-9  # per dict entry * log2(entries of its dict), json's sort_keys
STRIP_SECONDS = 0.25e-9  # per text character * stripped-set character of str.strip(chars)
URLIZE_SECONDS = 64e-9  # per (run of trailing punctuation in one word) ** 2 in urlize
SUM_SECONDS = 4e-9  # per item copied by sum() of lists or tuples (each partial sum is copied)
STRFTIME_CHARS = 64  # characters one % directive of strftime may expand to
MAX_ROUND_DIGITS = 4300  # |precision| of round (Python's own limit on integer <-> text digits)
LINK_CHARS = 64  # characters urlize adds around one link, besides its rel and target attributes

_WIDTH_METHODS = ("center", "ljust", "rjust", "zfill")
_STRIP_METHODS = ("strip", "lstrip", "rstrip")
_PERCENT_SPEC = re.compile(r"%(?:\([^)]*\))?[#0 +\-]*(\*|\d+)?(?:\.(\*|\d+))?")
_TRAILING_PUNCTUATION = re.compile(r"(?:[).,]|&gt;)+")  # what urlize's tail regex backtracks over


class CountedIterator:
    """A filter's lazy result that counts what it yields: all its items together (``2 +
    footprint`` each) at most ``chars``, else RenderBudgetError naming ``what``. Prints as the
    iterator it wraps."""

    def __init__(self, inner: Iterator[Any], budget: RenderBudget, what: str) -> None:
        self.inner, self.budget, self.what, self.total = inner, budget, what, 0

    def __iter__(self) -> CountedIterator:
        return self

    def __next__(self) -> Any:
        item = self.budget.watch(next, self.inner)
        self.total += 2 + self.budget.measure(item)
        self.budget.size(self.total, f"the items of {self.what}")
        return item

    def __repr__(self) -> str:
        return repr(self.inner)


class FilterCall:
    """One call of a filter, its arguments bound by name to the filter's signature (defaults
    applied), after ``lead`` arguments jinja passes (context, environment): ``value`` is the
    filtered value, ``get`` and ``set`` the other arguments."""

    def __init__(self, bound: inspect.BoundArguments, value_name: str, lead: int) -> None:
        self.bound, self.value_name, self.lead = bound, value_name, lead

    @property
    def value(self) -> Any:
        return self.bound.arguments[self.value_name]

    @value.setter
    def value(self, value: Any) -> None:
        self.bound.arguments[self.value_name] = value

    def get(self, name: str, default: Any = None) -> Any:
        return self.bound.arguments.get(name, default)

    def set(self, name: str, value: Any) -> None:
        if name in self.bound.arguments:
            self.bound.arguments[name] = value


# (budget, environment, call); run outside the filter's watch: a check that loops over the items in
# Python runs that loop under RenderBudget.watch itself
FilterCheck = Callable[[RenderBudget, Any, FilterCall], None]


# ---------------------------------------------------------------------------------------- operators
def check_binop(budget: RenderBudget, operator: str, left: Any, right: Any) -> None:
    """``*``, ``**``, ``+`` and ``%``: the size of a repeated, concatenated or formatted string,
    bytes or list, and the bits of a product or power, before it is built."""
    if operator == "*":
        for seq, n in ((left, right), (right, left)):
            if isinstance(seq, (str, bytes, list, tuple)) and isinstance(n, int) and n > 1:
                budget.size(budget.measure(seq) * n,
                            f"a {type(seq).__name__} repeated {n} times")
        if (isinstance(left, int) and isinstance(right, int)
                and left.bit_length() + right.bit_length() > MAX_INT_BITS):
            raise RenderBudgetError(f"a product of integers would exceed {MAX_INT_BITS} bits "
                                    "(MAX_INT_BITS)")
    elif operator == "**":
        if (isinstance(left, int) and isinstance(right, int) and right > 1 and abs(left) > 1
                and (abs(left).bit_length() - 1) * right > MAX_INT_BITS):
            raise RenderBudgetError(f"{left} ** {right} would exceed {MAX_INT_BITS} bits "
                                    "(MAX_INT_BITS)")
    elif (operator == "+" and isinstance(left, (str, bytes, list, tuple))
          and isinstance(right, (str, bytes, list, tuple))):
        budget.size(budget.measure(left) + budget.measure(right), "the result of +")
    elif operator == "%" and isinstance(left, (str, bytes)):
        check_percent(budget, left)
        budget.footprint(right, "a % argument")


def check_percent(budget: RenderBudget, fmt: str | bytes) -> None:
    """The widths and precisions of a ``%`` format: at most ``chars``, never ``*``."""
    text = fmt.decode("latin-1") if isinstance(fmt, bytes) else fmt
    for m in _PERCENT_SPEC.finditer(text):
        for value in m.groups():
            if value == "*":
                raise RenderBudgetError("a % format with a * width or precision is not allowed in "
                                        "a chat template")
            if value is not None:
                budget.width(int(value), "a % format's width or precision")


def check_format_spec(budget: RenderBudget, fmt: str) -> None:
    """The widths and precisions of a ``str.format`` template: at most ``chars``, never nested."""
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


# ------------------------------------------------------------------------------- methods and calls
def check_call(budget: RenderBudget, obj: Any, args: list[Any], kwargs: dict[str, Any]) -> None:
    """A call of a method of ``str``, ``Markup`` or ``bytes`` (``center``, ``ljust``, ``rjust``,
    ``zfill``, ``expandtabs``, ``join``, ``replace``, ``strip``, ``lstrip``, ``rstrip``,
    ``translate``) or of ``int.to_bytes``: its result's size or its time, before it runs. What
    ``join`` is given becomes a list in ``args`` (as ``join`` would make it) to be measured."""
    receiver, name = getattr(obj, "__self__", None), getattr(obj, "__name__", None)
    if isinstance(receiver, bool) or not isinstance(receiver, (str, bytes, int)):
        return
    if isinstance(receiver, int):
        if name == "to_bytes":
            budget.width(args[0] if args else kwargs.get("length", 1), "int.to_bytes's length")
        return
    kind = type(receiver).__name__
    if name in _WIDTH_METHODS:
        budget.width(args[0] if args else kwargs.get("width"), f"{kind}.{name}'s width")
    elif name == "expandtabs":
        tab = args[0] if args else kwargs.get("tabsize", 8)
        if isinstance(tab, int):
            tabs = (receiver.count("\t") if isinstance(receiver, str)
                    else receiver.count(b"\t"))
            budget.size(len(receiver) + tabs * max(tab, 0), "the result of expandtabs")
    elif name == "join" and args:
        if not isinstance(args[0], (list, tuple, str, bytes)):
            args[0] = list(args[0])  # what join would build first (a dict's keys, a lazy result)
        _check_join(budget, receiver, args[0])
    elif name == "replace" and len(args) >= 2:
        _check_replace(budget, receiver, args[0], args[1],
                       args[2] if len(args) > 2 else kwargs.get("count"))
    elif name in _STRIP_METHODS and args and isinstance(args[0], (str, bytes)):
        budget.afford(STRIP_SECONDS * len(receiver) * len(args[0]), f"{kind}.{name}")
    elif name == "translate" and args and isinstance(receiver, str):
        budget.build(len(receiver) * _longest_replacement(args[0]), "the result of translate")


def check_strftime(budget: RenderBudget, fmt: Any) -> None:
    """``strftime``'s result, before it is built: each ``%`` directive may expand to
    ``STRFTIME_CHARS``."""
    if isinstance(fmt, str):
        budget.build(len(fmt) + STRFTIME_CHARS * fmt.count("%"), "the result of strftime_now")


def _check_join(budget: RenderBudget, sep: str | bytes, seq: Any) -> None:
    if isinstance(seq, (list, tuple, str, bytes)):
        budget.size(budget.measure(seq) + len(sep) * max(len(seq) - 1, 0),
                    "the result of join")


def _check_replace(budget: RenderBudget, text: Any, old: Any, new: Any, count: Any) -> None:
    if not all(isinstance(x, str) for x in (text, old, new)) and \
            not all(isinstance(x, bytes) for x in (text, old, new)):
        return
    hits = text.count(old) if old else len(text) + 1
    if isinstance(count, int) and count >= 0:
        hits = min(hits, count)
    budget.size(len(text) + hits * (len(new) - len(old)), "the result of replace")


def _longest_replacement(table: Any) -> int:
    """The longest string ``str.translate`` may put for one character with ``table`` (a dict, list
    or tuple of replacements; anything else maps a character to at most one)."""
    if not isinstance(table, (dict, list, tuple)):
        return 1
    values = table.values() if isinstance(table, dict) else table
    strings = compress(values, map(isinstance, values, repeat(str)))
    return max(1, max(map(len, strings), default=1))


def _whole(value: Any) -> Any:
    """``value`` as a list when it is a lazy iterator (what a consumer would build anyway)."""
    return list(value) if isinstance(value, Iterator) else value


# ----------------------------------------------------------------------------------------- filters
def _center(budget: RenderBudget, env: Any, call: FilterCall) -> None:
    budget.width(call.get("width"), "the center filter's width")


def _indent(budget: RenderBudget, env: Any, call: FilterCall) -> None:
    text, width = str(call.value), call.get("width")
    per_line = len(width) if isinstance(width, str) else width if isinstance(width, int) else 0
    budget.size(len(text) + (text.count("\n") + 1) * per_line, "the result of the indent filter")


def _join(budget: RenderBudget, env: Any, call: FilterCall) -> None:
    items = call.value if isinstance(call.value, (list, tuple, str)) else list(call.value)
    attribute = call.get("attribute")
    if attribute is not None:  # what join does first, done here to measure it
        items = budget.watch(list, map(make_attrgetter(env, attribute), items))
        call.set("attribute", None)
    call.value = items
    _check_join(budget, str(call.get("d", "")), items)


def _replace(budget: RenderBudget, env: Any, call: FilterCall) -> None:
    _check_replace(budget, str(call.value), str(call.get("old")), str(call.get("new")),
                   call.get("count"))


def _format(budget: RenderBudget, env: Any, call: FilterCall) -> None:
    if isinstance(call.value, str):
        check_percent(budget, call.value)
    budget.footprint([call.get("args"), call.get("kwargs")], "the format filter's arguments")


def _batch(budget: RenderBudget, env: Any, call: FilterCall) -> None:
    budget.width(call.get("linecount"), "the batch filter's linecount")


def _slice(budget: RenderBudget, env: Any, call: FilterCall) -> None:
    budget.width(call.get("slices"), "the slice filter's slices")


def _tojson(budget: RenderBudget, env: Any, call: FilterCall) -> None:
    cap = budget.limits.chars * 4
    size = budget.measure(call.value, cap)
    indent, separators = call.get("indent"), call.get("separators")
    per_level = len(indent) if isinstance(indent, str) else max(indent, 0) \
        if isinstance(indent, int) else 0
    seps = sum(len(str(s)) for s in separators) if isinstance(separators, (list, tuple)) else 4
    depth, largest = budget.watch(_shape, call.value)
    budget.build(size + (size // 2 + 1) * (seps + 1 + per_level * depth), "the result of tojson")
    if call.get("sort_keys") and largest > 1:
        budget.afford(JSON_SORT_SECONDS * (size // 4) * math.log2(largest), "tojson's sort_keys")


def _pprint(budget: RenderBudget, env: Any, call: FilterCall) -> None:
    size = budget.measure(call.value, budget.limits.chars * 4)
    depth, _ = budget.watch(_shape, call.value)
    budget.build(size + (size // 2 + 1) * (depth + 1), "the result of pprint")


def _wordwrap(budget: RenderBudget, env: Any, call: FilterCall) -> None:
    text = call.value
    n = len(text) if isinstance(text, str) else budget.measure(text, budget.limits.chars * 4)
    wrapstring = call.get("wrapstring")
    sep = len(env.newline_sequence if wrapstring is None else str(wrapstring))
    budget.build(n + (n + 1) * sep, "the result of wordwrap")


def _urlize(budget: RenderBudget, env: Any, call: FilterCall) -> None:
    escaped = str(markupsafe.escape(call.value))
    runs = list(map(len, _TRAILING_PUNCTUATION.findall(escaped)))
    longest = max(runs, default=0)
    budget.step(URLIZE_SECONDS * longest * longest, f"urlize of a word with a run of {longest} "
                "trailing punctuation characters")
    links = escaped.count(".") + escaped.count("@") + escaped.count(":")
    attrs = sum(len(str(call.get(name) or "")) for name in ("rel", "target")) + LINK_CHARS
    trim = call.get("trim_url_limit")
    budget.build((len(escaped) if isinstance(trim, int) else 2 * len(escaped)) + links * attrs,
                 "the result of urlize")


def _urlencode(budget: RenderBudget, env: Any, call: FilterCall) -> None:
    value = call.value
    if isinstance(value, str) or not isinstance(value, Iterable):
        budget.build(3 * len(str(value).encode("utf-8", "surrogatepass")), "the result of "
                     "urlencode")
    else:
        budget.build(12 * budget.measure(value), "the result of urlencode")


def _trim(budget: RenderBudget, env: Any, call: FilterCall) -> None:
    chars = call.get("chars")
    if isinstance(chars, str):
        text = budget.measure(call.value, budget.limits.chars * 4)
        budget.afford(STRIP_SECONDS * text * len(chars), "the trim filter")


def _round(budget: RenderBudget, env: Any, call: FilterCall) -> None:
    precision = call.get("precision")
    if isinstance(precision, int) and abs(precision) > MAX_ROUND_DIGITS:
        raise RenderBudgetError(f"round to {precision} digits is beyond {MAX_ROUND_DIGITS} "
                                "(MAX_ROUND_DIGITS)")


def _sum(budget: RenderBudget, env: Any, call: FilterCall) -> None:
    items = call.value if isinstance(call.value, (list, tuple)) else list(call.value)
    attribute = call.get("attribute")
    if attribute is not None:  # what sum does first, done here to measure it
        items = budget.watch(list, map(make_attrgetter(env, attribute), items))
        call.set("attribute", None)
    call.value = items
    start = call.get("start")
    if isinstance(start, (list, tuple)):
        copied = len(start) + budget.watch(sum, map(len, filter(_is_sequence, items)))
        budget.build(copied, "the result of sum")
        budget.afford(SUM_SECONDS * len(items) * copied, f"sum() of {len(items)} sequences")


def _is_sequence(x: Any) -> bool:
    return isinstance(x, (list, tuple))


def _sort(budget: RenderBudget, env: Any, call: FilterCall) -> None:
    items = call.value = _whole(call.value)
    if not isinstance(items, Sized) or not isinstance(items, Iterable):
        return  # sort refuses it itself
    attribute = call.get("attribute")
    if attribute is None:
        _afford_sort(budget, items, 0.0, "sort")
    else:  # the keys reach through attributes: measure them as sort will make them
        start = time.monotonic()
        getter = make_multi_attrgetter(env, attribute, None if call.get("case_sensitive")
                                       else ignore_case)
        keys = budget.watch(list, map(getter, items))
        _afford_sort(budget, keys, time.monotonic() - start, "sort")


def _groupby(budget: RenderBudget, env: Any, call: FilterCall) -> None:
    items = call.value = _whole(call.value)
    if not isinstance(items, Sized) or not isinstance(items, Iterable):
        return  # groupby refuses it itself
    start = time.monotonic()
    getter = make_attrgetter(env, call.get("attribute"),
                             None if call.get("case_sensitive") else ignore_case,
                             call.get("default"))
    keys = budget.watch(list, map(getter, items))
    _afford_sort(budget, keys, time.monotonic() - start, "groupby")


def _dictsort(budget: RenderBudget, env: Any, call: FilterCall) -> None:
    if isinstance(call.value, dict):
        _afford_sort(budget, call.value, 0.0, "dictsort")


def _afford_sort(budget: RenderBudget, keys: Any, measured: float, what: str) -> None:
    """Sorting ``keys`` (a sized collection), after a key phase in Python that took ``measured``
    seconds here (or ``KEY_SECONDS`` per key, if more) and will take as long in the filter: the
    keys' size within the budget, and the key phase plus ``n log n`` comparisons in C, each up to
    the characters compared, within the time left."""
    size = budget.measure(keys, budget.limits.chars * 4)
    budget.build(size, f"the keys {what} compares")
    n = len(keys)
    levels = math.log2(n + 1)
    budget.afford(max(measured, KEY_SECONDS * n) + SORT_SECONDS * n * levels
                  + COMPARE_SECONDS * size * levels, f"{what} of {n} items")


def _shape(value: Any) -> tuple[int, int]:
    """The nesting depth of ``value``'s lists, tuples and dicts, and the entries of its largest
    dict (each object walked once; the containers among a container's items found in bulk)."""
    if not isinstance(value, _NESTED):
        return 0, 0
    depths: dict[int, int] = {id(value): 1}  # 1 while in progress: a cycle counts once
    largest = len(value) if isinstance(value, dict) else 0
    stack: list[list[Any]] = [[id(value), iter(_nested(value)), 0]]  # [id, children, deepest]
    while stack:
        frame = stack[-1]
        for child in frame[1]:
            if id(child) not in depths:
                depths[id(child)] = 1
                if isinstance(child, dict):
                    largest = max(largest, len(child))
                stack.append([id(child), iter(_nested(child)), 0])
                break
            frame[2] = max(frame[2], depths[id(child)])
        else:
            stack.pop()
            depths[frame[0]] = frame[2] + 1
            if stack:
                stack[-1][2] = max(stack[-1][2], frame[2] + 1)
    return depths[id(value)], largest


_NESTED = (list, tuple, dict)


def _nested(v: Any) -> list[Any]:
    """The lists, tuples and dicts among the items (or values) of the container ``v``."""
    items = v.values() if isinstance(v, dict) else v
    return list(compress(items, map(isinstance, items, repeat(_NESTED))))


FILTER_CHECKS: dict[str, FilterCheck] = {
    "center": _center, "indent": _indent, "join": _join, "replace": _replace, "format": _format,
    "batch": _batch, "slice": _slice, "tojson": _tojson, "pprint": _pprint, "wordwrap": _wordwrap,
    "urlize": _urlize, "urlencode": _urlencode, "trim": _trim, "round": _round, "sum": _sum,
    "sort": _sort, "groupby": _groupby, "dictsort": _dictsort,
}
