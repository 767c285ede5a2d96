"""Run Smile's own Java tests against the bridge jar: the external check of the bridge's Smile API.

    .venv/bin/python scripts/smile_java_tests.py --smile PATH [--ref torch] [--tests A,B,...]

PATH is a git repository of haifengl/smile (the tests are read from ``--ref`` with ``git show``) or a
plain checkout (read from its working files). Nothing of Smile is copied into this repository: each
test source is written to a temporary folder, compiled alone against the bridge jar and JUnit 5 from
the local Maven repository (``~/.m2/repository``, or ``--m2``) with the newest installed JDK, and
the ones that compile run through the launcher (``python -m java_bridge``, no model) with
``scripts/java/RunJUnit.java``. A test file that does not compile is reported with javac's error
count and first errors: it names a type outside the bridge's scope (LibTorch tensors on a device,
``smile.llm.attention``, ...) or a member the bridge lacks.

Prints one line per failing or skipped test and a table: test class, compiled, passed, failed,
skipped. Exit status 0 when every compiled test passed, 1 otherwise, 2 for bad arguments.
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

from java_bridge.build import bridge_jar  # noqa: E402 - after the path
from java_bridge.jdks import discover  # noqa: E402

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
    javac = jdks[0].home / "bin" / "javac"
    classpath = [bridge_jar(), *junit_jars(args.m2)]
    sources = test_sources(args.smile, args.ref, names)
    rows: list[tuple[str, str, int, int, int]] = []
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        runner = root / "runner"
        subprocess.run([str(javac), "-d", str(runner), "-cp", ":".join(map(str, classpath)),
                        str(REPO / "scripts" / "java" / "RunJUnit.java")], check=True, timeout=COMPILE_TIMEOUT_S)
        compiled: list[tuple[str, Path, str]] = []
        for name in names:
            if name not in sources:
                rows.append((name, "not found", 0, 0, 0))
                continue
            path, text = sources[name]
            src = root / "src" / name / Path(path).relative_to(TEST_ROOT)
            src.parent.mkdir(parents=True, exist_ok=True)
            src.write_text(text, encoding="utf-8")
            out = root / "out" / name
            done = subprocess.run([str(javac), "-nowarn", "-encoding", "UTF-8", "-d", str(out), "-cp",
                                   ":".join(map(str, classpath)), str(src)], capture_output=True, text=True,
                                  timeout=COMPILE_TIMEOUT_S)
            if done.returncode:
                count = re.search(r"(\d+) errors?", done.stderr)
                first = [line for line in done.stderr.splitlines() if ": error:" in line][:int(args.errors)]
                rows.append((name, f"no ({count.group(1) if count else '?'} errors)", 0, 0, 0))
                for line in first:
                    print(f"  {name}: {line.split(str(src.parent) + '/')[-1]}")
                continue
            package = re.search(r"^package\s+([\w.]+);", text, re.M)
            compiled.append((name, out, f"{package.group(1)}.{name}" if package else name))
        if compiled:
            cp = [*map(str, classpath), str(runner), *(str(o) for _, o, _ in compiled)]
            done = subprocess.run([sys.executable, "-m", "java_bridge", "--no-model", "--classpath", ":".join(cp),
                                   "--main", "RunJUnit", "--", *(c for _, _, c in compiled)],
                                  capture_output=True, text=True, timeout=RUN_TIMEOUT_S, cwd=REPO)
            results = {m.group(1): tuple(int(x) for x in m.groups()[1:])
                       for m in re.finditer(r"^RESULT (\S+) passed=(\d+) failed=(\d+) skipped=(\d+)",
                                            done.stdout, re.M)}
            for line in done.stdout.splitlines():
                if line.startswith(("FAIL ", "SKIP ")):
                    print("  " + line)
            for name, _, cls in compiled:
                passed, failed, skipped = results.get(cls, (0, 0, 0))
                if cls not in results:
                    print(f"  {name}: did not run (launcher exit {done.returncode}): "
                          f"{done.stderr.strip().splitlines()[-1:] or ''}")
                    failed = failed or 1
                rows.append((name, "yes", passed, failed, skipped))
                failures += failed
    print(f"\nSmile's tests ({args.smile}, {args.ref}) against the bridge jar, {jdks[0]}:")
    print("| test class | compiled | passed | failed | skipped |\n|---|---|---|---|---|")
    for name, compiled_text, passed, failed, skipped in rows:
        print(f"| {name} | {compiled_text} | {passed} | {failed} | {skipped} |")
    return 1 if failures or any(r[1] != "yes" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
