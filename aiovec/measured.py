"""Controller v2: the model proposes, measurement decides.

A configuration is ``(placement, processes, threads per process)``. Each control interval the
controller records the measured steps/s of the configuration that ran, and:

1. **Checks the last change.** After a move it measures the new configuration for ``confirm``
   intervals (no single interval decides; one more where they lie over ``spread`` apart) and
   compares them with what the configuration it left measured just before, under the same env
   cost. A move to fewer resources whose best interval fell short of the other's best by more than ``revert``
   (interference only slows a run: a dip in either visit decides nothing, and a warm-up interval that read higher
   than the counted ones is the visit's best; from hybrid to inline, one that did not
   beat it by ``gain``), or one to more whose median did
   not measure better by ``prefer`` and by its intervals' scatter (at most :data:`MAX_SCATTER`; a gain inside the
   scatter is undecided: one more interval is measured and the median of three decides, against the scatter of
   the two nearest it: see :func:`_inner_scatter`): it moves
   back and remembers the loser for ``memory`` intervals, doubled at each repeated loss
   (hysteresis), forgotten when the env's cost changes (decay: a changed env is re-explored). The revert is judged
   in turn: where the configuration it went back to then measures far below its own earlier figure and below the
   loser's, the loser is measured again, once (see ``_undo_revert``).
2. **Ranks the candidates.** Lock-step aware: only process counts that shorten the critical path
   (:func:`~aiovec.configs.efficient_counts`) and thread counts that shorten a worker's rounds
   (:func:`~aiovec.configs.efficient_threads`), plus the inline rung where allowed. A candidate
   measured recently scores its measured median; one not measured scores the model's prediction
   (:func:`~aiovec.costmodel.predict`) scaled by how far the model was off at the current one.
   Near-ties (``prefer``) go to fewer processes, then fewer threads; among predictions, a tie is judged on the
   model's own figures, so an exploration bonus never makes a costlier configuration the one probed.
3. **Moves** when the best candidate beats the current measurement by ``gain`` (``move_gain`` for a prediction
   of more processes: see :data:`MOVE_GAIN`); moves to
   configurations never measured are probes, limited to ``probes`` per env regime (``process_probes`` of
   them to another process count or placement, none once the env returns to a cost it had; beyond them, one look
   at inline from hybrid per regime: see ``_other_rung``). Records are from other moments: where the current
   configuration measures below its own earlier record (a slower host), the others' are scaled down alike,
   and a move to more resources on a record must also clear its scatter plus the current visit's.

A configuration is rated by its steps/s, in lock-step per second of the caller's time inside ``step()``
(:attr:`~aiovec.controller.Measurement.stepping_rate`): a caller with work of its own between steps is measured too.
Intervals in which the caller did not step (a learner update: in lock-step, in ``step()`` less than
:data:`LOCKSTEP_MIN_AWAITING` of it; first-finished, steps in flight less than ``min_demand`` of it) are skipped.

Intervals measured while other processes held half a CPU or more (``Measurement.foreign_cpus``, see
:data:`FOREIGN_LOAD`) decide nothing for good against quiet ones: a loss measured so bans nothing, a configuration
that lost so is measured again once the host is quiet, and records made only so are forgotten then.

After the env's per-step cost changes (two intervals in a row at an unchanged configuration; one, provisionally,
where its CPU per step moved 2x: see :data:`DECISIVE_CPU_JUMP`, or where CPU-bound envs on one thread began to wait:
see :data:`WAITS_APPEAR`), the first move may only change threads (instant) and processes follow in later moves (back
at a cost it had, on that cost's records: see :data:`FOLLOW_DECISIONS`); the interval that settles such a change is not
counted where threads changed on it (commands sent before the change and the new threads' start weigh on it). Knobs the
user fixed (``Measurement.fixed_workers``/``fixed_threads``) are never turned.

Pure: no clock, no I/O. Feed it :class:`~aiovec.controller.Measurement` objects.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections import deque
from dataclasses import dataclass, field

from .autoconf import INLINE_ENTER_S, INLINE_LEAVE_S
from .configs import Config, efficient_counts, efficient_threads, largest_shard, uneven
from .controller import Decision, Measurement
from .costmodel import Costs, command_cost, costs_from, predict, wait_from_command


@dataclass
class _Record:
    """Measured steps/s of one configuration in the current env regime."""

    samples: deque = field(default_factory=lambda: deque(maxlen=6))
    loaded: deque = field(default_factory=lambda: deque(maxlen=6))  # per sample: other processes held the CPUs
    seen: int = 0  # interval of the last sample
    losses: int = 0  # times it measured worse than the configuration it replaced
    banned_until: int = 0  # not proposed again before this interval

    @property
    def median(self) -> float:
        return statistics.median(self.samples) if self.samples else 0.0

    @property
    def only_loaded(self) -> bool:
        """Whether every sample was measured while other processes kept the CPUs busy (see :data:`FOREIGN_LOAD`)."""
        return bool(self.loaded) and all(self.loaded)

    def add(self, x: float, loaded: bool, i: int) -> None:
        self.samples.append(x)
        self.loaded.append(loaded)
        self.seen = i

    def pop(self) -> None:
        self.samples.pop()
        self.loaded.pop()

    def forget(self) -> None:
        """No samples (a record made only on a loaded host); bans and losses stay."""
        self.samples.clear()
        self.loaded.clear()

    def restart(self, x: float, loaded: bool) -> None:
        """Only ``x`` from now on (a loser's median: its earlier, better samples no longer speak for it)."""
        self.forget()
        self.samples.append(x)
        self.loaded.append(loaded)


@dataclass(frozen=True)
class _Reverted:
    """A revert from ``loser`` to ``to``: the loser's visit (median, best interval, scatter), what ``to`` measured
    before the move, and whether either visit ran on a loaded host."""

    loser: Config
    to: Config
    median: float
    best: float
    scatter: float
    before: float
    loaded: bool


def config_of(m: Measurement) -> Config:
    """The configuration an interval ran under."""
    if m.placement == "inline":
        return Config.inline()
    if m.placement == "hybrid":
        return Config.hybrid(max(2, m.num_workers))
    return Config("process", m.num_workers, max(1, m.threads))


def infer_costs(m: Measurement) -> Costs:
    """One env step's CPU and waiting, and the parent's CPU per step, from an interval at any configuration.

    ``cpu_per_step + blocked_per_step`` is the wall time of one env step as its thread saw it (the
    control loop scales a command's wall time by the threads that shared it). With ``T`` threads
    over a shard of ``s`` envs, a command lasts ``ceil(s / T)`` env steps when they wait, but ``s``
    CPU times when they compute (one GIL); a command about as long as its CPU shows no waiting,
    whatever the threads may hide.
    """
    cpu = m.cpu_per_step
    step = cpu + m.blocked_per_step
    if m.placement == "inline":
        return costs_from(cpu, step, m.main_cpu_per_step, "inline")
    if m.placement == "hybrid":
        return costs_from(cpu, step, m.main_cpu_per_step, "hybrid", 1 / max(2, m.num_workers))
    shard = m.largest_shard or largest_shard(m.num_envs, max(1, m.num_workers))
    t = max(1, min(m.threads, shard))
    if t > 1:  # threads hide waits and queue for the GIL: invert the model's command time
        command = (step + m.runq_per_step) * shard / t  # a command's wall time (per-step figures are per thread)
        step = cpu + wait_from_command(command, shard, t, cpu, m.runq_per_step * shard)
    return costs_from(cpu, step, m.main_cpu_per_step, "process")


MOVE_GAIN = 0.12
"""What a move to more processes (or from inline to hybrid) on the model's word must promise, above ``gain`` (and a
move to more worker processes on another configuration's record, from another moment). In one
run of ``python -m aiovec.bench controller`` (2 CPUs) 10 such probes promised +5% to +17% and measured 0.84-1.0x of
their promise: 7 were no better than where they came from and were reverted, each after ~4 control intervals of
envs in motion and as many back; 1 was still measuring when the run ended (stragglers, 4 s in: it would have
settled after 15 intervals); 2 were kept, at +5% and +7%. Of the 5 that promised under 12%, 3 were reverted or
unjudged, and 1 was kept (wait24, 4 -> 5 processes, +7%). The promise is the model's own figure: the exploration
bonus (``explore``, which gets an unmeasured neighbour measured where envs wait or are taken first-finished) buys
instant looks at threads, not process moves. Counted toward this bar, it carried the probes of 16 first-finished
envs waiting 2 ms in a later run (4p x 4t -> 8p x 2t on +12.4%, +4% without it; 2p x 8t -> 4p x 4t on +18%, +9%
without): each measured no better and came back, ~1.5 s of envs in motion, once inside the counted window.
Moves to fewer processes keep ``gain``: a tie there saves processes, and the model under-rates some (8 -> 2
processes for 8 CPU-bound envs: +6% predicted, +17% measured); so do changes of threads (instant, no envs move)."""


DECISIVE_CPU_JUMP = 2.0
"""A change of the env's CPU per step by this factor (and 100 us) in one control interval is a new cost at once,
without a second interval to confirm it. The demo's change of cost (24 envs waiting 3 ms, then computing 1 ms, then
waiting again; 3-s phases) lost a whole interval at ~1,000 steps/s after each change, where the setting for
waiting envs ran at ~6,000: the interval in which the cost changed is a blend (CPU 0.96 -> 0.29 ms per step),
and the two-interval rule waited for the next. Where a command lasts long (8 envs waiting 3 ms on one thread:
24 ms), the blend spans two intervals (CPU 0.91 -> ~0.35 -> 0.04 ms per step in one round at x3): a factor of
3 still waited for the third. CPU per step is what a busy host does not double: it stretches the wall time of a
step, which the rule for waiting (two intervals) still guards."""


FOLLOW_DECISIONS = 3
"""After the env returns to a cost it had, threads move at once (instant) and processes follow on that cost's records:
for this many decisions a record of more processes need only beat the current configuration by ``gain``, not
``move_gain`` plus the scatters (records from other moments, see :data:`MOVE_GAIN`; these are seconds old and of the
same cost, and the move is judged like any other). The change of cost (24 envs waiting 3 ms, computing, waiting again)
came back to 2p x 12t at ~5,950 steps/s where 3p x 8t had measured 6,312 in the first phase; it held (+6%, under 12%)
until 2 x 12 had drifted to ~5,550, then moved, 11 intervals after the change, and 3 x 8 measured 6,078-6,314."""


CPU_BOUND_SHARE = 0.1
"""Envs that wait less than this share of a step are CPU-bound: threads cannot overlap anything, so only one thread
per process is a candidate."""

WAITS_APPEAR = 0.2
"""Where envs computed on one thread per process (CPU-bound: :data:`CPU_BOUND_SHARE`) and one interval's step waits this
share of its time or more (and 100 us), the envs began to wait: a provisional change of cost, and the next move gives
each process threads for its whole shard at once (an instant change; the next interval settles the cost). The change
of cost (24 envs waiting 3 ms, computing 1 ms, waiting again) ran the interval after the waits came back at 2 x 1
thread, ~620 steps/s against ~5,900 at 2 x 12 (3% of the run): the interval in which they came back blended the two
costs (CPU 0.98 -> 0.87 ms, waiting 0 -> 0.31 ms per step), which neither rule for a change of cost took as one.
On one thread, waiting is clean: a step's wall time less its CPU and its time runnable in the run queue; only steal
time on a busy host also reads as it, so a loaded interval (:data:`FOREIGN_LOAD`) is not taken as a change. Keeping
the threads through the CPU phase instead was measured dearer: 24 envs of 1 ms CPU on 2 x 12 ran 0.94x 2 x 1 (0.89x
at 0.3 ms)."""


class MeasuredController:
    """Processes, threads per process and the in-process rungs (inline, hybrid), chosen by measured throughput (see
    module doc).

    >>> ctrl = aiovec.MeasuredController()
    >>> m = aiovec.Measurement(interval_s=1.0, num_workers=2, num_envs=64, steps=400, cpu_per_step=20e-6,
    ...                        blocked_per_step=5e-3, runq_per_step=0.0, main_cpu_per_step=20e-6, demand=1.0, cpus=2)
    >>> warm, first, second = ctrl.decide(m), ctrl.decide(m), ctrl.decide(m)   # no single interval decides
    >>> warm.reason, first.reason
    ('warming up 2p x 1t: 400 steps/s not counted', 'measuring 2p x 1t: 400 steps/s (1/2)')
    >>> (second.target, second.threads)   # 64 waiting envs: a few processes (even shards), threads for the rest
    (4, 16)
    """

    def __init__(
        self,
        min_workers: int = 1,
        max_workers: int | None = None,
        max_threads: int = 32,
        min_demand: float = 0.5,
        confirm: int = 2,
        gain: float = 0.05,
        move_gain: float = MOVE_GAIN,
        revert: float = 0.04,
        prefer: float = 0.03,
        memory: int = 80,
        probes: int = 4,
        process_probes: int = 1,
        explore: float = 0.08,
        max_settling_skips: int = 4,
        cost_change: float = 1.5,
        spread: float = 0.3,
    ) -> None:
        if min_workers < 1 or (max_workers is not None and max_workers < min_workers):
            raise ValueError(f"need 1 <= min_workers <= max_workers, got {min_workers}, {max_workers}")
        self.min_workers, self.max_workers, self.max_threads = min_workers, max_workers, max_threads
        self.min_demand, self.confirm, self.gain, self.revert, self.prefer = min_demand, confirm, gain, revert, prefer
        self.memory, self.probes, self.max_settling_skips, self.cost_change = memory, probes, max_settling_skips, cost_change
        self.process_probes = process_probes  # of ``probes``, those that move envs (each costs ~4 intervals)
        self.move_gain = move_gain  # what a move to more processes on the model's word must promise (see MOVE_GAIN)
        self.spread = spread  # intervals of one visit further apart than this (max / min - 1) call for more
        self.explore = explore  # bonus of an unmeasured neighbour where envs wait: measured, not only predicted
        self.records: dict[Config, _Record] = {}
        self.costs: Costs | None = None  # smoothed, at the current configuration
        self._i = 0
        self._skips = 0
        self._here: Config | None = None  # configuration of the last measured interval
        self._visit: list[float] = []  # steps/s since arriving at it
        self._drop_first = True  # the first interval: workers and caches warm up, the host settles after start-up
        self._warm_x: tuple[Config, float] | None = None  # the configuration whose warm-up this was, and its steps/s
        # What the last move left: its median and best steps/s, and whether other processes loaded the host then.
        self._base: tuple[Config, float, float, bool] | None = None
        self._reverted: _Reverted | None = None  # the last revert, until the configuration it went back to is measured
        self._undone: set[Config] = set()  # losers whose revert was undone in this env regime (once each)
        self._visit_loaded: list[bool] = []  # per interval of the visit: measured on a loaded host (FOREIGN_LOAD)
        self._recheck: Config | None = None  # to measure again: its record against this one was made on a loaded host
        self._jumps = 0
        self._probes_left = probes
        self._process_probes_left = process_probes
        self._rung_looked = False  # this env regime measured the other in-process rung (see ``_other_rung``)
        self._threads_first = False
        self._cpu_up = False  # the last change of cost raised the CPU per step (x2 and more)
        self._waits_began = False  # the last change of cost: CPU-bound envs on one thread began to wait (WAITS_APPEAR)
        self._explored_processes = False
        self._prior_here: float | None = None  # what the current configuration measured before this visit
        self._regimes: list[tuple[Costs, dict[Config, _Record]]] = []  # what earlier env costs measured
        self._decide_now = False
        self._provisional = False  # the last change of cost was decided on one interval, and the next may correct it
        self._warm_again = False  # the interval that settled a provisional change followed an instant change: not counted
        self._follow = 0  # decisions left in which processes follow a known cost's records at ``gain`` (FOLLOW_DECISIONS)
        self._following = False  # this decision is one of them
        self._before_change: Costs | None = None  # the cost before the last change
        self._settled_in = 0  # skipped intervals since the last process move: how long envs took to move
        self._slow_moves = False  # the last process move took more than two intervals (long episodes)
        self._look_again = False  # the memory's decay reopened the model's probes beyond PROBE_WINDOW
        self.regime_changes = 0

    # -- the decision ---------------------------------------------------------------------
    def decide(self, m: Measurement) -> Decision:
        """The configuration for the next interval, with the reason."""
        cur = config_of(m)
        if m.steps == 0:
            return self._hold(cur, "skipped: no steps", measured=False)
        if m.lockstep is True and m.awaiting > 0:
            if m.awaiting < LOCKSTEP_MIN_AWAITING:
                return self._hold(cur, f"skipped: caller was in step() only {m.awaiting:.0%} of the interval", measured=False)
        elif m.demand < self.min_demand:
            return self._hold(cur, f"skipped: caller asked for steps only {m.demand:.0%} of the interval", measured=False)
        if m.settling and self._skips < self.max_settling_skips:
            self._skips += 1
            self._settled_in += 1
            return self._hold(cur, "skipped: workers starting or envs moving", measured=False)
        self._skips = 0
        self._i += 1
        if self._i % self.memory == 0:
            self._probes_left = max(self._probes_left, 1)  # decay: one more look around now and then
            self._process_probes_left = max(self._process_probes_left, 1)
            self._look_again = True
        x, costs = m.stepping_rate, infer_costs(m)
        if self._drop_first:  # the first interval after processes changed: new workers warm up
            # Neither its throughput nor its costs count: costs it inferred while processes started (less waiting,
            # say) made the next two normal intervals look like a change of the env's cost, which forgot every
            # record and ban and probed again what had just been reverted.
            self._drop_first = False
            self._slow_moves = self._settled_in > 2
            self._warm_x = (cur, x)
            return self._hold(cur, f"warming up {cur.label}: {x:,.0f} steps/s not counted")
        loaded = m.foreign_cpus >= FOREIGN_LOAD
        regime = self._track(cur, costs, loaded)
        if self._warm_again:
            self._warm_again = False
            return self._hold(cur, f"{regime}warming up {cur.label} at the settled cost: {x:,.0f} steps/s not counted")
        self._visit.append(x)
        self._visit_loaded.append(loaded)
        rec = self.records.setdefault(cur, _Record())
        if not self._provisional:  # an interval that may blend two costs is neither's record
            rec.add(x, loaded, self._i)
        if not loaded:
            self._forget_loaded(cur)
        if len(self._visit) < self.confirm and not self._decide_now:
            return self._hold(cur, f"{regime}measuring {cur.label}: {x:,.0f} steps/s ({len(self._visit)}/{self.confirm})")
        if not self._decide_now and self._disagree():
            return self._hold(cur, f"{regime}measuring {cur.label} again: {x:,.0f} steps/s, intervals "
                                   f"{max(self._visit) / min(self._visit) - 1:.0%} apart")
        self._decide_now = False
        here = statistics.median(self._visit[-6:])
        undo = self._undo_revert(cur, here, m)
        if undo is not None:
            return _prefixed(regime, undo)
        if self._base is not None:
            base, before, before_best, base_loaded = self._base
            self._base = None
            here_loaded = _mostly(self._visit_loaded[-6:])
            # A change to more processes or threads must pay for itself, by more than its intervals scatter (a 3%
            # gain inside 10% of noise is noise); one to fewer must only not cost, judged on each visit's best
            # interval: the host only ever slows a run, so a dip in the visit it left must not keep it, nor a dip
            # in its own send it back (but a lone fast interval must not keep it either: see below).
            if _resources(cur) > _resources(base):
                bar = before * (1 + max(self.prefer, min(MAX_SCATTER, _inner_scatter(self._visit[-6:]))))
                if before * (1 + self.prefer) <= here < bar and len(self._visit) < self.confirm + EXTRA_SAMPLES:
                    # A gain, but inside the scatter: undecided, not worse. One more interval, and the median of
                    # three (one bad interval no longer counts) against the scatter of the two nearest it decides.
                    self._base = (base, before, before_best, base_loaded)
                    return self._hold(cur, f"{regime}measuring {cur.label} again: {here:,.0f} steps/s, +{here / before - 1:.0%} "
                                           f"on {base.label} within its intervals' scatter")
                worse = here < bar
                if not worse:
                    self._explored_processes = False  # a costlier move paid for itself: keep climbing
                why = f"{cur.label} measured {here:,.0f} steps/s, {base.label} {before:,.0f} before it"
            else:
                best = self._visit_best()
                # Hybrid to inline gives up the second CPU, which hybrid gets whenever the host frees it, and doubles
                # the loop's hold: inline must measure better, not only as well (see ``_other_rung``).
                bar = self._fewer_bar(base, cur)
                worse = best < before_best * bar
                why = f"{cur.label} at best {best:,.0f} steps/s, {base.label} {before_best:,.0f} before it"
                if not worse and here < before * bar:
                    # Its best interval keeps it, its median does not: one interval out of line in this visit (a fast
                    # first one: 64 waiting envs kept 5p x 13t on 8,377 then ran at 7,600-7,900 steps/s, where 8p x 8t
                    # had measured 8,350). One more interval; then the median of three decides.
                    if len(self._visit) < self.confirm + EXTRA_SAMPLES:
                        self._base = (base, before, before_best, base_loaded)
                        return self._hold(cur, f"{regime}measuring {cur.label} again: best {best:,.0f} steps/s keeps it, "
                                               f"median {here:,.0f} does not ({base.label} {before:,.0f})")
                    worse = True
                    why = f"{cur.label} measured {here:,.0f} steps/s, {base.label} {before:,.0f} before it"
            if worse and base in self._allowed(m):
                if here_loaded and not base_loaded:
                    why += "; no ban: measured while other processes kept the CPUs busy"
                else:
                    rec.losses += 1
                    rec.banned_until = self._i + self.memory * 2 ** (rec.losses - 1)
                rec.restart(here, here_loaded)
                d = self._move(cur, base, m, f"revert: {why}")
                self._base = None  # going back is judged only by :meth:`_undo_revert`
                if cur not in self._undone:
                    self._reverted = _Reverted(cur, base, here, self._visit_best(), _inner_scatter(self._visit[-6:]), before,
                                               here_loaded or base_loaded)
                return d
            if base_loaded and not here_loaded:
                self._recheck = base  # it lost to a quiet host: it has to measure again on one
        return self._choose(cur, here, costs, m, regime)

    def _fewer_bar(self, frm: Config, to: Config) -> float:
        """What a move from ``frm`` to fewer resources ``to`` must measure against ``frm`` (best interval against best
        interval): not worse by ``revert``; from hybrid to inline, better by ``gain`` (see ``_other_rung``)."""
        return 1 + self.gain if _gives_up_the_worker(frm, to) else 1 - self.revert

    def _undo_revert(self, cur: Config, here: float, m: Measurement) -> Decision | None:
        """Judge a revert by what the configuration it went back to measures now: where that fell by more than
        :data:`MAX_SCATTER` below what it measured before the move, and the loser's own figures would now pass the
        same test that sent it away, the verdict rested on a figure no longer true; the loser's ban is lifted and
        the run moves back to it, on trial again (once per loser and env regime: a second loss stands).

        16 CartPoles went hybrid -> inline -> hybrid (inline measured 140k steps/s against hybrid's 176k), and the
        hybrid they came back to ran at 87-105k for the rest of the run, the inline record banned (one run of
        three in ``python -m aiovec.bench controller``); a host that slowed both would make the loser lose again."""
        r = self._reverted
        if r is None or cur != r.to:
            self._reverted = None
            return None
        self._reverted = None
        if r.loaded or _mostly(self._visit_loaded[-6:]) or here >= r.before * (1 - MAX_SCATTER) or r.loser not in self._allowed(m):
            return None
        if _resources(r.loser) > _resources(cur):
            passes = r.median >= here * (1 + max(self.prefer, min(MAX_SCATTER, r.scatter)))
        else:
            bar = self._fewer_bar(cur, r.loser)
            passes = r.best >= self._visit_best() * bar and r.median >= here * bar
        if not passes:
            return None
        self._undone.add(r.loser)
        rec = self.records.get(r.loser)
        if rec is not None:
            rec.losses, rec.banned_until = max(0, rec.losses - 1), 0
        return self._move(cur, r.loser, m, f"{r.loser.label}: undo the revert: {cur.label} measures {here:,.0f} steps/s "
                                            f"now ({r.before:,.0f} before), {r.loser.label} measured {r.median:,.0f}")

    def _visit_best(self) -> float:
        """The best interval of this visit's last six, or its warm-up where that read higher.

        The warm-up is not counted because new workers may read low; but the host only ever slows a run, so one that
        read high shows what the configuration can do. 16 CartPoles started hybrid at 177,865 steps/s, then the host
        dipped for its two counted intervals (106,506 and 128,872); inline measured 140,000 and beat that best by the
        5% it needs, and held to the end (0.79x the best static, hybrid at 176,414 in the same sweep)."""
        best = max(self._visit[-6:])
        w = self._warm_x
        if w is not None and w[0] == self._here and len(self._visit) <= 6:
            best = max(best, w[1])
        return best

    def _disagree(self) -> bool:
        """Whether this visit's intervals lie too far apart to decide on yet (a host busy for a moment, a slow
        start): then :data:`EXTRA_SAMPLES` more are measured and the median of all decides, so one bad interval
        of two neither sends a good setting away nor keeps a bad one."""
        v = self._visit
        return len(v) < self.confirm + EXTRA_SAMPLES and min(v) > 0 and max(v) / min(v) > 1 + self.spread

    def _track(self, cur: Config, costs: Costs, loaded: bool = False) -> str:
        """Follow the env's cost at an unchanged configuration; a jump held two intervals is a new regime.

        Two intervals agreeing on the new cost decide at once (the second is all new cost). One interval decides
        where the env's CPU per step moved by :data:`DECISIVE_CPU_JUMP` or more (a busy host stretches a step's wall
        time, not its CPU time), provisionally: that interval may be a blend of the two costs, so until the next
        one settles the cost only instant changes (threads) are made, and a next interval whose CPU per step
        moved again re-keys the regime (see :meth:`_switch`); so does one in which CPU-bound envs on one thread began
        to wait (see :data:`WAITS_APPEAR`; not on a ``loaded`` host). What each earlier cost measured is kept: an env that returns to a
        cost it had resumes that cost's measurements and bans (no re-exploring what is known); a new cost starts
        afresh, threads first.
        """
        old = self.costs
        moved = cur != self._here
        if moved:
            self._here, self._visit, self._visit_loaded = cur, [], []
            rec = self.records.get(cur)
            self._prior_here = rec.median if rec is not None and rec.samples else None
        if self._provisional:
            self._provisional = False
            assert old is not None and self._before_change is not None
            if _cpu_moved(old.cpu_s, costs.cpu_s):  # the deciding interval was a blend: this one is the new cost
                # Threads changed on the blend: this interval ran commands sent before the change and started the
                # new threads (the change of cost: 4,700-5,500 steps/s at 2 x 12, which then ran ~5,900); it sets
                # the cost but is not counted, so the first decision at the settled cost compares a clean interval.
                self._warm_again = moved
                return self._switch(self._before_change, costs, settled=True)
        if moved:
            # Across configurations the inferred waiting carries the model's errors: only a jump of CPU counts.
            if old is None or not _cpu_moved(old.cpu_s, costs.cpu_s):
                self.costs, self._jumps = costs, 0
                return ""
            jump = True
        else:
            assert old is not None
            jump = _changed(old, costs, self.cost_change)
        self._jumps = self._jumps + 1 if jump else 0
        if self._jumps >= 2:
            rec = self.records.get(cur)
            if rec is not None and rec.samples:
                rec.pop()  # the first interval at the new cost was counted under the old one
            return self._keep_and_switch(old, costs)
        began = _waits_appeared(cur, old, costs)
        if (jump and _cpu_moved(old.cpu_s, costs.cpu_s, DECISIVE_CPU_JUMP)) or (began and not loaded):
            self._provisional, self._waits_began = True, began
            return self._keep_and_switch(old, costs)
        if not self._jumps:
            self.costs = Costs(*(0.5 * a + 0.5 * b for a, b in zip((old.cpu_s, old.wait_s, old.main_s),
                                                                  (costs.cpu_s, costs.wait_s, costs.main_s), strict=True)))
        return ""

    def _keep_and_switch(self, old: Costs, costs: Costs) -> str:
        """Keep what the cost ``old`` measured (the last few costs' records), then :meth:`_switch` to ``costs``."""
        self._regimes = [(c, r) for c, r in self._regimes if _changed(c, old, self.cost_change)][-3:]
        self._regimes.append((old, self.records))
        self._before_change = old
        return self._switch(old, costs)

    def _switch(self, old: Costs, costs: Costs, settled: bool = False) -> str:
        """A new env regime at ``costs`` (``old``: the cost before the change): a cost seen before resumes its records
        and bans and probes no new process count; a new one starts afresh, threads first. ``settled``: the cost a
        provisional change (one interval, perhaps a blend) settled at, which replaces that interval's cost."""
        known = next((r for c, r in self._regimes if not _changed(c, costs, self.cost_change)), None)
        self.records = known if known is not None else {}
        self.costs, self._jumps, self._base, self._visit, self._prior_here = costs, 0, None, [], None
        self._visit_loaded, self._recheck, self._reverted, self._undone, self._warm_x = [], None, None, set(), None
        self._process_probes_left = 0 if known is not None else self.process_probes
        self._rung_looked = False
        self._follow = FOLLOW_DECISIONS if known is not None else 0
        self._probes_left, self._threads_first, self._explored_processes = self.probes, known is None, known is not None
        self._cpu_up = _cpu_moved(old.cpu_s, costs.cpu_s) and costs.cpu_s > old.cpu_s
        self._decide_now = True
        if not settled:
            self.regime_changes += 1
        return (f"env cost {'settled' if settled else 'changed'} (CPU {1e3 * old.cpu_s:.2f} -> {1e3 * costs.cpu_s:.2f} ms, "
                f"waiting {1e3 * old.wait_s:.2f} -> {1e3 * costs.wait_s:.2f} ms per step"
                f"{'; a cost seen before: its measurements resume' if known is not None else ''}); ")

    def _choose(self, cur: Config, here: float, costs: Costs, m: Measurement, regime: str) -> Decision:
        self._following = self._follow > 0 and not self._provisional
        if self._following:
            self._follow -= 1
        model = self.costs or costs
        lockstep = m.lockstep is not False
        cal = here / max(predict(cur, model, m.num_envs, m.cpus, lockstep, command_cost(m.pace_s)), 1e-9)
        allowed = self._allowed(m)
        if cur.placement in ("inline", "hybrid") and cur not in allowed:  # too costly to step in this process: leave at once
            pick = self._best([c for c in allowed if c.placement == "process"], cur, here, model, cal, m, lockstep, force=True)
            if pick is not None:
                return _prefixed(regime, pick)
        if self._provisional:  # the cost may be a blend of two: only instant changes until the next interval settles it
            allowed = [c for c in allowed if not _moves_envs(c, cur)]
        if self._waits_began:
            self._waits_began = False
            cover = max((c for c in allowed if c.placement == "process" and c.processes == cur.processes),
                        key=lambda c: c.threads, default=cur)
            if cover.threads > cur.threads:
                return _prefixed(regime, self._move(cur, cover, m, f"{cover.label}: the envs began to wait; threads for "
                                                                      "the whole shard at once"))
        again = self._recheck
        if again is not None and m.foreign_cpus < FOREIGN_LOAD:
            self._recheck = None
            if again in allowed and again != cur:
                return _prefixed(regime, self._move(cur, again, m, f"{again.label}: measured again; it lost to {cur.label} "
                                                                    "while other processes kept the CPUs busy"))
        if self._threads_first:
            self._threads_first = False
            one = Config(cur.placement, cur.processes, 1)
            if self._cpu_up and cur.threads > 1 and one in allowed:
                # The envs now compute: threads only queue for the GIL, and the waiting inferred from a threaded
                # interval wanders (it stepped threads down one rung per move). One thread is measured next
                # (an instant change), and reverted if it measures worse.
                return _prefixed(regime, self._move(cur, one, m, f"{one.label}: the env's CPU per step jumped; threads queue for the GIL"))
            same = [c for c in allowed if c.placement == cur.placement and c.processes == cur.processes]
            pick = self._best(same, cur, here, model, cal, m, lockstep)
            if pick is not None:
                return _prefixed(regime, pick)
        pick = self._best(allowed, cur, here, model, cal, m, lockstep)
        if pick is not None:
            return _prefixed(regime, pick)
        return self._hold(cur, f"{regime}hold {cur.label}: {here:,.0f} steps/s measured; model x{cal:.2f} "
                               f"(CPU {1e3 * model.cpu_s:.2f} ms, waiting {1e3 * model.wait_s:.2f} ms per step)")

    def _best(self, cands: list[Config], cur: Config, here: float, costs: Costs, cal: float, m: Measurement,
              lockstep: bool, force: bool = False) -> Decision | None:
        scored = []
        # Where envs wait, or results are taken first-finished (stragglers), the model is least sure: measure neighbours.
        # The model far off (stragglers, a busy host) counts as unsure too.
        unsure = costs.waiting_share > 0.3 or m.lockstep is False or not 0.7 <= cal <= 1.4
        explore = _neighbours(cur, cands) if unsure else set()
        if self._explored_processes or self._slow_moves:  # process moves cost episodes of mixed placement: one look
            explore = {c for c in explore if c.processes == cur.processes}  # per regime, none where episodes are long
        rung = self._other_rung(cur, cands, costs, m)
        drift, drift_fewer = self._drift(here, False), self._drift(here, True)
        for c in cands:
            rec = self.records.get(c)
            if rec is not None and rec.banned_until > self._i and c != cur:
                continue
            fresh = rec is not None and rec.samples and self._i - rec.seen <= self.memory
            # (score, the model's own figure without the exploration bonus, measured, configuration)
            if c == cur:
                scored.append((here, here, True, c))
            elif fresh:
                x = rec.median * (drift_fewer if _resources(c) < _resources(cur) else drift)  # type: ignore[union-attr]
                scored.append((x, x, True, c))
            elif _moves_envs(c, cur) and self._process_probes_left <= 0 and not force and (c != rung or self._rung_looked):
                continue  # process probes spent (or a cost measured before: its measurements decide); see _other_rung
            elif force or (self._probes_left > 0 and self._may_probe()):
                bonus = 1 + self.explore if c in explore else 1.0
                raw = cal * predict(c, costs, m.num_envs, m.cpus, lockstep, command_cost(m.pace_s))
                scored.append((max(bonus * raw, here * (1 + self.gain)) if c == rung else bonus * raw, raw, False, c))
        if not scored:
            return None
        top, top_raw, top_measured, top_c = max(scored, key=lambda t: t[0])
        # Near ties: within ``prefer`` of the top; and where the top is a prediction, every cheaper prediction the
        # model cannot tell from it (its own figures within ``prefer``: an exploration bonus does not make one better).
        near = [t for t in scored if t[0] >= top * (1 - self.prefer)
                or (not top_measured and not t[2] and t[1] >= top_raw * (1 - self.prefer) and _resources(t[3]) < _resources(top_c))]
        # Among near ties: even shards first in lock-step (see configs.uneven), then the fewest resources.
        score, raw, measured, best = min(near, key=lambda t: (lockstep and uneven(t[3], m.num_envs), _resources(t[3]), -t[0]))
        if best == cur:
            return None
        if not measured and not top_measured:
            score = max(score, top)  # the model's promise is the top's: the cheapest of what it cannot tell apart is measured
            raw = max(raw, top_raw)
        if _gives_up_the_worker(cur, best) and measured:
            need = here * (1 + self.gain)  # giving up the second CPU must pay (see _other_rung)
        elif _resources(best) < _resources(cur) and measured:
            need = here * (1 - self.prefer)  # fewer resources: a measured near-tie will do
        elif measured:  # more resources on the strength of another moment's record: beyond both one's scatter too
            spread = _scatter(self._visit[-6:]) + _scatter(list(self.records[best].samples))
            # More worker processes, on a record as on a prediction, must promise ``move_gain``: a record 5% above
            # moved 24 waiting envs 4p x 6t -> 6p x 4t, which measured 5,433 against 5,716 and went back (8 intervals).
            more = best.placement == cur.placement == "process" and best.processes > cur.processes
            need = here * (1 + max(self.move_gain if more else self.gain, min(MAX_SCATTER, spread)))
            if self._following:  # back at a known cost: processes follow its records (FOLLOW_DECISIONS)
                need = here * (1 + self.gain)
        else:  # a prediction must promise a gain: every move costs intervals, and one that moves envs costs episodes
            costlier = _moves_envs(best, cur) and _resources(best) > _resources(cur) and best != rung
            need = here * (1 + (self.move_gain if costlier else self.gain))
            if costlier:
                score = raw  # the model's own figure: the exploration bonus buys instant looks, not process moves (MOVE_GAIN)
        if score < need and not force:
            return None
        if not measured:
            self._look_again = False
            self._probes_left -= 1
            self._process_probes_left = max(0, self._process_probes_left - _moves_envs(best, cur))
            self._rung_looked |= best == rung
            self._explored_processes |= best.processes != cur.processes
        kind = "measured" if measured else "model"
        why = "the env is too costly to step in this process; " if force else ""
        return self._move(cur, best, m, f"{best.label}: {why}{kind} {score:,.0f} steps/s vs {here:,.0f} at {cur.label}")

    # -- helpers --------------------------------------------------------------------------
    def _forget_loaded(self, cur: Config) -> None:
        """On a quiet host, forget the records measured only on a loaded one (see :data:`FOREIGN_LOAD`): they tell what
        that moment allowed, and would keep a configuration away until the memory's decay. Their bans stay (a loss
        on a loaded host bans nothing, see ``decide``); the model may look at them once more."""
        stale = [c for c, r in self.records.items() if c != cur and r.only_loaded]
        for c in stale:
            self.records[c].forget()
        if stale:
            self._look_again = True
            self._probes_left = max(self._probes_left, 1)

    def _may_probe(self) -> bool:
        """Whether the model may send the run to a configuration it has not measured: early in a visit (see
        :data:`PROBE_WINDOW`), or once after the memory's decay."""
        return len(self._visit) <= PROBE_WINDOW or self._look_again

    def _drift(self, here: float, fewer: bool) -> float:
        """How much slower the host (or the env) is now than when other configurations' records were made, at most 1.

        Records are from other moments: if the current configuration measures below what it measured on an earlier
        visit, theirs would be lower now too. For a configuration with ``fewer`` resources (a move that must only
        not cost), a drop within this visit counts as well, so a record from before it cannot turn a slower host into
        a near tie: 24 waiting envs held 3p x 8t at 6,700-6,850 steps/s until the host slowed it to ~6,500, then
        moved to a 2p x 12t record of 6,450 (and back), ten intervals after a change of cost. A clear drop still
        sends it back to more resources (their record is not discounted by it)."""
        early = statistics.median(self._visit[: self.confirm]) if fewer and len(self._visit) > 2 * self.confirm else 0.0
        ref = max(self._prior_here or 0.0, early)
        return min(1.0, here / ref) if ref > 0 else 1.0

    def _other_rung(self, cur: Config, cands: list[Config], costs: Costs, m: Measurement) -> Config | None:
        """Inline, where the current configuration is hybrid: to be measured rather than predicted, or None.

        Between these two the model is least reliable: beside a worker the parent's steps cost more CPU
        (CartPole x8 on a slow 2-CPU host: 25 us a step in hybrid, 18 inline), so costs inferred in hybrid
        under-rate inline, and the round trip's price varies by host more than its pace does. Only where a batch
        is cheap (the round trip weighs on it; see ``RUNG_LOOK_PACES``) and moves are quick (short episodes):
        elsewhere the model's ranking is clear enough, and a look would cost whole episodes of the worse placement.
        Only this way round: a look at inline starts nothing, while one at hybrid starts a process mid-run (8
        CartPoles here: ~1.5 s at ~0.9x for a tie, and inline measured ~3% slower after the envs came back), so
        where the controller runs, cheap batches start hybrid sooner instead (``autoconf.MEASURED_ROUND_TRIP_PACES``).

        Inline is kept only where its best interval beats hybrid's by ``gain`` (elsewhere a move to fewer resources
        need only not lose): it gives up the second CPU, which hybrid gets whenever the host frees it, and holds the
        loop for the whole batch. 16 CartPoles: hybrid's median measured 1.02x and 1.12x inline's in two same-run
        sweeps, yet two intervals each kept inline as a near-tie in 2 of 3 runs, 10-20% below hybrid.

        The look is made once per env regime even where its one process probe is spent: the probe that brought the
        envs to hybrid (from processes, on the model's word) must not be what keeps the model's least reliable
        ranking unmeasured. 8 envs back to cheap after 1 ms a step (costs read in the processes: ~0.05 ms a step,
        command overhead included) went 2p x 1t -> hybrid on the model and held it at ~59k steps/s, inline never
        looked at (it had run ~81k before the costly phase); 2 runs of ~30 of the test that checks it came back.
        """
        if cur.placement != "hybrid" or self._slow_moves:
            return None
        look = RUNG_LOOK_PACES * m.pace_s if m.pace_s > 0 else RUNG_LOOK_BATCH_S
        if m.num_envs * costs.cpu_s * (1 - 1 / max(2.0, m.cpus)) > look:
            return None
        return Config.inline() if Config.inline() in cands else None

    def _allowed(self, m: Measurement) -> list[Config]:
        """Candidate configurations for this vector env (lock-step efficient, within the user's bounds)."""
        n = m.num_envs
        hi = min(self.max_workers or n, n)
        if m.fixed_workers:
            counts = [m.num_workers]
        else:
            every = efficient_counts(n, hi)
            if m.lockstep is False:  # first-finished: no critical path; even shards, doubling (each a measurable step)
                every = [p for p in every if n % p == 0 or p & (p - 1) == 0]
            counts = [p for p in every if p >= self.min_workers] or [self.min_workers]
        staying = m.placement in ("inline", "hybrid")
        fits = self.costs is None or inline_fits(self.costs, staying) or m.fixed_placement  # the user's choice stands
        here = m.inline_ok and fits and not m.fixed_workers and not m.fixed_threads
        keep = m.placement if m.fixed_placement else None
        out = [Config.inline()] if here and keep in (None, "inline") else []
        if here and keep in (None, "hybrid"):  # this process as one of the workers: at most one per CPU in all
            out.extend(Config.hybrid(p) for p in counts if 2 <= p <= max(2, int(m.cpus)))
        if keep not in (None, "process"):
            return out
        cpu_bound = self.costs is not None and self.costs.waiting_share < CPU_BOUND_SHARE
        for p in counts:
            if m.fixed_threads:
                threads = [max(1, m.threads)]
            else:
                threads = [1] if cpu_bound else efficient_threads(largest_shard(n, p), self.max_threads)
            out.extend(Config("process", p, t) for t in threads)
        return out

    def _move(self, cur: Config, to: Config, m: Measurement, why: str) -> Decision:
        self._base = (cur, statistics.median(self._visit[-6:]), self._visit_best(), _mostly(self._visit_loaded[-6:])) if self._visit else None
        self._drop_first, self._warm_x = _moves_envs(to, cur), None
        if self._drop_first:
            self._settled_in = 0
        return Decision(to.processes, f"move to {why}", threads=to.threads, placement=to.placement)

    def _hold(self, cur: Config, why: str, measured: bool = True) -> Decision:
        return Decision(cur.processes, why, measured=measured, threads=cur.threads, placement=cur.placement)


FOREIGN_LOAD = 0.5
"""CPUs of this process's cores that other processes (steal included) must keep busy in an interval for it to count
as measured on a loaded host (:class:`aiovec.hostload.HostLoad`). Such intervals still count against each other, but
a move they decide is checked once the host is quiet: a loss measured loaded bans nothing, a configuration that
lost while loaded to one measured quiet is measured again, and records measured only loaded are forgotten when the
host turns quiet. A busy process beside CartPole x16 for the first 1.2 s of a run: hybrid measured 13-40k steps/s
(alone 165-185k), a look at inline measured 141-145k once the process had ended, and 6 of 6 runs stayed inline
(0.8x) until the memory's decay."""

LOCKSTEP_MIN_AWAITING = 0.05
"""In lock-step, the least share of an interval the caller must spend inside ``step()`` for the interval to be
measured: below it the caller was doing something else (a learner update), and the few steps it took say little.
Above it the interval is rated per second in ``step()`` (:attr:`~aiovec.controller.Measurement.stepping_rate`), so
a caller with work of its own between steps is tuned too. Rated per second of the whole interval and skipped below
half, 24 envs waiting 3 ms behind a caller that awaited 8 ms of its own I/O after each step (in ``step()`` ~35% of
the time) were never measured while they waited; when they turned to computing 1 ms a step there was no reading to
see the change against, and the run held 4p x 6t (threads queueing for the GIL read as waiting) where 2p x 1t stepped
them 8% faster (the caller's whole loop: 5%). Rated per second in ``step()``, the change was read on its first
interval and 2p x 1t chosen on the third."""

MAX_SCATTER = 0.15
"""The most a costlier move's intervals' scatter raises the gain it must show (see :func:`_scatter`)."""


def _mostly(loaded: list[bool]) -> bool:
    """Whether most of a visit's intervals were measured on a loaded host. One is not enough: the reading runs high
    around a move (exiting workers count as other processes), and in the controller benchmark one such interval
    before a move sent the change of cost back to the setting it had left, to measure it again (one move more)."""
    return 2 * sum(loaded) > len(loaded)


def _scatter(xs: list[float]) -> float:
    """How far a visit's intervals lie apart, relative to their median: ``(max - min) / median`` (0 for one)."""
    if len(xs) < 2:
        return 0.0
    mid = statistics.median(xs)
    return (max(xs) - min(xs)) / mid if mid > 0 else 0.0


def _inner_scatter(xs: list[float]) -> float:
    """:func:`_scatter` of a visit's intervals without the one furthest from their median, where there are three or
    more: the bar a move to more resources must clear by its median of three, which ignores one interval out of line,
    ignores it too. 40 envs of 0.05 ms CPU and 1 ms waiting went 4p x 5t -> 4p x 10t (a threads move: its first interval
    still runs commands sent before it) and read 9,886, 11,788 and 10,769 steps/s against 9,530 before it; the three lay
    18% apart, which raised the bar to +15%, and the +13% was reverted (0.80x the best static in that run). The two
    nearest their median lie 8% apart."""
    if len(xs) < 3:
        return _scatter(xs)
    mid = statistics.median(xs)
    rest = list(xs)
    rest.remove(max(xs, key=lambda x: abs(x - mid)))
    return (max(rest) - min(rest)) / mid if mid > 0 else 0.0


PROBE_WINDOW = 6
"""Intervals of a visit within which the model may probe a configuration nobody measured (a visit's first decision
comes after ``confirm`` intervals, later ones while the intervals disagree). Later in a long hold the smoothed costs
and the median wander with the host, and a neighbour's promise crosses its bar by drift alone: 24 waiting envs held
4p x 6t for 8 intervals at ~5,880 steps/s, then probed 3p x 8t at the +12% a move to more processes must promise,
and 40 envs of 0.05 ms CPU and 1 ms waiting held 4p x 10t for 15 intervals, then probed 4p x 5t at +8%; both
measured worse and came back (``python -m aiovec.bench controller``: settling in 12 and 17 intervals, not 10). Each
arrival (a move, a revert, a change of the env's cost) opens a new visit, so a look around follows every change."""

EXTRA_SAMPLES = 1
"""Intervals a visit adds to ``confirm`` where its intervals disagree (see ``MeasuredController._disagree``): with
three, the median no longer counts one bad interval at all."""

RUNG_LOOK_BATCH_S = 200e-6
"""Up to this much env CPU a batch moves off this process in hybrid (``n * t * (1 - 1/cpus)``), inline and hybrid
are both measured (see ``MeasuredController._other_rung``), where the host's pace is unknown (see ``RUNG_LOOK_PACES``)."""

RUNG_LOOK_PACES = 20.0
"""The same bound in units of the host's interpreter pace (:func:`aiovec.autoconf.python_pace`), about two commands
to a worker (``costmodel.COMMAND_PACES``): inline and hybrid tie near one command's worth (CartPole x8-x16 on
these VMs). Beyond two a look at inline only costs: HalfCheetah-v5 x8 (~180 us moved off a batch, 25 paces of
7.2 us) measured 20k steps/s inline against 29k hybrid, and the look held inline for ~1.5 s."""


def inline_fits(costs: Costs, staying: bool = False) -> bool:
    """Whether envs of this cost may step in this process: short steps (the loop-hold limit), mostly CPU.

    ``staying``: the envs already step here (inline or hybrid), so the higher ``INLINE_LEAVE_S`` applies.
    """
    limit = INLINE_LEAVE_S if staying else INLINE_ENTER_S
    return costs.cpu_s + costs.wait_s <= limit and costs.waiting_share <= 0.5


START_BAND = 0.97
""":func:`plan_start` takes the fewest processes among the configurations the model rates within this share of its
best: a guess, which the controller measures and corrects with threads at once and processes later. Between
configurations of the same concurrency the model errs by more than 1% here: 64 envs waiting 5 ms, with a probe of
60-100 us CPU a step, rated 16 processes x 4 threads within 1% of 8 x 8; 8 x 8 measured 6% faster in the static grid
(2 of 3 benchmark runs started at 16 and moved a second later)."""


def plan_start(num_envs: int, cpu_s: float, wall_s: float, cpus: float, workers: int, max_threads: int = 32,
               pace_s: float = 0.0) -> tuple[int, int]:
    """Processes and threads per process to start envs of this probed cost with, ``(workers, threads)``.

    Envs that mostly wait: the configuration the cost model rates best (the fewest processes, then
    threads, within :data:`START_BAND` of the top; lock-step efficient counts only, at most a quarter of the envs or
    one per core as processes), which the controller then measures. Other envs: ``workers`` (one per core at most)
    with one thread. ``pace_s``: the host's interpreter pace (:func:`~aiovec.autoconf.python_pace`; 0: unknown), which
    prices a command to a worker process as the controller prices it later (:func:`~aiovec.costmodel.command_cost`).

    >>> plan_start(48, 1e-3, 11e-3, 2, 2)   # 1 ms CPU + 10 ms waiting: the GIL of 2 processes would bind
    (4, 6)
    >>> plan_start(64, 20e-6, 5e-3, 2, 2)   # nearly pure waiting: threads, few processes, even shards
    (4, 16)
    >>> plan_start(64, 100e-6, 5.1e-3, 2, 2, pace_s=6e-6)   # a probe's CPU, a command at this VM's price
    (8, 8)
    >>> plan_start(8, 1e-3, 1e-3, 2, 2)
    (2, 1)
    """
    wait = max(0.0, wall_s - cpu_s)
    if wall_s <= 0 or wait <= 0.5 * wall_s:
        return workers, 1
    costs = Costs(cpu_s, wait, 20e-6)
    command = command_cost(pace_s)
    # Threads are the cheap knob for waiting envs (a process is ~40 MB and starts slowly): start with at most a
    # quarter of the envs as processes (or one per core); the controller adds more where measurement says so.
    # (A probe's CPU per step runs high, cold, which would otherwise favour processes over threads.)
    cap = max(int(cpus), num_envs // 4, 1)
    cands = [Config("process", p, t) for p in efficient_counts(num_envs, cap) for t in efficient_threads(largest_shard(num_envs, p), max_threads)]
    rated = [(predict(c, costs, num_envs, cpus, command=command), c) for c in cands]
    top = max(x for x, _ in rated)
    # a guess before any measurement: near the top, even shards first (see configs.uneven), then the fewest resources
    best = min((c for x, c in rated if x >= START_BAND * top), key=lambda c: (uneven(c, num_envs), _resources(c)))
    return best.processes, best.threads


def _neighbours(cur: Config, cands: list[Config]) -> set[Config]:
    """The next process counts up and down with about the same concurrency, and the next threads up and down.

    Where envs wait, processes and threads trade against each other in ways the model cannot
    see (GIL hand-overs, wake-ups): these are measured rather than predicted.
    """
    if cur.placement != "process":
        return set()
    procs = sorted({c.processes for c in cands if c.placement == "process"})
    out: set[Config] = set()
    same = sorted(c.threads for c in cands if c.placement == "process" and c.processes == cur.processes)
    k = same.index(cur.threads) if cur.threads in same else -1
    if k >= 0:
        out.update(Config("process", cur.processes, t) for t in same[max(0, k - 1): k + 2] if t != cur.threads)
    i = procs.index(cur.processes) if cur.processes in procs else -1
    for p in (procs[i - 1] if i > 0 else None, procs[i + 1] if 0 <= i < len(procs) - 1 else None):
        if p is None:
            continue
        ts = sorted(c.threads for c in cands if c.placement == "process" and c.processes == p)
        want = cur.processes * cur.threads / p
        out.add(Config("process", p, min(ts, key=lambda t: (abs(t - want), t))))
    return out


def _moves_envs(a: Config, b: Config) -> bool:
    """Whether going between two configurations moves envs (another process count or placement: episodes of mixed
    placement, process starts), unlike a change of threads, which is instant."""
    return a.processes != b.processes or a.placement != b.placement


def _gives_up_the_worker(a: Config, b: Config) -> bool:
    """Whether going from ``a`` to ``b`` is hybrid to inline: the second CPU given up, the loop held for the whole
    batch (such a move must measure better by ``gain``, see ``MeasuredController._other_rung``)."""
    return a.placement == "hybrid" and b.placement == "inline"


def _resources(c: Config) -> tuple[int, int]:
    """What a configuration costs the machine: processes first (memory, start-up), then threads; inline least."""
    if c.placement == "hybrid":
        return (c.processes - 1, c.threads)
    return (0, 0) if c.placement == "inline" else (c.processes, c.threads)


def _prefixed(regime: str, d: Decision) -> Decision:
    """``d`` with the news of a change of cost (``regime``, "" when none) before its reason."""
    return dataclasses.replace(d, reason=regime + d.reason) if regime else d


def _cpu_moved(a: float, b: float, factor: float = 2.0) -> bool:
    """A change of per-step CPU that no change of configuration explains (thread hand-overs, contention): x2 and 100 us."""
    return abs(a - b) > 100e-6 and max(a, b) > factor * max(min(a, b), 1e-9)


def _waits_appeared(cur: Config, old: Costs, new: Costs) -> bool:
    """Whether envs that computed on one thread per process began to wait (see :data:`WAITS_APPEAR`)."""
    return (cur.placement == "process" and cur.threads == 1 and old.waiting_share < CPU_BOUND_SHARE
            and new.waiting_share >= WAITS_APPEAR and new.wait_s >= 100e-6)


CPU_CHANGE_SHARE = 0.05
"""A move of the CPU per step counts toward a change of the env's cost only beyond this share of the whole step (CPU
plus waiting; and beyond 20 us). Where envs mostly wait, their CPU is tens of microseconds (thread hand-overs
included) and moves by 1.5-1.8x with the host's speed: 4 of ~300 adaptive runs in the benchmark's and the demo's
histories took such a move for a new cost (24 envs waiting 3 ms: CPU 0.12 -> 0.07 ms a step), forgot their records
and probed again, one settling in 15 intervals instead of 1. Every real change there moves the CPU by 20% of a step
or more (waiting 3 ms -> computing 1 ms: 0.08 -> 0.81 ms), and a cost that changes in its waiting changes the total."""


def _changed(a: Costs, b: Costs, factor: float) -> bool:
    """Whether per-step cost moved by more than ``factor`` (and more than noise: 20 us, and for the CPU part
    :data:`CPU_CHANGE_SHARE` of the step) in CPU or in total."""
    def moved(x: float, y: float, floor: float = 20e-6) -> bool:
        return abs(x - y) > floor and max(x, y) > factor * max(min(x, y), 1e-9)

    step = max(a.cpu_s + a.wait_s, b.cpu_s + b.wait_s)
    return moved(a.cpu_s, b.cpu_s, max(20e-6, CPU_CHANGE_SHARE * step)) or moved(a.cpu_s + a.wait_s, b.cpu_s + b.wait_s)
