"""The budget of one chat-template render: how long it may run and how much text it may build, and
``RenderBudget``, the running account that enforces it.

A chat template is code from the checkpoint folder; these limits (enforced by
``sandbox.BoundedSandbox`` and the checks of ``guards``) keep a hostile or broken one from
blocking the caller or exhausting memory. Each is far above what a real chat template needs (they
render in milliseconds, to prompts of at most a few hundred thousand characters).
"""

from __future__ import annotations

import os
import sys
import sysconfig
import time
import weakref
import _weakrefset
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from itertools import compress, repeat
from operator import is_
from types import FrameType
from typing import Any

import jinja2
import markupsafe
from jinja2.utils import Namespace

from ..collector import collecting
from ..errors import RenderBudgetError

MAX_RENDER_SECONDS = 5.0  # wall time of one render
# characters of the rendered prompt, and of any one string, list or dict a template builds
MAX_RENDER_CHARS = 8 << 20
# all expression output of one render, wherever it goes, and the most one step may build before its
# result is measured: this many times MAX_RENDER_CHARS
PRODUCED_CHARS_FACTOR = 4
MAX_RANGE = 100_000  # items of one range()
MAX_CALL_DEPTH = 64  # nested macro / recursive-loop calls
MAX_INT_BITS = 1 << 16  # bits of an integer a template builds
# the longest single step (one C call) that may run inside a filter's Python loop, which the
# deadline cannot interrupt: this fraction of the time budget
MAX_STEP_FRACTION = 0.1


@dataclass(frozen=True)
class RenderLimits:
    """The budget of one render: wall ``seconds``, ``chars`` (the rendered prompt and any one string
    or list built; ``PRODUCED_CHARS_FACTOR`` times it for all expression output), ``range`` items
    and call ``depth``. The defaults are the module's constants; tests pass smaller ones."""

    seconds: float = MAX_RENDER_SECONDS
    chars: int = MAX_RENDER_CHARS
    range: int = MAX_RANGE
    depth: int = MAX_CALL_DEPTH

    def __post_init__(self) -> None:
        if not self.seconds > 0 or min(self.chars, self.range, self.depth) < 1:
            raise ValueError(f"render limits must be positive, got {self}")


class Overrun(BaseException):
    """Raised by ``RenderBudget.hook`` into whatever code runs past the deadline. A BaseException,
    so that a library's ``except Exception`` cannot swallow it; the sandbox turns it into
    RenderBudgetError."""


_ENTRY_EVENTS = frozenset({"call", "c_call"})  # where the profile hook may stop a call


class RenderBudget:
    """One render's running account of its ``limits``: the deadline, the call depth and the
    characters produced. Every check raises RenderBudgetError naming the limit; ``watch`` runs
    library code (a filter, a method) with ``hook`` as the thread's profile function, which stops
    it at the deadline."""

    def __init__(self, limits: RenderLimits) -> None:
        self.limits = limits
        self.deadline = time.monotonic() + limits.seconds
        self.depth = 0
        self.produced = 0
        self.watching = False
        self.entry: FrameType | None = None  # the frame of the outermost ``watch``

    def watch(self, f: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``f(*args, **kwargs)`` with ``hook`` as this thread's profile function (the previous one
        restored after; nested calls run under the outer one). Overrun when Python code in it runs
        past the deadline."""
        if self.watching:
            return f(*args, **kwargs)
        previous = sys.getprofile()
        self.watching, self.entry = True, sys._getframe()
        sys.setprofile(self.hook)
        try:
            return f(*args, **kwargs)
        finally:
            self.watching = False  # first: the hook must not raise into this cleanup
            sys.setprofile(previous)

    def hook(self, frame: FrameType, event: str, arg: Any) -> None:
        """The profile function while ``watch`` runs: at every Python and C function call, Overrun
        once the deadline has passed (Python then drops the hook: one raise). Only at a call: a
        raise at a return would replace or chain an exception already on its way out (a C
        function's, or one the template's own handler is rewriting), and what reached the caller
        would be that confusion instead of the overrun. Only where the raise reaches the render's
        caller: never while the garbage collector runs (its callbacks, weakref callbacks and
        finalizers run inside whatever code allocated, and what they raise is swallowed, after which
        CPython 3.11 resumes the render with its profile function gone mid-call: a confused error or
        an aborted process), and only when every frame from ``frame`` down to ``watch``'s runs code
        on the render's behalf (``_for_the_template``); elsewhere the next call is checked."""
        if (event in _ENTRY_EVENTS and self.watching and time.monotonic() > self.deadline
                and not collecting() and self._on_the_render_path(frame)):
            self.watching = False
            raise Overrun

    def _on_the_render_path(self, frame: FrameType | None) -> bool:
        """Whether every frame from ``frame`` down to (not including) ``watch``'s own runs code on
        the render's behalf."""
        while frame is not None and frame is not self.entry:
            if not _for_the_template(frame):
                return False
            frame = frame.f_back
        return frame is not None

    def overrun(self) -> RenderBudgetError:
        """The error of a render that ran past its deadline."""
        return RenderBudgetError(f"took longer than its time budget of {self.limits.seconds:g} s "
                                 "(MAX_RENDER_SECONDS); a chat template renders in milliseconds")

    def tick(self) -> None:
        """RenderBudgetError once the deadline has passed."""
        if time.monotonic() > self.deadline:
            raise self.overrun()

    def afford(self, seconds: float, what: str) -> None:
        """RenderBudgetError, before a step starts, when its estimated worst-case ``seconds`` (on a
        slow core) exceed the time left; ``what`` names the step."""
        left = self.deadline - time.monotonic()
        if seconds > left:
            self.tick()
            raise RenderBudgetError(f"{what} could take {seconds:.2g} s, more than the "
                                    f"{left:.2g} s left of its time budget of "
                                    f"{self.limits.seconds:g} s (MAX_RENDER_SECONDS)")

    def step(self, seconds: float, what: str) -> None:
        """RenderBudgetError when one uninterruptible step inside a longer filter, estimated at
        ``seconds``, exceeds ``MAX_STEP_FRACTION`` of the time budget (the most it may run past
        the deadline)."""
        cap = self.limits.seconds * MAX_STEP_FRACTION
        if seconds > cap:
            raise RenderBudgetError(f"{what} could take {seconds:.2g} s in one step, more than "
                                    f"{cap:.2g} s (MAX_STEP_FRACTION x MAX_RENDER_SECONDS)")

    def size(self, n: int, what: str) -> None:
        """RenderBudgetError when ``what`` would be ``n`` > ``chars`` characters."""
        if n > self.limits.chars:
            raise RenderBudgetError(f"{what} would be {n} characters, over the budget of "
                                    f"{self.limits.chars} (MAX_RENDER_CHARS)")

    def build(self, n: int, what: str) -> None:
        """RenderBudgetError when a step may build up to ``n`` characters, more than
        ``PRODUCED_CHARS_FACTOR`` times ``chars``, before its result can be measured."""
        cap = self.limits.chars * PRODUCED_CHARS_FACTOR
        if n > cap:
            raise RenderBudgetError(f"{what} could build {n} characters, over {cap} "
                                    "(PRODUCED_CHARS_FACTOR x MAX_RENDER_CHARS)")

    def width(self, value: Any, what: str) -> None:
        """RenderBudgetError when ``value`` is an integer width or count over ``chars``."""
        if isinstance(value, int) and value > self.limits.chars:
            raise RenderBudgetError(f"{what} of {value} is over the budget of {self.limits.chars} "
                                    "characters (MAX_RENDER_CHARS)")

    def produce(self, n: int) -> None:
        """Count ``n`` characters of expression output; RenderBudgetError past
        ``PRODUCED_CHARS_FACTOR`` times ``chars``."""
        self.produced += n
        cap = self.limits.chars * PRODUCED_CHARS_FACTOR
        if self.produced > cap:
            raise RenderBudgetError(f"produced more than {cap} characters of output, macro results "
                                    "and set blocks (PRODUCED_CHARS_FACTOR x MAX_RENDER_CHARS)")

    def measure(self, value: Any, limit: int | None = None) -> int:
        """``footprint(value)`` up to ``limit`` (default ``chars``), checking the deadline as it
        walks."""
        return footprint(value, self.limits.chars if limit is None else limit, self.tick)

    def footprint(self, value: Any, what: str) -> None:
        """RenderBudgetError when ``footprint(value)`` is over ``chars``."""
        self.size(self.measure(value), what)

    def made(self, value: Any, what: str) -> None:
        """Check a value the template made (a filter's, call's, operator's or display's result):
        a string, bytes, list, tuple, dict or namespace of at most ``chars`` (``footprint``), an
        integer of at most ``MAX_INT_BITS`` bits. Anything else passes."""
        cls = value.__class__
        if cls is str or cls is bytes or isinstance(value, (str, bytes)):
            self.size(len(value), what)
        elif cls is int or (isinstance(value, int) and cls is not bool):
            if value.bit_length() > MAX_INT_BITS:
                raise RenderBudgetError(f"{what} is an integer of {value.bit_length()} bits, over "
                                        f"{MAX_INT_BITS} (MAX_INT_BITS)")
        elif cls in _CONTAINER_CLASSES or isinstance(value, _CONTAINERS):
            self.footprint(value, what)


def footprint(value: Any, limit: int, tick: Callable[[], None] | None = None) -> int:
    """An upper estimate of ``len(str(value))`` for strings, bytes, numbers and nested lists,
    tuples, dicts and namespaces, counting every reference to a shared object (so a list holding
    one object twice counts it twice) but walking each object once, and stopping once it passes
    ``limit`` (any result over ``limit`` only means "over"). Iterative (any depth), and each
    container's scalars are measured in bulk (C loops), so a flat list of a million strings costs
    milliseconds; ``tick`` is called every ``_TICK_EVERY`` containers."""
    own = _scalar_size(value)
    if own is not None:
        return own
    total, children = _flat_size(value, limit)
    sizes: dict[int, int] = {id(value): 8}  # 8: in progress, as a cycle prints "[...]"
    stack: list[list[Any]] = [[id(value), total, iter(children), 1]]  # [id, total, children, times]
    while stack:
        frame = stack[-1]
        if frame[1] > limit:
            return int(frame[1])
        for child, times in frame[2]:
            key = id(child)
            if key not in sizes:
                sizes[key] = 8
                if tick is not None and len(sizes) % _TICK_EVERY == 0:
                    tick()
                total, children = _flat_size(child, limit)
                if children:
                    stack.append([key, total, iter(children), times])
                    break
                sizes[key] = total
            frame[1] += times * sizes[key]
            if frame[1] > limit:
                return int(frame[1])
        else:
            stack.pop()
            sizes[frame[0]] = frame[1]
            if not stack:
                return int(frame[1])
            stack[-1][1] += frame[3] * frame[1]
    raise AssertionError("unreachable")


def _scalar_size(v: Any) -> int | None:
    """The size of ``v`` as text when it is not a container ``footprint`` walks, else None (exact
    classes first, without calls)."""
    cls = v.__class__
    if cls is str or cls is bytes:
        return len(v)
    if cls in _FIXED_SIZES:
        return _FIXED_SIZES[cls]
    if cls is int:
        return v.bit_length() // 3 + 2
    if cls in _CONTAINER_CLASSES:
        return None
    if isinstance(v, (str, bytes)):
        return len(v)
    if isinstance(v, int):
        return 5 if isinstance(v, bool) else v.bit_length() // 3 + 2
    if isinstance(v, float):
        return 24
    return None if isinstance(v, _CONTAINERS) else 64


_FIXED_SIZES: dict[type, int] = {bool: 5, type(None): 5, float: 24}
_CONTAINERS = (list, tuple, dict, Namespace)
_CONTAINER_CLASSES = frozenset(_CONTAINERS)
_SMALL = 32  # items of a container measured one by one rather than in bulk
_TICK_EVERY = 256  # containers footprint walks between two deadline checks


def _flat_size(v: Any, limit: int) -> tuple[int, list[tuple[Any, int]]]:
    """The container ``v``'s own size (brackets, separators and its scalar items, measured in
    bulk) and its distinct container items with how often each occurs."""
    if isinstance(v, Namespace):
        v = v._Namespace__attrs  # type: ignore[attr-defined]  # its repr shows them
    parts = (v.keys(), v.values()) if isinstance(v, dict) else (v,)
    n = len(v) * len(parts)
    total = 2 + 2 * n
    if total > limit:
        return total, []
    children: list[Any] = []
    if n <= _SMALL:
        for part in parts:
            for item in part:
                size = _scalar_size(item)
                if size is None:
                    children.append(item)
                else:
                    total += size
        if len(children) == 1:
            return total, [(children[0], 1)]
    else:
        for part in parts:
            for kind in set(map(type, part)):
                of_kind = compress(part, map(is_, map(type, part), repeat(kind)))
                if issubclass(kind, (str, bytes)):
                    total += sum(map(len, of_kind))
                elif issubclass(kind, _CONTAINERS):
                    children.extend(of_kind)
                elif kind is bool or kind is type(None):
                    total += 5 * sum(1 for _ in of_kind)
                elif issubclass(kind, int):
                    items = list(of_kind)
                    total += sum(map(int.bit_length, items)) // 3 + 2 * len(items)
                else:
                    total += (24 if kind is float else 64) * sum(1 for _ in of_kind)
    if not children:
        return total, []
    distinct = dict(zip(map(id, children), children))
    return total, [(distinct[key], times) for key, times in Counter(map(id, children)).items()]


# code a render runs on its behalf: jinja2's, markupsafe's and this folder's (the sandbox), the
# standard library's (textwrap, re, pprint, ...) but not weakref's callbacks, and the template's own
# (whose file name is not a path); not the installed packages' others (torch's weakref callbacks,
# say), nor the rest of this package, nor the caller's
_OWN_CODE = tuple(os.path.dirname(os.path.abspath(path)) + os.sep for path in
                  (jinja2.__file__, markupsafe.__file__, __file__))
_FOREIGN_CODE = tuple({os.path.abspath(sysconfig.get_paths()[key]) + os.sep
                       for key in ("purelib", "platlib")}) + tuple(
    os.path.abspath(module.__file__ or "") for module in (weakref, _weakrefset))
_STANDARD_LIBRARY = tuple({os.path.abspath(sysconfig.get_paths()[key]) + os.sep
                           for key in ("stdlib", "platstdlib")})


def _for_the_template(frame: FrameType) -> bool:
    """Whether ``frame`` runs code on the render's behalf (see ``_OWN_CODE``)."""
    name = frame.f_code.co_filename
    if name.startswith(_OWN_CODE):
        return True
    if name.startswith(_FOREIGN_CODE):
        return False
    return name.startswith(_STANDARD_LIBRARY) or not os.path.isabs(name)
