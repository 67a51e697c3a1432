"""``aiovec.run``: run a coroutine on uvloop where installed, else on asyncio's own loop."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def has_uvloop() -> bool:
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return False
    return True


def run(main: Coroutine[Any, Any, T], *, use_uvloop: bool | None = None, debug: bool | None = None) -> T:
    """Like :func:`asyncio.run`, on uvloop by default when it is installed.

    Ctrl-C cancels ``main``, so ``async with`` blocks inside it close their vector envs.
    """
    if use_uvloop is None:
        use_uvloop = has_uvloop()
    if use_uvloop:
        import uvloop

        return uvloop.run(main, debug=debug)
    return asyncio.run(main, debug=debug)
