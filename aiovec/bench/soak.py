"""``python -m aiovec.bench.soak [--minutes M]``: stepping under injected crashes, with full accounting.

Envs are ``aiovec/Fault-v0`` with a tag: ``obs[0]`` names the env and ``obs[1]`` counts
steps within the episode, so every received row can be checked for its env and its
place in the episode. Workers die at a fixed rate (SIGKILL, ``os._exit``, segfault);
restarts are enabled. Per env it counts transitions sent and received and reports
lost, duplicated and misattributed ones, hangs (a ``recv`` that outlives 30 s), leaked
processes and parent RSS.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import signal
import time
from typing import Any

import gymnasium as gym
import numpy as np

import aiovec
from aiovec.pool import _rss_mb

FAULT_KINDS = ("sigkill", "exit", "segfault")


def _env(i: int, fault: str, rate: float, episode_len: int = 50) -> gym.Env:
    return gym.make("aiovec/Fault-v0", fault=fault, rate=rate, tag=float(i), episode_len=episode_len, cpu_ms=0.05)


def _children() -> set[int]:
    out = set()
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                if int(fields[1]) == os.getpid() and fields[0] != "Z":
                    with open(f"/proc/{pid}/cmdline", "rb") as f:
                        cmd = f.read()
                    if b"forkserver" not in cmd and b"resource_tracker" not in cmd:
                        out.add(int(pid))
            except (OSError, IndexError, ValueError):
                pass
    return out


def _mapped_shm_entries() -> int:
    """/dev/shm entries this process still maps after closing (machine-wide counts would include others')."""
    try:
        with open("/proc/self/maps") as f:
            # unlinked heap arenas ("... (deleted)") have no name in /dev/shm: not a leak
            return len({line.split()[-1] for line in f if "/dev/shm/" in line and not line.rstrip().endswith("(deleted)")})
    except OSError:
        return 0


async def soak(seconds: float, num_envs: int = 8, num_workers: int = 4, fault_rate: float = 2e-4) -> dict[str, Any]:
    fns = [functools.partial(_env, i, FAULT_KINDS[i % len(FAULT_KINDS)], fault_rate) for i in range(num_envs)]
    sent = np.zeros(num_envs, dtype=np.int64)
    received = np.zeros(num_envs, dtype=np.int64)
    outstanding = np.zeros(num_envs, dtype=np.int64)
    duplicated = misattributed = hangs = bad_sequence = 0
    last_step = np.zeros(num_envs)
    rss0 = _rss_mb(os.getpid())
    before = _children()
    t0 = time.perf_counter()
    venv = aiovec.AsyncVecEnv(fns, num_workers=num_workers, max_restarts=10**6, restart_backoff=0.0)
    async with venv:
        obs, _ = await venv.reset(seed=0)
        last_step[:] = obs[:, 1]
        venv.send(np.zeros(num_envs, dtype=np.int64))
        sent += 1
        outstanding += 1
        while time.perf_counter() - t0 < seconds:
            try:
                r = await asyncio.wait_for(venv.recv(max(1, num_envs // 2)), 30)
            except asyncio.TimeoutError:
                hangs += 1
                break
            for row, i in enumerate(r.env_ids.tolist()):
                received[i] += 1
                if outstanding[i] != 1:
                    duplicated += 1
                outstanding[i] -= 1
                if r.obs[row, 0] != i:
                    misattributed += 1
                restarted = bool(r.infos.get("_worker_restarted", np.zeros(len(r.env_ids), bool))[row])
                step = r.obs[row, 1]
                # within an episode the counter grows by one; after an end or a restart it restarts at 0
                if not restarted and step != last_step[i] + 1 and step != 0:
                    bad_sequence += 1
                last_step[i] = -1 if restarted else step
            venv.send(np.zeros(len(r.env_ids), dtype=np.int64), r.env_ids)
            sent[r.env_ids] += 1
            outstanding[r.env_ids] += 1
        for r in await asyncio.wait_for(venv.drain(), 60):
            received[r.env_ids] += 1
            outstanding[r.env_ids] -= 1
        stats = venv.stats()
    await asyncio.sleep(0.5)
    leaked = _children() - before
    return {
        "seconds": time.perf_counter() - t0, "num_envs": num_envs, "num_workers": num_workers, "fault_rate_per_step": fault_rate,
        "transitions_sent": int(sent.sum()), "transitions_received": int(received.sum()),
        "lost": int((sent - received).clip(min=0).sum()), "duplicated": duplicated, "misattributed": misattributed,
        "out_of_sequence": bad_sequence, "hangs": hangs, "faults_survived": stats["restarts"],
        "leaked_processes": len(leaked), "parent_rss_mb_start": round(rss0, 1),
        "parent_rss_mb_end": round(_rss_mb(os.getpid()), 1),
    }


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(prog="python -m aiovec.bench.soak", description=__doc__.split("\n")[0])
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--envs", type=int, default=8)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--fault-rate", type=float, default=2e-4, help="probability per env step that the env kills its worker")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    report = aiovec.run(soak(args.minutes * 60, args.envs, args.workers, args.fault_rate))
    report["shm_entries_still_mapped"] = _mapped_shm_entries()
    print(json.dumps(report, indent=1))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)
    return report


if __name__ == "__main__":
    main()


def _worker_pids(venv: aiovec.AsyncVecEnv) -> list[int]:
    return [w["pid"] for w in venv.stats().get("workers", []) if w.get("pid")]


class _Ledger:
    """Checks every lock-step row: its env (``obs[0]``), its place in the episode (``obs[1]``), restarts."""

    def __init__(self, n: int, first_obs: np.ndarray) -> None:
        self.n = n
        self.last = first_obs[:, 1].copy()
        self.done = np.zeros(n, bool)
        self.counts = {"steps": 0, "transitions_sent": 0, "transitions_received": 0, "lost": 0, "duplicated": 0,
                       "misattributed": 0, "out_of_sequence": 0, "restarted_rows": 0,
                       "ended_twice": 0}

    def sent(self) -> None:
        self.counts["steps"] += 1
        self.counts["transitions_sent"] += self.n

    def check(self, obs: np.ndarray, terms: np.ndarray, truncs: np.ndarray, infos: dict) -> None:
        c = self.counts
        c["transitions_received"] += len(obs)
        c["duplicated"] += max(0, len(obs) - self.n)
        c["misattributed"] += int((obs[:, 0] != np.arange(len(obs))).sum())
        restarted = np.asarray(infos.get("worker_restarted", np.zeros(len(obs), bool)), bool) & \
            np.asarray(infos.get("_worker_restarted", np.ones(len(obs), bool)), bool)
        step = obs[:, 1]
        # a restarted row is the episode's truncation with the last delivered observation; after any end (NEXT_STEP)
        # the next row is the reset (step 0), even where a restart came between; otherwise the counter grows by one
        expected = np.where(restarted, self.last, np.where(self.done, 0, self.last + 1))
        bad = (step != expected) | (restarted & ~truncs)
        c["ended_twice"] += int((restarted & self.done).sum())  # a zero-length episode: an ended one cut again
        c["out_of_sequence"] += int(bad.sum())
        c["restarted_rows"] += int(restarted.sum())
        self.last = step.copy()
        self.done = np.asarray(terms | truncs | restarted, bool)


KILL_MODES = ("idle", "mid_step", "both")


async def idle_kill_soak(seconds: float, kill: str = "both", num_envs: int = 8, num_workers: int = 4, pause_s: float = 0.02,
                         kill_every: int = 10, timeout_s: float = 30.0) -> dict[str, Any]:
    """Lock-step stepping with the caller pausing between steps (a learner's update), and workers SIGKILLed.

    Every ``kill_every`` steps a worker is killed: while the envs are idle (``kill="idle"``: inside
    the pause, which is then waited out so the parent sees the death before the next step),
    mid-step (``"mid_step"``: right after the step's commands left), or alternately (``"both"``).
    Restarts are on. Every await is bounded by
    ``timeout_s`` (a timeout counts as a hang and ends the run); an exception from ``step`` is
    counted by type and ends the run (after one, the vector env's state cannot be trusted).
    """
    # Episodes shorter than the gap between kills of one worker's envs, so kills land on reset rows too.
    fns = [functools.partial(_env, i, "raise", 0.0, episode_len=8) for i in range(num_envs)]
    before = _children()
    t0 = time.perf_counter()
    hangs, kills = 0, {"idle": 0, "mid_step": 0, "mid_step_landed_in_flight": 0}
    errors: dict[str, int] = {}
    first_error = ""
    zeros = np.zeros(num_envs, dtype=np.int64)
    rng = np.random.default_rng(0)
    venv = aiovec.AsyncVecEnv(fns, num_workers=num_workers, max_restarts=10**6, restart_backoff=0.0)
    ledger: _Ledger | None = None
    try:
        async with venv:
            obs, _ = await asyncio.wait_for(venv.reset(seed=0), timeout_s)
            ledger = _Ledger(num_envs, obs)
            k = 0
            while time.perf_counter() - t0 < seconds:
                k += 1
                kill_now = k % kill_every == 0
                mid_step = kill_now and (kill == "mid_step" or (kill == "both" and (k // kill_every) % 2 == 0))
                pids = _worker_pids(venv) if kill_now else []
                ledger.sent()
                task = asyncio.ensure_future(venv.step(zeros))
                if mid_step and pids:
                    await asyncio.sleep(0)  # the step's commands are on their way
                    kills["mid_step_landed_in_flight"] += not task.done()
                    os.kill(int(rng.choice(pids)), signal.SIGKILL)
                    kills["mid_step"] += 1
                try:
                    obs, _, terms, truncs, infos = await asyncio.wait_for(task, timeout_s)
                except asyncio.TimeoutError:
                    hangs += 1
                    break
                except Exception as exc:
                    errors[type(exc).__name__] = errors.get(type(exc).__name__, 0) + 1
                    first_error = first_error or f"step {k}: {type(exc).__name__}: {exc}"
                    break
                ledger.check(obs, terms, truncs, infos)
                if kill_now and not mid_step and pids:
                    os.kill(int(rng.choice(pids)), signal.SIGKILL)
                    kills["idle"] += 1
                await asyncio.sleep(pause_s * (10 if kill_now and not mid_step else 1))
            stats = venv.stats()
    except asyncio.TimeoutError:  # a close or reset that never finished
        hangs += 1
        stats = {}
    await asyncio.sleep(0.5)
    counts = dict(ledger.counts) if ledger else {}
    if counts:  # a step that raised or hung returned no rows: those transitions are lost
        counts["lost"] = counts["transitions_sent"] - counts["transitions_received"]
    return {"kill": kill, "seconds": round(time.perf_counter() - t0, 1), "num_envs": num_envs, "num_workers": num_workers, "pause_s": pause_s,
            **counts, "kills_idle": kills["idle"], "kills_mid_step": kills["mid_step"],
            "mid_step_kills_in_flight": kills["mid_step_landed_in_flight"], "restarts": stats.get("restarts", 0),
            "hangs": hangs, "errors": sum(errors.values()), "error_types": errors, "first_error": first_error,
            "leaked_processes": len(_children() - before)}


SUMMED = ("steps", "transitions_sent", "transitions_received", "lost", "duplicated", "misattributed", "out_of_sequence",
          "ended_twice", "restarted_rows", "kills_idle", "kills_mid_step", "mid_step_kills_in_flight", "restarts", "hangs", "errors",
          "leaked_processes")


def kill_phases(seconds: float, timeout_s: float = 10.0, **kwargs: Any) -> dict[str, Any]:
    """Mid-step kills, then idle-time kills, ``seconds / 2`` each, each on its own loop; totals and each phase."""
    phases = [aiovec.run(idle_kill_soak(seconds / 2, kill, timeout_s=timeout_s, **kwargs)) for kill in ("mid_step", "idle")]
    total = {k: sum(p.get(k, 0) for p in phases) for k in SUMMED}
    return {"seconds": round(sum(p["seconds"] for p in phases), 1), **total, "phases": phases}
