"""Run one blocking call in a short-lived thread and await it, without blocking the event loop.

Used for the slow, rare work that must not hold the loop (building env 0 to learn its
spaces, building or resetting inline envs). A thread per call, not the loop's default
executor: nothing of ours outlives the call, whatever the application does with its loop.
A constructor that holds the GIL in C code for long can still delay the loop; Python
code (and anything that sleeps or does I/O) gives it up every few milliseconds.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


def in_thread(fn: Callable[..., T], *args: Any) -> asyncio.Future[T]:
    """Start ``fn(*args)`` in a daemon thread; the returned future (of the running loop) gets its result."""
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[T] = loop.create_future()

    def settle(ok: bool, value: Any) -> None:
        if fut.done():
            return
        if ok:
            fut.set_result(value)
        else:
            fut.set_exception(value)

    def run() -> None:
        try:
            result: tuple[bool, Any] = (True, fn(*args))
        except BaseException as exc:  # noqa: BLE001 - handed to the awaiting task
            result = (False, exc)
        try:
            loop.call_soon_threadsafe(settle, *result)
        except RuntimeError:
            pass  # the loop closed meanwhile: nobody waits for this any more

    threading.Thread(target=run, name=f"aiovec-{getattr(fn, '__name__', 'call')}", daemon=True).start()
    return fut
