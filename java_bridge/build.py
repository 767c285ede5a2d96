"""Compiling the bridge's Java sources with ``javac --release 17`` (Maven is not needed), cached by
source hash."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
import zipfile
from pathlib import Path

JAVA_SOURCES = Path(__file__).parent / "java"
JAVA_RELEASE = 17  # javac --release of the bridge jar: it loads on every JDK >= 17


def cache_dir() -> Path:
    """Where built jars go: ``SMILE_JAVA_CACHE``, else ``~/.cache/smile-llm/java``."""
    return Path(os.environ.get("SMILE_JAVA_CACHE", Path.home() / ".cache" / "smile-llm" / "java"))


def _sources(root: Path) -> list[Path]:
    return sorted(root.rglob("*.java"))


def _digest(files: list[Path], extra: str = "") -> str:
    h = hashlib.sha256(extra.encode())
    for f in files:
        h.update(str(f.name).encode())
        h.update(f.read_bytes())
    return h.hexdigest()[:16]


def compile_java(sources: list[Path] | Path, out_dir: Path,
                 classpath: list[Path] | None = None) -> Path:
    """``javac --release 17`` of ``sources`` (files, or every ``.java`` under a folder) into
    ``out_dir``. RuntimeError with javac's output if it fails or no ``javac`` is on PATH."""
    files = _sources(sources) if isinstance(sources, Path) else list(sources)
    javac = shutil.which("javac")
    if javac is None:
        raise RuntimeError("javac not found on PATH: install a JDK 17 or newer")
    out_dir.mkdir(parents=True, exist_ok=True)
    cmd = [javac, "--release", str(JAVA_RELEASE), "-encoding", "UTF-8", "-d", str(out_dir)]
    if classpath:
        cmd += ["-cp", os.pathsep.join(str(p) for p in classpath)]
    done = subprocess.run(cmd + [str(f) for f in files], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"javac failed ({done.returncode}):\n{done.stdout}{done.stderr}")
    return out_dir


def bridge_jar() -> Path:
    """The jar of the bridge's Java interfaces, built on first use and reused while the sources are
    unchanged."""
    files = _sources(JAVA_SOURCES)
    jar = cache_dir() / f"smile-llm-bridge-{_digest(files)}.jar"
    if jar.exists():
        return jar
    jar.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        classes = compile_java(files, Path(tmp) / "classes")
        partial = jar.with_suffix(f".{os.getpid()}.tmp")
        with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as z:
            z.writestr("META-INF/MANIFEST.MF",
                       "Manifest-Version: 1.0\nCreated-By: smile-llm java_bridge\n")
            for f in sorted(classes.rglob("*.class")):
                z.write(f, f.relative_to(classes).as_posix())
        os.replace(partial, jar)  # atomic: concurrent builds never see a half-written jar
    return jar


if __name__ == "__main__":
    print(bridge_jar())
