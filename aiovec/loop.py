"""``aiovec.run``: run a coroutine on uvloop where installed, else on asyncio's own loop; and the
checkpoint every awaited call of the API passes."""

from __future__ import annotations

import asyncio
import inspect
import signal
import sys
import types
from collections.abc import Coroutine
from typing import Any, TypeVar

from . import exits
from .ctrlc import CtrlC

T = TypeVar("T")


@types.coroutine
def checkpoint() -> Any:
    """Yield to the event loop once, so every other ready task runs before the caller goes on.

    What ``await asyncio.sleep(0)`` does (asyncio's own zero sleep is this bare yield), without the
    ``sleep`` call around it: it sits on the hot path of ``step()`` and ``recv()``, once a batch,
    where that call measured ~1.5 us of a ~100 us batch of 8 CartPoles. Cancellation is delivered
    here like at any other await.
    """
    yield


async def wait_done(fut: asyncio.Future[Any], timeout: float) -> bool:
    """Await ``fut`` for at most ``timeout`` seconds without cancelling it; whether it is done.

    Not ``asyncio.wait_for(asyncio.shield(fut), timeout)``: on 3.11 that returns ``fut``'s result when a
    cancellation arrives just as ``fut`` completes, and the cancelled task goes on. A worker's ``stop()`` did so
    on a second Ctrl-C (its ``serve`` ended as the cancellation came) and was still waiting when the loop closed:
    "Task was destroyed but it is pending!" at exit. Raises ``CancelledError`` when the caller is cancelled.
    """
    await asyncio.wait((fut,), timeout=timeout)
    return fut.done()


def has_uvloop() -> bool:
    """Whether uvloop can be imported here."""
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return False
    return True


def run(main: Coroutine[Any, Any, T], *, use_uvloop: bool | None = None, debug: bool | None = None) -> T:
    """Like :func:`asyncio.run`, on uvloop by default when it is installed.

    Ctrl-C cancels ``main``, so ``async with`` blocks inside it close their vector envs; a second
    Ctrl-C cancels it again, so a vector env still closing kills its workers at once; a third raises
    ``KeyboardInterrupt`` wherever the main thread is (:mod:`aiovec.ctrlc`). Called from the main
    thread with SIGTERM's default action in place, SIGTERM cancels ``main`` too, and once it has
    unwound ``run`` raises ``SystemExit(143)``.
    aiovec needs no special loop: inside an application that already runs one, just await it.

    >>> async def main():
    ...     async with aiovec.make("CartPole-v1", 2, num_workers=1) as venv:
    ...         obs, _ = await venv.reset(seed=0)
    ...         return type(asyncio.get_running_loop()).__module__, obs.shape
    >>> aiovec.run(main())
    ('uvloop', (2, 4))
    >>> aiovec.run(main(), use_uvloop=False)[0]
    'asyncio.unix_events'
    """
    if exits.in_main_reimport():
        main.close()
        exits.refuse_main_reimport()
    if use_uvloop is None:
        use_uvloop = has_uvloop()
    wrapped = _unwind_on_sigterm(main) if exits.can_handle_sigterm() else main
    try:
        return _run(wrapped, use_uvloop, debug)
    except KeyboardInterrupt:
        # asyncio raises it while handling the main task's CancelledError: without this, Ctrl-C
        # prints two chained tracebacks for one keypress.
        raise KeyboardInterrupt() from None
    except Exception as exc:
        if exits.is_no_guard_failure(exc):
            raise exits.MainGuardMissing() from None
        raise


def _run(coro: Coroutine[Any, Any, T], use_uvloop: bool, debug: bool | None) -> T:
    """Run ``coro`` on a new loop; from Python 3.11 on, with SIGINT handled by :class:`~aiovec.ctrlc.CtrlC`."""
    factory = None
    if use_uvloop:
        import uvloop

        factory = uvloop.new_event_loop
    if sys.version_info < (3, 11) or not CtrlC.can_install():
        if use_uvloop:
            return uvloop.run(coro, debug=debug)
        return asyncio.run(coro, debug=debug)
    ctrlc = CtrlC()
    ctrlc.install()  # before the runner starts: it installs its own handler only over Python's default
    returned = False
    try:
        with asyncio.Runner(loop_factory=factory, debug=debug) as runner:
            result = runner.run(_started(ctrlc, coro))
        returned = True
        return result
    except asyncio.CancelledError:
        if ctrlc.presses:
            raise KeyboardInterrupt() from None
        raise
    finally:
        if inspect.iscoroutine(coro) and inspect.getcoroutinestate(coro) == inspect.CORO_CREATED:
            coro.close()  # a press before the main task's first step: nothing ran, say nothing of it
        ctrlc.finish(interrupted=ctrlc.presses > 0 and not returned)


async def _started(ctrlc: CtrlC, coro: Coroutine[Any, Any, T]) -> T:
    """Hand the running loop and task to ``ctrlc``, then await ``coro``."""
    ctrlc.start(asyncio.get_running_loop(), asyncio.current_task())  # type: ignore[arg-type]
    return await coro


async def _unwind_on_sigterm(main: Coroutine[Any, Any, T]) -> T:
    """Await ``main``; SIGTERM cancels it (its ``finally`` and ``async with`` blocks run), then exits 143."""
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    received: list[int] = []

    def on_sigterm() -> None:
        received.append(signal.SIGTERM)
        if task is not None:
            task.cancel()

    loop.add_signal_handler(signal.SIGTERM, on_sigterm)
    try:
        result = await main
    except asyncio.CancelledError:
        if received:
            raise SystemExit(exits.SIGTERM_EXIT) from None
        raise
    finally:
        loop.remove_signal_handler(signal.SIGTERM)
    if received:  # main swallowed the cancellation: still end as SIGTERM asked
        raise SystemExit(exits.SIGTERM_EXIT)
    return result
