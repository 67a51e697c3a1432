"""Imported only by the fork server (a preload module): keeps its children quiet when their parent has gone.

A worker process is forked by the fork server, then reads its ``Process`` object from the parent, which carries
the executor's semaphores. When the parent stops while a worker is still being forked (Ctrl-C twice during
start-up, a ``start()`` cancelled at that moment), the parent has already released those semaphores, and the
child dies in ``SemLock._rebuild`` with ``FileNotFoundError`` (or, when the parent went before sending the
``Process`` object at all, in ``spawn._main`` with ``EOFError``): nothing is lost (the worker never started), yet the
fork server's child prints the traceback to the user's terminal. This hook drops exactly those two cases and hands
every other exception to the previous hook. It is installed in the fork server's process, never in the user's:
the fork server's children inherit it, and the fork server reports their exceptions through ``sys.excepthook``.
"""

from __future__ import annotations

import sys
from types import TracebackType


def _frames(tb: TracebackType | None) -> list[tuple[str, str]]:
    frames = []
    while tb is not None:
        code = tb.tb_frame.f_code
        frames.append((code.co_filename.replace("\\", "/").rsplit("/", 1)[-1], code.co_name))
        tb = tb.tb_next
    return frames


def _parent_released_the_semaphores(exc_type: type[BaseException], tb: TracebackType | None) -> bool:
    if not issubclass(exc_type, FileNotFoundError):
        return False
    frames = _frames(tb)
    return ("spawn.py", "_main") in frames and ("synchronize.py", "__setstate__") in frames


def _parent_left_before_sending(exc_type: type[BaseException], tb: TracebackType | None) -> bool:
    """``EOFError`` raised in ``spawn._main`` itself: the pipe its ``Process`` object comes through closed empty."""
    frames = _frames(tb)
    return issubclass(exc_type, EOFError) and bool(frames) and frames[-1] == ("spawn.py", "_main")


def _quiet_excepthook(exc_type: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
    if _parent_released_the_semaphores(exc_type, tb) or _parent_left_before_sending(exc_type, tb):
        return
    _previous(exc_type, exc, tb)


_previous = sys.excepthook
sys.excepthook = _quiet_excepthook
