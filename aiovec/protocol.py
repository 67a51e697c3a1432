"""The messages between the parent and a worker: named tuples, plus one-frame fast paths.

Bulk data (actions, observations, rewards, flags) never travels in a message: it
sits in shared memory (process and inline workers) or in a reply's ``arrays``
(backends without shared memory). A message names env ids explicitly, with one
exception known to both sides: :data:`STEP_SHARD`, "step every env you host", which
the parent sends only while no ADD/REMOVE to that worker is unanswered, so its view
of the worker's envs is exact.

Parent -> worker: one of the command tuples below (pickled), or the one byte
:data:`STEP_SHARD`. Worker -> parent: a pickled :class:`Reply`, or for a step that
had no infos and no errors, the fixed :data:`FAST_REPLY` frame (a marker byte and the
command's CPU and wall seconds).
"""

from __future__ import annotations

import pickle
import struct
from enum import IntEnum
from typing import Any, NamedTuple

import numpy as np


class Op(IntEnum):
    ADD = 0
    REMOVE = 1
    STEP = 2
    RESET = 3
    CALL = 4
    CLOSE = 5
    READY = 6
    TUNE = 7


ADD, REMOVE, STEP, RESET, CALL, CLOSE, READY, TUNE = (int(o) for o in Op)


class Add(NamedTuple):
    """Host env ``env_id``; ``state`` carries an env moved from elsewhere (or restarted)."""

    env_id: int
    factory: bytes
    state: dict | None
    op: int = ADD


class Remove(NamedTuple):
    """Stop hosting ``env_ids``; the reply's payload maps each to its portable state."""

    env_ids: tuple[int, ...]
    op: int = REMOVE


class Step(NamedTuple):
    """Step (or autoreset) each env with its action row."""

    env_ids: tuple[int, ...]
    op: int = STEP


class Reset(NamedTuple):
    env_ids: tuple[int, ...]
    seeds: list
    options: dict | None
    op: int = RESET


class Call(NamedTuple):
    """``kind``: "call" (payload ``(args, kwargs)``), "get", or "set" (payload: one value per env)."""

    env_ids: tuple[int, ...]
    kind: str
    name: str
    payload: Any
    op: int = CALL


class Close(NamedTuple):
    op: int = CLOSE


class Tune(NamedTuple):
    """Settings that change while the worker runs: ``{"spin_s": s, "measure_runq": bool, "env_threads": k}``."""

    options: dict
    op: int = TUNE


class Timing(NamedTuple):
    """What one command cost inside the worker."""

    cpu_s: float
    wall_s: float
    runq_s: float = 0.0


class ErrorInfo(NamedTuple):
    """An env's exception, as it travels back (``EnvError(*info)`` rebuilds it)."""

    env_id: int
    exc_type: str
    message: str
    traceback: str


class Reply(NamedTuple):
    """A worker's answer to one command, in command order.

    ``env_ids`` is None for a :data:`STEP_SHARD` step (the parent knows the shard);
    ``payload`` is per-command (infos for STEP/RESET, results for CALL, states for REMOVE,
    ``{"pid": .., "spin_s": ..}`` for READY, the settings in effect for TUNE).
    """

    op: int
    env_ids: tuple[int, ...] | None
    payload: Any
    errors: list[ErrorInfo] | None
    timing: Timing


class InfoRow(NamedTuple):
    """One env's info as it travels packed: ``schema`` (keys and value types, shared by the rows
    of a reply) and the values as plain Python scalars (cheap to pickle, unlike numpy scalars)."""

    schema: tuple[tuple[str, ...], tuple[type, ...]]
    values: tuple

    def to_dict(self) -> dict[str, Any]:
        keys, types = self.schema
        return {k: t(v) for k, t, v in zip(keys, types, self.values, strict=True)}


class PackedInfos(NamedTuple):
    """A reply's infos when every env returned the same keys with scalar values of the same types
    (MuJoCo's and ALE's every step): one schema, one tuple of Python scalars per env (None: no info)."""

    schema: tuple[tuple[str, ...], tuple[type, ...]]
    rows: list[tuple | None]

    def as_rows(self) -> list[InfoRow | None]:
        return [None if r is None else InfoRow(self.schema, r) for r in self.rows]


_SCALARS = (int, float, bool)


def pack_infos(infos: list[dict | None]) -> PackedInfos | list[dict | None]:
    """Pack one reply's infos (aligned with its env ids) when they share keys and scalar types; else as they are."""
    schema = None
    rows: list[tuple | None] = []
    for info in infos:
        if not info:
            rows.append(None)
            continue
        types = tuple(type(v) for v in info.values())
        if schema is None:
            if not all(t in _SCALARS or issubclass(t, np.number) for t in types):  # what gymnasium batches as numbers
                return infos
            schema = (tuple(info), types)
        elif types != schema[1] or tuple(info) != schema[0]:
            return infos
        rows.append(tuple(v.item() if type(v) not in _SCALARS else v for v in info.values()))
    return infos if schema is None else PackedInfos(schema, rows)


def info_rows(infos: PackedInfos | list | None) -> list | None:
    """A reply's infos as one entry per env (a dict, an :class:`InfoRow`, or None)."""
    return infos.as_rows() if isinstance(infos, PackedInfos) else infos


NO_TIMING = Timing(0.0, 0.0, 0.0)

STEP_SHARD = b"\x01"
"""Command: step every env this worker hosts, in env-id order."""

_FAST = struct.Struct("=Bdd")
FAST_REPLY_SIZE = _FAST.size
FAST_MARK = 1


def fast_reply(cpu_s: float, wall_s: float) -> bytes:
    """A step reply with no infos and no errors: a marker byte, then CPU and wall seconds."""
    return _FAST.pack(FAST_MARK, cpu_s, wall_s)


_PROTOCOL = pickle.HIGHEST_PROTOCOL


def encode(msg: tuple[Any, ...]) -> bytes:
    return pickle.dumps(msg, _PROTOCOL)


def decode_reply(frame: bytes | memoryview) -> Reply | Timing:
    """A pickled :class:`Reply`, or for a fast step reply just its :class:`Timing` (pickled frames start with 0x80)."""
    if len(frame) == FAST_REPLY_SIZE and frame[0] == FAST_MARK:
        _, cpu, wall = _FAST.unpack(frame)
        return Timing(cpu, wall)
    return pickle.loads(frame)


decode = pickle.loads
