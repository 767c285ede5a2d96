"""Run Smile's own Java tests against the bridge jar: the external check of the bridge's Smile API.

    .venv/bin/python scripts/smile_java_tests.py --smile PATH [--ref torch] [--tests A,B,...]

PATH is a git repository of haifengl/smile (the tests are read from ``--ref`` with ``git show``) or a
plain checkout (read from its working files). Nothing of Smile is copied into this repository: each
test source is written to a temporary folder, compiled alone against the bridge jar and JUnit 5 from
the local Maven repository (``~/.m2/repository``, or ``--m2``) with the newest installed JDK, and
the ones that compile run through the launcher (``python -m java_bridge``, no model) with
``scripts/java/RunJUnit.java``.

A test that does not compile against the jar alone is ported only where a type is out of scope: it is compiled
again with shadow classes ahead of the jar (``scripts/java_shadow.py``, as ``smile_java_compile.py`` does): the
bridge's own ``Tensor`` and ``KvCachePool`` sources with the project's stubs of Smile's LibTorch device members
appended (``scripts/java/stubs/*_device_members.java.txt``; bodies throw
``UnsupportedOperationException("LibTorch")``; never a name of the bridge's class, except ``KvCachePool``'s
device-tensor ``put``/``get`` with arities of their own), plus the stub types those name (``smile.util.Tuple2``,
...; no other stub of ``scripts/java/stubs``). A test method that still does not compile is left out of the class
and counted as a real failure, with javac's error and its kind (bridge API or stub, as ``smile_java_compile.py``
sorts them); an error outside the test methods leaves the class uncompiled, reported with javac's error count and
first errors (a type outside the bridge's scope such as ``smile.llm.attention``, or a member the bridge lacks).
Such a class runs in a launcher of its own whose system
class loader (``scripts/java/ShadowFirstLoader.java``) reads the shadows ahead of the jar. A failure whose
exception or one of its causes is the stubs' ``UnsupportedOperationException("LibTorch")`` is a device tensor
(out of scope); any other failure is a real one.

Prints one line per failing or skipped test (each failure classified) and a table: test class, compiled, passed,
failed (real failures), skipped, out of scope. Exit status 0 when every class compiled and no test failed for real,
1 otherwise, 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

sys.path.insert(0, str(REPO / "scripts"))

from java_bridge.build import bridge_jar  # noqa: E402 - after the path
from java_bridge.jdks import discover  # noqa: E402
from java_shadow import (JAVAC_FLAGS, KV_CACHE_POOL, TENSOR, build_shadow, check_shadow,  # noqa: E402
                         compile_named_stubs)
from smile_java_compile import bridge_classes, classify, smile_types, split_errors  # noqa: E402

DEFAULT_TESTS = ("KvCachePoolTest", "RadixCacheTest", "MessageTest", "InferenceEngineTest",
                 "GenerationListenersTest", "FlashInferKvMetadataTest", "ChatCompletionTest",
                 "FinishReasonTest", "RoleTest")
TEST_ROOT = "deep/src/test/java/"
JUNIT = (("org/junit/jupiter", "junit-jupiter-api", "5"), ("org/junit/jupiter", "junit-jupiter-engine", "5"),
         ("org/junit/jupiter", "junit-jupiter-params", "5"),
         ("org/junit/platform", "junit-platform-commons", "1"),
         ("org/junit/platform", "junit-platform-engine", "1"),
         ("org/junit/platform", "junit-platform-launcher", "1"),
         ("org/opentest4j", "opentest4j", ""), ("org/apiguardian", "apiguardian-api", ""))
COMPILE_TIMEOUT_S = 300
RUN_TIMEOUT_S = 900


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", version))


def junit_jars(m2: Path) -> list[Path]:
    """The newest JUnit 5 jar set in ``m2`` whose jupiter and platform versions match (5.x.y with
    1.x.y); SystemExit naming what is missing otherwise."""
    jars = []
    for group, artifact, major in JUNIT:
        folder = m2 / group / artifact
        versions = sorted((v.name for v in folder.glob("*") if (v / f"{artifact}-{v.name}.jar").is_file()
                           and v.name.startswith(major)), key=_version_key, reverse=True)
        if not versions:
            raise SystemExit(f"smile_java_tests: no {artifact} {major}.x jar under {folder}")
        jars.append((artifact, versions))
    jupiter = dict(jars)["junit-jupiter-api"]
    for v in jupiter:  # jupiter 5.N.M goes with platform 1.N.M
        platform = "1" + v[1:]
        if all(platform in dict(jars)[a] for a in ("junit-platform-commons", "junit-platform-engine",
                                                    "junit-platform-launcher")) and \
                all(v in dict(jars)[a] for a in ("junit-jupiter-engine", "junit-jupiter-params")):
            chosen = {a: (v if a.startswith("junit-jupiter") else platform) for a, _ in jars
                      if a.startswith("junit-")}
            break
    else:
        raise SystemExit(f"smile_java_tests: no matching JUnit jupiter/platform versions under {m2}")
    out = []
    for (group, artifact, _), (_, versions) in zip(JUNIT, jars):
        version = chosen.get(artifact) or versions[0]
        out.append(m2 / group / artifact / version / f"{artifact}-{version}.jar")
    return out


def test_sources(smile: Path, ref: str, names: list[str]) -> dict[str, tuple[str, str]]:
    """name -> (path inside the repository, source text) of each of Smile's test classes found."""
    found: dict[str, tuple[str, str]] = {}
    if (smile / TEST_ROOT).is_dir():
        for name in names:
            for path in (smile / TEST_ROOT).rglob(f"{name}.java"):
                found[name] = (str(path.relative_to(smile)), path.read_text(encoding="utf-8"))
        return found
    listing = subprocess.run(["git", "-C", str(smile), "ls-tree", "-r", "--name-only", ref],
                             capture_output=True, text=True, check=True, timeout=60).stdout.split()
    for path in listing:
        name = Path(path).stem
        if path.startswith(TEST_ROOT) and name in names:
            text = subprocess.run(["git", "-C", str(smile), "show", f"{ref}:{path}"], capture_output=True,
                                  text=True, check=True, timeout=60).stdout
            found[name] = (path, text)
    return found


TEST_ANNOTATION = re.compile(r"@(?:Test|ParameterizedTest|RepeatedTest|TestFactory|TestTemplate)\b")
# After a test annotation: its arguments, more annotations, modifiers and type, the name, parameters, the body's {.
TEST_HEADER = re.compile(r"(?:\s*\([^()]*\))?(?:\s*@[\w.]+(?:\s*\([^()]*\))?)*\s*[\w<>\[\],.?\s]*?\b(\w+)\s*"
                         r"\([^()]*\)\s*(?:throws\s+[\w.,\s]+)?\{")
SHADOW_LOADER = "ShadowFirstLoader"


def code_only(text: str) -> str:
    """``text`` with the insides of comments and of string, text-block and char literals blanked, newlines kept."""
    out, i, n = list(text), 0, len(text)

    def blank(a: int, b: int) -> None:
        for k in range(a, min(b, n)):
            if out[k] != "\n":
                out[k] = " "

    while i < n:
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
        elif text.startswith('"""', i):
            j = i + 3
            while j < n and not text.startswith('"""', j):
                j += 2 if text[j] == "\\" else 1
            blank(i + 3, j)
            i = j + 3
            continue
        elif text[i] in "\"'":
            j = i + 1
            while j < n and text[j] not in (text[i], "\n"):
                j += 2 if text[j] == "\\" else 1
            blank(i + 1, j)
            i = j + 1
            continue
        else:
            i += 1
            continue
        blank(i, j)
        i = j
    return "".join(out)


def test_methods(text: str) -> list[tuple[int, int, str]]:
    """(first line, last line, name) of each JUnit test method of ``text``: from its test annotation to the
    closing brace of its body."""
    code = code_only(text)
    spans = []
    for m in TEST_ANNOTATION.finditer(code):
        header = TEST_HEADER.match(code, m.end())
        if header is None:
            continue
        depth, i = 0, header.end() - 1
        for i in range(header.end() - 1, len(code)):
            depth += {"{": 1, "}": -1}.get(code[i], 0)
            if depth == 0:
                break
        spans.append((code.count("\n", 0, m.start()) + 1, code.count("\n", 0, i) + 1, header.group(1)))
    return spans


def describe(block: str) -> str:
    """javac's message of an error block and its symbol/location/reason detail, on one line."""
    lines = block.splitlines()
    detail = " | ".join(s.strip() for s in lines[1:] if s.strip().startswith(
        ("symbol:", "location:", "required:", "found:", "reason:")))
    return lines[0].split(": error: ", 1)[-1] + (f" ({detail})" if detail else "")


def javac_run(javac: Path, classpath: list[Path], out: Path, src: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(javac), *JAVAC_FLAGS, "-d", str(out), "-cp", ":".join(map(str, classpath)),
                           str(src)], capture_output=True, text=True, timeout=COMPILE_TIMEOUT_S)


def compile_dropping(javac: Path, classpath: list[Path], out: Path, src: Path, kind_of) -> list[tuple[str, str]] | None:
    """Compile ``src``; while every javac error lies inside a test method, blank those methods (the lines stay, so
    do the line numbers) and compile again. Returns (test name, "[kind] message") of each method left out, or None
    when an error lies outside the test methods. ``kind_of(block)`` is "bridge" or "stub"."""
    dropped: list[tuple[str, str]] = []
    for _ in range(5):
        done = javac_run(javac, classpath, out, src)
        if done.returncode == 0:
            return dropped
        text = src.read_text(encoding="utf-8")
        spans, hit = test_methods(text), {}
        blocks = split_errors(done.stderr)
        for block in blocks:
            line = int(re.search(r"\.java:(\d+): error: ", block).group(1))
            span = next((s for s in spans if s[0] <= line <= s[1]), None)
            if span is None:
                return None
            hit.setdefault(span, block)
        if not hit:
            return None
        lines = text.split("\n")
        for (first, last, method), block in sorted(hit.items()):
            lines[first - 1:last] = [""] * (last - first + 1)
            kind = "bridge API" if kind_of(block) == "bridge" else "stub"
            dropped.append((f"{method}()", f"does not compile [{kind}]: {describe(block)}"))
        src.write_text("\n".join(lines), encoding="utf-8")
    return None


def build_shadows(javac: Path, javap: Path, jar: Path, root: Path) -> tuple[Path, Path, set[str]]:
    """The shadow ``Tensor`` and ``KvCachePool`` (the bridge's sources with the device stubs, checked against
    ``java_shadow``'s refusal rule) compiled into one folder, the stub types they name (``smile.util.Tuple2``, ...)
    and no other stubs into another; returns both folders and the member names of the jar's ``Tensor``."""
    shadows = build_shadow(javac, jar, root, TENSOR)
    tensor_names = check_shadow(javap, jar, shadows, TENSOR)
    build_shadow(javac, jar, root, KV_CACHE_POOL)
    check_shadow(javap, jar, shadows, KV_CACHE_POOL)
    return shadows, compile_named_stubs(javac, jar, root, [TENSOR, KV_CACHE_POOL]), tensor_names


def run_junit(classpath: list[Path], classes: list[str], jvm_args: list[str]) -> \
        tuple[dict[str, tuple[int, ...]], str, subprocess.CompletedProcess]:
    """Run ``classes`` through the launcher with RunJUnit: (class -> (passed, failed, skipped, libtorch), stdout,
    the process)."""
    done = subprocess.run([sys.executable, "-m", "java_bridge", "--no-model", *jvm_args, "--classpath",
                           ":".join(map(str, classpath)), "--main", "RunJUnit", "--", *classes],
                          capture_output=True, text=True, timeout=RUN_TIMEOUT_S, cwd=REPO)
    results = {m.group(1): tuple(int(x) for x in m.groups()[1:])
               for m in re.finditer(r"^RESULT (\S+) passed=(\d+) failed=(\d+) skipped=(\d+) libtorch=(\d+)",
                                    done.stdout, re.M)}
    return results, done.stdout, done


def print_outcomes(stdout: str) -> None:
    """Each failing or skipped test of RunJUnit's output, each failure classified."""
    for line in stdout.splitlines():
        if line.startswith("SKIP "):
            print("  " + line)
        m = re.match(r"FAIL (.*?) -- (.*?)(?: \[LibTorch at (\S+)\])?$", line)
        if m and m.group(3):
            print(f"  FAIL {m.group(1)} -- device tensor (out of scope): {m.group(2)} at {m.group(3)}")
        elif m:
            print(f"  FAIL {m.group(1)} -- real failure: {m.group(2)}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--smile", type=Path, required=True, help="haifengl/smile: a git repository or checkout")
    ap.add_argument("--ref", default="torch", help="the git ref to read the tests from (default: torch)")
    ap.add_argument("--tests", default=",".join(DEFAULT_TESTS), help="test classes, comma-separated")
    ap.add_argument("--m2", type=Path, default=Path.home() / ".m2" / "repository")
    ap.add_argument("--errors", type=int, default=3, help="compile errors shown per test class")
    args = ap.parse_args(argv)
    names = [n for n in args.tests.split(",") if n]
    jdks = [j for j in discover() if (j.home / "bin" / "javac").exists()]
    if not jdks:
        print("smile_java_tests: no JDK with javac found", file=sys.stderr)
        return 2
    javac, javap = jdks[0].home / "bin" / "javac", jdks[0].home / "bin" / "javap"
    jar = bridge_jar()
    classpath = [jar, *junit_jars(args.m2)]
    sources = test_sources(args.smile, args.ref, names)
    # name -> [compiled, passed, failed (real), skipped, out of scope]
    rows: dict[str, list] = {}
    dropped: dict[str, list[tuple[str, str]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        runner = root / "runner"
        subprocess.run([str(javac), "-d", str(runner), "-cp", ":".join(map(str, classpath)),
                        *(str(REPO / "scripts" / "java" / f) for f in ("RunJUnit.java", f"{SHADOW_LOADER}.java"))],
                       check=True, timeout=COMPILE_TIMEOUT_S)
        plain: list[tuple[str, Path, str]] = []
        shadowed: list[tuple[str, Path, str]] = []
        shadows: tuple[Path, Path, set[str]] | None = None
        for name in names:
            if name not in sources:
                rows[name] = ["not found", 0, 0, 0, 0]
                continue
            path, text = sources[name]
            src = root / "src" / name / Path(path).relative_to(TEST_ROOT)
            src.parent.mkdir(parents=True, exist_ok=True)
            src.write_text(text, encoding="utf-8")
            out = root / "out" / name
            package = re.search(r"^package\s+([\w.]+);", text, re.M)
            cls = f"{package.group(1)}.{name}" if package else name
            done = javac_run(javac, classpath, out, src)
            if done.returncode == 0:
                plain.append((name, out, cls))
                continue
            # Not against the jar alone: again with the device stubs ahead of the jar.
            if shadows is None:
                shadows = build_shadows(javac, javap, jar, root / "shadow")
                bridge, types = bridge_classes(jar), smile_types(args.smile, args.ref)
            own = set(re.findall(r"\b(?:class|interface|enum|record)\s+(\w+)", text))
            left_out = compile_dropping(javac, [shadows[0], shadows[1], *classpath], out, src,
                                        lambda b: classify(b, bridge, own, types, shadows[2]))
            if left_out is not None:
                shadowed.append((name, out, cls))
                dropped[name] = left_out
                continue
            count = re.search(r"(\d+) errors?", done.stderr)
            first = [line for line in done.stderr.splitlines() if ": error:" in line][:int(args.errors)]
            rows[name] = [f"no ({count.group(1) if count else '?'} errors)", 0, 0, 0, 0]
            for line in first:
                print(f"  {name}: {line.split(str(src.parent) + '/')[-1]}")
        runs = [(plain, [], [])]
        if shadowed:
            runs.append((shadowed, [shadows[1]], [f"--jvm-arg=-Djava.system.class.loader={SHADOW_LOADER}",
                                                  f"--jvm-arg=-Dsmile.shadow.path={shadows[0]}"]))
        for tests, extra, jvm_args in runs:
            if not tests:
                continue
            cp = [*classpath, *extra, runner, *(o for _, o, _ in tests)]
            results, stdout, done = run_junit(cp, [c for _, _, c in tests], jvm_args)
            print_outcomes(stdout)
            for name, _, cls in tests:
                for test, why in dropped.get(name, []):
                    print(f"  FAIL {cls}.{test} -- real failure: {why}")
                passed, failed, skipped, libtorch = results.get(cls, (0, 0, 0, 0))
                if cls not in results:
                    print(f"  {name}: did not run (launcher exit {done.returncode}): "
                          f"{done.stderr.strip().splitlines()[-1:] or ''}")
                    failed = failed or 1
                compiled = "yes" if name not in dropped else "yes, device stubs" + (
                    f"; {len(dropped[name])} test(s) left out" if dropped[name] else "")
                rows[name] = [compiled, passed, failed - libtorch + len(dropped.get(name, [])), skipped, libtorch]
    print(f"\nSmile's tests ({args.smile}, {args.ref}) against the bridge jar, {jdks[0]}:")
    print("| test class | compiled | passed | failed | skipped | out of scope |\n|---|---|---|---|---|---|")
    for name in names:
        compiled, passed, failed, skipped, out_of_scope = rows[name]
        print(f"| {name} | {compiled} | {passed} | {failed} | {skipped} | {out_of_scope} |")
    return 1 if any(r[2] or not r[0].startswith("yes") for r in rows.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
