"""``python -m aiovec.bench [core|controller|ray|soak] [--quick] [--repeats N] [--duration S] [--out FILE]``."""

from __future__ import annotations

import argparse


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m aiovec.bench", description=__doc__)
    p.add_argument("suite", nargs="?", default="core", choices=["core", "controller", "ray", "soak"])
    p.add_argument("--quick", action="store_true", help="one short repeat of a reduced set (smoke test)")
    p.add_argument("--repeats", type=int, default=None)
    p.add_argument("--duration", type=float, default=None, help="seconds per measurement")
    p.add_argument("--out", default=None, help="write the results as JSON here")
    args = p.parse_args(argv)
    if args.suite == "soak":
        from .soak import main as soak

        soak(["--minutes", str((args.duration or 600) / 60)] + (["--out", args.out] if args.out else []))
        return
    if args.suite == "core":
        from .core import main as run
    elif args.suite == "ray":
        from .ray_bench import main as run
    else:
        from .controller import main as run
    run(quick=args.quick, repeats=args.repeats, duration=args.duration, out=args.out)


if __name__ == "__main__":
    main()
