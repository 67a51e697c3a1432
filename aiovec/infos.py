"""Vectorised infos (``key`` + ``_key`` masks), batched by gymnasium's own code."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from gymnasium.vector import VectorEnv


class _Batch:
    """Just enough of a VectorEnv for gymnasium's ``_add_info`` to batch ``n`` rows."""

    _add_info = VectorEnv._add_info

    def __init__(self, n: int) -> None:
        self.num_envs = n


def batch_infos(n: int, rows: Iterable[tuple[int, dict[str, Any] | None]]) -> dict[str, Any]:
    """Merge per-env info dicts into one vectorised dict of ``n`` rows; ``rows`` is ``(row, info)``."""
    out: dict[str, Any] = {}
    batch = None
    for row, info in rows:
        if info:
            if batch is None:
                batch = _Batch(n)
            out = batch._add_info(out, info, row)
    return out
