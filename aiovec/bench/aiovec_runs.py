"""aiovec as the v2 benchmark runs it: defaults after a warm-up, or with the process backend forced.

"Defaults" is ``num_workers="auto"`` with the controller on, measured only after
``warmup`` seconds (>= 2 s in a full run) so the controller has settled. Each run
reports the worker count aiovec ended with, so the floor can run at the same count.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

import numpy as np

import aiovec

from .peers import _actions, _atimed, env_fns


def has_option(name: str) -> bool:
    """Whether this aiovec's ``AsyncVecEnv`` takes the option (``placement`` is being added)."""
    return name in inspect.signature(aiovec.AsyncVecEnv).parameters


def process_forced() -> dict[str, Any]:
    """Options that force the process backend with one worker (``placement="process"`` where it exists)."""
    return {"num_workers": 1, "placement": "process"} if has_option("placement") else {"num_workers": 1}


def inline() -> dict[str, Any]:
    """Options for in-process stepping where aiovec has them; else its defaults (reported as such)."""
    return {"placement": "inline"} if has_option("placement") else {}


@dataclass
class Run:
    steps_per_s: float
    workers: int  # aiovec's worker count at the end of the measurement (0: stepping inline)
    placement: str  # what it reported, or "process" where it has no such notion


def placement_of(venv: aiovec.AsyncVecEnv) -> str:
    p = getattr(venv, "placement", None) or venv.stats().get("placement")
    return str(p) if p is not None else ("inline" if venv.num_workers == 0 else "process")


async def _run(env_id: str, n: int, kwargs: dict, duration: float, warmup: float, options: dict) -> Run:
    async with aiovec.AsyncVecEnv(env_fns(env_id, n, kwargs), **options) as venv:
        await venv.reset(seed=0)
        acts = _actions(venv.single_action_space, n)

        async def step(a: np.ndarray) -> int:
            await venv.step(a)
            return n

        rate = await _atimed(venv, acts, duration, step, warmup=warmup)
        return Run(rate, int(venv.num_workers), placement_of(venv))


def run(env_id: str, n: int, kwargs: dict, duration: float, warmup: float = 2.0, **options: Any) -> Run:
    """Lock-step steps/s of aiovec with ``options`` (its defaults when none), after ``warmup`` seconds."""
    return aiovec.run(_run(env_id, n, kwargs, duration, warmup, options))
