"""Quiet, clean exits: the missing ``__main__`` guard, SIGTERM, and vector envs nobody closed.

Three things go wrong at the end of a script that uses worker processes, and each has one
cause here:

* **The missing main guard.** Under ``forkserver`` and ``spawn`` a new worker imports the main
  script before it runs anything. A script that creates a vector env at import time then creates
  one again inside every worker, which fails there (a process cannot start processes while it is
  still being bootstrapped) and printed one traceback per worker plus the parent's.
  :func:`refuse_main_reimport` (called where a vector env or ``aiovec.run`` starts) ends such a
  worker at once with :data:`NO_GUARD_EXIT`, before it creates anything; the parent recognises
  that exit code and stops with :class:`MainGuardMissing`, one short message and the fix.
  A bootstrapping worker that fails inside aiovec another way ends the same way (excepthook).

* **Semaphores named in ``resource_tracker`` warnings.** Each worker's ``ProcessPoolExecutor`` has
  two queues with five named POSIX semaphores; a finalizer unlinks each one and then tells the
  resource tracker. When the last reference to an executor dies in a *daemon* thread (the
  synchronous facade's event-loop thread) while the interpreter is shutting down, that thread is
  frozen at its next GIL hand-off: the semaphore is unlinked but the tracker never hears of it, and
  warns "leaked semaphore objects" and "No such file or directory" for it. So every facade still
  open at exit is closed by :func:`_close_open_facades`, which runs before the interpreter joins
  its threads (``threading._register_atexit``), while its loop thread still runs normally.

* **SIGTERM.** Python runs no ``finally`` blocks and no finalizers on an unhandled SIGTERM, so
  workers and semaphores were left behind. ``aiovec.run`` cancels its main task on SIGTERM and
  raises ``SystemExit(143)`` after it unwound; a synchronous facade created in the main thread
  installs a handler that raises ``SystemExit(143)`` there (like Ctrl-C raises KeyboardInterrupt).
  Neither replaces a SIGTERM handler the application installed itself.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
import threading
import weakref
from types import FrameType, TracebackType
from typing import Any

from . import ctrlc

NO_GUARD_EXIT = 87  # a worker's exit status for "the main script started a vector env while being imported"
SIGTERM_EXIT = 128 + signal.SIGTERM  # the shell's status for "ended by SIGTERM"


class MainGuardMissing(SystemExit):
    """The main script creates a vector env when it is imported, so every worker created one too.

    A ``SystemExit``: Python prints only its message, and the script stops with status 1.
    """

    def __init__(self) -> None:
        main = getattr(sys.modules.get("__main__"), "__file__", None) or "your main script"
        super().__init__(
            f"aiovec: every worker process imports the main script ({main}) before it starts, and that import\n"
            "started a vector env again (it runs at import time). Fix: put the code that runs it under a main guard:\n\n"
            '    if __name__ == "__main__":\n'
            "        main()\n"
        )


# -- the missing main guard --------------------------------------------------------------
def in_main_reimport() -> bool:
    """Whether this process is a worker still importing the parent's main script (spawn/forkserver)."""
    return bool(getattr(multiprocessing.current_process(), "_inheriting", False))


def refuse_main_reimport() -> None:
    """End this process at once if it is a worker importing a main script that starts a vector env.

    ``os._exit``: nothing was created yet, and nothing the re-run script printed or buffered
    should appear twice. The parent reads :data:`NO_GUARD_EXIT` and explains.
    """
    if in_main_reimport():
        os._exit(NO_GUARD_EXIT)


def is_no_guard_failure(exc: BaseException | None) -> bool:
    """Whether ``exc`` (or an exception it was raised from) is a worker ended by :func:`refuse_main_reimport`."""
    from .errors import WorkerCrashedError

    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, WorkerCrashedError) and exc.exitcode == NO_GUARD_EXIT:
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def _excepthook(kind: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
    """Shorten the tracebacks of the missing-main-guard mistake; anything else goes to the previous hook.

    In a worker whose import of the main script failed inside aiovec (a script that runs
    ``asyncio.run`` at import time: :func:`refuse_main_reimport` is not on that path), the fork
    server or spawn calls this hook once ``_inheriting`` is cleared already, so the traceback tells.
    """
    if issubclass(kind, KeyboardInterrupt):
        ctrlc.quiet_exit()
    if _frames_in(tb, _is_main_reimport) and _frames_in(tb, _is_aiovec):
        _run_mp_finalizers()  # unlink the named semaphores this worker made, then leave without a word
        os._exit(NO_GUARD_EXIT)
    if is_no_guard_failure(exc):
        sys.stderr.write(str(MainGuardMissing().code))
        sys.stderr.flush()
        return
    _previous_excepthook(kind, exc, tb)


_HERE = os.path.dirname(os.path.abspath(__file__)) + os.sep


def _is_aiovec(code: Any) -> bool:
    return os.path.abspath(code.co_filename).startswith(_HERE)


def _is_main_reimport(code: Any) -> bool:
    return code.co_name == "_fixup_main_from_path" and code.co_filename.endswith(os.path.join("multiprocessing", "spawn.py"))


def _frames_in(tb: TracebackType | None, match: Any) -> bool:
    while tb is not None:
        if match(tb.tb_frame.f_code):
            return True
        tb = tb.tb_next
    return False


def _run_mp_finalizers() -> None:
    try:
        from multiprocessing import util

        util._run_finalizers(0)  # type: ignore[attr-defined]
        util._run_finalizers()  # type: ignore[attr-defined]
    except Exception:  # noqa: BLE001 - leaving anyway
        pass


_previous_excepthook = sys.excepthook
sys.excepthook = _excepthook


# -- SIGTERM ------------------------------------------------------------------------------
def can_handle_sigterm() -> bool:
    """True in the main thread while SIGTERM still has its default action (nobody else handles it)."""
    return threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL


def _raise_system_exit(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(SIGTERM_EXIT)


# -- synchronous facades still open at exit ------------------------------------------------
_open: weakref.WeakSet[Any] = weakref.WeakSet()
_lock = threading.Lock()
_installed_sigterm = False


def track(facade: Any) -> None:
    """A facade started: close it at exit if nobody does; in the main thread, let SIGTERM unwind."""
    global _installed_sigterm
    with _lock:
        _open.add(facade)
        if not _installed_sigterm and can_handle_sigterm():
            signal.signal(signal.SIGTERM, _raise_system_exit)
            _installed_sigterm = True


def untrack(facade: Any) -> None:
    """A facade closed; the last one gives SIGTERM its default action back (if ours is still installed)."""
    global _installed_sigterm
    with _lock:
        _open.discard(facade)
        if not _open and _installed_sigterm and threading.current_thread() is threading.main_thread():
            if signal.getsignal(signal.SIGTERM) is _raise_system_exit:
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
            _installed_sigterm = False


def _close_open_facades() -> None:
    for facade in list(_open):
        try:
            facade.close()
        except BaseException:  # noqa: BLE001 - at exit: close the others, say nothing
            pass


# Imported first so that its own exit hook (which kills the workers of never-closed async vector
# envs) is registered earlier and so runs later: facades are closed gracefully before that.
from .backends import process as _process  # noqa: E402,F401

threading._register_atexit(_close_open_facades)  # type: ignore[attr-defined]
