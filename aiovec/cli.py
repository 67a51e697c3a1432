"""The ``aiovec`` command: ``aiovec demo`` and ``aiovec bench``; ``aiovec`` alone prints its help."""

from __future__ import annotations

import argparse
import sys

SCENARIOS = ("cheap", "cpu", "wait64", "latency", "stragglers", "change")  # aiovec.demo.SCENARIOS (not imported: cheap --help)


def _positive(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {n}")
    return n


def parser() -> argparse.ArgumentParser:
    """The argument parser of the ``aiovec`` command (every flag with its help and default)."""
    from . import __version__

    p = argparse.ArgumentParser(prog="aiovec", description="asyncio vector envs with adaptive parallelism",
                                epilog="run 'aiovec demo' for the adaptive-parallelism demo (about 3 minutes on 2 cores)")
    p.add_argument("--version", action="version", version=f"aiovec {__version__}")
    sub = p.add_subparsers(dest="cmd", metavar="{demo,bench}")
    d = sub.add_parser("demo", help="the adaptive controller against every static worker count",
                       description="Run each scenario with several static worker counts and with the adaptive "
                                   "controller; print a table and write a PNG and demo.json.")
    d.add_argument("--quick", action="store_true", help="a short smoke run (default: off, the full run of ~3 minutes)")
    d.add_argument("--scenario", choices=SCENARIOS, default=None, help="run only this scenario (default: all of them)")
    d.add_argument("--max-workers", type=_positive, default=None, metavar="N",
                   help="upper bound for static and adaptive worker counts (default: the scenario's number of envs)")
    d.add_argument("--output", default="demo-output", metavar="DIR",
                   help="directory for adaptive.png and demo.json (default: %(default)s)")
    d.add_argument("--runs", type=_positive, default=1, metavar="N",
                   help="repeat the whole demo N times; the table shows the median with the range (default: %(default)s)")
    d.add_argument("--plain", action="store_true",
                   help="plain lines instead of the live terminal view (default: live when stdout is a terminal)")
    b = sub.add_parser("bench", help="aiovec against its peers (same as python -m aiovec.bench; 'aiovec bench --help')",
                       add_help=False)
    b.add_argument("rest", nargs=argparse.REMAINDER, help="arguments of python -m aiovec.bench")
    return p


def main(argv: list[str] | None = None) -> None:
    """Entry point of the ``aiovec`` console script."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["bench"]:  # everything after it is the benchmark's, flags first included (argparse's REMAINDER
        from .bench.__main__ import main as bench  # cannot start with one: 'aiovec bench --quick' failed)

        bench(argv[1:])
        return
    p = parser()
    args = p.parse_args(argv)
    if args.cmd is None:
        p.print_help()
        sys.exit(0)
    from .demo import run_demo

    run_demo(quick=args.quick, only=args.scenario, max_workers=args.max_workers, output=args.output, live=not args.plain,
             runs=args.runs)


if __name__ == "__main__":
    main()
