"""Which JDK the bridge starts: the newest installed one that can load the application's classes.

The contract, in three steps:

1. **What the application needs** (``required_java``): the class-file major version of the
   application's classes, read from the class path (folders of ``.class`` files and jars). The
   main class's own file decides when it is found (the first class-path entry that has it, as the
   JVM would load it); otherwise the highest version among at most ``MAX_CLASS_FILES`` class
   files (``META-INF/``, which holds multi-release variants, is skipped). A class file of major
   version ``m`` needs Java ``m - 44`` (61 is Java 17, 69 is Java 25). The bridge jar itself is
   compiled for Java ``BRIDGE_RELEASE``, so that is the floor.
2. **What is installed** (``discover``): ``JAVA_HOME``, the JDK of ``java`` on ``PATH``, every
   folder under ``/usr/lib/jvm`` and, on macOS, ``/Library/Java/JavaVirtualMachines/*/Contents/
   Home``. A folder counts when its ``release`` file has ``JAVA_VERSION`` and it has a libjvm
   (``lib/server/libjvm.so``; ``.dylib`` on macOS, ``bin/server/jvm.dll`` on Windows), which is
   what JPype loads. Symlinked duplicates count once; the list is newest first.
3. **The choice** (``choose``): with an explicit Java home, exactly that one, or ``JdkError`` if it
   has no libjvm or is too old (the message names both versions); otherwise the newest installed
   JDK that is new enough, or ``JdkError`` naming the class file, the Java version it needs and
   the JDKs found. ``JdkError`` messages are one line.

``JAVA_HOME`` is read here (``discover``), the one place this project looks at it.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import zipfile
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from .build import JAVA_RELEASE

BRIDGE_RELEASE = JAVA_RELEASE  # the bridge jar's javac --release: the oldest JDK that can run it
MAJOR_OFFSET = 44  # class-file major version - 44 = Java feature version
MAX_CLASS_FILES = 2000  # class files read per application when the main class is not found
CLASS_MAGIC = b"\xca\xfe\xba\xbe"
LINUX_ROOTS = (Path("/usr/lib/jvm"),)
MACOS_ROOT = Path("/Library/Java/JavaVirtualMachines")
LIBJVM = ("lib/server/libjvm.so", "lib/server/libjvm.dylib", "bin/server/jvm.dll")


class JdkError(RuntimeError):
    """No usable JDK: the message is one line, fit for ``java_bridge: <message>``."""


@dataclass(frozen=True)
class Jdk:
    """An installed JDK (or JRE) that JPype can start."""

    home: Path
    version: str  # the release file's JAVA_VERSION, e.g. "25.0.3" (or "1.8.0_392")
    libjvm: Path

    @property
    def feature(self) -> int:
        """The feature version: 25 for "25.0.3", 8 for "1.8.0_392"."""
        return version_key(self.version)[0]

    def __str__(self) -> str:
        return f"Java {self.version} at {self.home}"


@dataclass(frozen=True)
class ClassVersion:
    """The class file that sets what the application needs: ``where`` names it (``out/App.class``,
    ``app.jar!com/x/App.class``), ``major`` is its class-file major version."""

    where: str
    major: int

    @property
    def feature(self) -> int:
        """The oldest Java feature version that loads the class."""
        return self.major - MAJOR_OFFSET

    def __str__(self) -> str:
        return f"{self.where} (class file version {self.major}, Java {self.feature})"


def version_key(version: str) -> tuple[int, ...]:
    """The numbers of a ``JAVA_VERSION`` for ordering: ``"25.0.3"`` -> (25, 0, 3), ``"1.8.0_392"``
    -> (8, 0, 392), ``"26-ea"`` -> (26,). ValueError if it does not start with a number."""
    numbers = [int(n) for n in re.findall(r"\d+", version.split("-")[0])]
    if not numbers:
        raise ValueError(f"not a Java version: {version!r}")
    return tuple(numbers[1:] if numbers[0] == 1 and len(numbers) > 1 else numbers)


def class_file_major(header: bytes) -> int | None:
    """The major version of a class file from its first 8 bytes (None if they are not a class
    file's: magic 0xCAFEBABE, minor, major, big-endian)."""
    if len(header) < 8 or header[:4] != CLASS_MAGIC:
        return None
    return int.from_bytes(header[6:8], "big")


def _class_files(entry: Path) -> Iterator[tuple[str, bytes]]:
    """(where, header) of the class files of one class-path entry, lazily, ``META-INF`` skipped."""
    if entry.is_dir():
        for folder, dirs, files in os.walk(entry):
            dirs.sort()
            if Path(folder) == entry and "META-INF" in dirs:
                dirs.remove("META-INF")
            for name in sorted(files):
                if name.endswith(".class"):
                    path = Path(folder) / name
                    try:
                        with open(path, "rb") as f:
                            yield str(path), f.read(8)
                    except OSError:
                        continue
        return
    try:
        with zipfile.ZipFile(entry) as z:
            for info in z.infolist():
                name = info.filename
                if name.endswith(".class") and not name.startswith("META-INF/"):
                    with z.open(info) as f:
                        yield f"{entry}!{name}", f.read(8)
    except (OSError, zipfile.BadZipFile, RuntimeError):  # not a jar, unreadable, encrypted
        return


def _main_class_file(entry: Path, main: str) -> tuple[str, bytes] | None:
    """(where, header) of the main class's file in one class-path entry, or None."""
    name = main.replace(".", "/") + ".class"
    if entry.is_dir():
        path = entry / name
        try:
            with open(path, "rb") as f:
                return str(path), f.read(8)
        except OSError:
            return None
    try:
        with zipfile.ZipFile(entry) as z, z.open(name) as f:
            return f"{entry}!{name}", f.read(8)
    except (OSError, KeyError, zipfile.BadZipFile, RuntimeError):
        return None


def required_java(classpath: Iterable[str | Path], main: str | None = None,
                  limit: int = MAX_CLASS_FILES) -> ClassVersion | None:
    """The class file that decides which Java the application needs: the main class's (``main``, a
    binary name such as ``com.example.App``) in the first class-path entry that has it, else the
    one of highest major version among the first ``limit`` class files of the entries. None when
    no class file is found. Entries that are neither folders nor readable jars are skipped."""
    entries = [Path(e) for e in classpath]
    if main:
        for entry in entries:
            found = _main_class_file(entry, main)
            major = None if found is None else class_file_major(found[1])
            if found is not None and major is not None:
                return ClassVersion(found[0], major)
    best: ClassVersion | None = None
    seen = 0
    for entry in entries:
        for where, header in _class_files(entry):
            major = class_file_major(header)
            if major is not None and (best is None or major > best.major):
                best = ClassVersion(where, major)
            seen += 1
            if seen >= limit:
                return best
    return best


def probe(home: str | Path) -> Jdk | None:
    """The JDK in ``home``, or None unless it has a ``release`` file with ``JAVA_VERSION`` and a
    libjvm."""
    home = Path(home)
    try:
        release = (home / "release").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    found = re.search(r'^JAVA_VERSION="?([^"\s]+)"?\s*$', release, re.MULTILINE)
    if found is None:
        return None
    try:
        version_key(found.group(1))
    except ValueError:
        return None
    for rel in LIBJVM:
        if (home / rel).is_file():
            return Jdk(home, found.group(1), home / rel)
    return None


def _candidates(roots: Sequence[Path] | None) -> Iterator[Path]:
    java_home = os.environ.get("JAVA_HOME")
    if java_home:
        yield Path(java_home)
    java = shutil.which("java")
    if java:
        yield Path(java).resolve().parent.parent
    if roots is None:
        roots = list(LINUX_ROOTS)
        if sys.platform == "darwin":  # each Contents/Home is a JDK itself
            roots.extend(sorted(MACOS_ROOT.glob("*/Contents/Home")))
    for root in roots:
        if (root / "release").is_file():  # a JDK itself (the macOS Contents/Home folders)
            yield root
            continue
        try:
            yield from sorted(p for p in root.iterdir() if p.is_dir())
        except OSError:
            continue


def discover(roots: Sequence[Path] | None = None) -> list[Jdk]:
    """The installed JDKs that JPype can start, newest first (``JAVA_HOME``'s first among equal
    versions). Candidates: ``JAVA_HOME``, the JDK of ``java`` on ``PATH``, then each folder under
    ``roots`` (default ``/usr/lib/jvm``, plus ``/Library/Java/JavaVirtualMachines/*/Contents/Home``
    on macOS; a root that is itself a JDK counts as one). Each is checked by ``probe``; a folder
    reached twice (symlinks) counts once, under its resolved path."""
    found: list[Jdk] = []
    seen: set[Path] = set()
    for home in _candidates(roots):
        try:
            real = home.resolve()
        except OSError:
            continue
        if real in seen:
            continue
        seen.add(real)
        jdk = probe(real)
        if jdk is not None:
            found.append(jdk)
    return sorted(found, key=lambda j: version_key(j.version), reverse=True)  # stable


def _needs(app: ClassVersion | None) -> tuple[int, str]:
    """(feature version, why) of the oldest Java that runs the application with the bridge."""
    if app is None or app.feature <= BRIDGE_RELEASE:
        why = f"the bridge jar (Java {BRIDGE_RELEASE})"
        return BRIDGE_RELEASE, why if app is None else f"{why} and {app}"
    return app.feature, str(app)


def choose(app: ClassVersion | None, java_home: str | Path | None = None,
           jdks: Sequence[Jdk] | None = None) -> Jdk:
    """The JDK to start for an application whose classes need ``app`` (``required_java``).

    With ``java_home`` (the launcher's ``--java-home``): exactly that one; ``JdkError`` if it is
    not a JDK/JRE with a libjvm, or older than the application needs (naming both versions).
    Otherwise the newest of ``jdks`` (default ``discover()``) that is new enough; ``JdkError``
    naming the class file's Java version and the JDKs found if none is."""
    need, why = _needs(app)
    if java_home is not None:
        jdk = probe(java_home)
        if jdk is None:
            raise JdkError(f"--java-home {java_home} is not a JDK or JRE with a libjvm (it needs a "
                           f"release file with JAVA_VERSION and {LIBJVM[0]})")
        if jdk.feature < need:
            raise JdkError(f"--java-home {java_home} is Java {jdk.version}, too old for {why}: it "
                           f"needs Java {need} or newer")
        return jdk
    installed = discover() if jdks is None else list(jdks)
    for jdk in installed:
        if jdk.feature >= need:
            return jdk
    found = "; ".join(str(j) for j in installed) or "none"
    raise JdkError(f"no installed JDK can run {why}: it needs Java {need} or newer; found: {found} "
                   f"(install a JDK {need}+ or pass --java-home DIR)")
