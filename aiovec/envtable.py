"""The per-env state machine of one vector env: the single owner of every env's state.

Each env is in one :class:`EnvState`. Transitions are methods named after the event
that causes them, vectorised over arrays of env ids, so the hot path (a whole batch
stepped without errors) costs a few numpy operations whatever the number of envs::

    IDLE --send--> STEPPING --step_done--> READY --collect--> IDLE
    IDLE/BROKEN --begin_reset--> RESETTING --reset_done--> IDLE (or BROKEN)
    STEPPING --step_failed--> BROKEN (the env raised; reset it)
    any --worker_lost--> LOST (a READY result already in the buffers stays deliverable)
    STEPPING --worker_restarted--> READY (a synthesised truncation: the worker died mid-step)
    STEPPING --worker_restarted--> STEPPING (its step was a reset row: sent again, to the new worker)
    IDLE/READY --worker_restarted--> flagged "restarted": the next send truncates instead of stepping
    (same-step autoreset: STEPPING stays STEPPING, sent again; every env is flagged "cut": the new worker's
    first row for it, a reset, is delivered as the truncation of the cut episode, see :meth:`take_cut`)

The table knows nothing of workers, sockets or asyncio; the vector env calls its
transitions from reply handlers, and :meth:`check` verifies the invariants (run after
every transition in debug mode: ``python -X dev`` or ``AIOVEC_DEBUG=1``).

Placement (which worker hosts an env, moves in progress) is not here: it belongs to
the pool, which only asks the vector env whether an env may move (:meth:`movable`).
"""

from __future__ import annotations

import os
import sys
import time
from enum import IntEnum
from typing import Any

import numpy as np

from .errors import EnvStateError, WorkerCrashedError
from .protocol import InfoRecords


class EnvState(IntEnum):
    """Where one env is in its step cycle."""

    IDLE = 0  # may be sent an action or reset
    STEPPING = 1  # a step command is in flight
    READY = 2  # its result is in the buffers, not yet handed out by recv/step
    RESETTING = 3  # a reset command is in flight
    BROKEN = 4  # its last step or reset raised: only a reset is allowed
    LOST = 5  # its worker died and no restart was left


STATE_NAMES = {
    EnvState.IDLE: "idle",
    EnvState.STEPPING: "stepping",
    EnvState.READY: "ready (result not received yet)",
    EnvState.RESETTING: "resetting",
    EnvState.BROKEN: "broken (reset it)",
    EnvState.LOST: "lost (worker died)",
}

IDLE, STEPPING, READY, RESETTING, BROKEN, LOST = (int(s) for s in EnvState)


def debug_enabled() -> bool:
    """Whether invariants are checked after every transition (``-X dev`` or ``AIOVEC_DEBUG=1``)."""
    return bool(sys.flags.dev_mode or os.environ.get("AIOVEC_DEBUG"))


class EnvTable:
    """States, episode boundaries, arrival order and pending infos of ``num_envs`` envs.

    Invariants (see :meth:`check`):

    - ``in_flight`` equals the number of STEPPING envs;
    - ``num_ready`` equals the number of READY envs, and each has an arrival number already handed out;
    - only IDLE or READY envs carry the ``restarted`` flag; only IDLE, READY or STEPPING envs the ``cut`` flag;
    - every LOST env has the error that lost it;
    - an env with a pending info is READY and has exactly one (a dict or a row of one block).
    - ``settled`` (set only by a clean in-turn batch, cleared by every other transition) means every env is IDLE.
    """

    def __init__(self, num_envs: int, *, debug: bool | None = None) -> None:
        n = self.num_envs = num_envs
        self.state = np.full(n, IDLE, dtype=np.int8)
        self._boundary = np.ones(n, dtype=np.bool_)  # at an episode boundary: may move between workers
        # Reset (or never stepped) since its last row: a boundary that is a start, not an end of an episode.
        self.fresh = np.ones(n, dtype=np.bool_)
        self._some_fresh = True
        # Flag arrays whose OR is the boundary of every env, not computed yet (see stepped_in_turn).
        self._flags: tuple[np.ndarray, np.ndarray] | None = None
        self.restarted = np.zeros(n, dtype=np.bool_)  # its worker was replaced while it was idle
        self.cut = np.zeros(n, dtype=np.bool_)  # same-step autoreset: its next row from the new worker ends the cut episode
        self.arrival = np.zeros(n, dtype=np.int64)  # order in which READY envs finished
        self._next_arrival = 0
        self.infos: dict[int, dict] = {}  # READY env -> its non-empty info
        self.info_blocks: list[InfoBlock] = []  # READY envs' infos that arrived as records
        self.lost: dict[int, WorkerCrashedError] = {}
        self.in_flight = 0
        self.num_ready = 0
        self.num_restarted = 0
        self.num_cut = 0
        self.settled = False  # every env IDLE, as the last transition (a clean in-turn step) left them
        self.in_turn_batches = 0  # clean batches stepped in turn: which one ``settled`` refers to
        self._busy_s = 0.0  # time with at least one step in flight: the caller's demand
        self._busy_since = 0.0
        self.debug = debug_enabled() if debug is None else debug
        self.all = np.arange(n)

    # -- queries ------------------------------------------------------------------------
    @property
    def boundary(self) -> np.ndarray:
        """Per env, whether it is at an episode boundary (its last step ended the episode, or it was
        reset): where it may move to another worker."""
        if self._flags is not None:
            self._resolve_boundary()
        return self._boundary

    def _resolve_boundary(self) -> None:
        np.logical_or(*self._flags, out=self._boundary)  # type: ignore[misc]
        self._flags = None

    def _unsettle(self) -> None:
        """Any transition but a clean in-turn step: the boundary a settled table left pending is read
        from the flags now, before a step of the envs may overwrite them."""
        self.settled = False
        if self._flags is not None:
            self._resolve_boundary()

    def require(self, ids: Any, allowed: tuple[int, ...], what: str) -> None:
        """Raise unless every env in ``ids`` is in one of ``allowed`` (a lost env raises its crash)."""
        st = self.state[ids]
        if allowed == (IDLE,):  # IDLE is 0: one reduction, the hot path of every send
            if not np.count_nonzero(st):
                return
            bad = st != IDLE
        else:
            bad = ~np.isin(st, allowed)
        if bad.any():
            i = int(self.all[ids][np.argmax(bad)])
            if self.state[i] == LOST and i in self.lost:
                raise self.lost[i]
            raise EnvStateError(f"cannot {what} env {i}: it is {STATE_NAMES[EnvState(self.state[i])]}")

    def all_idle(self) -> bool:
        return not self.in_flight and not self.num_ready and bool((self.state == IDLE).all())

    def oldest_ready(self, k: int) -> np.ndarray:
        """The ``k`` READY envs that finished first, in the order they finished."""
        ready = np.flatnonzero(self.state == READY)
        if len(ready) > k or (len(ready) > 1 and not _sorted(self.arrival[ready])):
            ready = ready[np.argsort(self.arrival[ready], kind="stable")[:k]]
        return ready

    def movable(self, i: int) -> bool:
        """Whether env ``i`` may move to another worker now (idle, or ready, at an episode boundary)."""
        return bool(self.boundary[i]) and self.state[i] in (IDLE, READY, BROKEN)

    def busy_time(self) -> float:
        """Seconds so far with at least one step in flight."""
        return self._busy_s + (time.perf_counter() - self._busy_since if self.in_flight else 0.0)

    # -- transitions --------------------------------------------------------------------
    def send(self, ids: Any, ran_s: float = 0.0) -> tuple[Any, np.ndarray | None]:
        """IDLE -> STEPPING for ``ids`` (an id array or a slice; checked by the caller).

        Envs flagged restarted do not step: returns ``(stepping, held)``, ``held`` being None
        or the ids held back; the caller writes their truncation and calls :meth:`truncate_restarted`.
        ``ran_s``: how long these steps already ran, where they ran before this transition (stepped in the
        caller's turn, accounted as a reply afterwards): it counts as busy time, the caller's demand.
        """
        self._unsettle()
        held = None
        if self.num_restarted:
            flags = self.restarted[ids]
            if np.count_nonzero(flags):
                rows = self.all[ids]
                held, ids = rows[flags], rows[~flags]
        count = self.num_envs if isinstance(ids, slice) else len(ids)
        self.state[ids] = STEPPING
        if not self.in_flight and count:
            self._busy_since = time.perf_counter() - ran_s
        self.in_flight += count
        if self.debug:
            self.check()
        return ids, held

    def stepped_in_turn(self, terminations: np.ndarray, truncations: np.ndarray, busy_s: float) -> None:
        """IDLE -> IDLE for every env: all stepped cleanly within the caller's turn (a lone inline
        worker), so no step was ever in flight for another task to see; what changes is each env's
        episode boundary and the busy time. The caller checked that every env was idle and none
        restarted (:meth:`send`, :meth:`step_done` and :meth:`collect` in one, for the hot path).

        ``terminations``/``truncations`` are kept, not read: the boundary is their OR, computed when
        it is read or when the next transition (which any step or reset of an env passes first) leaves
        the table unsettled; until then nothing writes them, since every env is idle."""
        self._flags = (terminations, truncations)  # the boundary, computed only when read or before they change
        if self._some_fresh:
            self._unfresh(slice(None))
        self._busy_s += busy_s
        self.settled = True
        self.in_turn_batches += 1
        if self.debug:
            assert not self.num_restarted and not np.count_nonzero(self.state), "stepped in turn: every env must be idle"
            self.check()

    def truncate_restarted(self, ids: np.ndarray) -> None:
        """IDLE (restarted) -> READY with a synthesised truncation, for envs :meth:`send` held back."""
        self._unsettle()
        self.restarted[ids] = False
        self.num_restarted -= len(ids)
        self._make_ready(ids)
        for i in ids.tolist():
            self.infos[i] = {"worker_restarted": True}
        self.boundary[ids] = True
        if self._some_fresh:
            self._unfresh(ids)
        if self.debug:
            self.check()

    def step_done(self, ids: np.ndarray, terminations: np.ndarray, truncations: np.ndarray, infos: list | None,
                  errors: list | None) -> list[int]:
        """STEPPING -> READY for a worker's reply over ``ids`` (env errors: -> BROKEN).

        ``terminations``/``truncations``: the flags of every env (indexed by env id); ``infos``: None
        or one info (or None) per id; ``errors``: None or ``(env_id, ...)`` tuples. Returns the failed ids.
        """
        self._unsettle()
        self.in_flight -= len(ids)
        if not self.in_flight:
            self._busy_s += time.perf_counter() - self._busy_since
        if errors is None and infos is None and len(ids) == self.num_envs:  # the whole batch, clean: no fancy indexing
            self.state.fill(READY)
            self.arrival.fill(self._next_arrival)
            self._next_arrival += 1
            self.num_ready += self.num_envs
            np.logical_or(terminations, truncations, out=self.boundary)
            if self._some_fresh:
                self._unfresh(slice(None))
            if self.debug:
                self.check()
            return []
        failed: list[int] = []
        if type(infos) is InfoRecords:
            if errors:  # a worker packs records only when every env returned an info, so never in fact
                infos = infos.as_dicts()
            else:
                self.info_blocks.append(InfoBlock(np.array(ids, dtype=np.int64), infos))
                infos = None
        if errors:
            failed = [e[0] for e in errors]
            self.state[failed] = BROKEN
            keep = ~np.isin(ids, failed)
            ids = ids[keep]
            if infos is not None:
                infos = [info for info, k in zip(infos, keep.tolist(), strict=True) if k]
        rows = slice(None) if len(ids) == self.num_envs else ids  # a whole batch: no fancy indexing
        self._make_ready(rows, len(ids))
        if isinstance(rows, slice):
            np.logical_or(terminations, truncations, out=self.boundary)
        else:
            self.boundary[rows] = terminations[rows] | truncations[rows]
        if self._some_fresh:
            self._unfresh(rows)
        if infos is not None:
            for i, info in zip(ids.tolist(), infos, strict=True):
                if info:
                    self.infos[i] = info
        if self.debug:
            self.check()
        return failed

    def collect(self, ids: Any) -> tuple[list[tuple[int, dict]], list[tuple[np.ndarray, InfoRecords, np.ndarray | None]]]:
        """READY -> IDLE for ``ids`` (LOST for envs whose worker died meanwhile).

        Returns their infos, rows counted within ``ids``: ``(row, info)`` for each dict, and
        ``(rows, records, selected)`` for each block of records (``selected``: which of the
        block's rows, None for all), ready for :func:`aiovec.infos.batch_infos`.
        """
        self._unsettle()
        rows: list[tuple[int, dict]] = []
        if self.infos:
            pop = self.infos.pop
            for k, i in enumerate(self.all[ids].tolist()):
                info = pop(i, None)
                if info is not None:
                    rows.append((k, info))
        parts = self._collect_blocks(ids) if self.info_blocks else []
        if isinstance(ids, slice):
            self.state.fill(IDLE)
            self.num_ready -= self.num_envs
        else:
            self.state[ids] = IDLE
            self.num_ready -= len(ids)
        if self.lost:
            for i in self.all[ids].tolist():
                if i in self.lost:
                    self.state[i] = LOST
                    if self.restarted[i]:
                        self.restarted[i] = False
                        self.num_restarted -= 1
        if self.debug:
            self.check()
        return rows, parts

    def _collect_blocks(self, ids: Any) -> list[tuple[np.ndarray, InfoRecords, np.ndarray | None]]:
        parts, keep = [], []
        if isinstance(ids, slice):  # every env, in env order: an env's row is its id
            for block in self.info_blocks:
                parts.append((block.ids if block.pending is None else block.ids[block.pending], block.records, block.pending))
            self.info_blocks = []
            return parts
        row_of = np.full(self.num_envs, -1, dtype=np.int64)
        row_of[ids] = np.arange(len(ids))
        for block in self.info_blocks:
            rows = row_of[block.ids]
            taken = rows >= 0 if block.pending is None else (rows >= 0) & block.pending
            count = np.count_nonzero(taken)
            if count == len(rows):
                parts.append((rows, block.records, None))
                continue
            if count:
                parts.append((rows[taken], block.records, taken))
                block.pending = taken ^ (block.pending if block.pending is not None else True)
                if not block.pending.any():  # its last rows went now
                    continue
            keep.append(block)
        self.info_blocks = keep
        return parts

    def begin_reset(self, ids: np.ndarray) -> None:
        """IDLE/BROKEN -> RESETTING (checked by the caller); a reset clears the restarted and cut flags (it ends the
        episode the worker's death cut, and the caller knows)."""
        self._unsettle()
        self.state[ids] = RESETTING
        cleared = int(self.restarted[ids].sum())
        if cleared:
            self.restarted[ids] = False
            self.num_restarted -= cleared
        if self.num_cut:
            self._uncut(ids)
        if self.debug:
            self.check()

    def reset_done(self, ids: Any, failed: list[int]) -> None:
        """RESETTING -> IDLE at an episode boundary (-> BROKEN for envs whose reset raised)."""
        self._unsettle()
        ids = np.asarray(ids, dtype=np.int64)
        if failed:
            self.state[failed] = BROKEN
            ids = ids[~np.isin(ids, failed)]
        self.state[ids] = IDLE
        self.boundary[ids] = True
        self.fresh[ids] = True
        self._some_fresh = True
        if self.debug:
            self.check()

    def ended(self, i: int) -> bool:
        """Whether env ``i``'s last row (delivered or ready) ended its episode; for a stepping env, the
        row before the step in flight."""
        return bool(self.boundary[i]) and not self.fresh[i]

    def worker_restarted(self, ids: list[int], reset_rows_follow: bool = False, cut_rows_follow: bool = False) -> tuple[list[int], list[int]]:
        """A worker died and a new one takes over ``ids``. Returns ``(truncated, resent)``.

        STEPPING -> READY (``truncated``: the caller writes their truncation into the buffers),
        RESETTING -> BROKEN (the reset is lost; resetting again is allowed), IDLE/READY ->
        flagged restarted (their next send truncates instead of stepping).

        ``reset_rows_follow`` (next-step autoreset): an env whose last row ended its episode steps
        into a reset row, which its new worker gives as well as the old one would have, so no episode
        is cut: idle or ready, it is not flagged; stepping, it stays STEPPING (``resent``: the caller
        sends that step again, to the new worker) rather than ending a zero-length episode.

        ``cut_rows_follow`` (same-step autoreset, where a row that ends an episode carries the next one's first
        observation): the new worker resets each env at its next step, and that row is the truncation, so
        nothing is synthesised: stepping envs are sent again (``resent``), and every env is flagged ``cut``.
        """
        self._unsettle()
        synthesized, resent = [], []
        for i in ids:
            if i in self.lost:
                continue  # its own worker is gone for good: nothing restarts it
            st = self.state[i]
            ended = reset_rows_follow and self.ended(i)
            if cut_rows_follow and st in (IDLE, READY, STEPPING):
                if st == STEPPING:
                    resent.append(i)
                if not self.cut[i]:
                    self.cut[i] = True
                    self.num_cut += 1
            elif st == RESETTING:
                self.state[i] = BROKEN
            elif st == STEPPING and ended:
                resent.append(i)
            elif st == STEPPING:
                self.in_flight -= 1
                self._make_ready(np.array([i]))
                self.infos[i] = {"worker_restarted": True}
                self.boundary[i] = True
                self.fresh[i] = False
                synthesized.append(i)
            elif st in (IDLE, READY) and not self.restarted[i] and not ended:
                self.restarted[i] = True
                self.num_restarted += 1
        if not self.in_flight and self._busy_since and synthesized:
            self._busy_s += time.perf_counter() - self._busy_since
        if self.debug:
            self.check()
        return synthesized, resent

    def worker_lost(self, ids: list[int], err: WorkerCrashedError) -> None:
        """A worker died with no restart left: its envs become LOST (a READY result stays deliverable)."""
        self._unsettle()
        for i in ids:
            st = self.state[i]
            if st == STEPPING:
                self.in_flight -= 1
            if st != READY:
                self.state[i] = LOST
            if self.restarted[i]:
                self.restarted[i] = False
                self.num_restarted -= 1
            if self.cut[i]:
                self.cut[i] = False
                self.num_cut -= 1
            self.lost[i] = err
        if self.debug:
            self.check()

    def take_cut(self, ids: np.ndarray) -> np.ndarray:
        """Of ``ids`` (a worker's reply, before :meth:`step_done`), the envs flagged ``cut``, flags cleared: the
        caller turns their rows (a reset by the new worker) into the truncation of the episode the death cut."""
        mine = ids[self.cut[ids]]
        self._uncut(mine)
        return mine

    def _uncut(self, ids: Any) -> None:
        cleared = int(np.count_nonzero(self.cut[ids]))
        if cleared:
            self.cut[ids] = False
            self.num_cut -= cleared

    def _unfresh(self, rows: Any) -> None:
        """A row arrived for ``rows``: their boundary (if any) is now the end of an episode."""
        self.fresh[rows] = False
        if isinstance(rows, slice) or not self.fresh.any():
            self._some_fresh = False

    def _make_ready(self, ids: Any, k: int | None = None) -> None:
        """-> READY, all with one arrival number: envs of one reply finished together (ties: env order)."""
        self._unsettle()
        self.state[ids] = READY
        self.arrival[ids] = self._next_arrival
        self._next_arrival += 1
        self.num_ready += len(ids) if k is None else k

    # -- invariants ---------------------------------------------------------------------
    def _verify(self) -> None:
        if self.debug:
            self.check()

    def check(self) -> None:
        """Raise AssertionError naming the first broken invariant."""
        st = self.state
        assert not self.settled or not np.count_nonzero(st), "settled, but not every env is idle"
        stepping = int((st == STEPPING).sum())
        assert self.in_flight == stepping, f"in_flight={self.in_flight} but {stepping} envs are stepping"
        ready = np.flatnonzero(st == READY)
        assert self.num_ready == len(ready), f"num_ready={self.num_ready} but {len(ready)} envs are ready"
        assert (self.arrival[ready] < self._next_arrival).all(), "a ready env without an arrival number"
        flagged = np.flatnonzero(self.restarted)
        assert self.num_restarted == len(flagged), f"num_restarted={self.num_restarted} but {len(flagged)} flagged"
        assert np.isin(st[flagged], (IDLE, READY)).all(), "a restarted flag on an env that is neither idle nor ready"
        cut = np.flatnonzero(self.cut)
        assert self.num_cut == len(cut), f"num_cut={self.num_cut} but {len(cut)} flagged"
        assert np.isin(st[cut], (IDLE, READY, STEPPING)).all(), "a cut flag on an env that is not idle, ready or stepping"
        assert all(st[i] == READY for i in self.infos), "an info is pending for an env that is not ready"
        pending = [b.ids if b.pending is None else b.ids[b.pending] for b in self.info_blocks]
        in_blocks = np.concatenate(pending) if pending else np.zeros(0, dtype=np.int64)
        assert (st[in_blocks] == READY).all(), "a record info is pending for an env that is not ready"
        assert len(np.unique(in_blocks)) == len(in_blocks), "an env has infos pending in two blocks"
        assert all(b.pending is None or b.pending.any() for b in self.info_blocks), "a block with nothing pending is kept"
        assert not set(in_blocks.tolist()) & set(self.infos), "an env has both a dict info and a record info pending"
        assert not (self.fresh & ~self.boundary).any(), "a fresh env that is not at an episode boundary"
        assert self._some_fresh or not self.fresh.any(), "fresh envs the table does not know of"
        lost = np.flatnonzero(st == LOST)
        assert all(int(i) in self.lost for i in lost), "a lost env without the error that lost it"


class InfoBlock:
    """One reply's infos as records, pending until their envs are collected (possibly over several collects)."""

    __slots__ = ("ids", "records", "pending")

    def __init__(self, ids: np.ndarray, records: InfoRecords) -> None:
        self.ids = ids  # env id of each row
        self.records = records
        self.pending: np.ndarray | None = None  # rows not collected yet; None: all of them


def _sorted(a: np.ndarray) -> bool:
    return bool((a[1:] >= a[:-1]).all())
