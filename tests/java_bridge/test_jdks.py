"""Choosing the JDK (``java_bridge.jdks``): class-file versions, JDK discovery on fake JDK folders,
the choice and its errors; then the launcher running a Java 25 application on an installed JDK 25
(skipped without ``javac``, JPype or a JDK 25 with its ``javac``)."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from java_bridge import jdks
from java_bridge.jdks import ClassVersion, Jdk, JdkError

from .conftest import MISSING

REPO = Path(__file__).resolve().parents[2]
TIMEOUT = 180


def header(major: int, minor: int = 0) -> bytes:
    """The first 8 bytes of a class file of that version, plus a little body."""
    return jdks.CLASS_MAGIC + minor.to_bytes(2, "big") + major.to_bytes(2, "big") + b"\0" * 8


def write_class(root: Path, name: str, major: int) -> Path:
    path = root / (name.replace(".", "/") + ".class")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(header(major))
    return path


def fake_jdk(home: Path, version: str | None, libjvm: bool = True) -> Path:
    """A folder that looks like a JDK: a ``release`` file (none if ``version`` is None) and an
    empty ``lib/server/libjvm.so``."""
    home.mkdir(parents=True, exist_ok=True)
    if version is not None:
        (home / "release").write_text(f'IMPLEMENTOR="Test"\nJAVA_VERSION="{version}"\n'
                                      f'OS_NAME="Linux"\n')
    if libjvm:
        (home / "lib" / "server").mkdir(parents=True, exist_ok=True)
        (home / "lib" / "server" / "libjvm.so").write_bytes(b"")
    return home


@pytest.fixture
def no_system_jdks(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No JAVA_HOME and no ``java`` on PATH, so discovery sees only the roots a test passes."""
    monkeypatch.delenv("JAVA_HOME", raising=False)
    empty = tmp_path / "empty-path"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))


# ---- class-file versions ----------------------------------------------------------------------

def test_class_file_major_reads_the_header() -> None:
    assert jdks.class_file_major(header(69)) == 69
    assert jdks.class_file_major(header(61, minor=3)) == 61
    assert jdks.class_file_major(b"PK\3\4" + b"\0" * 8) is None  # not a class file
    assert jdks.class_file_major(jdks.CLASS_MAGIC + b"\0\0") is None  # truncated
    assert ClassVersion("A.class", 69).feature == 25 and ClassVersion("A.class", 52).feature == 8


def test_version_key_orders_release_versions() -> None:
    assert jdks.version_key("25.0.3") == (25, 0, 3)
    assert jdks.version_key("1.8.0_392") == (8, 0, 392)
    assert jdks.version_key("26-ea") == (26,)
    assert jdks.version_key("17.0.15") < jdks.version_key("21") < jdks.version_key("25.0.1")
    with pytest.raises(ValueError):
        jdks.version_key("unknown")


def test_the_main_class_decides_in_a_folder(tmp_path: Path) -> None:
    write_class(tmp_path, "com.example.App", 61)
    newer = write_class(tmp_path, "com.example.Util", 69)
    found = jdks.required_java([tmp_path], "com.example.App")
    assert found == ClassVersion(str(tmp_path / "com/example/App.class"), 61)
    # without the main class (or a main not on the class path): the highest version found
    assert jdks.required_java([tmp_path]) == ClassVersion(str(newer), 69)
    assert jdks.required_java([tmp_path], "com.example.Missing") == ClassVersion(str(newer), 69)


def test_jars_the_first_entry_with_the_main_class_and_meta_inf_skipped(tmp_path: Path) -> None:
    jar = tmp_path / "app.jar"
    with zipfile.ZipFile(jar, "w") as z:
        z.writestr("META-INF/MANIFEST.MF", "Manifest-Version: 1.0\n")
        z.writestr("META-INF/versions/25/app/Lib.class", header(69))  # a multi-release variant
        z.writestr("app/Lib.class", header(55))
        z.writestr("app/Main.class", header(65))
    classes = tmp_path / "classes"
    write_class(classes, "app.Main", 61)
    assert jdks.required_java([jar, classes], "app.Main") == ClassVersion(f"{jar}!app/Main.class",
                                                                          65)
    assert jdks.required_java([classes, jar], "app.Main").major == 61  # the JVM loads this one
    assert jdks.required_java([jar]) == ClassVersion(f"{jar}!app/Main.class", 65)


def test_unreadable_entries_are_skipped_and_the_scan_is_bounded(tmp_path: Path) -> None:
    not_a_jar = tmp_path / "notes.txt"
    not_a_jar.write_text("hello")
    assert jdks.required_java([not_a_jar, tmp_path / "missing.jar"], "App") is None
    classes = tmp_path / "classes"
    for i in range(5):
        write_class(classes, f"p.C{i}", 61)
    write_class(classes, "q.Last", 69)  # "q" sorts after "p": past a limit of 5 files
    assert jdks.required_java([classes], limit=5).major == 61
    assert jdks.required_java([classes], limit=6).major == 69


# ---- discovery --------------------------------------------------------------------------------

def test_probe_needs_a_release_file_and_a_libjvm(tmp_path: Path) -> None:
    jdk = jdks.probe(fake_jdk(tmp_path / "jdk-25", "25.0.1"))
    assert jdk == Jdk(tmp_path / "jdk-25", "25.0.1", tmp_path / "jdk-25/lib/server/libjvm.so")
    assert jdk.feature == 25 and str(jdk) == f"Java 25.0.1 at {tmp_path / 'jdk-25'}"
    assert jdks.probe(fake_jdk(tmp_path / "no-libjvm", "21.0.2", libjvm=False)) is None
    assert jdks.probe(fake_jdk(tmp_path / "no-release", None)) is None
    assert jdks.probe(tmp_path / "missing") is None


@pytest.mark.usefixtures("no_system_jdks")
def test_discover_lists_jdks_newest_first_once_each(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    tmp_path = tmp_path.resolve()  # homes are listed resolved
    root = tmp_path / "jvm"
    fake_jdk(root / "java-17", "17.0.2")
    fake_jdk(root / "temurin-25", "25.0.1")
    fake_jdk(root / "java-21-jre-only", "21.0.1", libjvm=False)  # no libjvm: not startable
    fake_jdk(root / "docs", None)
    (root / "java-1.25").symlink_to(root / "temurin-25")  # Debian-style alias: counted once
    assert [j.version for j in jdks.discover([root])] == ["25.0.1", "17.0.2"]
    # JAVA_HOME is one more candidate (first among equal versions), not a forced choice
    monkeypatch.setenv("JAVA_HOME", str(fake_jdk(tmp_path / "elsewhere" / "jdk-21", "21.0.4")))
    assert [j.version for j in jdks.discover([root])] == ["25.0.1", "21.0.4", "17.0.2"]
    monkeypatch.setenv("JAVA_HOME", str(root / "java-17"))
    assert [j.home for j in jdks.discover([root])] == [root / "temurin-25", root / "java-17"]
    # a root that is a JDK itself (macOS Contents/Home), and the JDK of `java` on PATH
    mac = fake_jdk(tmp_path / "Mac" / "jdk-26.jdk" / "Contents" / "Home", "26")
    bin_dir = fake_jdk(tmp_path / "path-jdk", "22.0.1") / "bin"
    bin_dir.mkdir()
    (bin_dir / "java").write_text("#!/bin/sh\n")
    (bin_dir / "java").chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_dir))
    assert [j.version for j in jdks.discover([root, mac])] == ["26", "25.0.1", "22.0.1", "17.0.2"]


# ---- the choice -------------------------------------------------------------------------------

def test_choose_the_newest_jdk_that_loads_the_classes(tmp_path: Path) -> None:
    j17 = jdks.probe(fake_jdk(tmp_path / "17", "17.0.15"))
    j21 = jdks.probe(fake_jdk(tmp_path / "21", "21.0.4"))
    j11 = jdks.probe(fake_jdk(tmp_path / "11", "11.0.2"))
    assert j17 and j21 and j11
    app17, app21 = ClassVersion("App.class", 61), ClassVersion("App.class", 65)
    assert jdks.choose(app17, jdks=[j21, j17]) == j21  # the newest, not the oldest that fits
    assert jdks.choose(app21, jdks=[j21, j17]) == j21
    assert jdks.choose(None, jdks=[j17, j11]) == j17
    # the bridge jar itself needs Java 17, whatever the application's classes say
    with pytest.raises(JdkError, match="the bridge jar \\(Java 17\\) and App.class \\(class file "
                                       "version 52, Java 8\\): it needs Java 17 or newer"):
        jdks.choose(ClassVersion("App.class", 52), jdks=[j11])


def test_no_jdk_new_enough_names_the_class_file_version_and_the_jdks_found(tmp_path: Path) -> None:
    j17 = jdks.probe(fake_jdk(tmp_path / "17", "17.0.15"))
    j21 = jdks.probe(fake_jdk(tmp_path / "21", "21.0.4"))
    assert j17 and j21
    with pytest.raises(JdkError) as err:
        jdks.choose(ClassVersion("out/App.class", 69), jdks=[j21, j17])
    assert str(err.value) == (
        f"no installed JDK can run out/App.class (class file version 69, Java 25): it needs Java "
        f"25 or newer; found: Java 21.0.4 at {tmp_path / '21'}; Java 17.0.15 at "
        f"{tmp_path / '17'} (install a JDK 25+ or pass --java-home DIR)")
    with pytest.raises(JdkError, match="found: none"):
        jdks.choose(ClassVersion("out/App.class", 69), jdks=[])


def test_java_home_is_used_as_given_or_refused(tmp_path: Path) -> None:
    j17 = fake_jdk(tmp_path / "17", "17.0.15")
    j25 = fake_jdk(tmp_path / "25", "25.0.3")
    app25 = ClassVersion("out/App.class", 69)
    # exactly that one, even when a newer one is listed
    assert jdks.choose(ClassVersion("out/App.class", 61), j17, jdks=[jdks.probe(j25)]).home == j17
    assert jdks.choose(app25, str(j25)).version == "25.0.3"
    with pytest.raises(JdkError) as err:
        jdks.choose(app25, j17)
    assert str(err.value) == (f"--java-home {j17} is Java 17.0.15, too old for out/App.class "
                              f"(class file version 69, Java 25): it needs Java 25 or newer")
    with pytest.raises(JdkError, match="is not a JDK or JRE with a libjvm"):
        jdks.choose(app25, fake_jdk(tmp_path / "jre", "25.0.3", libjvm=False))
    with pytest.raises(JdkError, match="is not a JDK or JRE with a libjvm"):
        jdks.choose(app25, tmp_path / "missing")


def test_java_home_option_is_parsed() -> None:
    from java_bridge.launch import parse

    base = ["--classpath", "x.jar", "--main", "App"]
    assert parse(base).java_home is None
    assert parse(base + ["--java-home", "/opt/jdk"]).java_home == "/opt/jdk"


# ---- the launcher on real JDKs ----------------------------------------------------------------

APP = """
import smile.llm.cache.KvCachePool;
import smile.llm.python.Bridge;

public class VersionApp {
    public static void main(String[] args) {
        try (KvCachePool pool = Bridge.newKvCachePool(1, 16, 1, 4, 1, "float32")) {
            System.out.println("VersionApp java=" + Runtime.version().feature()
                               + " slots=" + pool.numSlots());
        }
    }
}
"""


def _newest_with_javac(minimum: int) -> Jdk | None:
    return next((j for j in jdks.discover()
                 if j.feature >= minimum and (j.home / "bin" / "javac").is_file()), None)


@pytest.fixture(scope="module")
def newest() -> Jdk:
    """The newest installed JDK, when it is 25 or newer and has a javac (else the test skips)."""
    if MISSING:
        pytest.skip(MISSING)
    jdk = _newest_with_javac(25)
    if jdk is None or jdk != jdks.discover()[0]:
        pytest.skip("no JDK 25 or newer with a javac is installed (e.g. under /usr/lib/jvm)")
    return jdk


def compile_app(javac: Path, release: int, out: Path) -> Path:
    from java_bridge.build import bridge_jar

    out.mkdir(parents=True, exist_ok=True)
    (out / "VersionApp.java").write_text(APP, encoding="utf-8")
    done = subprocess.run([str(javac), "--release", str(release), "-encoding", "UTF-8", "-cp",
                           str(bridge_jar()), "-d", str(out / "classes"),
                           str(out / "VersionApp.java")],
                          capture_output=True, text=True, timeout=TIMEOUT)
    assert done.returncode == 0, done.stdout + done.stderr
    return out / "classes"


@pytest.fixture(scope="module")
def app25(newest: Jdk, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """VersionApp compiled with the JDK 25+'s javac --release 25 (class file version 69)."""
    return compile_app(newest.home / "bin" / "javac", 25, tmp_path_factory.mktemp("app25"))


def launch(classes: Path, *options: str,
           env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "java_bridge", "--classpath", str(classes), "--main",
           "VersionApp", "--no-model", *options]
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=TIMEOUT,
                          env=env)


def test_a_java_25_app_runs_on_the_newest_jdk(app25: Path, newest: Jdk) -> None:
    assert jdks.required_java([app25], "VersionApp") == ClassVersion(
        str(app25 / "VersionApp.class"), 69)
    done = launch(app25)
    assert done.returncode == 0, done.stderr
    assert f"VersionApp java={newest.feature} slots=16" in done.stdout
    assert "WARNING" not in done.stderr  # JDK 24+'s native-access warning is switched off


def test_java_home_is_a_candidate_not_the_choice(app25: Path, newest: Jdk) -> None:
    old = next((j for j in jdks.discover() if 17 <= j.feature < 25), None)
    if old is None:
        pytest.skip("no JDK 17..24 installed besides the JDK 25")
    done = launch(app25, env={**os.environ, "JAVA_HOME": str(old.home)})
    assert done.returncode == 0, done.stderr
    assert f"VersionApp java={newest.feature} slots=16" in done.stdout


def test_a_java_17_app_runs_on_the_newest_jdk_too(newest: Jdk, tmp_path: Path) -> None:
    classes = compile_app(newest.home / "bin" / "javac", 17, tmp_path / "app17")
    assert jdks.required_java([classes], "VersionApp") == ClassVersion(
        str(classes / "VersionApp.class"), 61)
    done = launch(classes)
    assert done.returncode == 0, done.stderr
    assert f"VersionApp java={newest.feature} slots=16" in done.stdout


def test_java_home_too_old_for_the_app_exits_2_naming_both_versions(app25: Path,
                                                                   tmp_path: Path) -> None:
    old = next((j for j in jdks.discover() if 17 <= j.feature < 25), None)
    if old is None:
        pytest.skip("no JDK 17..24 installed besides the JDK 25")
    done = launch(app25, "--java-home", str(old.home))
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"java_bridge: --java-home {old.home} is Java {old.version}, too old for "
        f"{app25 / 'VersionApp.class'} (class file version 69, Java 25): it needs Java 25 or newer"]
    done = launch(app25, "--java-home", str(tmp_path))
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"java_bridge: --java-home {tmp_path} is not a JDK or JRE with a libjvm (it needs a "
        f"release file with JAVA_VERSION and lib/server/libjvm.so)"]
