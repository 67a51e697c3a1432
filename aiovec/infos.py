"""Vectorised infos (``key`` + ``_key`` masks), identical to what gymnasium's vector envs return.

MuJoCo and ALE envs return an info on every step, so batching them is on the hot
path: gymnasium's ``_add_info`` walks every key of every row (~45 us for 8 envs x 4
keys). When every info carries the same keys with plain numbers, the same result is
built one array per key; anything else (nested dicts, ``final_obs``, objects, keys
that differ between rows) goes through gymnasium's own code.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import numpy as np
from gymnasium.vector import VectorEnv

from .protocol import InfoRecords, record_dtype

_SCALARS = (int, float, bool)

Part = tuple[np.ndarray, InfoRecords, "np.ndarray | None"]
"""Infos that arrived as records, for some rows of a batch: ``(rows, records, selected)``,
``selected`` picking which of the block's records (None: all), in the same order as ``rows``."""


class _Batch:
    """Just enough of a VectorEnv for gymnasium's ``_add_info`` to batch ``n`` rows."""

    _add_info = VectorEnv._add_info

    def __init__(self, n: int) -> None:
        self.num_envs = n


def batch_infos(n: int, rows: Sequence[tuple[int, dict[str, Any]]], parts: Sequence[Part] = ()) -> dict[str, Any]:
    """Merge per-env infos into one vectorised dict of ``n`` rows.

    ``rows`` holds ``(row, info)`` dicts; ``parts`` holds infos that arrived as records.
    """
    rows = [(k, info) for k, info in rows if info]
    if parts:
        first = parts[0][1]
        if not rows and all(r.keys == first.keys and r.types == first.types for _, r, _ in parts):
            return _batch_records(n, parts)
        for where, recs, selected in parts:  # mixed: back to one dict per row, in row order
            dicts = recs.as_dicts()
            picked = range(len(dicts)) if selected is None else np.flatnonzero(selected).tolist()
            rows.extend(zip(where.tolist(), (dicts[j] for j in picked), strict=True))
        rows.sort(key=lambda r: r[0])
    if not rows:
        return {}
    try:
        fast = _batch_flat(n, rows)
    except OverflowError:  # an int beyond int64: gymnasium's path decides (and falls back to objects)
        fast = None
    if fast is not None:
        return fast
    out: dict[str, Any] = {}
    batch = _Batch(n)
    try:
        for row, info in rows:
            out = batch._add_info(out, info, row)
    except (ValueError, TypeError, OverflowError):  # what gymnasium cannot batch: one object per row, not an error
        return _batch_objects(n, rows)  # (raised here, it would cost the batch's transitions, already taken)
    return out


def _batch_objects(n: int, rows: Sequence[tuple[int, dict[str, Any]]]) -> dict[str, Any]:
    """Infos gymnasium's ``_add_info`` cannot batch (arrays of other shapes per env, ints beyond int64): each key
    an object array holding every row's own value, with its ``_key`` mask."""
    out: dict[str, Any] = {}
    for row, info in rows:
        for key, value in info.items():
            if key not in out:
                out[key], out[f"_{key}"] = np.full(n, None, dtype=object), np.zeros(n, dtype=np.bool_)
            out[key][row] = value
            out[f"_{key}"][row] = True
    return out


def _batch_records(n: int, parts: Sequence[Part]) -> dict[str, Any]:
    """Record parts sharing keys and types: one array and one mask per key, as gymnasium builds them."""
    first = parts[0][1]
    keys = first.keys
    covered = 0
    for where, _, _ in parts:
        covered += len(where)
    table = np.empty(n, record_dtype(keys, first.types)) if covered == n else np.zeros(n, record_dtype(keys, first.types))
    for where, recs, selected in parts:
        table[where] = recs.records() if selected is None else recs.records()[selected]
    if covered == n:
        masks = _all_true(len(keys), n).copy()
    else:
        masks = np.zeros((len(keys), n), dtype=np.bool_)
        for where, _, _ in parts:
            masks[:, where] = True
    out: dict[str, Any] = {}
    for key, mask in zip(keys, masks, strict=True):  # each key its own array; the masks are rows of one block
        out[key] = table[key].copy()
        out[f"_{key}"] = mask
    return out


@functools.lru_cache(maxsize=64)
def _all_true(keys: int, n: int) -> np.ndarray:
    """A read-only block of masks with every row set, copied for each batch (``np.ones`` costs ~4x the copy)."""
    masks = np.ones((keys, n), dtype=np.bool_)
    masks.flags.writeable = False
    return masks


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
