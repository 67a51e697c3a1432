"""The env table alone: every transition against a plain reference model, invariants after each.

The table is the single owner of per-env state, so it is tested without workers: random
sequences of the events the vector env feeds it (sends, replies with and without errors,
collects, resets, worker restarts and losses) must keep it equal to a dict-of-states model
and keep every invariant (``EnvTable.check``).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aiovec.envtable import BROKEN, IDLE, LOST, READY, RESETTING, STEPPING, EnvState, EnvTable
from aiovec.errors import EnvStateError, WorkerCrashedError
from aiovec.infos import batch_infos
from aiovec.protocol import pack_infos

N = 6


def crash(ids: list[int]) -> WorkerCrashedError:
    return WorkerCrashedError(0, ids, -9, None, "test")


OTHER_TRANSITIONS = {  # every transition but a clean in-turn batch, each on env 1
    "send": lambda t: t.send(np.array([1])),
    "begin_reset": lambda t: t.begin_reset(np.array([1])),
    "worker_restarted": lambda t: t.worker_restarted([1]),
    "worker_lost": lambda t: t.worker_lost([1], crash([1])),
}


def test_states_are_an_int_enum_and_idle_is_zero() -> None:
    assert [s.name for s in EnvState] == ["IDLE", "STEPPING", "READY", "RESETTING", "BROKEN", "LOST"]
    assert IDLE == 0  # the hot path checks "all idle" with one reduction


def test_lock_step_cycle_and_arrival_order() -> None:
    t = EnvTable(N, debug=True)
    stepping, held = t.send(slice(None))
    assert held is None and t.in_flight == N
    done = np.zeros(N, bool)
    done[4] = True
    t.step_done(np.array([3, 4, 5]), done, np.zeros(N, bool), [None, {"x": 1}, None], None)
    t.step_done(np.array([0, 1, 2]), done, np.zeros(N, bool), None, None)
    assert t.in_flight == 0 and t.num_ready == N
    assert t.oldest_ready(4).tolist() == [3, 4, 5, 0]
    assert t.boundary.tolist() == [False, False, False, False, True, False]
    rows, parts = t.collect(np.array([3, 4, 5, 0]))
    assert rows == [(1, {"x": 1})] and parts == []
    assert t.num_ready == 2 and t.state.tolist() == [IDLE, READY, READY, IDLE, IDLE, IDLE]



def test_stepped_in_turn_updates_boundaries_and_busy_time_and_refuses_a_busy_table() -> None:
    """A lone inline worker's clean batch: IDLE -> IDLE, as send + step_done + collect would leave it."""
    t, ref = EnvTable(N, debug=True), EnvTable(N, debug=True)
    terms, truncs = np.zeros(N, bool), np.zeros(N, bool)
    terms[1], truncs[4] = True, True
    t.stepped_in_turn(terms, truncs, 0.25)
    ref.send(slice(None))
    ref.step_done(np.arange(N), terms, truncs, None, None)
    ref.collect(slice(None))
    assert t.boundary.tolist() == ref.boundary.tolist() == [False, True, False, False, True, False]
    assert t.state.tolist() == ref.state.tolist() == [IDLE] * N and t.in_flight == t.num_ready == 0
    assert t.busy_time() == pytest.approx(0.25)
    t.send(np.array([2]))
    with pytest.raises(AssertionError, match="every env must be idle"):
        t.stepped_in_turn(terms, truncs, 0.0)


def test_steps_that_ran_before_their_send_count_as_busy_time() -> None:
    """A batch stepped in the caller's turn and then accounted as a reply (it returned infos or errors) is sent
    with the time it ran: that time is the caller's demand, as if it had been in flight."""
    t = EnvTable(N, debug=True)
    t.send(slice(None), ran_s=0.25)
    t.step_done(np.arange(N), np.zeros(N, bool), np.zeros(N, bool), None, None)
    assert t.busy_time() >= 0.25


def test_the_boundary_of_an_in_turn_batch_is_the_flags_as_they_were_at_the_next_transition() -> None:
    """stepped_in_turn keeps the flag arrays (the shared result buffers) instead of reading them; the
    next transition reads them, so a step that then overwrites the buffers does not move the boundary
    of the envs it did not step, and every read in between sees the batch's flags."""
    for name, transition in OTHER_TRANSITIONS.items():
        t = EnvTable(N, debug=True)
        terms, truncs = np.zeros(N, bool), np.zeros(N, bool)
        terms[2], truncs[4] = True, True
        t.stepped_in_turn(terms, truncs, 0.0)
        assert t.movable(2) and t.movable(4) and not t.movable(0), name
        transition(t)
        terms[:], truncs[:] = ~terms, False  # the buffers, overwritten by a later step of the envs
        assert t.boundary[[0, 2, 3, 4, 5]].tolist() == [False, True, False, True, False], name
    t = EnvTable(N, debug=True)  # two batches in a row: the last one's flags count
    first, second, nothing = np.ones(N, bool), np.zeros(N, bool), np.zeros(N, bool)
    t.stepped_in_turn(first, nothing, 0.0)
    t.stepped_in_turn(second, nothing, 0.0)
    assert t.boundary.tolist() == [False] * N


def test_settled_says_every_env_is_idle_until_any_other_transition() -> None:
    """``settled`` lets step() skip its look at every env's state after a clean in-turn batch; any other
    transition clears it, and check() refuses a settled table with an env that is not idle."""
    nothing = np.zeros(N, bool)
    for name, transition in OTHER_TRANSITIONS.items():
        t = EnvTable(N, debug=True)
        assert not t.settled
        t.stepped_in_turn(nothing, nothing, 0.0)
        assert t.settled
        transition(t)
        assert not t.settled, name
    t = EnvTable(N, debug=False)
    t.stepped_in_turn(nothing, nothing, 0.0)
    t.state[3] = BROKEN  # a transition that bypassed the table
    with pytest.raises(AssertionError, match="settled"):
        t.check()

def test_env_error_breaks_only_that_env_and_require_names_it() -> None:
    t = EnvTable(N, debug=True)
    t.send(np.arange(N))
    failed = t.step_done(np.arange(N), np.zeros(N, bool), np.zeros(N, bool), None, [(2, "ValueError", "boom", "tb")])
    assert failed == [2] and t.state[2] == BROKEN and t.num_ready == N - 1
    with pytest.raises(EnvStateError, match="env 2: it is broken"):
        t.require(np.array([2]), (IDLE,), "send to")
    t.collect(np.array([0, 1, 3, 4, 5]))
    t.begin_reset(np.array([2]))
    assert t.state[2] == RESETTING
    t.reset_done([2], [])
    assert t.state[2] == IDLE and t.boundary[2]


def test_idle_restart_holds_the_env_back_once_with_a_truncation() -> None:
    t = EnvTable(N, debug=True)
    t.worker_restarted([1, 2])  # their worker died between steps
    assert t.restarted.tolist() == [False, True, True, False, False, False] and t.in_flight == 0
    stepping, held = t.send(slice(None))
    assert held.tolist() == [1, 2] and stepping.tolist() == [0, 3, 4, 5] and t.in_flight == 4
    t.truncate_restarted(held)
    assert t.state[1] == READY and t.infos[1] == {"worker_restarted": True} and not t.restarted.any()
    t.step_done(stepping, np.zeros(N, bool), np.zeros(N, bool), None, None)
    rows, _ = t.collect(slice(None))
    assert len(rows) == 2
    assert t.send(slice(None))[1] is None  # once only


def test_a_restart_mid_step_of_a_reset_row_sends_that_step_again() -> None:
    """Next-step autoreset: env 0's last row ended its episode, so its step in flight is a reset row; env 1 was
    reset (a boundary too, but a start); env 2 is mid-episode. Their worker dies mid-step: env 0 stays stepping
    (sent again, no episode cut), envs 1 and 2 end truncated. Without next-step rows, all three truncate."""
    for follow, expect in ((True, ([1, 2], [0])), (False, ([0, 1, 2], []))):
        t = EnvTable(N, debug=True)
        t.begin_reset(np.arange(N))
        t.reset_done(np.arange(N), [])
        t.send(np.arange(N))
        te = np.zeros(N, bool)
        te[0] = True
        t.step_done(np.arange(N), te, np.zeros(N, bool), None, None)
        t.collect(slice(None))
        assert t.ended(0) and not t.ended(2) and not t.fresh.any()
        t.begin_reset(np.array([1]))
        t.reset_done([1], [])
        assert not t.ended(1) and t.boundary[1]
        t.send(np.arange(N))
        assert t.worker_restarted([0, 1, 2], reset_rows_follow=follow) == expect
        assert t.state[0] == (STEPPING if follow else READY) and t.state[1] == READY and t.state[3] == STEPPING
        assert t.in_flight == (N - 2 if follow else N - 3)


def test_mid_step_restart_and_loss() -> None:
    t = EnvTable(N, debug=True)
    t.send(np.arange(N))
    assert t.worker_restarted([0, 1]) == ([0, 1], [])  # mid-step: synthesised truncations, ready at once
    assert t.in_flight == N - 2 and t.num_ready == 2
    err = crash([2, 3])
    t.worker_lost([2, 3], err)
    assert t.state[2] == LOST and t.in_flight == N - 4 and t.lost[2] is err
    with pytest.raises(WorkerCrashedError):
        t.require(np.array([3]), (IDLE,), "send to")


def test_check_catches_a_broken_invariant() -> None:
    t = EnvTable(N, debug=False)
    t.state[0] = STEPPING  # a transition that bypassed the table
    with pytest.raises(AssertionError, match="in_flight"):
        t.check()


class Model:
    """The reference: one state per env in a dict, changed one env at a time."""

    def __init__(self) -> None:
        self.state = dict.fromkeys(range(N), IDLE)
        self.restarted: set[int] = set()
        self.order: list[int] = []  # ready envs in arrival order
        self.lost: set[int] = set()
        self.with_info: set[int] = set()  # ready envs whose reply carried an info


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["send", "reply", "fail", "collect", "reset", "restart", "lose", "in_turn"]),
                          st.lists(st.integers(0, N - 1), min_size=1, max_size=N, unique=True)), max_size=40))
def test_random_event_sequences_match_the_reference_model(events: list) -> None:
    t, m = EnvTable(N, debug=True), Model()
    for kind, ids in events:
        if kind == "send":
            ids = [i for i in ids if m.state[i] == IDLE]
            if not ids:
                continue
            stepping, held = t.send(np.array(ids))
            held_ids = [i for i in ids if i in m.restarted]
            assert (held.tolist() if held is not None else []) == held_ids
            if held is not None:
                t.truncate_restarted(held)
            for i in ids:
                if i in m.restarted:
                    m.restarted.discard(i)
                    m.state[i] = READY
                else:
                    m.state[i] = STEPPING
            m.order += sorted(held_ids)  # envs that become ready together queue in env order
        elif kind in ("reply", "fail"):
            ids = [i for i in ids if m.state[i] == STEPPING]
            if not ids:
                continue
            errs = [(ids[0], "E", "m", "tb")] if kind == "fail" else None
            # a clean reply carries one info per env, as columns (MuJoCo's and ALE's infos travel so)
            infos = None if errs else pack_infos([{"env": i, "half": i / 2} for i in ids])
            t.step_done(np.array(ids), np.zeros(N, bool), np.zeros(N, bool), infos, errs)
            if infos is not None:
                m.with_info.update(ids)
            for i in ids:
                m.state[i] = BROKEN if kind == "fail" and i == ids[0] else READY
            m.order += sorted(i for i in ids if m.state[i] == READY)
        elif kind == "collect":
            k = min(len(ids), len(m.order))
            if not k:
                continue
            got = t.oldest_ready(k).tolist()
            assert got == m.order[:k]
            rows, parts = t.collect(np.array(got))
            infos = batch_infos(len(got), rows, parts)
            for row, i in enumerate(got):  # each env's own info, on its own row, exactly once
                if i in m.with_info:
                    assert infos["_env"][row] and infos["env"][row] == i and infos["half"][row] == i / 2
                    m.with_info.discard(i)
                else:
                    assert "_env" not in infos or not infos["_env"][row]
            for i in got:
                m.state[i] = LOST if i in m.lost else IDLE
            del m.order[:k]
        elif kind == "reset":
            ids = [i for i in ids if m.state[i] in (IDLE, BROKEN)]
            if not ids:
                continue
            t.begin_reset(np.array(ids))
            t.reset_done(ids, [])
            for i in ids:
                m.state[i] = IDLE
                m.restarted.discard(i)
        elif kind == "restart":
            ids = [i for i in ids if m.state[i] != LOST]
            t.worker_restarted(ids)
            ids = [i for i in ids if i not in m.lost]  # a lost env's worker is gone for good
            for i in ids:
                if m.state[i] == STEPPING:
                    m.state[i] = READY
                    m.order.append(i)
                elif m.state[i] == RESETTING:
                    m.state[i] = BROKEN
                elif m.state[i] in (IDLE, READY):
                    m.restarted.add(i)
        elif kind == "in_turn":  # a lone inline worker's clean batch: only where every env is idle
            if any(m.state[i] != IDLE for i in range(N)) or m.restarted:
                continue
            t.stepped_in_turn(np.zeros(N, bool), np.zeros(N, bool), 0.0)
            assert t.settled
        elif kind == "lose":
            t.worker_lost(ids, crash(ids))
            m.lost.update(ids)
            for i in ids:
                if m.state[i] == READY:
                    continue  # its result stays deliverable; it becomes LOST when collected
                if i in m.order:
                    m.order.remove(i)
                m.state[i] = LOST
                m.restarted.discard(i)
            for i in ids:
                m.restarted.discard(i)
        t.check()
        assert t.state.tolist() == [m.state[i] for i in range(N)]
        assert sorted(np.flatnonzero(t.restarted).tolist()) == sorted(m.restarted)


def test_record_infos_collected_over_several_recvs_leave_nothing_behind() -> None:
    t = EnvTable(N, debug=True)
    for _ in range(3):
        t.send(np.arange(N))
        t.step_done(np.arange(N), np.zeros(N, bool), np.zeros(N, bool), pack_infos([{"env": i} for i in range(N)]), None)
        got = []
        for part in (np.array([4, 1]), np.array([0, 5, 2]), np.array([3])):  # first-finished batches across one reply
            rows, parts = t.collect(part)
            infos = batch_infos(len(part), rows, parts)
            got += list(zip(part.tolist(), infos["env"].tolist(), strict=True))
        assert sorted(got) == [(i, i) for i in range(N)]  # each env its own info, once
        assert t.info_blocks == []  # a block whose rows are all delivered is dropped
