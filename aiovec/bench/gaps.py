"""How long the event loop is held: a side task that yields with ``sleep(0)`` and times its own turns.

uvloop's timers have 1 ms resolution, too coarse to see a loop held for a few hundred
microseconds; a task that yields with ``await asyncio.sleep(0)`` and reads
``time.perf_counter()`` on every turn sees every hold, however short.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import numpy as np


class TurnGaps:
    """Records the gaps between consecutive turns of a yielding side task while it runs.

    ``async with TurnGaps() as g: ...`` runs the side task for the body; ``g.summary()``
    then gives the gap percentiles and how many turns the task got.
    """

    def __init__(self) -> None:
        self._times: list[float] = []
        self._task: asyncio.Task[None] | None = None
        self._stop = False

    async def _turns(self) -> None:
        record, clock = self._times.append, time.perf_counter
        record(clock())
        while not self._stop:
            await asyncio.sleep(0)
            record(clock())

    async def __aenter__(self) -> TurnGaps:
        self._task = asyncio.get_running_loop().create_task(self._turns())
        await asyncio.sleep(0)  # its first turn: the recording starts before the body does
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._stop = True
        if self._task is not None:
            await self._task

    def gaps_s(self) -> np.ndarray:
        return np.diff(np.asarray(self._times))

    def summary(self) -> dict[str, Any]:
        """p50/p99/max gap in ms, turns, and the span the task covered (its first to last turn)."""
        gaps = self.gaps_s() * 1e3
        if not gaps.size:
            return {"turns": len(self._times), "p50_ms": float("nan"), "p99_ms": float("nan"), "max_ms": float("nan"), "span_s": 0.0}
        p50, p99 = np.percentile(gaps, [50, 99])
        return {"turns": len(self._times), "p50_ms": float(p50), "p99_ms": float(p99), "max_ms": float(gaps.max()),
                "span_s": float(self._times[-1] - self._times[0])}
