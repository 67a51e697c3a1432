"""How long aiovec holds the event loop while it steps envs in this process.

While aiovec steps CartPole x8 and x64 inline, x64 hybrid (one shard here, one in a
worker process), and x8 in one worker process (the parent polls for replies that are due,
``WorkerPool.poll_replies``), in a lock-step loop and in a first-finished ``send``/``recv`` rollout
loop, a side task yields with ``await asyncio.sleep(0)`` and records the gaps between its
turns (:class:`.gaps.TurnGaps`). Target: p99 gap <= 1 ms, and the side task keeps getting
turns beside the rollout loop.
"""

from __future__ import annotations

import time
from typing import Any

import aiovec

from .aiovec_options import inline
from .gaps import TurnGaps
from .peers import _actions, env_fns


async def _case(env_id: str, n: int, mode: str, duration: float, options: dict) -> dict[str, Any]:
    async with aiovec.AsyncVecEnv(env_fns(env_id, n, {}), **options) as venv:
        await venv.reset(seed=0)
        acts = _actions(venv.single_action_space, n)
        steps, k = 0, 0
        async with TurnGaps() as gaps:
            end = time.perf_counter() + duration
            if mode == "step":
                while time.perf_counter() < end:
                    await venv.step(acts[k % len(acts)])
                    steps, k = steps + n, k + 1
            else:
                venv.send(acts[0])
                while time.perf_counter() < end:
                    r = await venv.recv(max(1, n // 2))
                    venv.send(acts[k % len(acts)][: len(r.env_ids)], r.env_ids)
                    steps, k = steps + len(r.env_ids), k + 1
                await venv.drain()
        elapsed = gaps.summary()["span_s"] or duration
        where = options.get("placement", "defaults")
        return {"name": f"CartPole-v1 x{n} {where}, {'lock-step step()' if mode == 'step' else f'send/recv({max(1, n // 2)})'}",
                "num_envs": n, "mode": mode, "steps_per_s": steps / elapsed, "workers": venv.num_workers, "gaps": gaps.summary()}


async def _all(duration: float) -> list[dict[str, Any]]:
    hybrid = {"placement": "hybrid", "num_workers": 2}
    one_process = {"placement": "process", "num_workers": 1}
    plan = [(n, inline()) for n in (8, 64)] + [(64, hybrid), (8, one_process)]
    return [await _case("CartPole-v1", n, mode, duration, options) for n, options in plan for mode in ("step", "recv")]


def main(quick: bool = False) -> dict[str, Any]:
    cases = aiovec.run(_all(0.5 if quick else 1.5))
    return {"options": "in-process stepping",
            "cases": cases, "side_task_kept_running": all(c["gaps"]["turns"] > 100 for c in cases)}


if __name__ == "__main__":
    import json

    print(json.dumps(main(), indent=1))
