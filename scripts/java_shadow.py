"""Shadow classes for the checks of Smile's code against the bridge jar (``smile_java_compile.py``,
``smile_java_tests.py``); not part of the product.

A shadow is one of the bridge's classes rebuilt in a temporary folder from its own source
(``java_bridge/java/...``, read at run time) with a project-written fragment of stub members appended
(``scripts/java/stubs/*_device_members.java.txt``: Smile's signatures of LibTorch device members, bodies
``throw new UnsupportedOperationException("LibTorch")``). The folder goes ahead of the jar, so code that calls
those members compiles and, when run, fails with that exception where it reaches one.

Refusal rule (``check_shadow``): the shadow keeps every public member of the jar's class unchanged and adds no
member with the name of one of them, since an added overload could make a call compile that the bridge's member
does not accept and so hide a bridge-API error. The one exception is a name listed in ``Shadow.overloads`` (Smile's
device-tensor forms of a member that the bridge declares with host buffers, such as ``KvCachePool.put``): an
added overload of such a name must take a fixed number of parameters that no bridge member of that name takes
(and no bridge member of that name may be varargs), so no call with the bridge's arity can resolve to the stub.
"""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
STUBS = REPO / "scripts" / "java" / "stubs"
JAVA_SOURCES = REPO / "java_bridge" / "java"
COMPILE_TIMEOUT_S = 300
# -Xdiags:verbose: a call that matches no overload names its method and class even when there is one candidate.
JAVAC_FLAGS = ["-nowarn", "-encoding", "UTF-8", "-proc:none", "-Xmaxerrs", "10000", "-Xdiags:verbose"]


@dataclass(frozen=True)
class Shadow:
    """A bridge class (``smile.deep.tensor.Tensor``) and the fragment of stub members appended to its source.
    ``overloads``: the bridge's member names that the fragment may overload (see the module's refusal rule)."""
    cls: str
    fragment: Path  # not *.java: only ever compiled inside the shadow
    overloads: frozenset[str] = field(default_factory=frozenset)

    @property
    def source(self) -> Path:
        return JAVA_SOURCES / (self.cls.replace(".", "/") + ".java")

    @property
    def simple(self) -> str:
        return self.cls.rsplit(".", 1)[-1]


TENSOR = Shadow("smile.deep.tensor.Tensor", STUBS / "tensor_device_members.java.txt")
KV_CACHE_POOL = Shadow("smile.llm.cache.KvCachePool", STUBS / "kvcachepool_device_members.java.txt",
                       frozenset({"put", "get"}))


def _fail(message: str) -> SystemExit:
    return SystemExit(f"{Path(sys.argv[0]).stem or 'java_shadow'}: {message}")


def public_members(javap: Path, classpath: str, cls: str) -> set[str]:
    """The public members of ``cls`` as ``javap -public`` prints them, one declaration each
    (``public smile.deep.tensor.Tensor to(smile.deep.tensor.Device);``)."""
    done = subprocess.run([str(javap), "-public", "-cp", classpath, cls], capture_output=True, text=True,
                          check=True, timeout=COMPILE_TIMEOUT_S)
    return {line.strip() for line in done.stdout.splitlines() if line.strip().endswith(";")}


def member_name(declaration: str) -> str:
    """``to`` for ``public smile.deep.tensor.Tensor to(smile.deep.tensor.Device);``, ``Colon`` for a field."""
    return re.search(r"(\w+)(?:\(.*\))?(?: throws [\w.$, ]+)?;$", declaration).group(1)


def parameters(declaration: str) -> list[str] | None:
    """The parameter types of a method or constructor declaration as javap prints it (``['int', 'int[]']``);
    None for a field."""
    m = re.search(r"\(([^()]*)\)(?: throws [\w.$, ]+)?;$", declaration)
    if m is None:
        return None
    out, depth, current = [], 0, ""
    for ch in m.group(1):
        depth += (ch == "<") - (ch == ">")
        if ch == "," and depth == 0:
            out.append(current.strip())
            current = ""
        else:
            current += ch
    return [*out, current.strip()] if current.strip() else out


def _distinct_arity(declaration: str, bridge: set[str]) -> bool:
    """Whether ``declaration`` (an added overload) takes a fixed number of parameters that no member of ``bridge``
    with its name takes, none of them varargs: then no call with one of the bridge's arities can resolve to it."""
    mine = parameters(declaration)
    if mine is None or any(p.endswith("...") for p in mine):
        return False
    for other in bridge:
        if member_name(other) != member_name(declaration):
            continue
        theirs = parameters(other)
        if theirs is None or any(p.endswith("...") for p in theirs) or len(theirs) == len(mine):
            return False
    return True


def build_shadow(javac: Path, jar: Path, root: Path, shadow: Shadow) -> Path:
    """Compile the bridge's source of ``shadow.cls`` with the fragment appended into ``root/classes`` (shadows built
    earlier in the same ``root`` come ahead of the jar); return that folder.

    Stub types that the fragment names (``Index``, ``NoGradGuard``, ``smile.util.Tuple2``) are read from the stubs'
    sources, not compiled into it (``-implicit:none``): the folder holds the shadowed classes and their nested types
    only."""
    source = shadow.source.read_text(encoding="utf-8").rstrip()
    if not source.endswith("}"):
        raise _fail(f"{shadow.source} does not end with the class's closing brace")
    fragment = shadow.fragment.read_text(encoding="utf-8")
    src = root / "src" / shadow.source.relative_to(JAVA_SOURCES)
    src.parent.mkdir(parents=True, exist_ok=True)
    src.write_text(f"{source[:-1].rstrip()}\n\n{fragment.rstrip()}\n}}\n", encoding="utf-8")
    classes = root / "classes"
    done = subprocess.run([str(javac), *JAVAC_FLAGS, "-implicit:none", "-d", str(classes), "-cp",
                           f"{classes}:{jar}", "-sourcepath", str(STUBS), str(src)], capture_output=True, text=True,
                          timeout=COMPILE_TIMEOUT_S)
    if done.returncode:
        raise _fail(f"the shadow {shadow.simple} (bridge's + {shadow.fragment.name}) does not compile:\n"
                    f"{done.stderr}")
    return classes


def check_shadow(javap: Path, jar: Path, classes: Path, shadow: Shadow) -> set[str]:
    """The member names of the jar's ``shadow.cls``, after checking the shadow in ``classes`` against the refusal
    rule (module docstring): it keeps every member of the jar's class and adds none of those names, except
    ``shadow.overloads`` with an arity of their own."""
    real = public_members(javap, str(jar), shadow.cls)
    stubbed = public_members(javap, str(classes), shadow.cls)
    names = {member_name(d) for d in real}
    if real - stubbed:
        raise _fail(f"the shadow {shadow.simple} lacks the jar's {sorted(real - stubbed)}: is the jar built from "
                    "java_bridge/java?")
    clash = sorted(d for d in stubbed - real if member_name(d) in names
                   and not (member_name(d) in shadow.overloads and _distinct_arity(d, real)))
    if clash:
        raise _fail(f"{shadow.fragment.name} declares names of the bridge's {shadow.simple}, which would hide "
                    f"bridge-API errors: {clash}")
    return names


def compile_stubs(javac: Path, classpath: str, out: Path, skip: set[str] = frozenset()) -> None:
    """Compile the stubs, except the ones whose path (``smile/llm/model/llama/Llama.java``) is in ``skip``."""
    files = [str(p) for p in sorted(STUBS.rglob("*.java")) if str(p.relative_to(STUBS)) not in skip]
    done = subprocess.run([str(javac), *JAVAC_FLAGS, "-d", str(out), "-cp", classpath, *files],
                          capture_output=True, text=True, timeout=COMPILE_TIMEOUT_S)
    if done.returncode:
        raise _fail(f"the stubs do not compile:\n{done.stderr}")


def compile_named_stubs(javac: Path, jar: Path, root: Path, shadows: list[Shadow]) -> Path:
    """Compile the stubs that the shadows built in ``root`` name (``Index``, ``NoGradGuard``, ``AutoScope``,
    ``Tuple2``, and what those name), and no others, into ``root/stubs``; return that folder. The shadows' own
    classes, compiled again on the way, are removed from it: they live in ``root/classes``."""
    out = root / "stubs"
    done = subprocess.run([str(javac), *JAVAC_FLAGS, "-implicit:class", "-d", str(out), "-cp",
                           f"{root / 'classes'}:{jar}", "-sourcepath", str(STUBS),
                           *(str(root / "src" / s.source.relative_to(JAVA_SOURCES)) for s in shadows)],
                          capture_output=True, text=True, timeout=COMPILE_TIMEOUT_S)
    if done.returncode:
        raise _fail(f"the stubs that the shadows name do not compile:\n{done.stderr}")
    for shadow in shadows:
        folder = out / shadow.source.relative_to(JAVA_SOURCES).parent
        for f in [*folder.glob(f"{shadow.simple}.class"), *folder.glob(f"{shadow.simple}$*.class")]:
            f.unlink()
    return out
