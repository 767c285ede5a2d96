"""Compile Smile's own application code against the bridge jar: does code written for Smile's API build on it?

    .venv/bin/python scripts/smile_java_compile.py --smile PATH [--ref torch] [--files A,B,...] [--errors N]

PATH is a git repository of haifengl/smile (the sources are read from ``--ref`` with ``git show``) or a plain
checkout (read from its working files). Nothing of Smile is copied into this repository: each source is written to
a temporary folder and compiled alone, with the newest installed JDK, against the bridge jar and the project's
stubs (``scripts/java/stubs/``): minimal declarations of what these files use outside the bridge's scope
(Jackson, slf4j, Jakarta/Quarkus, ``smile.llm.attention``, ``checkpoint``, ``model``, ``parallel``,
``smile.util``, ``smile.torch``, the serve module's siblings of ``ChatService``, ``smile.deep.tensor.Index`` and
``SafeTensors``). The stubs are compiled first; the file under test replaces its own stub (Smile's
``InferenceEngine`` replaces the bridge's class: it is compiled as a user of the bridge's executor API).

javac's errors are sorted into three kinds:
- bridge API: a member or type of ``smile.llm``, ``smile.llm.cache``, ``smile.llm.engine`` or the bridge's
  ``smile.deep.tensor`` classes is missing or typed differently. These are the bridge's gaps.
- device tensor (out of scope): a member of ``smile.deep.tensor.Tensor`` that only LibTorch provides (matmul,
  views, ``to(Device)``, ...). The bridge's ``Tensor`` is a host-array subset, so these are expected; stubbing them
  would mean shadowing the bridge's class, so they are counted instead.
- stub: a member or type of a stubbed class is missing (the stubs are incomplete; not the bridge's concern).

Prints each bridge-API error, the first ``--errors`` of the other kinds per file, and a table. Exit status 0 when no
file has a bridge-API error, 1 otherwise, 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from java_bridge.build import bridge_jar  # noqa: E402 - after the path
from java_bridge.jdks import discover  # noqa: E402

STUBS = REPO / "scripts" / "java" / "stubs"
DEFAULT_FILES = ("deep/src/main/java/smile/llm/model/llama/Llama.java",
                 "deep/src/main/java/smile/llm/model/qwen/Qwen.java",
                 "deep/src/main/java/smile/llm/engine/InferenceEngine.java",
                 "serve/src/main/java/smile/chat/ChatService.java")
BRIDGE_PACKAGES = ("smile/llm/", "smile/llm/cache/", "smile/llm/engine/", "smile/deep/tensor/")
BRIDGE_SCOPE = ("smile.llm", "smile.llm.cache", "smile.llm.engine")  # smile.deep.tensor: only the jar's classes
COMPILE_TIMEOUT_S = 300
JAVAC_FLAGS = ["-nowarn", "-encoding", "UTF-8", "-proc:none", "-Xmaxerrs", "10000"]


def bridge_classes(jar: Path) -> dict[str, str]:
    """Simple name (``Tensor``, ``GenerationRequest.Kind``) -> package of each class of the jar in the bridge's
    Smile packages (``smile.llm.python`` is the bridge's own and not part of Smile's API)."""
    out: dict[str, str] = {}
    with zipfile.ZipFile(jar) as z:
        for name in z.namelist():
            folder, _, base = name.rpartition("/")
            if not base.endswith(".class") or folder + "/" not in BRIDGE_PACKAGES:
                continue
            simple = base[:-len(".class")].replace("$", ".")
            if not re.search(r"\.\d", simple):  # anonymous classes
                out[simple] = folder.replace("/", ".")
    return out


def read_sources(smile: Path, ref: str, paths: list[str]) -> dict[str, str]:
    """Path inside the repository -> source text, for each path found."""
    found: dict[str, str] = {}
    for path in paths:
        if (smile / path).is_file():
            found[path] = (smile / path).read_text(encoding="utf-8")
            continue
        done = subprocess.run(["git", "-C", str(smile), "show", f"{ref}:{path}"], capture_output=True, text=True,
                              timeout=60)
        if done.returncode == 0:
            found[path] = done.stdout
    return found


def smile_types(smile: Path, ref: str) -> dict[str, set[str]]:
    """Simple name -> the packages where Smile's main sources declare a top-level type of that name."""
    if (smile / "deep").is_dir():
        files = [str(p.relative_to(smile)) for p in smile.rglob("src/main/java/**/*.java")]
    else:
        files = subprocess.run(["git", "-C", str(smile), "ls-tree", "-r", "--name-only", ref], capture_output=True,
                               text=True, check=True, timeout=60).stdout.split()
    out: dict[str, set[str]] = {}
    for f in files:
        m = re.match(r"[\w-]+/src/main/java/(.+)/(\w+)\.java$", f)
        if m:
            out.setdefault(m.group(2), set()).add(m.group(1).replace("/", "."))
    return out


def split_errors(stderr: str) -> list[str]:
    """javac's diagnostics, one block (the error line and its indented detail) each."""
    blocks: list[str] = []
    for line in stderr.splitlines():
        if re.match(r"^\S.*\.java:\d+: error: ", line):
            blocks.append(line)
        elif blocks and not re.match(r"^\d+ errors?$", line) and not line.startswith("Note:"):
            blocks[-1] += "\n" + line
    return blocks


def _owner(block: str) -> str | None:
    """The class whose member or type the error is about, as javac names it, if it names one."""
    for pattern in (r"location: (?:variable|field) \S+ of type ([\w.]+)", r"location: (?:class|interface|enum|"
                    r"record) ([\w.]+)", r"location: package ([\w.]+)",
                    r"(?:method|constructor) \S+ in (?:class|interface|enum|record) ([\w.]+)"
                    r"(?:<[^>]*>)? cannot be applied",
                    r"does not override abstract method .* in ([\w.]+)",
                    r"package ([\w.]+) does not exist"):
        m = re.search(pattern, block)
        if m:
            return m.group(1)
    return None


def classify(block: str, bridge: dict[str, str], own: set[str], smile: dict[str, set[str]]) -> str:
    """"bridge", "device" or "stub" for one javac error block. ``own`` holds the simple names declared by the
    file under test (its nested classes are neither the bridge's nor a stub's); ``smile`` is ``smile_types``."""
    if re.search(r"location: (?:class|variable \S+ of type) (?:smile\.deep\.tensor\.)?Tensor\n", block + "\n"):
        return "device"  # Tensor.Options, matmul, ...: LibTorch's
    missing = re.search(r"symbol: +(?:class|interface|variable) ([A-Z]\w*)\n", block + "\n")
    if missing and "location: variable" not in block and missing.group(1) not in own:
        # A type the file names that nothing declares: the bridge's gap if Smile declares it in a bridge package.
        packages = smile.get(missing.group(1), set())
        return "bridge" if packages & set(BRIDGE_SCOPE) else "stub"
    owner = _owner(block)
    if owner is not None:
        name = owner.split("<")[0]
        for prefix in ("smile.deep.tensor.", "smile.llm.cache.", "smile.llm.engine.", "smile.llm."):
            if name.startswith(prefix) and name[len(prefix):] in bridge:
                name = name[len(prefix):]
        if name in ("smile.llm", "smile.llm.cache", "smile.llm.engine", "smile.deep.tensor"):
            return "bridge"  # a type missing from one of the bridge's packages (stubbed ones are found)
        if name == "Tensor":
            return "device"
        if name in bridge and name.split(".")[0] not in own:
            return "bridge"
        return "stub"
    # No owner named (incompatible types, ...): the bridge's if it names one of the bridge's types.
    lines = block.splitlines()  # the message and its detail, not the source line javac echoes
    text = " ".join([lines[0].split(": error: ", 1)[-1], *(s for s in lines[2:] if s.strip() != "^")])
    words = set(re.findall(r"[A-Z]\w*(?:\.[A-Z]\w*)*", text))
    named = {w for w in words if w in bridge and w.split(".")[0] not in own}
    if named == {"Tensor"}:
        return "device"
    return "bridge" if named else "stub"


def compile_stubs(javac: Path, jar: Path, out: Path, skip: set[str]) -> None:
    """Compile the stubs, except the ones whose path (``smile/llm/model/llama/Llama.java``) is in ``skip``."""
    files = [str(p) for p in sorted(STUBS.rglob("*.java")) if str(p.relative_to(STUBS)) not in skip]
    done = subprocess.run([str(javac), *JAVAC_FLAGS, "-d", str(out), "-cp", str(jar), *files], capture_output=True,
                          text=True, timeout=COMPILE_TIMEOUT_S)
    if done.returncode:
        raise SystemExit(f"smile_java_compile: the stubs do not compile:\n{done.stderr}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--smile", type=Path, required=True, help="haifengl/smile: a git repository or checkout")
    ap.add_argument("--ref", default="torch", help="the git ref to read the sources from (default: torch)")
    ap.add_argument("--files", default=",".join(DEFAULT_FILES), help="source paths in Smile, comma-separated")
    ap.add_argument("--errors", type=int, default=3, help="stub and device errors shown per file")
    args = ap.parse_args(argv)
    paths = [p for p in args.files.split(",") if p]
    jdks = [j for j in discover() if (j.home / "bin" / "javac").exists()]
    if not jdks:
        print("smile_java_compile: no JDK with javac found", file=sys.stderr)
        return 2
    javac = jdks[0].home / "bin" / "javac"
    jar = bridge_jar()
    bridge = bridge_classes(jar)
    sources = read_sources(args.smile, args.ref, paths)
    types = smile_types(args.smile, args.ref)
    rows: list[tuple[str, str, int, int, int]] = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for path in paths:
            name = Path(path).name
            if path not in sources:
                rows.append((name, "not found", 0, 0, 0))
                continue
            text = sources[path]
            package = re.search(r"^package\s+([\w.]+);", text, re.M)
            rel = (package.group(1).replace(".", "/") + "/" if package else "") + name
            stubs = root / "stubs" / name
            compile_stubs(javac, jar, stubs, {rel})
            src = root / "src" / name / rel
            src.parent.mkdir(parents=True, exist_ok=True)
            src.write_text(text, encoding="utf-8")
            # The file first on the class path: a class it declares is compiled from it, not read from the jar.
            done = subprocess.run([str(javac), *JAVAC_FLAGS, "-d", str(root / "out" / name), "-cp",
                                   f"{stubs}:{jar}", "-sourcepath", "", str(src)], capture_output=True, text=True,
                                  timeout=COMPILE_TIMEOUT_S)
            own = set(re.findall(r"\b(?:class|interface|enum|record)\s+(\w+)", text))
            kinds: dict[str, list[str]] = {"bridge": [], "device": [], "stub": []}
            for block in split_errors(done.stderr):
                kinds[classify(block, bridge, own, types)].append(block.split(str(src.parent) + "/")[-1])
            for kind, label in (("bridge", "bridge API"), ("device", "device tensor (out of scope)"),
                                ("stub", "stub")):
                shown = kinds[kind] if kind == "bridge" else kinds[kind][:args.errors]
                for block in shown:
                    detail = " | ".join(s.strip() for s in block.splitlines()[1:] if s.strip().startswith(
                        ("symbol:", "location:", "required:", "found:", "reason:")))
                    print(f"  {name} [{label}]: {block.splitlines()[0]}" + (f"  ({detail})" if detail else ""))
            compiled = "yes" if done.returncode == 0 else "no"
            rows.append((name, compiled, len(kinds["bridge"]), len(kinds["stub"]), len(kinds["device"])))
    print(f"\nSmile's sources ({args.smile}, {args.ref}) against the bridge jar and stubs, {jdks[0]}:")
    print("| file | compiles | bridge-API errors | stub errors | device tensor (out of scope) |\n|---|---|---|---|---|")
    for name, compiled, n_bridge, n_stub, n_device in rows:
        print(f"| {name} | {compiled} | {n_bridge} | {n_stub} | {n_device} |")
    return 1 if any(r[2] or r[1] == "not found" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
