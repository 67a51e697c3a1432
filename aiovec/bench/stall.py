"""Does building and starting a vector env stall the application's event loop?

Four envs whose constructor takes 0.5 s (sleeping, or burning CPU in Python) are
built with ``aiovec.AsyncVecEnv([...] * 4)`` inside a running loop, then started and
reset, while a side task records the gaps between its turns. Target: no gap over
20 ms during construction, start and reset.
"""

from __future__ import annotations

import time
from typing import Any

import aiovec

from .gaps import TurnGaps
from .slowenvs import BusyBootEnv, SleepyBootEnv


async def _case(cls: type, name: str) -> dict[str, Any]:
    error = None
    t0 = time.perf_counter()
    venv = None
    async with TurnGaps() as gaps:
        try:
            venv = aiovec.AsyncVecEnv([cls] * 4)
            await venv.start()
            await venv.reset(seed=0)
        except Exception as exc:  # reported, not raised: the other case still runs
            error = f"{type(exc).__name__}: {exc}"
    seconds = time.perf_counter() - t0
    if venv is not None:
        await venv.close()
    return {"name": name, "seconds": seconds, "gaps": gaps.summary(), "error": error}


async def _all() -> list[dict[str, Any]]:
    return [await _case(SleepyBootEnv, "constructor sleeps 0.5 s"), await _case(BusyBootEnv, "constructor burns 0.5 s of CPU")]


def main(quick: bool = False) -> dict[str, Any]:
    return {"num_envs": 4, "cases": aiovec.run(_all())}
