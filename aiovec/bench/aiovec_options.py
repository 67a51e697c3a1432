"""The aiovec options the v2 benchmark asks for, on cores that have them or not yet.

``placement`` ("auto" | "inline" | "process") is being added to the core; until it is
there, the process backend is forced with ``num_workers=1`` alone, and "inline" falls
back to aiovec's defaults (the reports say which options ran).
"""

from __future__ import annotations

import inspect
from typing import Any

import aiovec


def has_option(name: str) -> bool:
    """Whether this aiovec's ``AsyncVecEnv`` takes the option (``placement`` is being added)."""
    return name in inspect.signature(aiovec.AsyncVecEnv).parameters


def process_forced() -> dict[str, Any]:
    """Options that force the process backend with one worker (``placement="process"`` where it exists)."""
    return {"num_workers": 1, "placement": "process"} if has_option("placement") else {"num_workers": 1}


def inline() -> dict[str, Any]:
    """Options for in-process stepping where aiovec has them; else its defaults (reported as such)."""
    return {"placement": "inline"} if has_option("placement") else {}
