"""The ``aiovec`` command: ``aiovec demo`` and ``aiovec bench``."""

from __future__ import annotations

import argparse


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="aiovec", description="asyncio vector envs with adaptive parallelism")
    sub = p.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("demo", help="the adaptive controller against every static worker count")
    d.add_argument("--quick", action="store_true", help="a short smoke run")
    d.add_argument("--scenario", default=None, help="cheap, cpu, latency, stragglers or change (default: all)")
    d.add_argument("--max-workers", type=int, default=None)
    d.add_argument("--output", default="demo-output", help="directory for the PNG plot and JSON results")
    b = sub.add_parser("bench", help="aiovec against its peers (same as python -m aiovec.bench)")
    b.add_argument("rest", nargs=argparse.REMAINDER)
    args = p.parse_args(argv)
    if args.cmd == "demo":
        from .demo import run_demo

        run_demo(quick=args.quick, only=args.scenario, max_workers=args.max_workers, output=args.output)
    else:
        from .bench.__main__ import main as bench

        bench(args.rest)


if __name__ == "__main__":
    main()
