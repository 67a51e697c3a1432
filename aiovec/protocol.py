"""The messages between the parent and a worker: named tuples, plus one-frame fast paths.

Bulk data (actions, observations, rewards, flags) never travels in a message: it
sits in shared memory (process and inline workers) or in a reply's ``arrays``
(backends without shared memory). A message names env ids explicitly, with one
exception known to both sides: :data:`STEP_SHARD`, "step every env you host", which
the parent sends only while no ADD/REMOVE to that worker is unanswered, so its view
of the worker's envs is exact.

Parent -> worker: one of the command tuples below (pickled), or the one byte
:data:`STEP_SHARD`. Worker -> parent: a pickled :class:`Reply`; or, for a step without
errors, one of two frames built without pickle: :func:`fast_reply` (no infos: a marker
byte and the :class:`Timing`) and :func:`records_reply` (infos as :class:`InfoRecords`).
"""

from __future__ import annotations

import functools
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


class InfoRecords(NamedTuple):
    """A reply's infos when every env of it returned the same keys, each with numbers of one type
    (MuJoCo's and ALE's every step): one numpy record per env in one ``bytes`` (cheap to pickle:
    numpy scalars and arrays are not). Record ``k`` belongs to the reply's ``k``-th env."""

    keys: tuple[str, ...]
    types: tuple[type, ...]  # each key's value type, as the envs returned it (gymnasium's dtype)
    rows: int
    data: bytes

    def records(self) -> np.ndarray:
        """The records as a read-only structured array viewing ``data``, one field per key."""
        return np.frombuffer(self.data, record_dtype(self.keys, self.types), self.rows)

    def as_dicts(self) -> list[dict[str, Any]]:
        """The infos as the envs returned them, one dict per row (values of their original types)."""
        recs = self.records()
        cols = [recs[k].tolist() if kind in _SCALARS else recs[k] for k, kind in zip(self.keys, self.types, strict=True)]
        return [{k: kind(col[r]) for k, kind, col in zip(self.keys, self.types, cols, strict=True)} for r in range(self.rows)]


@functools.lru_cache(maxsize=256)
def record_dtype(keys: tuple[str, ...], types: tuple[type, ...]) -> np.dtype:
    """One field per info key, of that key's type."""
    return np.dtype(list(zip(keys, types, strict=True)))


_SCALARS = (int, float, bool)


def _batchable(kind: type) -> bool:
    """What gymnasium batches into a numeric array (``numpy.bool_`` is not: it gets an object array)."""
    return kind in _SCALARS or issubclass(kind, np.number)


@functools.lru_cache(maxsize=256)
def _record_schema(keys: tuple, types: tuple[type, ...]) -> bool:
    """Whether infos of these keys and value types can travel as records (decided once per schema)."""
    return all(map(_batchable, types)) and all(type(k) is str and k for k in keys)


def pack_infos(infos: list[dict | None]) -> InfoRecords | list[dict | None]:
    """One reply's infos (aligned with its env ids) as records when every env returned the same
    string keys with numbers of the same type per key; else as they are."""
    first = infos[0]
    if not first:
        return infos
    keys = first.keys()
    types = tuple(map(type, first.values()))
    for info in infos:
        if not info or info.keys() != keys or tuple(map(type, info.values())) != types:
            return infos
    keys = tuple(keys)
    if not _record_schema(keys, types):
        return infos
    try:
        data = np.array([tuple(info.values()) for info in infos], record_dtype(keys, types)).tobytes()
    except (OverflowError, ValueError, TypeError):  # an int beyond int64 and the like: they travel as they are
        return infos
    return InfoRecords(keys, types, len(infos), data)


NO_TIMING = Timing(0.0, 0.0, 0.0)

STEP_SHARD = b"\x01"
"""Command: step every env this worker hosts, in env-id order."""

_FAST = struct.Struct("=Bddd")
FAST_REPLY_SIZE = _FAST.size
FAST_MARK = 1


def fast_reply(timing: Timing) -> bytes:
    """A step reply with no infos and no errors: a marker byte, then the :class:`Timing`."""
    return _FAST.pack(FAST_MARK, *timing)


RECORDS_MARK = 2
_RECORDS = struct.Struct("=BdddHII")  # marker, timing, schema number, length of the pickled schema (0: sent before), rows
MAX_SCHEMAS = 256
"""Schemas one worker numbers; beyond that, replies travel pickled (infos whose keys never settle)."""


def records_reply(timing: Timing, infos: InfoRecords, schemas: dict[tuple, int]) -> bytes | None:
    """A step reply whose infos are records, without pickle: the schema (keys, types) travels once per
    worker, numbered in ``schemas`` (the worker's own record); None when that record is full."""
    key = (infos.keys, infos.types)
    number = schemas.get(key)
    schema = b""
    if number is None:
        if len(schemas) >= MAX_SCHEMAS:
            return None
        number = schemas[key] = len(schemas)
        schema = pickle.dumps(key, _PROTOCOL)
    return _RECORDS.pack(RECORDS_MARK, *timing, number, len(schema), infos.rows) + schema + infos.data


def pack_step_infos(infos: list[dict | None] | None, errors: list | None) -> InfoRecords | list[dict | None] | None:
    """A step's infos as the fast paths carry them: records where :func:`pack_infos` can (no errors), else as they are."""
    return pack_infos(infos) if infos is not None and errors is None else infos


def is_fast_step(infos: Any, errors: list | None) -> bool:
    """Whether a step's reply takes a fast path: no errors, and infos None or records."""
    return errors is None and (infos is None or type(infos) is InfoRecords)


def step_frame(timing: Timing, infos: Any, schemas: dict[tuple, int]) -> bytes | None:
    """A fast step's frame (:func:`fast_reply` or :func:`records_reply`); None where the reply must be pickled."""
    if infos is None:
        return fast_reply(timing)
    return records_reply(timing, infos, schemas) if type(infos) is InfoRecords else None


_PROTOCOL = pickle.HIGHEST_PROTOCOL


def encode(msg: tuple[Any, ...]) -> bytes:
    return pickle.dumps(msg, _PROTOCOL)


def decode_reply(frame: bytes | memoryview, schemas: dict[int, tuple]) -> Reply | Timing:
    """A reply frame: a pickled :class:`Reply` (pickles start with 0x80), a fast step reply (just its
    :class:`Timing`), or a step reply with infos as records (``schemas``: what this worker numbered so far)."""
    mark = frame[0]
    if mark == FAST_MARK and len(frame) == FAST_REPLY_SIZE:
        return Timing(*_FAST.unpack(frame)[1:])
    if mark == RECORDS_MARK:
        return Reply(STEP, None, decode_records(frame, schemas)[1], None, Timing(*_RECORDS.unpack_from(frame)[1:4]))
    return pickle.loads(frame)


def decode_records(frame: bytes | memoryview, schemas: dict[int, tuple]) -> tuple[Timing, InfoRecords]:
    """A :func:`records_reply` frame as its timing and infos."""
    _, cpu, wall, runq, number, size, rows = _RECORDS.unpack_from(frame)
    start = _RECORDS.size
    if size:
        schemas[number] = pickle.loads(frame[start : start + size])
    keys, types = schemas[number]
    return Timing(cpu, wall, runq), InfoRecords(keys, types, rows, bytes(frame[start + size :]))


decode = pickle.loads
