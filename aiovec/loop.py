"""``aiovec.run``: run a coroutine on uvloop where installed, else on asyncio's own loop."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def has_uvloop() -> bool:
    """Whether uvloop can be imported here."""
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return False
    return True


def run(main: Coroutine[Any, Any, T], *, use_uvloop: bool | None = None, debug: bool | None = None) -> T:
    """Like :func:`asyncio.run`, on uvloop by default when it is installed.

    Ctrl-C cancels ``main``, so ``async with`` blocks inside it close their vector envs.
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
    if use_uvloop is None:
        use_uvloop = has_uvloop()
    if use_uvloop:
        import uvloop

        return uvloop.run(main, debug=debug)
    return asyncio.run(main, debug=debug)
