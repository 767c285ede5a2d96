"""Compile Smile's own application code against the bridge jar: does code written for Smile's API build on it?

    .venv/bin/python scripts/smile_java_compile.py --smile PATH [--ref torch] [--files A,B,...] [--errors N]

PATH is a git repository of haifengl/smile (the sources are read from ``--ref`` with ``git show``) or a plain
checkout (read from its working files). Nothing of Smile is copied into this repository: each source is written to
a temporary folder and compiled alone, with the newest installed JDK, against the bridge jar and the project's
stubs (``scripts/java/stubs/``): minimal declarations of what these files use outside the bridge's scope
(Jackson, slf4j, Jakarta/Quarkus, ``smile.llm.attention``, ``checkpoint``, ``model``, ``parallel``,
``smile.util``, ``smile.torch``, the serve module's siblings of ``ChatService``, ``smile.deep.tensor.Index``,
``NoGradGuard`` and ``SafeTensors``). The file under test replaces its own stub (Smile's ``InferenceEngine``
replaces the bridge's class: it is compiled as a user of the bridge's executor API).

The LibTorch device members of ``smile.deep.tensor.Tensor`` that these files call (views, ``to(Device)``,
``get(Index...)``, ``Tensor.Options``, scopes, ...) are stubbed too, for this check only: a shadow
``smile/deep/tensor/Tensor.java`` is built in the temporary folder from the bridge's own source
(``java_bridge/java/smile/deep/tensor/Tensor.java``, read at run time) with the members of
``scripts/java/stubs/tensor_device_members.java.txt`` appended, compiled first, and put ahead of the jar on the class
path (``scripts/java_shadow.py``, shared with ``smile_java_tests.py``). The product's ``Tensor`` stays the host-array
subset. The fragment may not declare a name that the bridge's ``Tensor`` declares (the script refuses to run): an
overload there would make a call that the bridge's member does not accept compile, hiding a bridge-API error.

javac's errors are sorted into two kinds:
- bridge API: a member or type of ``smile.llm``, ``smile.llm.cache``, ``smile.llm.engine`` or the bridge's
  ``smile.deep.tensor`` classes is missing or typed differently. These are the bridge's gaps. An error about a
  ``Tensor`` member that the jar's ``Tensor`` declares (called with another signature) is one. An error that names
  no class's member (incompatible types, ...) counts as one when the call javac points at has the name of a member
  of the jar's ``Tensor`` (its receiver is not known: a possible false alarm, never a hidden gap) or when the
  message names one of the bridge's types.
- stub: a member or type of a stubbed class is missing or typed differently (the stubs are incomplete; not the
  bridge's concern). This includes a ``Tensor`` member that the bridge's ``Tensor`` does not declare (a device
  member that the fragment lacks or declares with another signature) and the members of its stubbed nested types.

Prints each bridge-API error, the first ``--errors`` stub errors per file, and a table. Exit status 0 when no
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

sys.path.insert(0, str(REPO / "scripts"))

from java_bridge.build import bridge_jar  # noqa: E402 - after the path
from java_bridge.jdks import discover  # noqa: E402
from java_shadow import (COMPILE_TIMEOUT_S, JAVAC_FLAGS, TENSOR, build_shadow,  # noqa: E402
                         check_shadow, compile_stubs)

DEFAULT_FILES = ("deep/src/main/java/smile/llm/model/llama/Llama.java",
                 "deep/src/main/java/smile/llm/model/qwen/Qwen.java",
                 "deep/src/main/java/smile/llm/engine/InferenceEngine.java",
                 "serve/src/main/java/smile/chat/ChatService.java")
BRIDGE_PACKAGES = ("smile/llm/", "smile/llm/cache/", "smile/llm/engine/", "smile/deep/tensor/")
BRIDGE_SCOPE = ("smile.llm", "smile.llm.cache", "smile.llm.engine")  # smile.deep.tensor: only the jar's classes


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


def tensor_member(block: str) -> str | None:
    """The name of the ``smile.deep.tensor.Tensor`` member (method, field or nested type) that the error is about,
    or None when it is not about one."""
    text = block + "\n"
    tensor = r"(?:smile\.deep\.tensor\.)?Tensor"
    if re.search(rf"location: (?:class|variable \S+ of type) {tensor}\n", text):
        m = re.search(r"symbol: +(?:static )?(?:method|variable|class) (\w+)", text)
        return m.group(1) if m else None
    m = re.search(rf"(?:method|constructor) (\w+) in class {tensor} cannot be applied", text)
    if m:
        return m.group(1)
    m = re.search(r"no suitable (?:method|constructor) found for (\w+)\(", text)
    candidates = re.findall(r"^\s+(?:method|constructor) ([\w.]+)\.\w+\(", text, re.M)
    if m and candidates and all(c in ("Tensor", "smile.deep.tensor.Tensor") for c in candidates):
        return m.group(1)
    return None


def call_at_caret(block: str) -> str | None:
    """The method whose call javac's caret points at (``shape`` for ``int n = t.shape();``), if it points at one."""
    lines = block.splitlines()
    if len(lines) < 3 or lines[2].strip() != "^":
        return None
    source, col = lines[1], lines[2].index("^")
    m = re.search(r"(\w+)\s*$", source[:col]) if source[col:col + 1] == "(" else re.match(r"\.?(\w+)\s*\(",
                                                                                            source[col:])
    return m.group(1) if m else None


def classify(block: str, bridge: dict[str, str], own: set[str], smile: dict[str, set[str]],
             tensor_names: set[str]) -> str:
    """"bridge" or "stub" for one javac error block. ``own`` holds the simple names declared by the file under test
    (its nested classes are neither the bridge's nor a stub's); ``smile`` is ``smile_types``; ``tensor_names`` the
    member names that the jar's ``Tensor`` declares."""
    member = tensor_member(block)
    if member is not None:
        # The bridge's member called with another signature is the bridge's gap; any other is a device stub's.
        return "bridge" if member in tensor_names else "stub"
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
        if name in bridge and name.split(".")[0] not in own:
            return "bridge"
        return "stub"
    # No owner named (incompatible types, ...): the bridge's if the call at the caret has the name of a member of
    # the bridge's Tensor (its receiver is not known, so this may be a false alarm, never a hidden gap) or if the
    # message names one of the bridge's types.
    if call_at_caret(block) in tensor_names:
        return "bridge"
    lines = block.splitlines()  # the message and its detail, not the source line javac echoes
    text = " ".join([lines[0].split(": error: ", 1)[-1], *(s for s in lines[2:] if s.strip() != "^")])
    words = set(re.findall(r"[A-Z]\w*(?:\.[A-Z]\w*)*", text))
    named = {w for w in words if w in bridge and w.split(".")[0] not in own}
    return "bridge" if named else "stub"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--smile", type=Path, required=True, help="haifengl/smile: a git repository or checkout")
    ap.add_argument("--ref", default="torch", help="the git ref to read the sources from (default: torch)")
    ap.add_argument("--files", default=",".join(DEFAULT_FILES), help="source paths in Smile, comma-separated")
    ap.add_argument("--errors", type=int, default=3, help="stub errors shown per file")
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
    rows: list[tuple[str, str, int, int]] = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        shadow = build_shadow(javac, jar, root / "tensor", TENSOR)
        tensor_names = check_shadow(jdks[0].home / "bin" / "javap", jar, shadow, TENSOR)
        for path in paths:
            name = Path(path).name
            if path not in sources:
                rows.append((name, "not found", 0, 0))
                continue
            text = sources[path]
            package = re.search(r"^package\s+([\w.]+);", text, re.M)
            rel = (package.group(1).replace(".", "/") + "/" if package else "") + name
            stubs = root / "stubs" / name
            # The shadow Tensor ahead of the jar, so the jar's Tensor is never read.
            compile_stubs(javac, f"{shadow}:{jar}", stubs, {rel})
            src = root / "src" / name / rel
            src.parent.mkdir(parents=True, exist_ok=True)
            src.write_text(text, encoding="utf-8")
            # The file first on the class path: a class it declares is compiled from it, not read from the jar.
            done = subprocess.run([str(javac), *JAVAC_FLAGS, "-d", str(root / "out" / name), "-cp",
                                   f"{stubs}:{shadow}:{jar}", "-sourcepath", "", str(src)], capture_output=True,
                                  text=True, timeout=COMPILE_TIMEOUT_S)
            own = set(re.findall(r"\b(?:class|interface|enum|record)\s+(\w+)", text))
            kinds: dict[str, list[str]] = {"bridge": [], "stub": []}
            for block in split_errors(done.stderr):
                kind = classify(block, bridge, own, types, tensor_names)
                kinds[kind].append(block.split(str(src.parent) + "/")[-1])
            for kind, label in (("bridge", "bridge API"), ("stub", "stub")):
                shown = kinds[kind] if kind == "bridge" else kinds[kind][:args.errors]
                for block in shown:
                    detail = " | ".join(s.strip() for s in block.splitlines()[1:] if s.strip().startswith(
                        ("symbol:", "location:", "required:", "found:", "reason:")))
                    print(f"  {name} [{label}]: {block.splitlines()[0]}" + (f"  ({detail})" if detail else ""))
            compiled = "yes" if done.returncode == 0 else "no"
            rows.append((name, compiled, len(kinds["bridge"]), len(kinds["stub"])))
    print(f"\nSmile's sources ({args.smile}, {args.ref}) against the bridge jar and stubs (device Tensor members "
          f"stubbed), {jdks[0]}:")
    print("| file | compiles | bridge-API errors | stub errors |\n|---|---|---|---|")
    for name, compiled, n_bridge, n_stub in rows:
        print(f"| {name} | {compiled} | {n_bridge} | {n_stub} |")
    return 1 if any(r[2] or r[1] == "not found" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
