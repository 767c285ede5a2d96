"""Fixtures of the JVM bridge tests.

The whole folder is skipped at collection when ``javac`` or JPype is missing (each module calls
``require_java()`` before importing anything that needs them). The Java test drivers under
``tests/java_bridge/java`` are compiled once per session against the bridge jar. The JVM starts lazily, the first
time a test asks for ``jvm``, once per pytest process (JPype cannot restart it, so it is never shut down); the
Python implementations are then registered with ``smile.llm.python.Bridge`` the way the launcher does. Tests
that need a fresh process (the launcher, ``System.exit``) use ``java_classes`` only and run in a subprocess.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

MISSING = ("no javac on PATH: the JVM bridge tests need a JDK 17 or newer" if shutil.which("javac") is None
           else "JPype is not installed (pip install -e '.[java]')" if importlib.util.find_spec("jpype") is None
           else "")


def require_java() -> None:
    """Skip the calling test module at collection, before it imports JPype, when javac or JPype is missing.

    (Every module of this folder calls it first: a skip raised while pytest loads a conftest.py aborts the run
    when the folder is named on the command line, so the conftest itself never skips.)"""
    if MISSING:
        pytest.skip(MISSING, allow_module_level=True)


JAVA_TESTS = Path(__file__).parent / "java"
EXAMPLES = Path(__file__).resolve().parents[2] / "java_bridge" / "examples"
SCALE = os.environ.get("SMILE_TEST_SCALE", "full")


def scenario_names(class_file: str) -> list[str]:
    """The ``@Scenario`` methods of a driver, read from its source (the JVM is not running at collection)."""
    src = (JAVA_TESTS / "bridgetest" / class_file).read_text(encoding="utf-8")
    return re.findall(r"@Scenario\s+public\s+static\s+void\s+(\w+)\s*\(", src)


@pytest.fixture(scope="session")
def java_classes(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The test drivers and the shipped examples (``java_bridge/examples``, default package) compiled with
    ``javac --release 17`` against the bridge jar."""
    from java_bridge.build import bridge_jar, compile_java

    sources = sorted(JAVA_TESTS.rglob("*.java")) + sorted(EXAMPLES.glob("*.java"))
    return compile_java(sources, tmp_path_factory.mktemp("java_bridge") / "classes", classpath=[bridge_jar()])


@dataclass
class Jvm:
    """The running JVM with the Python implementations registered."""

    jpype: Any
    bridge: Any  # the smile.llm.python.Bridge class
    factory: Any  # the registered FactoryAdapter
    model: Any  # the smile_llm.LanguageModel registered as "model"
    model_adapter: Any  # its LanguageModelAdapter

    def cls(self, name: str) -> Any:
        return self.jpype.JClass(name)


@pytest.fixture(scope="session")
def jvm(java_classes: Path) -> Iterator[Jvm]:
    """Starts the JVM (once per process, with the drivers on the class path) and registers the factory, the
    default model as "model" and "pinCurrentThread", as ``python -m java_bridge`` does."""
    from smile_llm import LanguageModel

    model = LanguageModel.default()  # torch initialises before the JVM starts, as in the launcher
    from java_bridge.jvm import start_jvm

    started_before = _jvm_started()
    jpype = start_jvm([java_classes])
    try:
        jpype.JClass("bridgetest.Scenarios")
    except Exception as exc:  # noqa: BLE001
        if started_before:
            pytest.fail(f"a JVM was started earlier in this process without the test drivers on its class path "
                        f"(JPype cannot add class path entries or restart it): {exc}")
        raise
    from java_bridge.adapters import FactoryAdapter, LanguageModelAdapter, PinThread

    bridge = jpype.JClass("smile.llm.python.Bridge")
    factory = FactoryAdapter()
    bridge.registerFactory(factory)
    bridge.register("pinCurrentThread", PinThread())
    adapter = LanguageModelAdapter(model)
    bridge.register("model", adapter)
    yield Jvm(jpype, bridge, factory, model, adapter)
    # the JVM stays up (it cannot restart); release what this session made
    factory._close_all()
    model.close()


@pytest.fixture(scope="session")
def plain_model(jvm: Jvm, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The default model without a chat template (its folder copied without ``chat_template.jinja`` and
    ``tokenizer_config.json``), registered for Java as "plainModel"."""
    from java_bridge.adapters import LanguageModelAdapter
    from smile_llm import LanguageModel
    from smile_llm.text.chat_template import CONFIG_FILE, TEMPLATE_FILE
    from smile_llm.models.shipped import DEFAULT_MODEL_DIR

    folder = tmp_path_factory.mktemp("plain_model")
    for f in DEFAULT_MODEL_DIR.iterdir():
        if f.name not in (TEMPLATE_FILE, CONFIG_FILE) and f.suffix in (".json", ".safetensors"):
            shutil.copy(f, folder / f.name)
    model = LanguageModel.from_pretrained(folder, max_seq_len=256, max_batch_size=1)
    assert model.chat_template is None
    jvm.bridge.register("plainModel", LanguageModelAdapter(model))
    yield model
    model.close()


def _jvm_started() -> bool:
    import jpype

    return bool(jpype.isJVMStarted())
