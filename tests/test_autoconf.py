"""The start of ``"auto"``: the probe of env 0's step cost, and the placement it leads to."""

from __future__ import annotations

import time

import gymnasium as gym
import numpy as np

from aiovec.autoconf import (
    MEASURED_ROUND_TRIP_PACES,
    ROUND_TRIP_PACES,
    ROUND_TRIP_S,
    StepCost,
    choose_placement,
    probe_step_cost,
    python_pace,
)


class ColdStart(gym.Env):
    """Its first 12 steps are slow (lazy imports, cold caches), then each costs ~0.1 ms of CPU."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self) -> None:
        self.steps = 0

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        return np.zeros(1, np.float32), {}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict]:
        self.steps += 1
        end = time.perf_counter() + (2e-3 if self.steps <= 12 else 1e-4)
        while time.perf_counter() < end:
            pass
        return np.zeros(1, np.float32), 0.0, False, False, {}


def test_probe_reads_the_steady_cost_not_the_cold_first_steps() -> None:
    cost = probe_step_cost(ColdStart())
    assert cost is not None and cost.wall_s < 1e-3 and cost.cpu_s < 1e-3, cost  # its first 12 steps took 2 ms each
    assert cost.waiting_share < 0.5, cost


def test_placement_rule() -> None:
    cheap = StepCost(cpu_s=6e-6, wall_s=6e-6)  # CartPole
    assert choose_placement(8, cheap, 2, 1e-3) == "inline"
    assert choose_placement(64, cheap, 2, 1e-3) == "hybrid"
    assert choose_placement(64, cheap, 1, 1e-3) == "inline"  # one CPU: nothing to share the work with
    n = int(2 * ROUND_TRIP_S / cheap.wall_s)  # where n t (1 - 1/2) crosses the round trip
    assert choose_placement(n - 1, cheap, 2, 1e-3) == "inline" and choose_placement(n + 2, cheap, 2, 1e-3) == "hybrid"
    assert choose_placement(64, StepCost(cpu_s=20e-6, wall_s=2e-3), 2, 1e-3) == "process"  # mostly waiting
    assert choose_placement(64, cheap, 2, 1.0) == "process"  # slow to build
    assert choose_placement(8, StepCost(cpu_s=1e-3, wall_s=1e-3), 2, 1e-3) == "process"  # one step would hold the loop 1 ms
    pong_slow_phase = StepCost(cpu_s=0.52e-3, wall_s=0.52e-3)  # Pong (0.35 ms) probed in a slow phase of the host
    assert choose_placement(8, pong_slow_phase, 2, 0.1) == "hybrid"
    assert choose_placement(8, StepCost(cpu_s=0.7e-3, wall_s=0.7e-3), 2, 0.1) == "process"  # above the entry limit
    straggler = StepCost(cpu_s=0.5e-3, wall_s=0.5e-3, mean_wall_s=0.67e-3)  # 90% of steps 0.5 ms, 10% 5 ms; 4% probed
    assert choose_placement(8, straggler, 2, 0.1) == "process"


def test_the_round_trip_is_weighed_in_the_hosts_pace() -> None:
    """The same CartPole on a host twice as slow: its step and the round trip both double, so the choice stays."""
    fast = StepCost(cpu_s=6e-6, wall_s=6e-6, pace_s=4.5e-6)
    slow = StepCost(cpu_s=12e-6, wall_s=12e-6, pace_s=9e-6)
    for n in (4, 8, 12, 16, 24, 32, 64):
        assert choose_placement(n, fast, 2, 1e-3) == choose_placement(n, slow, 2, 1e-3), n
    n = int(2 * ROUND_TRIP_PACES * slow.pace_s / slow.wall_s)  # where n t (1 - 1/2) crosses the round trip
    assert choose_placement(n - 1, slow, 2, 1e-3) == "inline" and choose_placement(n + 2, slow, 2, 1e-3) == "hybrid"
    # A fixed 50 us round trip would have put the slow host's 8 CartPoles in hybrid (8 x 12 / 2 = 48 us is at it).
    assert choose_placement(9, StepCost(12e-6, 12e-6), 2, 1e-3) == "hybrid" and choose_placement(9, slow, 2, 1e-3) == "inline"


def test_where_the_controller_measures_both_rungs_a_cheap_batch_starts_hybrid_sooner() -> None:
    """With the adaptive controller, inline's bound is the lower MEASURED_ROUND_TRIP_PACES: a hybrid start that
    loses costs a look at inline (nothing started), an inline start that loses a process started mid-run. On this
    VM (pace 7.2 us, CartPole 6 us a step) 16 CartPoles start hybrid (1.27x inline here), 8 still inline (a tie)."""
    assert MEASURED_ROUND_TRIP_PACES < ROUND_TRIP_PACES
    here = StepCost(cpu_s=6e-6, wall_s=6e-6, pace_s=7.2e-6)
    # PPO's wrapped CartPole in a fresh process (~8 us a step, pace 6 us: 5.3 paces for 8): inline, which a training
    # loop keeps (it asks for steps too rarely for the controller's look at inline to come).
    assert choose_placement(8, StepCost(cpu_s=8e-6, wall_s=8e-6, pace_s=6e-6), 2, 1e-3, measured=True) == "inline"
    assert choose_placement(16, here, 2, 1e-3, measured=True) == "hybrid" and choose_placement(16, here, 2, 1e-3) == "inline"
    assert choose_placement(8, here, 2, 1e-3, measured=True) == "inline"
    n = int(2 * MEASURED_ROUND_TRIP_PACES * here.pace_s / here.wall_s)
    assert choose_placement(n - 1, here, 2, 1e-3, measured=True) == "inline" and choose_placement(n + 2, here, 2, 1e-3, measured=True) == "hybrid"
    # The pace unknown: the fixed figure, as without the controller.
    assert choose_placement(16, StepCost(6e-6, 6e-6), 2, 1e-3, measured=True) == choose_placement(16, StepCost(6e-6, 6e-6), 2, 1e-3)


def test_the_probe_measures_the_pace() -> None:
    cost = probe_step_cost(gym.make("CartPole-v1"))
    assert cost is not None and cost.pace_s is not None and 0 < cost.pace_s < 1e-3, cost
    assert 0 < python_pace(3) < 1e-3
