"""Vectorised infos (``key`` + ``_key`` masks), identical to what gymnasium's vector envs return.

MuJoCo and ALE envs return an info on every step, so batching them is on the hot
path: gymnasium's ``_add_info`` walks every key of every row (~45 us for 8 envs x 4
keys). When every info carries the same keys with plain numbers, the same result is
built one array per key; anything else (nested dicts, ``final_obs``, objects, keys
that differ between rows) goes through gymnasium's own code.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from gymnasium.vector import VectorEnv

from .protocol import InfoRow

_SCALARS = (int, float, bool)


class _Batch:
    """Just enough of a VectorEnv for gymnasium's ``_add_info`` to batch ``n`` rows."""

    _add_info = VectorEnv._add_info

    def __init__(self, n: int) -> None:
        self.num_envs = n


def batch_infos(n: int, rows: Sequence[tuple[int, dict[str, Any] | InfoRow]]) -> dict[str, Any]:
    """Merge per-env infos into one vectorised dict of ``n`` rows; ``rows`` is ``(row, info)``.

    An info is a dict, or an :class:`~aiovec.protocol.InfoRow` as packed by a worker.
    """
    rows = [(k, info) for k, info in rows if info]
    if not rows:
        return {}
    schema = rows[0][1].schema if type(rows[0][1]) is InfoRow else None
    if schema is not None and all(type(info) is InfoRow and info.schema == schema for _, info in rows):
        return _batch_packed(n, schema, rows)
    rows = [(k, info.to_dict() if type(info) is InfoRow else info) for k, info in rows]
    fast = _batch_flat(n, rows)
    if fast is not None:
        return fast
    out: dict[str, Any] = {}
    batch = _Batch(n)
    for row, info in rows:
        out = batch._add_info(out, info, row)
    return out


def _batch_packed(n: int, schema: tuple, rows: list[tuple[int, InfoRow]]) -> dict[str, Any]:
    """Packed rows sharing one schema: one array per key, as gymnasium's ``_add_info`` would build it."""
    keys, types = schema
    whole = len(rows) == n and all(k == r for r, (k, _) in enumerate(rows))
    idx = None if whole else np.fromiter((k for k, _ in rows), np.int64, len(rows))
    columns = list(zip(*(info.values for _, info in rows), strict=True))
    out: dict[str, Any] = {}
    for key, kind, values in zip(keys, types, columns, strict=True):
        out[key], out[f"_{key}"] = _column(n, kind, values, idx)
    return out


def _column(n: int, kind: type, values: Any, idx: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """One key's array and mask over ``n`` rows: ``values`` for every row (``idx`` None) or for rows ``idx``."""
    if idx is None:
        return np.array(values, dtype=kind), np.ones(n, dtype=np.bool_)
    array = np.zeros(n, dtype=kind)
    array[idx] = values
    mask = np.zeros(n, dtype=np.bool_)
    mask[idx] = True
    return array, mask


def _batch_flat(n: int, rows: list[tuple[int, dict[str, Any]]]) -> dict[str, Any] | None:
    first = rows[0][1]
    keys = first.keys()
    if "final_obs" in first or any(info.keys() != keys for _, info in rows[1:]):
        return None
    idx = None if len(rows) == n and all(k == r for r, (k, _) in enumerate(rows)) else np.fromiter((k for k, _ in rows), np.int64, len(rows))
    out: dict[str, Any] = {}
    for key, value in first.items():
        kind = type(value)
        if not (kind in _SCALARS or issubclass(kind, np.number)):
            return None
        values = [info[key] for _, info in rows]
        if any(type(v) is not kind for v in values):
            return None  # gymnasium casts later rows into the first row's dtype: leave that to it
        out[key], out[f"_{key}"] = _column(n, kind, values, idx)
    return out
