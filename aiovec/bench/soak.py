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
import time
from typing import Any

import gymnasium as gym
import numpy as np

import aiovec
from aiovec.pool import _rss_mb

FAULT_KINDS = ("sigkill", "exit", "segfault")


def _env(i: int, fault: str, rate: float) -> gym.Env:
    return gym.make("aiovec/Fault-v0", fault=fault, rate=rate, tag=float(i), episode_len=50, cpu_ms=0.05)


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
