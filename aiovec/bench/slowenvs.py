"""Envs whose constructor takes 0.5 s, as a booting simulator does (importable, so factories pickle by reference)."""

from __future__ import annotations

import time
from typing import Any

from aiovec.envs import CostEnv, burn_cpu

BOOT_S = 0.5


class SleepyBootEnv(CostEnv):
    """Its constructor sleeps ``BOOT_S`` (waiting on a simulator): a thread would hide it, the GIL is free."""

    def __init__(self, **kwargs: Any) -> None:
        time.sleep(BOOT_S)
        super().__init__(obs_dim=4, **kwargs)


class BusyBootEnv(CostEnv):
    """Its constructor burns ``BOOT_S`` of CPU in a Python loop: it holds the GIL, only another process hides it."""

    def __init__(self, **kwargs: Any) -> None:
        burn_cpu(BOOT_S)
        super().__init__(obs_dim=4, **kwargs)
