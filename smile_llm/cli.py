"""``smile-llm`` command line (also ``python -m smile_llm``)."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="smile-llm", description="smile-llm: LLM serving core")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="serve a short multi-turn chat through the KV pool and show prefix reuse")
    demo.add_argument("--turns", type=int, default=6)
    demo.add_argument("--seed", type=int, default=7)
    args = parser.parse_args(argv)
    if args.command == "demo":
        from .demo import run_demo

        run_demo(turns=args.turns, seed=args.seed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
