"""The speculative-decoding laboratory: drafters x draft settings compared on one workload against
plain decoding, with lossless checks, per-round traces, a results table and plots
(``smile-llm spec-lab``, docs/speculative.md).

    from smile_llm.lab import LabConfig, run_lab, write_results
    result = run_lab(LabConfig(drafters=("mtp", "ngram"), ks=(1, 2, 3), workload="code"))
    print(result.best().configuration.label, result.passed)
    write_results(result, "lab_out", "run_lab(...)")

``workload.py`` (JSONL prompts, the shipped ``code`` and ``prose``), ``config.py`` (what runs),
``models.py`` (loading), ``timing.py`` (the drafter timing proxy), ``trace.py`` (per-round counts),
``lossless.py`` and ``chi2.py`` (the checks), ``runner.py`` (the loop), ``result.py``, ``report.py``
and ``plots.py`` (the output).
"""

from __future__ import annotations

from .chi2 import ChiSquare, chi2_sf, two_sample_chi2
from .config import (
    Configuration,
    LabConfig,
    parse_ks,
    parse_names,
    parse_trees,
    policy_supported,
    trees_supported,
)
from .errors import LabError
from .lossless import LosslessCheck, Mismatch
from .report import write_results
from .result import ConfigResult, LabResult, Timings
from .runner import run_lab
from .timing import TimedDrafter, install_timer
from .trace import RoundTally
from .workload import Prompt, load_workload, parse_workload, shipped_workloads

__all__ = ["ChiSquare", "ConfigResult", "Configuration", "LabConfig", "LabError", "LabResult",
           "LosslessCheck", "Mismatch", "Prompt", "RoundTally", "TimedDrafter", "Timings",
           "chi2_sf", "install_timer", "load_workload", "parse_ks", "parse_names", "parse_trees",
           "parse_workload", "policy_supported", "run_lab", "shipped_workloads", "trees_supported",
           "two_sample_chi2", "write_results"]
