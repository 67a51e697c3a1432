"""``python -m aiovec.bench [core|v2|controller|ray|soak] [--quick] [--repeats N] [--duration S] [--out FILE] [--only NAME]``."""

from __future__ import annotations

import argparse
import multiprocessing
import os
import signal
import sys
import threading

_received: int | None = None


def _kill_children() -> None:
    for child in multiprocessing.active_children():
        child.kill()


def _exit_on_sigterm(signum: int, frame: object) -> None:
    # SIGTERM (kill, a CI timeout): the peers' workers have no parent-death signal and would outlive this
    # process, and a peer's close() may wait forever on a call the signal cut short. Kill them, then unwind
    # (every runner's finally closes its vector env, which now only reaps). Python drops an exception
    # raised where it cannot propagate (a lock release, a __del__): main() and a timer make sure we exit.
    global _received
    _received = signum
    _kill_children()
    last_resort = threading.Timer(30.0, os._exit, (128 + signum,))
    last_resort.daemon = True
    last_resort.start()
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m aiovec.bench", description=__doc__)
    p.add_argument("suite", nargs="?", default="core", choices=["core", "v2", "controller", "ray", "soak"])
    p.add_argument("--quick", action="store_true", help="one short repeat of a reduced set (smoke test)")
    p.add_argument("--repeats", type=int, default=None)
    p.add_argument("--duration", type=float, default=None, help="seconds per measurement")
    p.add_argument("--out", default=None, help="write the results as JSON here")
    p.add_argument("--only", default=None, help="v2: the workloads whose name contains NAME, or one of loophold, stall, soak; controller: the scenarios whose key contains NAME")
    p.add_argument("--unseen", action="store_true",
                   help="controller: five workloads its rules were never tuned on, instead of the issue's scenarios")
    args = p.parse_args(argv)
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    if args.suite == "soak":
        from .soak import main as soak

        soak(["--minutes", str((args.duration or 600) / 60)] + (["--out", args.out] if args.out else []))
        return
    options = {}
    if args.suite == "core":
        from .core import main as run
    elif args.suite == "v2":
        from .v2 import main as run

        options["only"] = args.only
    elif args.suite == "ray":
        from .ray_bench import main as run
    else:
        from .controller import main as run

        options.update(only=args.only, unseen=args.unseen)
    try:
        run(quick=args.quick, repeats=args.repeats, duration=args.duration, out=args.out, **options)
    except BaseException:
        if _received is not None:  # whatever the unwinding ran into after the signal, it is a SIGTERM exit
            raise SystemExit(128 + _received) from None
        raise
    finally:
        _kill_children()  # a peer interrupted inside its constructor has nobody to close its workers


if __name__ == "__main__":
    sys.exit(main())
