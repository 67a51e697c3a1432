"""The messages between the parent and a worker: small pickled tuples.

Bulk data (actions, observations, rewards, flags) never travels in a message:
it sits in shared memory (process backend) or in the reply's ``arrays``
(backends without shared memory). A message only names env ids.

Parent -> worker: ``(op, *args)``
    ADD     (env_id, factory_bytes, state)   host an env; ``state`` carries an env moved from elsewhere
    REMOVE  (env_ids,)                       stop hosting envs; reply carries their portable state
    STEP    (env_ids,)                       step (or autoreset) each env with its action row
    RESET   (env_ids, seeds, options)
    CALL    (env_ids, kind, name, payload)   kind: "call" (payload=(args, kwargs)), "get", "set" (payload=values)
    CLOSE   ()
    TUNE    (options,)                       transport settings that change while it runs: {"spin_s": seconds}

Worker -> parent: ``(op, env_ids, payload, errors, timing)`` where ``errors`` is
``None`` or a list of ``(env_id, exc_type, message, traceback)`` and ``timing`` is
``(cpu_s, wall_s, runq_s)`` for the whole command. READY's payload is the worker's pid, or
``(pid, spin_s)`` from a worker that can spin; TUNE's is the settings now in effect.
"""

from __future__ import annotations

import pickle
from typing import Any

ADD, REMOVE, STEP, RESET, CALL, CLOSE, READY, TUNE = range(8)
OP_NAMES = ("add", "remove", "step", "reset", "call", "close", "ready", "tune")

_PROTOCOL = pickle.HIGHEST_PROTOCOL


def encode(msg: tuple[Any, ...]) -> bytes:
    return pickle.dumps(msg, _PROTOCOL)


decode = pickle.loads
