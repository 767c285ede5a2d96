"""``smile-llm spec-lab``: the command line over ``run_lab`` and ``write_results``."""

from __future__ import annotations

import argparse
import shlex
import sys

from .config import LabConfig, parse_ks, parse_names, parse_trees
from .errors import LabError
from .plots import MATPLOTLIB_HINT, plots_available
from .report import headline, table, write_results
from .runner import run_lab


def config_from_args(args: argparse.Namespace) -> LabConfig:
    """The ``LabConfig`` of parsed ``spec-lab`` arguments. LabError for a bad value."""
    return LabConfig(drafters=parse_names(args.drafters, "--drafters"), ks=parse_ks(args.k),
                     workload=args.workload, model=args.model, kind=args.kind,
                     trees=parse_trees(args.trees or []), policy=args.policy, new_tokens=args.new,
                     repeats=args.repeats, temperature=args.temperature, samples=args.samples,
                     sample_prompts=args.sample_prompts, sample_tokens=args.sample_tokens,
                     seed=args.seed, threads=args.threads, prefix_reuse=args.prefix_reuse)


def run_command(args: argparse.Namespace, argv: list[str]) -> int:
    """Run the lab for parsed ``args`` (``argv``: the arguments after ``smile-llm``, recorded in
    command.txt), print progress lines on stderr as it goes (one per timed run), then the table, and
    write the results folder (without matplotlib the plots are skipped with one line on stderr
    saying how to install it). Returns 0 when every configuration is lossless, 1 when one is not
    (the results are written either way, the failures on stderr), 2 for bad input (nothing run)."""
    try:
        config = config_from_args(args)
        result = run_lab(config, progress=lambda line: print(line, file=sys.stderr, flush=True))
    except LabError as exc:
        print(f"smile-llm spec-lab: {exc}", file=sys.stderr)
        return 2
    command = shlex.join(["smile-llm", *argv])
    files = write_results(result, args.out, command)
    print(table(result))
    print(headline(result))
    print(f"wrote {', '.join(str(f) for f in files)}")
    if not plots_available():
        print(f"smile-llm spec-lab: plots skipped: matplotlib is not installed ({MATPLOTLIB_HINT})",
              file=sys.stderr)
    if not result.passed:
        for r in result.failures:
            check = r.check
            details = [m.describe() for m in check.mismatches] if check else ["not checked"]
            print(f"smile-llm spec-lab: LOSSLESS CHECK FAILED for {r.configuration.label}: "
                  f"{check.describe() if check else ''}; " + "; ".join(details[:5]),
                  file=sys.stderr)
        return 1
    return 0
