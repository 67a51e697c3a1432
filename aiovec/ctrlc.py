"""Ctrl-C under ``aiovec.run``: the first stops gracefully, the second stops now, and neither prints
more than the one ``KeyboardInterrupt``.

asyncio's runner cancels the main task on the first Ctrl-C and raises ``KeyboardInterrupt`` on the
second wherever the main thread happens to be. With worker processes that is often somewhere no
exception may land: inside a ``multiprocessing`` finalizer (once between a semaphore's unlink and
the resource tracker's unregister, so the tracker warned at exit), in a weak-set callback, while
the interpreter joins its threads, in ``logging``'s exit hook. Each printed "Exception ignored in"
with a traceback (2 of 101 double Ctrl-Cs 0.25-0.6 s after start, 0-80 ms apart, on 2 cores).

So :func:`aiovec.run` owns SIGINT (where it is still Python's default) and turns each press into
an asyncio event instead of an exception:

========  ==========================================================================================
press     effect
========  ==========================================================================================
first     the main task is cancelled: ``async with`` blocks close their vector envs, with their grace
second    the main task is cancelled again: a vector env still closing kills its workers at once
third     ``KeyboardInterrupt`` where the main thread is, as without aiovec: the way out of a loop
          that some code blocks without ever yielding
========  ==========================================================================================

Once ``aiovec.run`` has raised ``KeyboardInterrupt``, a press within :data:`QUIET_AFTER` seconds,
or while the interpreter exits, is still only counted, so the interpreter's exit finishes quietly;
the third press of the whole sequence, or any press after that window, raises as Python's own
handler does and gives SIGINT back to it.

Synchronous code (``aiovec.VectorEnv``) gets Ctrl-C as Python delivers it, with two exceptions that
keep a second press from cutting a close in half (its loop stopped with the workers' semaphores
still held: "leaked semaphore objects", "Event loop is closed", tasks destroyed pending; 15 of 82 double
presses 0.25-0.6 s into a script on 2 cores, 2 of 79 after this, both in the user's own frames):
:func:`hurrying` turns a press while the main thread waits for a close into "kill the workers now",
and :func:`quiet_exit` counts the presses that follow an uncaught ``KeyboardInterrupt`` while the
interpreter exits, like ``aiovec.run`` does after its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import FrameType
from typing import Any

QUIET_AFTER = 2.0  # seconds after run() raised KeyboardInterrupt in which a press is only counted
FORCE_AT = 3  # the press that raises KeyboardInterrupt wherever the main thread is


class Phase(enum.Enum):
    """Where the run that installed the handler is."""

    STARTING = enum.auto()  # installed, the main task not started yet: a press raises, nothing runs to unwind
    RUNNING = enum.auto()  # the main task runs, unwinds, or the runner closes: presses cancel it
    ENDED = enum.auto()  # run() raised KeyboardInterrupt: presses are counted while the program exits


_exiting = False  # set when the interpreter starts its shutdown (joining threads, then atexit hooks)


def _mark_exiting() -> None:
    global _exiting
    _exiting = True


threading._register_atexit(_mark_exiting)  # type: ignore[attr-defined]


def _wake() -> None:
    """Nothing: scheduled so that a loop asleep in its selector looks at the cancelled task now."""


class CtrlC:
    """The SIGINT handler of one :func:`aiovec.run` call; see the module docstring for what each press does.

    Runs in the main thread between two bytecodes, like any Python signal handler: it only counts,
    cancels a task and wakes the loop, all of which are safe there (asyncio's runner does the same).
    """

    def __init__(self) -> None:
        self.presses = 0
        self.phase = Phase.STARTING
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[Any] | None = None
        self._ended_at = 0.0

    @staticmethod
    def can_install() -> bool:
        """In the main thread, with SIGINT at Python's default handler or at one an earlier, ended run left (not over
        a run still going: ``aiovec.run`` called inside it fails, and must not take its Ctrl-C away)."""
        if threading.current_thread() is not threading.main_thread():
            return False
        current = signal.getsignal(signal.SIGINT)
        return current is signal.default_int_handler or (isinstance(current, CtrlC) and current.phase is Phase.ENDED)

    def install(self) -> None:
        signal.signal(signal.SIGINT, self)

    def start(self, loop: asyncio.AbstractEventLoop, task: asyncio.Task[Any]) -> None:
        """The main task runs: from now on a press cancels it."""
        self._loop, self._task = loop, task
        self.phase = Phase.RUNNING

    def finish(self, interrupted: bool) -> None:
        """``run()`` is returning: give SIGINT back now, or (after an interrupt) once the exit is through."""
        if interrupted:
            self.phase = Phase.ENDED
            self._ended_at = time.monotonic()
        else:
            self.restore()

    def restore(self) -> None:
        if signal.getsignal(signal.SIGINT) is self:
            signal.signal(signal.SIGINT, signal.default_int_handler)

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        self.presses += 1
        if self.presses < FORCE_AT:
            if self.phase is Phase.RUNNING:
                if self._task is not None and not self._task.done():
                    self._task.cancel()
                    assert self._loop is not None
                    self._loop.call_soon_threadsafe(_wake)
                return
            if self.phase is Phase.ENDED and (_exiting or time.monotonic() - self._ended_at < QUIET_AFTER):
                return
        if self.phase is not Phase.RUNNING:
            self.restore()
        raise KeyboardInterrupt()


@dataclass
class Presses:
    """How many Ctrl-Cs :func:`hurrying` took while its block ran."""

    count: int = 0


@contextlib.contextmanager
def hurrying(on_press: Callable[[], None]) -> Iterator[Presses]:
    """While the main thread waits for a close: a Ctrl-C calls ``on_press`` (kill the workers now) and is counted,
    instead of raising ``KeyboardInterrupt`` inside the wait and leaving the close half done. The third press
    raises as Python's own handler does: the way out of a close that something else holds up.

    Does nothing outside the main thread or where the application handles SIGINT itself. The caller decides what
    the counted presses mean once the close is through (:func:`owe_interrupt`). ``on_press`` runs in the signal
    handler: it must only schedule (``loop.call_soon_threadsafe``).
    """
    presses = Presses()
    if not CtrlC.can_install():
        yield presses
        return
    previous = signal.getsignal(signal.SIGINT)

    def handler(signum: int, frame: FrameType | None) -> None:
        presses.count += 1
        if presses.count >= FORCE_AT:
            raise KeyboardInterrupt()
        on_press()

    signal.signal(signal.SIGINT, handler)
    try:
        yield presses
    finally:
        if signal.getsignal(signal.SIGINT) is handler:
            signal.signal(signal.SIGINT, previous)


def owe_interrupt(presses: Presses) -> bool:
    """Whether presses taken by :func:`hurrying` should still raise ``KeyboardInterrupt``: yes, unless an exception
    is already being handled (a close in a ``finally`` or ``except`` block while an interrupt unwinds: raising there
    would print a second, chained traceback for the same keypresses)."""
    return presses.count > 0 and sys.exc_info()[0] is None


def quiet_exit() -> None:
    """An uncaught ``KeyboardInterrupt`` is ending the script: from now on count the presses while the interpreter
    exits (closing vector envs nobody closed, finalizers, exit hooks) instead of raising in them; the third press
    of the sequence raises as usual. Not in an interactive session, which goes on after the traceback."""
    if sys.flags.interactive or hasattr(sys, "ps1") or not CtrlC.can_install():
        return
    if isinstance(signal.getsignal(signal.SIGINT), CtrlC):
        return  # aiovec.run's own handler counts them already
    handler = CtrlC()
    handler.presses = 1  # the press that ended the script
    handler.install()
    handler.finish(interrupted=True)
