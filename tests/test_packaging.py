"""Packaging: what ``pip install .`` declares and resolves, and ``smile-llm --version``.

The base install carries everything a checkpoint folder and a chat need (tokenizers, jinja2); the license is an
SPDX expression; torch is pinned to the releases the suite runs on, and with a CPU torch already installed pip keeps
it (no CUDA wheels); the README tells a CPU-only user how to get that CPU torch first."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from smile_llm import cli

tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
from packaging.requirements import Requirement  # noqa: E402
from packaging.version import Version  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
TESTED_TORCH = ("2.13.0",)  # the torch releases this suite has run on


def base_requirements() -> dict[str, Requirement]:
    return {Requirement(r).name.lower(): Requirement(r) for r in PYPROJECT["project"]["dependencies"]}


def test_the_base_install_has_the_tokenizer_and_the_chat_template_engine() -> None:
    deps = base_requirements()
    assert {"torch", "numpy", "safetensors", "tokenizers", "jinja2"} <= set(deps)


def test_the_license_is_an_spdx_expression_and_setuptools_can_read_it() -> None:
    assert PYPROJECT["project"]["license"] == "GPL-3.0-or-later"
    setuptools = next(Requirement(r) for r in PYPROJECT["build-system"]["requires"]
                      if Requirement(r).name == "setuptools")
    assert not setuptools.specifier.contains("76.9") and setuptools.specifier.contains("77.0")  # PEP 639 from 77


def test_torch_is_pinned_to_the_tested_releases() -> None:
    pin = base_requirements()["torch"].specifier
    assert all(pin.contains(v) for v in TESTED_TORCH)
    assert not pin.contains("2.12.1") and not pin.contains("2.14.0")  # never run here
    import torch

    assert pin.contains(Version(torch.__version__).base_version), torch.__version__


def test_the_readme_installs_cpu_torch_first_within_the_pin() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    found = re.search(r"pip install torch==([\d.]+) --index-url https://download\.pytorch\.org/whl/cpu", readme)
    assert found, "the README's install section gives no CPU torch command"
    assert base_requirements()["torch"].specifier.contains(found.group(1))
    assert re.search(r"pip install \.\s", readme[found.end():]), "no pip install . after the CPU torch command"


def test_with_torch_installed_pip_resolves_nothing_more(tmp_path: Path) -> None:
    """``pip install --dry-run`` of this project's metadata into this environment (which has the CPU torch and
    every other base dependency), offline: it would install the project alone, no torch and no nvidia-* wheel."""
    project = tmp_path / "project"
    for package in ("smile_llm", "java_bridge"):
        (project / package).mkdir(parents=True)
        (project / package / "__init__.py").write_text("")
    shutil.copy(REPO / "pyproject.toml", project)
    shutil.copy(REPO / "README.md", project)
    report = tmp_path / "report.json"
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--no-index", "--no-build-isolation",
                           "--quiet", "--report", str(report), str(project)], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    names = [item["metadata"]["name"].lower() for item in json.loads(report.read_text())["install"]]
    assert names == ["smile-llm"], names


def test_version_comes_from_the_installed_metadata_or_the_package() -> None:
    done = subprocess.run([sys.executable, "-m", "smile_llm", "--version"], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and done.stdout == f"smile-llm {PYPROJECT['project']['version']}\n", done


def test_version_falls_back_to_the_package_version(monkeypatch) -> None:
    import importlib.metadata

    import smile_llm

    def missing(name: str) -> str:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", missing)
    assert cli.version() == smile_llm.__version__ == PYPROJECT["project"]["version"]

