"""Controller v2 (MeasuredController): deterministic traces on a simulated machine, and real workers.

The traces pin down the rules: lock-step efficient configurations only, threads for waiting envs,
a change that measured worse is reverted and not retried at once, threads move first after a
change of cost, fixed knobs stay fixed, one noisy interval moves nothing, v1 controllers and
measurements keep working. The real-worker test compares throughputs measured in the same test
(ratios and counts, never seconds).
"""

from __future__ import annotations

import asyncio
import dataclasses
import statistics
import time
from collections.abc import Callable

import numpy as np
import pytest
from conftest import assert_clean

import aiovec
from aiovec import Decision, MeasuredController, Measurement
from aiovec.autoconf import INLINE_ENTER_S, INLINE_LEAVE_S
from aiovec.configs import Config, efficient_counts, largest_shard
from aiovec.costmodel import Costs, predict
from aiovec.measured import MOVE_GAIN, config_of, inline_fits


def interval(c: Config, n: int, t_cpu: float, t_wait: float, rate: float | None = None, cpus: float = 2, **extra) -> Measurement:
    """What the control loop would report for one second at configuration ``c`` (throughput from the model unless given)."""
    x = rate if rate is not None else predict(c, Costs(t_cpu, t_wait, 20e-6), n, cpus)
    return Measurement(1.0, c.processes, n, int(x), t_cpu, t_wait, 0.0, 20e-6, 1.0, cpus,
                       threads=c.threads, placement=c.placement, lockstep=True, **extra)


def follow(ctrl: MeasuredController, c: Config, steps: int, truth: Callable[[Config], float] | None = None, **env) -> list[Config]:
    """Feed ``steps`` intervals, applying each decision; ``truth`` gives the steps/s a configuration really achieves."""
    trace = []
    for _ in range(steps):
        d = ctrl.decide(interval(c, rate=truth(c) if truth else None, **env))
        c = Config(d.placement or c.placement, d.target, d.threads or c.threads)
        trace.append(c)
    return trace


def test_waiting_envs_get_threads_not_processes_and_settle_within_ten_intervals() -> None:
    env = {"n": 64, "t_cpu": 20e-6, "t_wait": 5e-3}
    trace = follow(MeasuredController(), Config("process", 2, 1), 20, **env)
    final = trace[-1]
    assert final.processes <= 64 // 4 and final.concurrency >= 64, trace
    assert all(c == final for c in trace[9:]), [c.label for c in trace]


def test_cpu_bound_envs_get_one_process_per_core() -> None:
    trace = follow(MeasuredController(), Config("process", 8, 1), 12, n=8, t_cpu=1e-3, t_wait=0.0)
    assert trace[-1] == Config("process", 2, 1), [c.label for c in trace]


def test_lock_step_rates_processes_that_do_not_divide_over_the_cores_below_those_that_do() -> None:
    """24 envs of 1 ms CPU on 2 cores measured 12.4 ms a batch at 2 processes, 14.4 at 3, 12.8 at 4: a third
    process leaves one core with two shards. The model once rated 3 a tie with 2, so after the demo's change
    to computing the controller held 3 processes ~15% below 2."""
    cpu_bound = Costs(1e-3, 0.0, 20e-6)
    rate = {p: predict(Config("process", p, 1), cpu_bound, 24, 2) for p in (2, 3, 4)}
    assert rate[3] < 0.9 * rate[2] and rate[3] < 0.9 * rate[4], rate
    truth = {2: 1936, 3: 1670, 4: 1878, 6: 1846, 8: 1796, 12: 1750, 24: 1700}  # measured here (12, 24: below 8)
    trace = follow(MeasuredController(), Config("process", 3, 1), 12, truth=lambda c: truth.get(c.processes, 1000),
                   n=24, t_cpu=1e-3, t_wait=0.0)
    assert trace[-1].processes in (2, 4), [c.label for c in trace]


def test_lock_step_moves_only_between_efficient_process_counts() -> None:
    allowed = set(efficient_counts(24))
    for t_wait in (0.0, 3e-3, 20e-3):
        trace = follow(MeasuredController(), Config("process", 2, 1), 25, n=24, t_cpu=1e-3, t_wait=t_wait)
        assert {c.processes for c in trace} <= allowed
        assert 20 not in {c.processes for c in trace}


def test_a_change_that_measured_worse_is_reverted_and_not_retried_at_once() -> None:
    # The model likes 3 processes for CPU-bound envs on 2 cores as much as 2; here they really cost 30%.
    def truth(c: Config) -> float:
        base = predict(c, Costs(1e-3, 0.0, 20e-6), 12, 2)
        return base * (0.7 if c.processes > 2 else 1.0)

    ctrl = MeasuredController(prefer=0.0, gain=-0.01)  # eager: it will try a costlier near-tie
    trace = follow(ctrl, Config("process", 2, 1), 30, truth=truth, n=12, t_cpu=1e-3, t_wait=0.0)
    labels = [c.label for c in trace]
    assert trace[-1].processes == 2, labels
    reverted = [i for i in range(1, len(trace)) if trace[i - 1].processes > 2 and trace[i].processes == 2]
    assert len(reverted) <= 2, labels  # each loser banned for a while, not retried every interval
    assert sum(c.processes > 2 for c in trace[15:]) == 0, labels


def test_one_noisy_interval_moves_nothing() -> None:
    ctrl = MeasuredController()
    env = {"n": 8, "t_cpu": 1e-3, "t_wait": 0.0}
    c = follow(ctrl, Config("process", 2, 1), 10, **env)[-1]
    good = predict(c, Costs(1e-3, 0.0, 20e-6), 8, 2)
    d = ctrl.decide(interval(c, rate=0.4 * good, **env))  # host noise: one bad interval
    assert config_of(interval(c, **env)) == Config("process", d.target, d.threads or 1)
    assert d.target == c.processes and d.threads == c.threads



def test_intervals_that_disagree_are_measured_again_and_their_median_decides() -> None:
    """Two intervals of a visit 2x apart (the host busy for a moment; a slow start): a third is measured before
    anything is decided, and the median of the three decides, so the bad one does not count as half."""
    env = {"n": 16, "t_cpu": 100e-6, "t_wait": 2e-3}
    c = Config("process", 4, 4)
    good = predict(c, Costs(100e-6, 2e-3, 20e-6), 16, 2)
    ctrl = MeasuredController()
    reasons = [ctrl.decide(interval(c, rate=x, **env)).reason for x in (good, good, 0.5 * good)]
    assert reasons[0].startswith("warming up") and reasons[1].startswith("measuring")
    assert "again" in reasons[2] and "100% apart" in reasons[2], reasons
    d = ctrl.decide(interval(c, rate=good, **env))  # a third interval: the median is the good figure
    assert "again" not in d.reason and f"{int(good):,}" in d.reason, d.reason
    # Intervals that agree decide after ``confirm`` (2), as before.
    ctrl = MeasuredController()
    reasons = [ctrl.decide(interval(c, rate=x, **env)).reason for x in (good, good, 0.9 * good)]
    assert "again" not in reasons[2], reasons
    # One more only: intervals that keep disagreeing decide on the median of three.
    ctrl = MeasuredController()
    reasons = [ctrl.decide(interval(c, rate=x, **env)).reason for x in (good, good, 0.5 * good, 2 * good)]
    assert ["again" in r for r in reasons[2:]] == [True, False], reasons


def test_a_costlier_move_must_gain_more_than_its_intervals_scatter() -> None:
    """More processes must pay for themselves: a 4% gain from intervals that lie 12% apart is noise (a third interval
    is measured first: the gain is undecided, not a loss), and the controller moves back to fewer processes; the
    same 4% from agreeing intervals stands; a real 10% gain whose second interval dipped is measured once more, and
    the median of three keeps it (it was reverted after two: 40 waiting envs lost 11% to it)."""
    env = {"n": 16, "t_cpu": 100e-6, "t_wait": 2e-3}
    start = Config("process", 4, 4)
    rate = predict(start, Costs(100e-6, 2e-3, 20e-6), 16, 2)

    def run(b_rates: list[float]) -> list[Decision]:
        ctrl, c = MeasuredController(move_gain=0.0), start  # the model's promise here is below the default bar
        for _ in range(8):  # at the start until the model proposes a costlier neighbour
            d = ctrl.decide(interval(c, rate=rate, **env))
            if d.target != c.processes:
                break
        moved = Config(d.placement or c.placement, d.target, d.threads or c.threads)
        assert moved.processes > start.processes, [d.reason]
        return [ctrl.decide(interval(moved, rate=x, **env)) for x in [rate, *b_rates]]  # a warm-up, then the visit

    noisy = run([1.04 * rate * 1.06, 1.04 * rate * 0.94, 1.04 * rate])
    assert "again" in noisy[-2].reason and "within its intervals' scatter" in noisy[-2].reason, [d.reason for d in noisy]
    assert noisy[-1].target == start.processes and "revert" in noisy[-1].reason, [d.reason for d in noisy]
    steady = run([1.04 * rate, 1.04 * rate])
    assert all("revert" not in d.reason and "again" not in d.reason for d in steady), [d.reason for d in steady]
    dipped = run([1.10 * rate, 1.10 * rate * 0.91, 1.10 * rate])
    assert "again" in dipped[-2].reason, [d.reason for d in dipped]
    assert all("revert" not in d.reason for d in dipped), [d.reason for d in dipped]
    # A 13% gain whose first interval read low (a threads move still running commands sent before it) and whose
    # three intervals lie 18% apart: the median of three ignores the one out of line, and so does the bar.
    first_low = run([1.13 * rate * 0.918, 1.13 * rate * 1.095, 1.13 * rate])
    assert "again" in first_low[-2].reason, [d.reason for d in first_low]
    assert all("revert" not in d.reason for d in first_low), [d.reason for d in first_low]
    # The same spread around a 4% gain is still noise: the two intervals nearest the median lie 8% apart.
    noisier = run([1.04 * rate * 0.92, 1.04 * rate * 1.08, 1.04 * rate])
    assert noisier[-1].target == start.processes and "revert" in noisier[-1].reason, [d.reason for d in noisier]


def test_more_processes_on_the_models_word_must_promise_more_than_a_thread_change() -> None:
    """A probe to more processes moves envs for episodes and, in the controller benchmark, measured 0.84-1.0x of
    what the model promised (7 of 10 reverted): the model's +4% here (+12% with the exploration bonus of an unmeasured
    neighbour) does not start one, where the same promise from a change of threads (instant) would; with no bar it does."""
    env = {"n": 16, "t_cpu": 100e-6, "t_wait": 2e-3}
    start = Config("process", 4, 4)
    rate = predict(start, Costs(100e-6, 2e-3, 20e-6), 16, 2)
    default = follow(MeasuredController(), start, 12, lambda c: rate, **env)
    assert all(c.processes <= start.processes for c in default), [c.label for c in default]
    low_bar = follow(MeasuredController(move_gain=0.0), start, 12, lambda c: rate, **env)
    assert any(c.processes > start.processes for c in low_bar), [c.label for c in low_bar]


def _probe_to_fewer_processes(ctrl: MeasuredController, env: dict) -> tuple[Config, Config]:
    """From 8p x 3t (24 envs waiting ~3 ms) the model probes 6p x 4t, which measures about the same and stays."""
    a = Config("process", 8, 3)
    for x in (6000, 6000, 6100):
        d = ctrl.decide(interval(a, rate=x, **env))
    b = Config(d.placement or a.placement, d.target, d.threads or a.threads)
    assert b == Config("process", 6, 4), d.reason
    for x in (5900, 5950, 5900):  # a warm-up, then two intervals within the revert margin: kept
        d = ctrl.decide(interval(b, rate=x, **env))
    assert (d.target, d.threads) == (6, 4) and "revert" not in d.reason, d.reason
    return a, b


def test_a_move_to_fewer_processes_kept_only_by_one_fast_interval_is_measured_again_and_reverted() -> None:
    """wait64 on this VM: the model moved 8p x 8t (8,350 steps/s) to 5p x 13t, whose first interval measured 8,377,
    then 7,600-7,900 for the rest of the run (0.90x the best static). Its best interval kept it, its median did not:
    a third interval is measured, and the median of three decides. A visit whose median also holds is kept."""
    env = {"n": 24, "t_cpu": 80e-6, "t_wait": 2.9e-3}
    for rates, kept in (((6100, 5500, 5550), False), ((6000, 5950, 5900), True)):
        ctrl = MeasuredController()
        a = Config("process", 8, 3)
        for x in (6000, 6000, 6100):
            d = ctrl.decide(interval(a, rate=x, **env))
        b = Config(d.placement or a.placement, d.target, d.threads or a.threads)
        assert b == Config("process", 6, 4), d.reason
        ctrl.decide(interval(b, rate=5000, **env))  # the warm-up interval: not counted
        ds = [ctrl.decide(interval(b, rate=x, **env)) for x in rates]
        if kept:
            assert all((d.target, d.threads) == (6, 4) and "again" not in d.reason for d in ds), [d.reason for d in ds]
        else:
            assert "again" in ds[1].reason and "median" in ds[1].reason, [d.reason for d in ds]
            assert (ds[2].target, ds[2].threads) == (8, 3) and "revert" in ds[2].reason, [d.reason for d in ds]


def test_a_move_back_to_more_processes_on_an_older_record_must_clear_both_scatters() -> None:
    """wait24 on this VM: the probe to fewer processes was kept, then its intervals sank a little (the host) and
    the older, 5% higher record of the configuration it left moved it back 4 s later (settling in 17 intervals).
    A gap inside the two visits' combined scatter moves nothing now; a clear one still does."""
    env = {"n": 24, "t_cpu": 80e-6, "t_wait": 2.9e-3}
    ctrl = MeasuredController()
    a, b = _probe_to_fewer_processes(ctrl, env)
    held = [ctrl.decide(interval(b, rate=x, **env)) for x in (5700, 5650, 5700, 5680)]
    assert all((d.target, d.threads) == (6, 4) for d in held), [d.reason for d in held]
    ctrl = MeasuredController()
    a, b = _probe_to_fewer_processes(ctrl, env)
    moved = [ctrl.decide(interval(b, rate=x, **env)) for x in (5000, 5000, 5000, 5000)]
    assert any((d.target, d.threads) == (a.processes, a.threads) for d in moved), [d.reason for d in moved]


def test_more_processes_on_a_record_must_promise_what_a_prediction_must() -> None:
    """Change scenario, one round: a record 5% above the current visit moved 24 waiting envs 4p x 6t -> 6p x 4t,
    which measured lower, and back: 8 intervals of envs in motion. A record must clear ``move_gain`` to add
    processes, as a prediction must; a clear gap still moves."""
    env = {"n": 24, "t_cpu": 80e-6, "t_wait": 2.9e-3}
    for move_gain, rates, moves in ((0.05, (5500,) * 4, True), (MOVE_GAIN, (5500,) * 4, False), (MOVE_GAIN, (5000,) * 4, True)):
        ctrl = MeasuredController(move_gain=move_gain)
        a, b = _probe_to_fewer_processes(ctrl, env)  # a (8p x 3t) recorded ~6,030 steps/s
        ds = [ctrl.decide(interval(b, rate=x, **env)) for x in rates]
        back = any((d.target, d.threads) == (a.processes, a.threads) for d in ds)
        assert back == moves, (move_gain, rates, [d.reason for d in ds])


def test_records_from_another_moment_are_scaled_by_the_drift_of_the_current_configuration() -> None:
    """The env returns to a cost it had (waiting, after a phase of computing) on a slower host: the configuration
    it resumes measures 15% below its own earlier record, so the other configuration's record from that time would
    be 15% lower too, and is no reason to move; nor is any new process count probed (a cost measured before)."""
    env = {"n": 24, "t_cpu": 80e-6, "t_wait": 2.9e-3}
    cpu = {"n": 24, "t_cpu": 1e-3, "t_wait": 0.0}
    ctrl = MeasuredController()
    a, b = _probe_to_fewer_processes(ctrl, env)
    for x in (5900, 5900, 5900):
        ctrl.decide(interval(b, rate=x, **env))
    c = b
    for _ in range(10):  # the envs compute for a while: threads go to one
        d = ctrl.decide(interval(c, rate=1800, **cpu))
        c = Config(d.placement or c.placement, d.target, d.threads or c.threads)
    assert c.threads == 1 and ctrl.regime_changes == 1, c
    trace = []
    for _ in range(14):  # waiting again, on a host 15% slower: back to 6p x 4t, and it stays there
        d = ctrl.decide(interval(c, rate=0.85 * 5900 if c == b else 0.85 * 6050 if c == a else 1500, **env))
        trace.append(d.reason)
        c = Config(d.placement or c.placement, d.target, d.threads or c.threads)
    assert ctrl.regime_changes == 2, trace
    assert c == b and sum("move to" in r for r in trace) == 1, trace  # one move: to the resumed record


def test_a_host_that_slows_within_a_visit_discounts_the_older_records_too() -> None:
    """24 waiting envs held 3p x 8t at 6,800 steps/s; the host then slowed it to 6,500, and the 2p x 12t record of
    6,450 made before the visit read as a near tie: the controller moved there (and reverted), ten intervals after
    the change of cost in the controller benchmark. Records are scaled by this visit's own drop too. (The model's
    own figure promises 3p x 8t +6% over 2p x 12t here: the bar for a move to more processes is lowered to that, so
    that the run gets there from the start, as it did in the benchmark on a record.)"""
    ctrl, c = MeasuredController(move_gain=0.04), Config("process", 2, 12)
    slow = False

    def truth(c: Config) -> float:
        if c == Config("process", 2, 12):
            return 6450
        if c == Config("process", 3, 8):
            return 6500 if slow else 6800
        return 0.9 * predict(c, Costs(60e-6, 2.8e-3, 20e-6), 24, 2)

    trace = []
    for i in range(30):
        slow = i >= 14
        d = ctrl.decide(interval(c, n=24, t_cpu=60e-6, t_wait=2.8e-3, rate=truth(c)))
        c = Config(d.placement or c.placement, d.target, d.threads or c.threads)
        trace.append(c)
    assert trace[5] == Config("process", 3, 8), [x.label for x in trace]
    assert set(trace[5:]) == {Config("process", 3, 8)}, [x.label for x in trace]


def test_the_model_probes_early_in_a_visit_not_when_its_promise_drifts_over_the_bar_in_a_long_hold() -> None:
    """wait24 and mixed40 in the controller benchmark held a configuration for 8 and 15 intervals, then probed a
    neighbour whose promise had drifted over its bar with the inferred costs; both measured worse and came back,
    settling in 12 and 17 intervals. Here the env's CPU falls 30% and its waiting rises 40% over 30 intervals (no new
    cost regime), and every configuration but the start measures 15% below the model: the promise of 3p x 8t crosses
    +12% after 13 intervals. It is not probed; the memory's decay still gives one look around later."""
    start = Config("process", 4, 6)
    ctrl, c, trace = MeasuredController(), start, []
    for i in range(100):
        f = min(i, 30) / 30
        costs = Costs(60e-6 * (1 - 0.3 * f), 2.8e-3 * (1 + 0.4 * f), 20e-6)
        rate = predict(c, costs, 24, 2) * (1 if c == start else 0.85)
        d = ctrl.decide(interval(c, n=24, t_cpu=costs.cpu_s, t_wait=costs.wait_s, rate=rate))
        c = Config(d.placement or c.placement, d.target, d.threads or c.threads)
        trace.append(c)
    labels = [x.label for x in trace]
    assert set(trace[:60]) == {start}, labels
    assert Config("process", 3, 8) in trace[60:] and trace[-1] == start, labels  # one look after the decay (80), reverted


def test_one_process_probe_per_env_regime() -> None:
    """wait64 on this VM: a second probe, from 5 to 16 processes, started 11 processes inside the measured window
    (0.78x of the best static setting in that round). A probe to another process count costs ~4 intervals and a
    move back as many: one per env regime, where threads (instant) are probed as the model says."""
    env = {"n": 64, "t_cpu": 80e-6, "t_wait": 5e-3}
    start = Config("process", 4, 16)

    def truth(c: Config) -> float:  # every other configuration measures 10% below the model; the start exactly it
        x = predict(c, Costs(80e-6, 5e-3, 20e-6), 64, 2)
        return x if c == start else 0.9 * x

    trace = follow(MeasuredController(), start, 40, truth=truth, **env)
    labels = [c.label for c in trace]
    assert {c.processes for c in trace} == {4, 8} and trace[-1] == start, labels  # 8p x 8t probed and left; not 16p x 4t
    two = follow(MeasuredController(process_probes=2), start, 40, truth=truth, **env)
    assert {c.processes for c in two} == {4, 8, 16}, [c.label for c in two]  # the knob: a second probe where allowed


def test_an_env_back_at_a_cost_it_had_probes_no_new_placement() -> None:
    """Cheap, then 1 ms a step (the envs leave this process), then cheap again: the cost seen before resumes its
    measurements, and only they decide (back inline); an unmeasured placement (hybrid, with as many workers as the
    processes it left) is not probed, its intervals to be weighed against a record from another moment."""
    cheap = {"n": 8, "t_cpu": 10e-6, "t_wait": 0.0, "inline_ok": True}
    costly = {"n": 8, "t_cpu": 1e-3, "t_wait": 0.0, "inline_ok": True}
    ctrl, c, phases = MeasuredController(), Config.inline(), []
    for env, k, host in ((cheap, 8, 0.7), (costly, 10, 1.0), (cheap, 12, 1.0)):  # the first seconds on a busy host
        seen = []
        for _ in range(k):
            x = host * predict(c, Costs(env["t_cpu"], env["t_wait"], 20e-6), env["n"], 2)
            d = ctrl.decide(interval(c, rate=x, **env))
            c = Config(d.placement or c.placement, d.target, d.threads or c.threads)
            seen.append(c)
        phases.append(seen)
    assert phases[1][-1].placement == "process", [c.label for c in phases[1]]
    assert phases[2][-1] == Config.inline() and all(c.placement != "hybrid" for c in phases[2]), [c.label for c in phases[2]]


@pytest.mark.parametrize("pace_s", [8e-6, 0.0])
def test_a_probe_goes_to_the_cheapest_configuration_the_model_cannot_tell_from_its_top(pace_s: float) -> None:
    """64 envs waiting 6 ms, from 16p x 4t: the model rates 7-22 processes within ~4% of each other, and the
    exploration bonus put its neighbour 13p x 5t on top; measured on this VM, 8p x 8t ran ~10% faster than
    13p x 5t. The probe now goes to the cheapest of the predictions within ``prefer`` of the top's own figure."""
    trace = follow(MeasuredController(), Config("process", 16, 4), 12, n=64, t_cpu=0.12e-3, t_wait=6e-3, pace_s=pace_s)
    first = next(c for c in trace if c != Config("process", 16, 4))
    assert first.processes <= 10 and first.concurrency >= 64, [c.label for c in trace]
    assert all(c.processes <= 16 for c in trace), [c.label for c in trace]


def test_after_a_change_of_cost_threads_move_first_and_it_readapts_within_six_intervals() -> None:
    ctrl = MeasuredController()
    c = follow(ctrl, Config("process", 2, 1), 15, n=24, t_cpu=1e-3, t_wait=0.0)[-1]
    assert c == Config("process", 2, 1)
    after = follow(ctrl, c, 12, n=24, t_cpu=30e-6, t_wait=3e-3)  # the envs start waiting
    changed = [x for x in after if x != c]
    assert changed and changed[0].processes == c.processes and changed[0].threads > 1, [x.label for x in after]
    best = predict(after[-1], Costs(30e-6, 3e-3, 20e-6), 24, 2)
    assert predict(after[5], Costs(30e-6, 3e-3, 20e-6), 24, 2) >= 0.9 * best, [x.label for x in after]


def test_a_change_of_cpu_per_step_by_twice_decides_in_one_interval_one_of_waiting_in_two() -> None:
    """24 envs computing 1 ms a step start waiting 3 ms: their CPU per step falls ~30x (in the interval the change
    falls in, a blend, 2.5x), which a busy host cannot do (it stretches wall time, not CPU time), so the first
    interval that shows it decides, and threads come at once. The demo's change of cost lost a whole interval at ~1,000 steps/s, where threads ran at ~6,000, waiting
    for a second. A change of waiting alone (wall time) on a busy host (steal time reads as waiting) still needs two
    intervals to agree."""
    ctrl = MeasuredController()
    c = follow(ctrl, Config("process", 2, 1), 15, n=24, t_cpu=1e-3, t_wait=0.0)[-1]
    d = ctrl.decide(interval(c, n=24, t_cpu=30e-6, t_wait=3e-3))
    assert "cost changed" in d.reason and (d.threads or 1) > 1 and d.target == c.processes, d.reason

    ctrl = MeasuredController()  # a blend: the cost changed within the interval (CPU 1 -> 0.4 ms a step)
    c = follow(ctrl, Config("process", 2, 1), 15, n=24, t_cpu=1e-3, t_wait=0.0)[-1]
    d = ctrl.decide(interval(c, n=24, t_cpu=0.4e-3, t_wait=1.8e-3))
    assert "cost changed" in d.reason, d.reason

    ctrl = MeasuredController()
    c = follow(ctrl, Config("process", 2, 1), 15, n=24, t_cpu=1e-3, t_wait=0.0)[-1]
    reasons = [ctrl.decide(interval(c, n=24, t_cpu=1e-3, t_wait=3e-3, rate=predict(c, Costs(1e-3, 3e-3, 20e-6), 24, 2),
                                    foreign_cpus=1.0)).reason
               for _ in range(2)]
    assert "cost changed" not in reasons[0] and "cost changed" in reasons[1], reasons


def test_computing_envs_on_one_thread_that_begin_to_wait_get_threads_for_their_shard_in_one_interval() -> None:
    """24 envs computing 1 ms a step on 2 processes of one thread begin to wait 3 ms again: the interval the change
    falls in blends the costs (CPU 0.87 ms, waiting 0.31 ms a step in the change-of-cost benchmark), which moved
    neither rule for a change, and the next ran at one thread (~620 steps/s where 2 x 12 ran ~5,900). On one thread
    waiting is a clean reading, so the blend decides, provisionally: threads for the whole shard, no envs moved; the
    next interval settles the cost at the waiting regime seen before, whose records resume. A quiet CPU-bound interval
    changes nothing, a loaded one does not decide, and envs that already waited a little keep the two-interval rule."""
    def computing_then_waiting() -> tuple[MeasuredController, Config]:
        ctrl = MeasuredController()
        c = follow(ctrl, Config("process", 2, 1), 12, n=24, t_cpu=30e-6, t_wait=3e-3)[-1]
        assert c.threads > 1, c
        c = follow(ctrl, c, 12, n=24, t_cpu=1e-3, t_wait=0.0)[-1]
        assert c == Config("process", 2, 1), c
        return ctrl, c

    ctrl, c = computing_then_waiting()
    assert "cost" not in ctrl.decide(interval(c, n=24, t_cpu=1e-3, t_wait=0.0)).reason
    d = ctrl.decide(interval(c, n=24, t_cpu=0.87e-3, t_wait=0.31e-3))
    assert "cost changed" in d.reason and "began to wait" in d.reason, d.reason
    assert (d.target, d.threads, d.placement) == (2, 12, "process"), d
    d = ctrl.decide(interval(Config("process", 2, 12), n=24, t_cpu=30e-6, t_wait=3e-3))
    assert "cost settled" in d.reason and "seen before" in d.reason, d.reason

    ctrl, c = computing_then_waiting()  # a blend whose CPU per step also halved: the rule for CPU decides, same move
    d = ctrl.decide(interval(c, n=24, t_cpu=0.44e-3, t_wait=1.79e-3))
    assert "began to wait" in d.reason and (d.target, d.threads) == (2, 12), d.reason

    ctrl, c = computing_then_waiting()
    d = ctrl.decide(interval(c, n=24, t_cpu=0.87e-3, t_wait=0.31e-3, foreign_cpus=1.0))
    assert "cost changed" not in d.reason and (d.threads or 1) == 1, d.reason

    ctrl = MeasuredController()
    c = follow(ctrl, Config("process", 2, 1), 12, n=24, t_cpu=1e-3, t_wait=0.12e-3)[-1]
    d = ctrl.decide(interval(c, n=24, t_cpu=1e-3, t_wait=0.5e-3))
    assert "cost changed" not in d.reason, d.reason


def test_back_at_a_known_cost_processes_follow_its_records_within_a_few_intervals() -> None:
    """24 envs wait 3 ms (3p x 8t measured best), compute 1 ms (2p x 1t), then wait again: threads first (2p x 12t at
    once), and processes follow that cost's record of 3p x 8t when it beats 2 x 12 by ``gain``, within a few
    intervals, not only once 2 x 12 has drifted 12% below it (the change-of-cost benchmark: 11 intervals). A record
    within ``gain`` moves nothing, and a record move that then measures no better is reverted as any other."""
    def run(rate_2x12: float, rate_3x8: float) -> list[Config]:
        now = {Config("process", 3, 8): rate_3x8, Config("process", 2, 12): rate_2x12}
        ctrl = MeasuredController()
        c = Config("process", 3, 8)
        for _ in range(6):  # the first waiting phase: 3 x 8 measured
            d = ctrl.decide(interval(c, n=24, t_cpu=70e-6, t_wait=2.8e-3, rate=6300.0))
            assert (d.target, d.threads) == (3, 8), d.reason
        c = follow(ctrl, c, 12, n=24, t_cpu=1e-3, t_wait=0.0)[-1]
        assert c == Config("process", 2, 1), c
        trace = []
        for k in range(10):
            if k == 0:
                m = interval(c, n=24, t_cpu=0.87e-3, t_wait=0.31e-3)  # the blend the waits come back in
            else:
                m = interval(c, n=24, t_cpu=70e-6, t_wait=2.8e-3, rate=now.get(c))
            d = ctrl.decide(m)
            c = Config(d.placement or c.placement, d.target, d.threads or c.threads)
            trace.append(c)
        return trace

    trace = run(5950.0, 6300.0)
    labels = [c.label for c in trace]
    assert trace[0] == Config("process", 2, 12), labels  # threads at once
    assert Config("process", 3, 8) in trace[:4] and trace[-4:] == [Config("process", 3, 8)] * 4, labels
    trace = run(6150.0, 6300.0)  # within gain: no process move
    assert trace[-4:] == [Config("process", 2, 12)] * 4 and Config("process", 3, 8) not in trace, [c.label for c in trace]
    trace = run(5950.0, 5900.0)  # the record does not hold now: back to 2 x 12
    assert Config("process", 3, 8) in trace and trace[-3:] == [Config("process", 2, 12)] * 3, [c.label for c in trace]


def test_a_change_decided_on_one_interval_moves_no_envs_until_the_next_settles_the_cost() -> None:
    """The interval a change falls in blends the two costs: 8 envs back from 1 ms of CPU a step to 10 us showed
    0.2 ms in it. Deciding on it alone, the controller once moved them from processes to hybrid (the best for a
    cost no interval really had), then stayed there. Now it changes only threads (instant) on such an interval;
    the next, at the cheap cost seen before, settles the regime there, and its records take the envs back inline."""
    cheap = {"n": 8, "t_cpu": 10e-6, "t_wait": 0.0, "inline_ok": True}
    costly = {"n": 8, "t_cpu": 1e-3, "t_wait": 0.0, "inline_ok": True}
    ctrl, c = MeasuredController(), Config.inline()
    c = follow(ctrl, c, 8, **cheap)[-1]
    assert c == Config.inline(), c
    c = follow(ctrl, c, 10, **costly)[-1]
    assert c.placement == "process" and ctrl.regime_changes == 1, c
    d = ctrl.decide(interval(c, n=8, t_cpu=0.2e-3, t_wait=0.0, inline_ok=True))
    assert "cost changed" in d.reason and d.target == c.processes and (d.placement or c.placement) == c.placement, d.reason
    c = Config(d.placement or c.placement, d.target, d.threads or c.threads)
    d = ctrl.decide(interval(c, **cheap))
    assert "cost settled" in d.reason and "seen before" in d.reason, d.reason
    assert ctrl.regime_changes == 2
    c = Config(d.placement or c.placement, d.target, d.threads or c.threads)
    rest = follow(ctrl, c, 6, **cheap)
    assert rest[-1] == Config.inline() and all(x.placement != "hybrid" for x in rest), [x.label for x in rest]


def test_when_waiting_envs_start_computing_threads_go_to_one_at_once() -> None:
    """After a change of cost that raises the CPU per step, threads only queue for the GIL; the waiting inferred
    from a threaded interval then wanders (here: read as 2.5 ms), which once stepped threads down a rung per move."""
    ctrl = MeasuredController()
    c = follow(ctrl, Config("process", 4, 6), 12, n=24, t_cpu=30e-6, t_wait=3e-3)[-1]
    assert c.threads > 1, c
    truth = Costs(1e-3, 0.0, 20e-6)
    trace = []
    for _ in range(4):
        misread = 2.5e-3 if c.threads > 1 else 0.0  # threads queueing for the GIL read as waiting
        d = ctrl.decide(interval(c, n=24, t_cpu=1e-3, t_wait=misread, rate=predict(c, truth, 24, 2)))
        c = Config(d.placement or c.placement, d.target, d.threads or c.threads)
        trace.append((c.label, d.reason[:60]))
    first = next(i for i, (_, why) in enumerate(trace) if "cost changed" in why)
    assert trace[first][0].endswith(" x 1t") and first == 0, trace  # one move, on the first interval (CPU x33)
    assert c.threads == 1, trace


def test_lock_step_near_ties_go_to_even_shards_so_a_change_to_computing_keeps_the_balance() -> None:
    """24 envs that wait: 4, 5 and 6 processes with threads rate within a few percent, and 5 (shards 5,5,5,5,4)
    once won on resources; when the envs then computed, threads went to one and the uneven shards stayed
    (moving envs takes episodes), ~5% below 4 processes. Near ties now go to even shards, at start too."""
    from aiovec.configs import uneven
    from aiovec.measured import plan_start

    assert plan_start(24, 80e-6, 3.1e-3, 2, 2)[0] in (4, 6)
    ctrl = MeasuredController()
    c = follow(ctrl, Config("process", 2, 1), 12, n=24, t_cpu=80e-6, t_wait=3e-3)[-1]
    assert not uneven(c, 24) and c.threads > 1, c
    truth = Costs(1e-3, 0.0, 20e-6)
    for _ in range(4):
        d = ctrl.decide(interval(c, n=24, t_cpu=1e-3, t_wait=0.0, rate=predict(c, truth, 24, 2)))
        c = Config(d.placement or c.placement, d.target, d.threads or c.threads)
    assert c.threads == 1 and not uneven(c, 24), c


def test_fixed_knobs_stay_fixed() -> None:
    ctrl = MeasuredController()
    trace = follow(ctrl, Config("process", 3, 1), 12, n=24, t_cpu=30e-6, t_wait=3e-3, fixed_workers=True)
    assert {c.processes for c in trace} == {3} and trace[-1].threads > 1
    ctrl = MeasuredController()
    trace = follow(ctrl, Config("process", 2, 4), 12, n=24, t_cpu=30e-6, t_wait=3e-3, fixed_threads=True)
    assert {c.threads for c in trace} == {4}


def test_cheap_envs_may_move_inline_when_allowed() -> None:
    trace = follow(MeasuredController(), Config("process", 2, 1), 12, n=16, t_cpu=10e-6, t_wait=0.0, inline_ok=True)
    assert trace[-1].placement == "inline"
    trace = follow(MeasuredController(), Config("process", 2, 1), 12, n=16, t_cpu=10e-6, t_wait=0.0)
    assert all(c.placement == "process" for c in trace)



def test_inline_and_hybrid_are_both_measured_where_a_batch_is_cheap() -> None:
    """Between the two in-process rungs the model misjudges (beside a worker the parent's steps cost more), so where
    a batch is cheap a hybrid start is followed by a look at inline (which starts nothing), and the faster one
    is kept, against the model's ranking; from inline the model's proposal of hybrid is measured and reverted."""
    env = {"n": 8, "t_cpu": 30e-6, "t_wait": 0.0, "inline_ok": True}
    def model(c: Config) -> float:
        return predict(c, Costs(30e-6, 0.0, 20e-6), 8, 2)

    assert model(Config.hybrid(2)) > 1.05 * model(Config.inline())  # the model alone would never look at inline

    def inline_fast(c: Config) -> float:
        return 1.5 * model(Config.hybrid(2)) if c.placement == "inline" else model(c)

    trace = follow(MeasuredController(), Config.hybrid(2), 12, inline_fast, **env)
    assert trace[-1] == Config.inline() and trace[-4:] == [Config.inline()] * 4, [c.label for c in trace]

    def hybrid_slow(c: Config) -> float:
        return 0.6 * model(c) if c.placement == "hybrid" else model(c)

    trace = follow(MeasuredController(), Config.inline(), 18, hybrid_slow, **env)  # it looks at 2 processes too
    assert Config.hybrid(2) in trace and trace[-4:] == [Config.inline()] * 4, [c.label for c in trace]
    # A costly batch (HalfCheetah-like, 0.1 ms a step): the model's ranking stands, no look at inline.
    env["t_cpu"] = 100e-6
    trace = follow(MeasuredController(), Config.hybrid(2), 12, None, **env)
    assert Config.inline() not in trace, [c.label for c in trace]
    # Where the host's pace is known the bound is in its units: on a VM of 7.2 us a pace, HalfCheetah x8 at 45 us a step
    # (180 us a batch moved off this process) is not looked at, though inline measured faster would be kept...
    env.update(t_cpu=45e-6, pace_s=7.2e-6)
    trace = follow(MeasuredController(), Config.hybrid(2), 12, inline_fast, **env)
    assert Config.inline() not in trace, [c.label for c in trace]
    # ...while 16 CartPoles at 6 us a step (48 us a batch) are.
    env.update(n=16, t_cpu=6e-6)
    trace = follow(MeasuredController(), Config.hybrid(2), 12, inline_fast, **env)
    assert Config.inline() in trace, [c.label for c in trace]


def test_hybrid_reached_on_the_regimes_process_probe_still_gets_its_look_at_inline() -> None:
    """From processes the model may send cheap envs to hybrid, which spends the env regime's one process probe; the
    look at inline (the model's least reliable ranking) is still made, once: kept where inline measures faster,
    reverted where it measures slower, and not made again. Without it, 8 envs back to cheap after a costly phase
    held hybrid at ~59k steps/s where inline had run ~81k."""
    for t_cpu in (30e-6, 50e-6):
        env = {"n": 8, "t_cpu": t_cpu, "t_wait": 0.0, "inline_ok": True}

        def model(c: Config, t_cpu: float = t_cpu) -> float:
            return predict(c, Costs(t_cpu, 0.0, 20e-6), 8, 2)

        assert model(Config.hybrid(2)) > model(Config.inline())  # the model alone prefers hybrid
        for inline_x, ends in ((1.5, Config.inline()), (0.8, Config.hybrid(2))):
            def truth(c: Config, inline_x: float = inline_x) -> float:
                return inline_x * model(Config.hybrid(2)) if c.placement == "inline" else model(c)

            trace = follow(MeasuredController(), Config("process", 2, 1), 20, truth, **env)
            labels = [c.label for c in trace]
            assert Config.hybrid(2) in trace and Config.inline() in trace, labels
            assert trace[-6:] == [ends] * 6, labels
            first_inline = trace.index(Config.inline())
            if ends == Config.hybrid(2):  # one look, reverted, not repeated
                back = trace.index(Config.hybrid(2), first_inline)
                assert Config.inline() not in trace[back:], labels


def test_a_move_to_fewer_resources_is_judged_on_each_visits_best_interval() -> None:
    """cheap on this VM: hybrid measured 89k, then 52k and 65k steps/s while the host was busy; inline then measured
    77k against that 65k median and stayed, 12% below hybrid for the rest of the run. The host only ever slows a
    run, so a move to fewer resources is judged on each visit's best interval: back to hybrid, and it stays. A
    real loss still reverts, and so does a tie (inline gives up the second CPU and holds the loop twice as long: it
    must measure better); a real gain keeps inline."""
    env = {"n": 16, "t_cpu": 10e-6, "t_wait": 0.0, "inline_ok": True}

    def run(hybrid_rates: list[float], inline_rate: float) -> list[str]:
        ctrl, c, trace = MeasuredController(), Config.hybrid(2), []
        rates = iter(hybrid_rates)
        for _ in range(14):
            x = next(rates, hybrid_rates[-1]) if c.placement == "hybrid" else inline_rate
            d = ctrl.decide(interval(c, rate=x, **env))
            c = Config(d.placement or c.placement, d.target, d.threads or c.threads)
            trace.append(c.label)
        return trace

    dip = run([94000, 89000, 51600, 65300, 90000], 76500)
    assert "inline" in dip and dip[-1] == "inline + 1p" and dip[-4:] == ["inline + 1p"] * 4, dip
    loss = run([90000, 90000, 90000, 90000], 76500)
    assert "inline" in loss and loss[-1] == "inline + 1p", loss
    tie = run([90000, 90000, 90000, 90000], 88000)
    assert "inline" in tie and tie[-4:] == ["inline + 1p"] * 4, tie
    gain = run([90000, 90000, 90000, 90000], 97000)
    assert gain[-4:] == ["inline"] * 4, gain


def test_a_warm_up_interval_that_read_higher_than_the_counted_ones_is_the_visits_best() -> None:
    """The demo's cheap scenario (16 CartPoles), one run of three: hybrid's warm-up interval read 177,865 steps/s, the
    host then slowed its two counted ones (106,506 and 128,872); a look at inline measured ~140k, beat that best by
    the 5% it must, and held to the end (0.79x; static hybrid 176,414 in the same sweep). The host only ever slows a
    run, so the warm-up's figure is what hybrid can do: inline goes back. A warm-up that read low (workers starting)
    is still not counted: the same counted intervals keep inline."""
    env = {"n": 16, "t_cpu": 10e-6, "t_wait": 0.0, "inline_ok": True}

    def run(hybrid_rates: list[float]) -> list[str]:
        ctrl, c, trace = MeasuredController(), Config.hybrid(2), []
        rates = iter(hybrid_rates)
        for _ in range(14):
            x = next(rates, hybrid_rates[-1]) if c.placement == "hybrid" else 140000
            d = ctrl.decide(interval(c, rate=x, **env))
            c = Config(d.placement or c.placement, d.target, d.threads or c.threads)
            trace.append(c.label)
        return trace

    high = run([177865, 106506, 128872, 176000])
    assert "inline" in high and high[-4:] == ["inline + 1p"] * 4, high
    low = run([90000, 106506, 128872, 176000])
    assert low[-4:] == ["inline"] * 4, low


def test_a_revert_whose_destination_then_measures_far_below_its_old_figure_is_undone_once() -> None:
    """cheap (16 CartPoles), one run of three: hybrid measured 160-176k steps/s, inline 140k, the revert went back
    to hybrid, which then ran at 87-105k with inline banned. A revert is judged by what it went back to: fallen
    more than its intervals scatter and below what the loser measured, the loser is measured again (once); a loser
    that then loses again stays banned; a destination that measures as before stays."""
    env = {"n": 16, "t_cpu": 10e-6, "t_wait": 0.0, "inline_ok": True}

    def run(hybrid_after: float, inline_rates: list[float]) -> tuple[list[str], list[str]]:
        ctrl, c, trace, reasons = MeasuredController(), Config.hybrid(2), [], []
        inline_visits = iter(inline_rates)
        reverted = False
        x_inline = next(inline_visits)
        for _ in range(24):
            if c.placement == "hybrid":
                x = hybrid_after if reverted else 165000
            else:
                x = x_inline
            d = ctrl.decide(interval(c, rate=x, **env))
            nxt = Config(d.placement or c.placement, d.target, d.threads or c.threads)
            if c.placement == "inline" and nxt.placement == "hybrid":
                reverted = True
                x_inline = next(inline_visits, x_inline)
            c = nxt
            trace.append(c.label)
            reasons.append(d.reason)
        return trace, reasons

    fell, why = run(95000, [140000])
    assert fell[-4:] == ["inline"] * 4 and any("undo the revert" in r for r in why), list(zip(fell, why, strict=True))
    both_slow, why = run(95000, [140000, 80000])
    assert both_slow[-4:] == ["inline + 1p"] * 4 and sum("undo the revert" in r for r in why) == 1, list(zip(both_slow, why, strict=True))
    steady, why = run(160000, [140000])
    assert steady[-4:] == ["inline + 1p"] * 4 and not any("undo" in r for r in why), list(zip(steady, why, strict=True))


def test_a_configuration_that_lost_on_a_loaded_host_is_measured_again_once_the_host_is_quiet() -> None:
    """CartPole x16 with a busy process beside it for the first second (1 CPU of 2 taken): hybrid measured ~40k
    steps/s, a look at inline measured 141k once the process had ended, and inline stayed for the run, where hybrid
    runs at 180k. Intervals on a loaded host (``foreign_cpus``) decide nothing for good: the loser is measured again
    on the quiet host, and kept. With the load gone from neither visit, the same figures keep inline."""
    env = {"n": 16, "t_cpu": 6e-6, "t_wait": 0.0, "inline_ok": True}

    def run(hybrid_loaded: bool) -> list[str]:
        ctrl, c, trace = MeasuredController(), Config.hybrid(2), []
        for i in range(16):
            hog = hybrid_loaded and i < 3
            x = (40000 if hog else 180000) if c.placement == "hybrid" else 141000
            d = ctrl.decide(interval(c, rate=x, foreign_cpus=1.0 if hog else 0.0, **env))
            c = Config(d.placement or c.placement, d.target, d.threads or c.threads)
            trace.append(c.label)
        return trace

    loaded = run(True)
    assert "inline" in loaded and loaded[-6:] == ["inline + 1p"] * 6, loaded
    # The same low hybrid intervals on a quiet host (its own slowness, say) are a fair loss: inline stays.
    ctrl, c, trace = MeasuredController(), Config.hybrid(2), []
    for i in range(16):
        x = (40000 if i < 3 else 180000) if c.placement == "hybrid" else 141000
        d = ctrl.decide(interval(c, rate=x, **env))
        c = Config(d.placement or c.placement, d.target, d.threads or c.threads)
        trace.append(c.label)
    assert trace[-6:] == ["inline"] * 6, trace


def test_a_loss_measured_on_a_loaded_host_bans_nothing_and_its_record_is_forgotten_when_quiet() -> None:
    """A move whose visit ran while other processes held the CPUs and measured worse is reverted (it measured
    worse), but not banned; its record, made only on the loaded host, is forgotten at the first quiet interval."""
    env = {"n": 16, "t_cpu": 6e-6, "t_wait": 0.0, "inline_ok": True}
    ctrl, c = MeasuredController(), Config.hybrid(2)
    for i in range(12):
        at_inline = c.placement == "inline"
        x = 60000 if at_inline else 180000
        d = ctrl.decide(interval(c, rate=x, foreign_cpus=1.0 if at_inline else 0.0, **env))
        nxt = Config(d.placement or c.placement, d.target, d.threads or c.threads)
        if at_inline and nxt != c:
            assert d.reason.startswith("move to revert") and "no ban" in d.reason, d.reason
            assert ctrl.records[Config.inline()].banned_until == 0 and ctrl.records[Config.inline()].only_loaded
            reverted = i
        c = nxt
    assert reverted and c == Config.hybrid(2)
    assert not ctrl.records[Config.inline()].samples  # forgotten: hybrid's intervals since were quiet


def test_a_command_to_a_worker_is_priced_at_the_hosts_pace() -> None:
    """The model's cost of a command to a worker process moves with the host's interpreter pace: on a slow host
    (pace 8 us: ~90 us a command) 8 CartPole-like envs (16 us a step) stay inline, where the fixed 40 us once
    started a process for them every run, to measure it 15-40% slower and revert; on a fast host (pace 2 us) the
    model still rates hybrid higher, and measures it; with no pace (a v1 trace) the fixed figure rates hybrid too
    close to inline to start a process for it (see ``measured.MOVE_GAIN``)."""
    env = {"n": 8, "t_cpu": 16e-6, "t_wait": 0.0, "inline_ok": True}
    slow = follow(MeasuredController(), Config.inline(), 12, **env, pace_s=8e-6)
    assert set(slow) == {Config.inline()}, [c.label for c in slow]
    fast = follow(MeasuredController(), Config.inline(), 12, **env, pace_s=2e-6)
    assert Config.hybrid(2) in fast, [c.label for c in fast]
    unknown = follow(MeasuredController(), Config.inline(), 12, **env)  # no pace (a v1 trace): the fixed figure
    assert set(unknown) == {Config.inline()}, [c.label for c in unknown]
    low_bar = follow(MeasuredController(move_gain=0.05), Config.inline(), 12, **env)
    assert Config.hybrid(2) in low_bar, [c.label for c in low_bar]


def test_a_step_cost_near_the_loop_hold_limit_does_not_flip_the_placement() -> None:
    """A step measured between the enter and leave limits (Pong on a noisy 2-CPU host: 0.45-0.62 ms) keeps the
    envs where they step: hybrid stays hybrid, and processes are not left for it; above the leave limit the envs
    leave as soon as the cost is measured."""
    band = 0.5 * (INLINE_ENTER_S + INLINE_LEAVE_S)
    env = {"n": 8, "t_wait": 0.0, "inline_ok": True}
    stay = follow(MeasuredController(), Config.hybrid(2), 12, t_cpu=band, **env)
    assert set(stay) == {Config.hybrid(2)}, [c.label for c in stay]
    assert inline_fits(Costs(band, 0.0, 0.0), staying=True) and not inline_fits(Costs(band, 0.0, 0.0))
    leave = follow(MeasuredController(), Config.hybrid(2), 12, t_cpu=1.1 * INLINE_LEAVE_S, **env)
    assert {c.placement for c in leave[2:]} == {"process"}, [c.label for c in leave]  # once its cost is measured


def test_a_placement_the_user_chose_stays() -> None:
    """placement="inline"/"hybrid"/"process" with num_workers="auto": the controller tunes only within it,
    even where the model rates another placement better (it once left an explicit inline for processes)."""
    trace = follow(MeasuredController(), Config.inline(), 12, n=8, t_cpu=10e-6, t_wait=0.0, inline_ok=True, fixed_placement=True)
    assert set(trace) == {Config.inline()}, trace
    trace = follow(MeasuredController(), Config.inline(), 12, n=8, t_cpu=10e-6, t_wait=0.0, inline_ok=False)  # not allowed: leaves
    assert trace[-1].placement == "process", trace
    trace = follow(MeasuredController(), Config.hybrid(2), 12, n=8, t_cpu=2e-3, t_wait=0.0, inline_ok=True, fixed_placement=True)
    assert {c.placement for c in trace} == {"hybrid"}, trace  # too costly for the model, but the user's choice
    trace = follow(MeasuredController(), Config("process", 2, 1), 12, n=16, t_cpu=10e-6, t_wait=0.0, inline_ok=True,
                   fixed_placement=True)
    assert {c.placement for c in trace} == {"process"}, trace


def test_lock_step_is_rated_per_second_in_step_so_a_caller_with_work_of_its_own_is_measured() -> None:
    """A lock-step caller that spends 70% of each interval on its own work (a policy, a service) is measured, at the
    rate its envs step while it waits in ``step()``; one that hardly stepped (a learner update) is skipped; so is a
    first-finished one whose steps were in flight less than ``min_demand`` of the interval."""
    c = Config("process", 2, 1)
    low = dataclasses.replace(interval(c, 24, 1e-3, 0.0, rate=600), demand=0.3, awaiting=0.3)
    assert low.stepping_rate == 2000 and low.throughput == 600
    ctrl = MeasuredController()
    assert ctrl.decide(low).reason == "warming up 2p x 1t: 2,000 steps/s not counted"
    assert ctrl.decide(low).reason == "measuring 2p x 1t: 2,000 steps/s (1/2)"
    idle = dataclasses.replace(low, steps=20, demand=0.01, awaiting=0.01)
    d = ctrl.decide(idle)
    assert not d.measured and d.reason == "skipped: caller was in step() only 1% of the interval"
    first = dataclasses.replace(low, lockstep=False, awaiting=0.0)
    d = MeasuredController().decide(first)
    assert not d.measured and d.reason == "skipped: caller asked for steps only 30% of the interval"
    # A v1-style measurement (no awaiting) keeps the old rule: rated per second of the interval, skipped below half.
    v1 = dataclasses.replace(low, awaiting=0.0)
    assert v1.stepping_rate == 600 and not MeasuredController().decide(v1).measured


def test_v1_measurements_and_decisions_keep_working() -> None:
    m = Measurement(1.0, 2, 16, 1800, 1e-3, 0.0, 1e-4, 5e-5, 1.0, 2)  # positional, as v1 callers build it
    assert m.threads == 1 and m.placement == "process" and m.lockstep is None
    assert Decision(3, "mine").threads is None and Decision(3, "mine").placement is None
    d = MeasuredController().decide(m)
    assert d.target >= 1 and d.reason
    assert aiovec.AdaptiveController().decide(m).threads is None  # v1 controller unchanged


# -- real workers, envs of known cost (ratios and counts, never seconds) ----------------------------
async def _rate(venv: aiovec.AsyncVecEnv, seconds: float) -> float:
    acts = np.zeros(venv.num_envs, dtype=np.int64)
    steps, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        await asyncio.wait_for(venv.step(acts), 30)
        steps += venv.num_envs
    return steps / (time.perf_counter() - t0)


@pytest.mark.slow
def test_real_waiting_envs_auto_uses_threads_and_matches_a_process_per_env(clean) -> None:
    """24 envs waiting 3 ms a step, lock-step: a process per env is the v1 answer; auto must do about as well
    with at most a quarter as many processes (threads inside them), measured in the same test."""
    kw = {"wait_ms": 3.0, "episode_len": 20}

    async def main() -> tuple[float, float, int, list[dict]]:
        async with aiovec.make("aiovec/Sleep-v0", 24, num_workers=24, env_kwargs=kw) as venv:
            await venv.reset(seed=0)
            await _rate(venv, 0.5)
            static = await _rate(venv, 2.0)
        async with aiovec.make("aiovec/Sleep-v0", 24, env_kwargs=kw) as venv:
            assert isinstance(venv.controller, MeasuredController)
            await venv.reset(seed=0)
            await _rate(venv, 3.0)  # settle
            auto = await _rate(venv, 2.0)
            return static, auto, venv._pool.num_processes, list(venv.control_history)

    static, auto, procs, hist = aiovec.run(main())
    trace = [h["config"] for h in hist]
    assert procs <= 6, trace
    assert auto >= 0.8 * static, f"auto {auto:.0f} vs 24 processes {static:.0f} steps/s; {trace}"
    assert all(h["lockstep"] in (True, None) for h in hist if h["measured"]), [h["lockstep"] for h in hist]
    assert_clean(clean)


@pytest.mark.slow
def test_a_lock_step_caller_with_work_of_its_own_has_its_envs_retuned_when_their_cost_changes(clean) -> None:
    """24 envs wait 3 ms a step, then compute 1 ms, then wait again, behind a caller that awaits 8 ms of its own
    I/O after each step (in ``step()`` about a third of the time while the envs wait). Rated per second of the whole
    interval, every waiting interval read under half and was skipped: the controller had no reading of the waiting
    envs to see the change against, and measured nothing once they waited again. Rated per second in ``step()``,
    every interval is measured: threads go to one while the envs compute and come back when they wait."""
    waiting, computing, again = 2.0, 4.0, 5.0
    t0 = time.time() + 2.0
    kw = {"schedule": [(waiting, 0.0, 3.0), (computing, 1.0, 0.0), (again, 0.0, 3.0), (3600.0, 0.0, 3.0)], "start_time": t0,
          "episode_len": 25}

    async def main() -> tuple[list[dict], float]:
        async with aiovec.make("aiovec/PhaseChange-v0", 24, env_kwargs=kw) as venv:
            await venv.reset(seed=0)
            p0 = time.perf_counter() + (t0 - time.time())
            acts = np.zeros(24, dtype=np.int64)
            while time.time() - t0 < waiting + computing + again:
                await asyncio.wait_for(venv.step(acts), 30)
                await asyncio.sleep(0.008)
            return list(venv.control_history), p0 - venv._stats.t0

    hist, t_phase0 = aiovec.run(main())
    trace = [(round(h["t"] - t_phase0, 2), h["config"], round(h["awaiting"], 2), h["reason"][:90]) for h in hist]
    in_computing = [h for h in hist if waiting + 1.0 < h["t"] - t_phase0 < waiting + computing]
    at_end = [h for h in hist if h["t"] - t_phase0 > waiting + computing + again - 1.5]
    assert any(h["threads"] == 1 and h["placement"] == "process" for h in in_computing), trace
    assert at_end and all(h["threads"] > 1 for h in at_end), trace
    # every interval measured, but for a move's own (a probe may start one): none skipped for the caller's demand
    assert any(h["measured"] for h in at_end) and not [h for h in at_end if h["reason"].startswith("skipped: caller")], trace
    assert_clean(clean)


def test_env_threads_default_is_the_controllers_and_an_explicit_one_is_fixed(clean) -> None:
    """``env_threads=None`` (the default) lets ``num_workers="auto"`` choose threads; any number, 1 included, fixes them."""
    kw = {"wait_ms": 3.0, "episode_len": 20}

    async def main() -> tuple[int, bool, int, bool, set[int]]:
        async with aiovec.make("aiovec/Sleep-v0", 24, env_kwargs=kw) as venv:
            await venv.reset(seed=0)
            chosen, free = venv.env_threads, not venv._control.fixed_threads
        async with aiovec.make("aiovec/Sleep-v0", 24, env_threads=1, env_kwargs=kw) as venv:
            await venv.reset(seed=0)
            await _rate(venv, 2.0)
            seen = {h["threads"] for h in venv.control_history} | {h["target_threads"] or 1 for h in venv.control_history}
            return chosen, free, venv.env_threads, venv._control.fixed_threads, seen

    chosen, free, explicit, fixed, seen = aiovec.run(main())
    assert chosen > 1 and free  # 24 waiting envs: threads from the start, and the controller may turn them
    assert explicit == 1 and fixed and seen == {1}, seen
    with pytest.raises(aiovec.ConfigError):
        aiovec.make("aiovec/Sleep-v0", 2, env_threads=0)
    assert_clean(clean)


@pytest.mark.slow
def test_inline_start_moves_to_processes_when_the_env_turns_costly_and_back(clean) -> None:
    """Cheap envs start in this process under the controller; 1 ms of CPU a step breaks the inline rung's loop-hold
    limit (and one core's worth of throughput), so they move to processes; cheap again, they come back inline.

    The start is the probe's guess from one cold env's timing against the host's pace (``choose_placement``): inline,
    or hybrid where the probe read slow, whereupon the controller looks at inline within its first intervals (a CI dry
    run on a fresh clone started hybrid once, its controller at inline 1.4 s later). What is asserted is where the
    controller takes the envs."""
    cheap, costly = 2.0, 4.0
    # Before start_time the schedule wraps to its last phase (cheap, like the first). The start time is in the
    # env's kwargs, not set_attr: an env that moves to another worker is built again from them.
    t0 = time.time() + 2.0
    kw = {"schedule": [(cheap, 0.0, 0.0), (costly, 1.0, 0.0), (3600.0, 0.0, 0.0)], "start_time": t0, "episode_len": 10}

    async def main() -> tuple[str, list[dict], float]:
        async with aiovec.make("aiovec/PhaseChange-v0", 8, env_kwargs=kw) as venv:
            await venv.reset(seed=0)
            start = venv.placement
            p0 = time.perf_counter() + (t0 - time.time())
            acts = np.zeros(8, dtype=np.int64)
            while time.time() - t0 < cheap + costly + 4.0:
                await asyncio.wait_for(venv.step(acts), 30)
            return start, list(venv.control_history), p0 - venv._stats.t0  # history times count from _stats.t0

    start, hist, t_phase0 = aiovec.run(main())
    trace = [(round(h["t"] - t_phase0, 2), h["config"], h["reason"][:90]) for h in hist]
    assert start in ("inline", "hybrid"), trace
    in_costly = [h for h in hist if cheap + 0.5 < h["t"] - t_phase0 < cheap + costly]
    after = [h for h in hist if h["t"] - t_phase0 > cheap + costly + 2.5]
    assert any(h["placement"] == "process" for h in in_costly), trace
    assert after and after[-1]["placement"] == "inline", trace
    # the loop-hold limit: never inline while a step costs 1 ms (once the controller has seen it)
    moved_out = min(h["t"] for h in in_costly if h["placement"] == "process")
    assert not [h for h in in_costly if h["t"] > moved_out and h["target_placement"] == "inline"], trace
    # and leaving did not cost throughput: measured steps/s in the costly phase, inline vs processes (same run;
    # on an idle 2-core machine processes give ~1.8x, on a busy one the cores are shared and it can be ~1x)
    inline_x = [h["steps_per_s"] for h in in_costly if h["placement"] == "inline" and h["measured"]]
    proc_x = [h["steps_per_s"] for h in in_costly if h["placement"] == "process" and h["measured"]]
    if inline_x and proc_x:
        assert statistics.median(proc_x) >= 0.9 * statistics.median(inline_x), trace
    assert_clean(clean)


def test_hybrid_is_a_rung_for_envs_that_compute_and_is_left_when_a_step_gets_too_long() -> None:
    """This process as one of the workers (hybrid): where the model rates it best and in-process stepping is
    allowed; never for envs whose step would hold the event loop over the limit; never without permission."""

    def run(c: Config, n: int, t_cpu: float, inline_ok: bool) -> list[Config]:
        ctrl, trace = MeasuredController(), []
        for _ in range(12):  # the parent's turn: ~1 us per env step, as measured for the process path
            x = predict(c, Costs(t_cpu, 0.0, 1e-6), n, 2)
            d = ctrl.decide(Measurement(1.0, c.processes, n, int(x), t_cpu, 0.0, 0.0, 1e-6, 1.0, 2, threads=c.threads,
                                        placement=c.placement, lockstep=True, inline_ok=inline_ok))
            c = Config(d.placement or c.placement, d.target, d.threads or c.threads)
            trace.append(c)
        return trace

    trace = run(Config("process", 2, 1), 64, 20e-6, inline_ok=True)
    assert trace[-1] == Config.hybrid(2), trace
    trace = run(Config.hybrid(2), 8, 1e-3, inline_ok=True)
    assert trace[-1].placement == "process" and Config.hybrid(2) not in trace[2:], trace
    trace = run(Config("process", 2, 1), 64, 20e-6, inline_ok=False)
    assert all(c.placement == "process" for c in trace), trace


def test_the_interval_new_workers_warm_up_in_is_no_change_of_the_envs_cost() -> None:
    """The first interval after a process move is not counted (workers start, caches warm): nor may the costs it
    implies (less waiting per step while processes start) become the baseline the next intervals are compared with.
    Two normal intervals after it looked like a change of the env's cost: records and bans were forgotten, and the
    controller went on to a worse setting and held it (seen on 16 waiting envs stepped first-finished)."""
    env = {"n": 16, "t_cpu": 100e-6, "t_wait": 2e-3}
    home = Config("process", 4, 4)

    def truth(c: Config) -> float:  # every other setting measures worse than promised: probes are reverted
        x = predict(c, Costs(100e-6, 2e-3, 20e-6), 16, 2, False)
        return x if c == home else 0.8 * x

    ctrl, c, warming, trace = MeasuredController(), home, False, []
    for _ in range(30):
        if warming:  # processes starting: the same CPU per step, less waiting, fewer steps
            m = interval(c, 16, 110e-6, 1.2e-3, rate=0.7 * truth(c))
        else:
            m = interval(c, rate=truth(c), **env)
        d = ctrl.decide(dataclasses.replace(m, lockstep=False))
        new = Config(d.placement or c.placement, d.target, d.threads or c.threads)
        warming = new.processes != c.processes
        c = new
        trace.append(d.reason)
    assert ctrl.regime_changes == 0 and c == home, trace


@pytest.mark.slow
def test_the_held_out_workloads_run_from_the_benchmark_command(clean, capsys) -> None:
    """``python -m aiovec.bench controller --unseen`` runs workloads the rules were not tuned on, against the same
    static grid and targets. Six envs burning 2 ms of CPU: the best static setting has several processes, and so has
    the setting the controller ends at."""
    from aiovec.bench.__main__ import main

    main(["controller", "--unseen", "--only", "cpu6", "--quick", "--repeats", "1", "--duration", "0.5"])
    out = capsys.readouterr().out
    assert "6 envs, 2 ms CPU" in out and "cheap" not in out, out
    row = next(line for line in out.splitlines() if line.startswith("| 6 envs, 2 ms CPU"))
    cells = [c.strip() for c in row.split("|")]
    # CPU-bound: both the best static setting and where the controller ends use several processes, one thread each
    # (which of 2 and 6 processes wins a single half-second round is the host's call).
    for setting in (cells[3], cells[9].removeprefix("process ")):
        assert setting.endswith("p x 1t") and int(setting.split("p")[0]) >= 2, row
    assert_clean(clean)


def test_the_start_prices_a_command_at_the_hosts_pace_and_takes_the_fewest_processes_near_the_top() -> None:
    """64 envs waiting 5 ms: a probe reads 50-150 us of CPU a step, and the start priced a command to a worker at
    the fixed 40 us (the controller prices it at the host's pace, ~66-90 us here) and took the fewest processes
    only within 1% of the model's best: 2 of 3 benchmark runs started 16 processes x 4 threads and moved to 8 x 8 a
    second later, which measured 6% faster in the same run's static grid. A dearer command never starts more
    processes."""
    from aiovec.measured import plan_start

    for cpu in (100e-6, 150e-6):
        assert plan_start(64, cpu, 5e-3 + cpu, 2, 2)[0] == 16  # at the fixed price
    for cpu in (60e-6, 100e-6, 150e-6):
        for pace in (6e-6, 8e-6):
            assert plan_start(64, cpu, 5e-3 + cpu, 2, 2, pace_s=pace) == (8, 8), (cpu, pace)
    for n, cpu, wait in ((24, 80e-6, 3e-3), (48, 1e-3, 10e-3), (32, 60e-6, 10e-3), (16, 50e-6, 2e-3), (64, 20e-6, 5e-3)):
        for pace in (4e-6, 8e-6, 12e-6):
            assert plan_start(n, cpu, cpu + wait, 2, 2, pace_s=pace)[0] <= plan_start(n, cpu, cpu + wait, 2, 2)[0], (n, cpu, pace)


def test_first_finished_waits_are_not_moved_to_many_processes_on_the_models_word() -> None:
    """16 envs waiting 2 ms, taken first-finished half at a time: measured at fixed settings in one run, 2 processes
    x 8 threads 5,992 steps/s, 4 x 4 5,960, 16 x 1 5,696 (the parent's CPU a step 17.6 us at 2 processes, 43.5 at 16).
    Rated by the slowest worker alone, 16 x 1 promised +20% and every round of the held-out benchmark probed more
    processes, measured no better and came back, once with 1.5 s of process starts. With the parent's turn for a
    wave in series with the wave (``FIRST_FINISHED_WAVES``), 16 x 1 promises less than a move to more processes must,
    and the controller measures at most the neighbouring 4 processes and stays at 2 or 4."""
    truth = {2: 5992.0, 4: 5960.0, 8: 5600.0, 16: 5696.0}
    ctrl, c, seen = MeasuredController(), Config("process", 2, 8), []
    for _ in range(20):
        m = dataclasses.replace(interval(c, n=16, t_cpu=58e-6, t_wait=1.86e-3, rate=truth[c.processes]),
                                lockstep=False, main_cpu_per_step=17.6e-6, pace_s=6e-6)
        d = ctrl.decide(m)
        c = Config(d.placement or c.placement, d.target, d.threads or c.threads)
        seen.append(c.processes)
    assert max(seen) <= 4 and seen[-1] in (2, 4), seen
    costs = Costs(58e-6, 1.86e-3, 17.6e-6)
    rate = {p: predict(Config("process", p, 16 // p), costs, 16, 2, lockstep=False, command=6.6e-5) for p in (2, 16)}
    assert rate[16] < rate[2] * (1 + MOVE_GAIN), rate


def test_the_interval_that_settles_a_change_is_not_counted_where_threads_just_changed() -> None:
    """Waits come back after a phase of computing: the blended interval gives 2 processes 12 threads; the next
    settles the cost at the waiting regime seen before, but it ran commands sent before the change and started the
    threads (4,700 steps/s in a benchmark round, where 2 x 12 then ran ~5,900). Counted, it lost to the waiting
    regime's record of 3 x 8 (~6,000) by more than a move to more processes must promise, and the envs went to 3
    processes and came back (~1.5 s). Not counted, the first decision compares a clean interval with the record."""
    waiting, computing = Costs(60e-6, 2.8e-3, 20e-6), Costs(1e-3, 0.0, 20e-6)

    def truth(c: Config, costs: Costs) -> float:
        if costs is waiting and c.processes * c.threads >= 24:
            return 6000.0 if c.processes == 3 else 5900.0
        return 0.9 * predict(c, costs, 24, 2)

    ctrl, c = MeasuredController(), Config("process", 3, 8)
    for costs, steps in ((waiting, 12), (computing, 12)):
        for _ in range(steps):
            d = ctrl.decide(interval(c, n=24, t_cpu=costs.cpu_s, t_wait=costs.wait_s, rate=truth(c, costs)))
            c = Config(d.placement or c.placement, d.target, d.threads or c.threads)
    assert ctrl.records and c.threads == 1, c
    d = ctrl.decide(interval(c, n=24, t_cpu=0.8e-3, t_wait=0.6e-3, rate=1400.0))
    assert "began to wait" in d.reason and d.threads == largest_shard(24, c.processes), d.reason
    c = Config(c.placement, d.target, d.threads)
    d = ctrl.decide(interval(c, n=24, t_cpu=60e-6, t_wait=2.8e-3, rate=4700.0))
    assert "cost settled" in d.reason and "not counted" in d.reason and (d.target, d.threads) == (c.processes, c.threads), d.reason
    d = ctrl.decide(interval(c, n=24, t_cpu=60e-6, t_wait=2.8e-3, rate=truth(c, waiting)))
    assert (d.target, d.threads) == (c.processes, c.threads), d.reason


def test_an_exploration_bonus_does_not_carry_a_move_to_more_processes() -> None:
    """Where envs wait or are taken first-finished, an unmeasured neighbour scores the model's figure plus the
    exploration bonus, so that it is measured. A move to more processes must promise ``move_gain`` on the model's
    own figure: with the bonus counted, 16 first-finished envs waiting 2 ms moved 4 x 4 -> 8 x 2 on +12.4% (+4%
    without it) and 2 x 8 -> 4 x 4 on +18% (+9%) in the held-out benchmark: each measured no better and came back,
    ~1.5 s of envs in motion. Here the model rates 8 x 2 2% above 4 x 4 (x 1.08 with the bonus), every configuration
    measures alike, and the bar is 6%."""
    n, t_cpu, t_wait, main, start = 16, 70e-6, 1.96e-3, 25e-6, Config("process", 4, 4)
    costs = Costs(t_cpu, t_wait, main)
    rates = {p: predict(Config("process", p, 16 // p), costs, n, 2, lockstep=False, command=88e-6) for p in (4, 8)}
    assert 1.0 < rates[8] / rates[4] < 1.06 < 1.08 * rates[8] / rates[4], rates
    ctrl, c, seen = MeasuredController(move_gain=0.06), start, []
    for _ in range(24):
        m = dataclasses.replace(interval(c, n=n, t_cpu=t_cpu, t_wait=t_wait, rate=0.93 * rates[4]), lockstep=False,
                                pace_s=8e-6, main_cpu_per_step=main)
        d = ctrl.decide(m)
        seen.append(d.reason)
        c = Config(d.placement or c.placement, d.target, d.threads or c.threads)
        assert c.processes <= start.processes, seen


def test_a_host_speed_change_in_the_small_cpu_of_waiting_envs_is_no_change_of_cost() -> None:
    """24 envs waiting 3 ms on 3p x 8t: the host speeds up and their CPU per step falls from 0.12 to 0.07 ms for good
    (4% of a step). That is no new cost (records kept, no probe); a move of the CPU by a fifth of the step still is."""
    ctrl, c = MeasuredController(), Config("process", 3, 8)
    for _ in range(8):
        d = ctrl.decide(interval(c, n=24, t_cpu=0.12e-3, t_wait=2.99e-3, rate=6000))
        c = Config(d.placement or c.placement, d.target, d.threads or c.threads)
    held = c
    reasons = []
    for _ in range(6):
        d = ctrl.decide(interval(c, n=24, t_cpu=0.07e-3, t_wait=3.0e-3, rate=6100))
        reasons.append(d.reason)
        c = Config(d.placement or c.placement, d.target, d.threads or c.threads)
    assert not any("env cost changed" in r for r in reasons) and c == held, reasons
    before = ctrl.regime_changes
    for _ in range(2):
        d = ctrl.decide(interval(c, n=24, t_cpu=0.81e-3, t_wait=2.5e-3, rate=2000))
    assert ctrl.regime_changes > before, d.reason
