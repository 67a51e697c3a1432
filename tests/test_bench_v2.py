"""The v2 benchmark: the floor steps exactly like gymnasium, and the CLI's smoke run reports every figure, consistently."""

from __future__ import annotations

import json
import math
import statistics
import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest

import aiovec
from aiovec.bench.floor import FloorVecEnv
from aiovec.bench.peers import env_fns
from aiovec.machine import available_cpus


def test_floor_steps_like_sync_vector_env() -> None:
    """Same seeds, same actions: the floor's 2 workers give SyncVectorEnv's rows (NEXT_STEP autoreset included)."""
    n, steps = 6, 60  # CartPole episodes end well within 60 random steps: autoresets are exercised
    sync = gym.vector.SyncVectorEnv(env_fns("CartPole-v1", n, {}))
    obs_sync, _ = sync.reset(seed=0)
    acts = np.random.default_rng(0).integers(0, 2, (steps, n))

    async def floor_rows() -> list[tuple[np.ndarray, ...]]:
        venv = FloorVecEnv("CartPole-v1", n, {}, num_workers=2, seed=0)
        try:
            await venv.start()
            return [await venv.step(a) for a in acts]
        finally:
            venv.close()

    rows = aiovec.run(floor_rows())
    ends = 0
    for a, (obs, rew, term, trunc) in zip(acts, rows, strict=True):
        s_obs, s_rew, s_term, s_trunc, _ = sync.step(a)
        np.testing.assert_array_equal(obs, s_obs)
        np.testing.assert_array_equal(rew, s_rew)
        np.testing.assert_array_equal(term, s_term)
        np.testing.assert_array_equal(trunc, s_trunc)
        ends += int(term.sum() + trunc.sum())
    sync.close()
    assert ends > 0


@pytest.mark.slow
def test_v2_cli_smoke_run(tmp_path) -> None:
    out = tmp_path / "v2.json"
    proc = subprocess.run([sys.executable, "-m", "aiovec.bench", "v2", "--quick", "--only", "CartPole-v1 x8", "--repeats", "1",
                           "--duration", "0.2", "--out", str(out)], capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(out.read_text())
    assert list(r["workloads"]) == ["CartPole-v1 x8"]
    w = r["workloads"]["CartPole-v1 x8"]
    expected = {"gym_sync", "gym_async", "aiovec", "aiovec_process", "floor_1", "floor_2", "cores"} | ({"envpool"} if r["envpool"] else set())
    assert expected <= set(w["steps_per_s"])
    for name, xs in w["steps_per_s"].items():
        assert len(xs) == 1 and all(math.isfinite(x) and x > 0 for x in xs), (name, xs)
    s, q = w["steps_per_s"], w["ratios"]
    best = w["floor_best_workers"]
    assert s[f"floor_{best}"][0] == max(s["floor_1"][0], s["floor_2"][0])
    assert q["aiovec/gym_sync"][0] == pytest.approx(s["aiovec"][0] / s["gym_sync"][0])
    assert q["aiovec/floor"][0] == pytest.approx(s["aiovec"][0] / s[f"floor_{best}"][0])
    assert q["aiovec/limit"][0] == pytest.approx(s["aiovec"][0] / w["limit_steps_per_s"][0])
    assert q["aiovec_process/floor_1"][0] == pytest.approx(s["aiovec_process"][0] / s["floor_1"][0])
    assert q["cores/limit"][0] == pytest.approx(s["cores"][0] / w["limit_steps_per_s"][0])
    assert q["aiovec/cores"][0] == pytest.approx(s["aiovec"][0] / s["cores"][0])
    assert w["aiovec_workers"][0] >= 0
    assert w["limit_steps_per_s"][0] == pytest.approx(min(8, available_cpus()) / w["step_time_s"][0])
    assert "| CartPole-v1 x8 |" in r["table"] and "| CartPole-v1 x8 |" in proc.stdout
    targets = {t["target"]: t for t in r["targets"]}
    t = targets["CartPole-v1 x8 defaults / SyncVectorEnv >= 1.0"]
    assert t["value"] == pytest.approx(statistics.median(q["aiovec/gym_sync"])) and t["holds"] == (t["value"] >= 1.0)
    assert not {"loophold", "stall", "soak"} & set(r)  # --only a workload runs that workload alone
