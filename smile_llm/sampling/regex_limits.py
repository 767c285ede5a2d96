"""The nesting limit of every regular expression a constraint holds: the ``regex`` field, a Lark
grammar's ``/.../`` terminals and a JSON schema's ``pattern``s and ``patternProperties`` keys.

``MAX_REGEX_NESTING`` = 64 levels of groups, character classes and repetitions applied to
repetitions. The grammar engine's regex parser refuses more than 250 itself (its nest limit), and
the stack of a compile thread would hold far more; below 64 a refused regex gets this package's
message, and compile work stays small (a pattern of 64 stacked repetitions compiles in ~0.4 s;
real patterns nest a few levels).
"""

from __future__ import annotations

from ..errors import ConstraintError

MAX_REGEX_NESTING = 64


def regex_nesting(pattern: str) -> int:
    """How deep ``pattern`` nests: groups, character classes (nested ones too) and repetitions
    applied to repetitions (``a{2}{2}`` nests 2), the most at any point. Escapes are skipped; the
    count is an upper bound of what the engine's parser counts, never an error for bad syntax."""
    deepest = depth = classes = reps = 0
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == "\\":
            if pattern[i + 1 : i + 2] in ("p", "P") and pattern[i + 2 : i + 3] == "{":
                end = pattern.find("}", i + 3)  # a Unicode class, \p{Greek}
                i = n if end < 0 else end + 1
            else:
                i += 2
            reps = 0
            continue
        if classes:
            if pattern.startswith("[:", i):  # a POSIX class, [:alpha:]
                end = pattern.find(":]", i + 2)
                i = n if end < 0 else end + 2
                continue
            if c == "[":
                classes += 1
                i = _class_start(pattern, i + 1)
            elif c == "]":
                classes -= 1
                i += 1
            else:
                i += 1
            deepest = max(deepest, depth + classes)
            continue
        if c == "[":
            classes = 1
            i = _class_start(pattern, i + 1)
            reps = 0
        elif c == "(":
            depth += 1
            reps = 0
            i += 1
            if pattern.startswith("?", i):  # (?:, (?i), (?P<name>: skip to the group's body
                while i < n and pattern[i] not in ":)>":
                    i += 1
                if i < n and pattern[i] != ")":
                    i += 1
        elif c == ")":
            depth = max(0, depth - 1)
            reps = 0
            i += 1
        elif c in "*+?" or (c == "{" and _is_counted(pattern, i)):
            lazy = c == "?" and i > 0 and pattern[i - 1] in "*+?}" and reps
            if not lazy:
                reps += 1
            i = pattern.find("}", i) + 1 if c == "{" else i + 1
        else:
            reps = 0
            i += 1
        deepest = max(deepest, depth + classes + reps)
    return deepest


def _class_start(pattern: str, i: int) -> int:
    """The index after a class's opening ``[``, ``^`` and a leading literal ``]``."""
    if pattern.startswith("^", i):
        i += 1
    if pattern.startswith("]", i):
        i += 1
    return i


def _is_counted(pattern: str, i: int) -> bool:
    """Whether the ``{`` at ``i`` opens a counted repetition (``{n}``, ``{n,}``, ``{n,m}``)."""
    end = pattern.find("}", i)
    if end < 0:
        return False
    body = pattern[i + 1 : end].replace(" ", "")
    low, _, high = body.partition(",")
    return low.isdigit() and (not high or high.isdigit())


def check_regex(pattern: str, field: str, where: str = "") -> None:
    """ConstraintError naming ``field`` (and ``where`` in it, e.g. a schema's pointer) when
    ``pattern`` nests deeper than ``MAX_REGEX_NESTING``."""
    nesting = regex_nesting(pattern)
    if nesting > MAX_REGEX_NESTING:
        at = f"{where}: " if where else ""
        raise ConstraintError(f"{at}a regular expression nests {nesting} levels deep, over the "
                              f"limit of {MAX_REGEX_NESTING} (MAX_REGEX_NESTING)", field=field)
