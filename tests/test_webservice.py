"""examples/webservice.py: real HTTP against the app on an ephemeral port while rollouts step at full speed.

Measures request latency (p50/p99) and event-loop lag (how late a 5 ms timer fires) under load and
prints them (also to /tmp/aiovec_webservice_load_<loop>.json); asserts only correctness: every request
answered with sensible JSON, steps increasing, stop leaves no worker process, cleanup stops the rest.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import assert_clean, load_example, pid_gone, wait

ROOT = Path(__file__).resolve().parents[1]
LOAD_S = 4.0  # how long the saturating GET storm lasts
CLIENTS = 16  # its concurrent request loops (each sends the next request when the last is answered)
PACED_S = 3.0  # then a paced load: PACED_CLIENTS loops, one request each PACED_INTERVAL_S (~80 requests/s)
PACED_CLIENTS = 8
PACED_INTERVAL_S = 0.1
LAG_TICK_S = 0.005


@pytest.fixture(scope="module")
def ws():
    yield from load_example("webservice.py")


async def start_server(ws: Any) -> tuple[Any, str]:
    from aiohttp import web

    runner = web.AppRunner(ws.create_app())
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    return runner, f"http://{host}:{port}"


async def get_json(session: Any, url: str) -> tuple[int, Any]:
    async with session.get(url) as resp:
        return resp.status, await resp.json()


async def wait_running(session: Any, base: str, rid: int, timeout: float = 30.0) -> dict:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        status, st = await get_json(session, f"{base}/rollouts/{rid}")
        assert status == 200, st
        assert st["state"] in ("starting", "running"), st
        if st["state"] == "running" and st["steps"] > 0 and st["episodes_finished"] > 0:
            return st
        await asyncio.sleep(0.05)
    raise AssertionError(f"rollout {rid} did not start stepping within {timeout} s: {st}")


class LagProbe:
    """A periodic timer; records how late each tick fires (the loop's lag)."""

    def __init__(self, tick: float) -> None:
        self.tick, self.lags = tick, []

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            t = loop.time()
            await asyncio.sleep(self.tick)
            self.lags.append(max(0.0, loop.time() - t - self.tick))


def pct(xs: list[float]) -> dict[str, float]:
    a = np.asarray(xs) * 1000.0
    return {"n": int(a.size), "p50_ms": float(np.percentile(a, 50)), "p99_ms": float(np.percentile(a, 99)), "max_ms": float(a.max())}


async def storm(s: Any, base: str, rid: int, clients: int, duration: float, pace_s: float) -> dict:
    """``clients`` request loops for ``duration`` s (each waits ``pace_s`` between requests), a lag probe beside them."""
    probe = LagProbe(LAG_TICK_S)
    probe_task = asyncio.create_task(probe.run())
    latencies: list[float] = []
    seen_steps: dict[int, list[int]] = {k: [] for k in range(clients)}  # per client: its requests are sequential
    statuses: dict[int, int] = {}
    urls = [f"{base}/stats?history=120", f"{base}/rollouts/{rid}", f"{base}/rollouts/{rid}/episodes?limit=20", f"{base}/rollouts"]
    _, st = await get_json(s, f"{base}/rollouts/{rid}")
    steps_start = st["steps"]
    t0 = time.perf_counter()
    end = t0 + duration

    async def client(k: int) -> None:
        i = k
        while time.perf_counter() < end:
            url = urls[i % len(urls)]
            i += 1
            t = time.perf_counter()
            async with s.get(url) as resp:
                body = await resp.json()
                latencies.append(time.perf_counter() - t)
            statuses[resp.status] = statuses.get(resp.status, 0) + 1
            assert resp.status == 200, (url, body)
            if "/stats" in url:
                assert body["server"]["loop_lag"]["samples"] > 0
                (ro,) = [r for r in body["rollouts"] if r["id"] == rid]
                assert ro["state"] == "running" and ro["num_workers"] >= 1
                assert ro["history"] and all(h["num_workers"] >= 1 for h in ro["history"])
                seen_steps[k].append(ro["steps"])
            elif url.endswith(f"/rollouts/{rid}"):
                assert body["steps_per_s_total"] > 0 and body["latency_s"]["p50"] > 0
                for e in body["recent_returns"]:  # CartPole: +1 per step, at most 500 steps
                    assert e["return"] == e["length"] and 1 <= e["length"] <= 500, e
                seen_steps[k].append(body["steps"])
            elif "/episodes" in url:
                assert body["episodes_finished"] > 0 and len(body["episodes"]) <= 20
            else:
                assert any(r["id"] == rid for r in body["rollouts"])
            if pace_s:
                await asyncio.sleep(pace_s)

    try:
        await wait(asyncio.gather(*(client(k) for k in range(clients))))
    finally:
        probe_task.cancel()
        await asyncio.gather(probe_task, return_exceptions=True)
    elapsed = time.perf_counter() - t0
    _, st2 = await get_json(s, f"{base}/rollouts/{rid}")
    assert set(statuses) == {200}
    for k, seq in seen_steps.items():
        assert seq == sorted(seq), f"client {k} saw the step count go backwards"
        assert len(seq) < 2 or seq[-1] > seq[0], f"client {k}: the rollout did not step during the load"
    assert st2["steps"] > steps_start, "the rollout did not step during the load"
    return {
        "clients": clients, "pace_s": pace_s, "load_s": round(elapsed, 3), "requests": len(latencies),
        "requests_per_s": len(latencies) / elapsed, "request_latency": pct(latencies), "loop_lag": pct(probe.lags),
        "steps_per_s_under_http_load": (st2["steps"] - steps_start) / (time.perf_counter() - t0),
    }


async def scenario(ws: Any, loop_name: str) -> dict:
    import aiohttp

    runner, base = await start_server(ws)
    try:
        async with aiohttp.ClientSession() as s:
            # -- bad input is refused, not crashed on
            async with s.post(f"{base}/rollouts", json={"env_id": "NoSuchEnv-v0"}) as resp:
                assert resp.status == 400 and "NoSuchEnv" in (await resp.json())["error"]
            async with s.post(f"{base}/rollouts", json={"num_envs": "many"}) as resp:
                assert resp.status == 400
            async with s.get(f"{base}/rollouts/99") as resp:
                assert resp.status == 404
            for bad in ("-1", "0", "soon", "nan"):
                async with s.get(f"{base}/stats?lag_window_s={bad}") as resp:
                    assert resp.status == 400 and "lag_window_s" in (await resp.json())["error"], bad

            async with s.post(f"{base}/rollouts", json={"env_id": "CartPole-v1", "num_envs": 8}) as resp:
                assert resp.status == 201, await resp.text()
                rid = (await resp.json())["id"]
            st0 = await wait(wait_running(s, base, rid))
            pids = st0["worker_pids"]
            assert pids and st0["num_workers"] >= 1

            # steps/s with no HTTP load, for comparison
            t0, steps0 = time.perf_counter(), st0["steps"]
            await asyncio.sleep(1.0)
            _, st1 = await get_json(s, f"{base}/rollouts/{rid}")
            idle_rate = (st1["steps"] - steps0) / (time.perf_counter() - t0)
            _, whole = await get_json(s, f"{base}/stats?history=0")
            _, recent = await get_json(s, f"{base}/stats?history=0&lag_window_s=0.5")
            lag_all, lag_recent = whole["server"]["loop_lag"], recent["server"]["loop_lag"]
            assert lag_recent["window_s"] == 0.5 and lag_all["window_s"] is None
            assert 0 < lag_recent["samples"] <= 0.5 / lag_recent["interval_s"] + 1 < lag_all["samples"], (lag_recent, lag_all)

            # -- phase 1: saturating load (closed loop, as fast as answers come); phase 2: paced load
            phases = {
                "saturating": await storm(s, base, rid, CLIENTS, LOAD_S, pace_s=0.0),
                "paced": await storm(s, base, rid, PACED_CLIENTS, PACED_S, pace_s=PACED_INTERVAL_S),
            }
            for ph in phases.values():
                ph["steps_per_s_no_http_load"] = idle_rate

            # -- one episode's returns, at two discounts. The rollout keeps running and keeps its last 1000
            # episodes: under load, the episode read first can be evicted before the second read (a 404 that says
            # so); then the pair is read again for a newer episode.
            for _ in range(5):
                _, eps = await get_json(s, f"{base}/rollouts/{rid}/episodes?limit=5")
                n = eps["episodes"][-1]["index"]
                status, ep = await get_json(s, f"{base}/rollouts/{rid}/episodes/{n}?gamma=1")
                status9, ep9 = await get_json(s, f"{base}/rollouts/{rid}/episodes/{n}?gamma=0.9")
                if status == status9 == 200:
                    break
                for st, body in ((status, ep), (status9, ep9)):
                    assert st in (200, 404) and (st == 200 or "not kept" in body["error"]), (st, body)
            assert status == status9 == 200, (ep, ep9)
            assert ep["return"] == sum(ep["rewards"]) == ep["returns_to_go"][0] and len(ep["rewards"]) == ep["length"]
            assert ep["returns_to_go"] == [float(ep["length"] - t) for t in range(ep["length"])]
            assert abs(ep9["returns_to_go"][0] - (1 - 0.9 ** ep9["length"]) / 0.1) < 1e-9

            # -- a second rollout (first-finished mode), left running for cleanup to stop
            async with s.post(f"{base}/rollouts", json={"env_id": "CartPole-v1", "num_envs": 4, "mode": "recv", "num_workers": 2}) as resp:
                assert resp.status == 201
                rid2 = (await resp.json())["id"]
            st_b = await wait(wait_running(s, base, rid2))

            # -- stop the first: its workers are gone when the response arrives
            async with s.post(f"{base}/rollouts/{rid}/stop") as resp:
                assert resp.status == 200
                stopped = await resp.json()
            assert stopped["state"] == "stopped" and stopped["num_workers"] == 0
            pids = stopped["worker_pids"]
            assert all(pid_gone(p) for p in pids), f"workers still running after stop: {pids}"
            async with s.post(f"{base}/rollouts/{rid}/stop") as resp:  # idempotent
                assert resp.status == 200 and (await resp.json())["state"] == "stopped"
            _, st3 = await get_json(s, f"{base}/rollouts/{rid}")
            await asyncio.sleep(0.3)
            _, st4 = await get_json(s, f"{base}/rollouts/{rid}")
            assert st3["steps"] == st4["steps"] == stopped["steps"], "a stopped rollout kept stepping"
            _, st_b2 = await get_json(s, f"{base}/rollouts/{rid2}")
            assert st_b2["state"] == "running" and st_b2["steps"] > st_b["steps"], "stopping one rollout disturbed the other"
            pids2 = st_b2["worker_pids"]
    finally:
        await wait(runner.cleanup())  # stops the second rollout, closes its vector env
    assert all(pid_gone(p) for p in pids2), f"workers still running after app cleanup: {pids2}"

    return {"loop": loop_name, "env": "CartPole-v1", "num_envs": 8, "num_workers_at_start": st0["num_workers"],
            "loop_lag_tick_ms": LAG_TICK_S * 1000, **phases}


@pytest.mark.parametrize("loop_name", ["uvloop", "asyncio"])
def test_webservice_under_load(ws, clean, loop_name):
    from conftest import run_on

    report = run_on(loop_name, scenario(ws, loop_name), guard=60.0)
    assert_clean(clean)  # after the loop is gone: no worker, no /dev/shm entry, no thread left
    out = Path(f"/tmp/aiovec_webservice_load_{loop_name}.json")
    out.write_text(json.dumps(report, indent=2))
    for name in ("saturating", "paced"):
        ph = report[name]
        rl, lag = ph["request_latency"], ph["loop_lag"]
        print(f"\n[{loop_name}, {name}] {ph['requests']} GETs in {ph['load_s']:.1f} s ({ph['requests_per_s']:.0f}/s, {ph['clients']} clients): "
              f"latency p50 {rl['p50_ms']:.2f} ms, p99 {rl['p99_ms']:.2f} ms, max {rl['max_ms']:.2f} ms; "
              f"loop lag ({LAG_TICK_S * 1000:.0f} ms timer) p50 {lag['p50_ms']:.3f} ms, p99 {lag['p99_ms']:.3f} ms, max {lag['max_ms']:.2f} ms; "
              f"steps/s {ph['steps_per_s_no_http_load']:.0f} without / {ph['steps_per_s_under_http_load']:.0f} under this load")
    print(f"({report['num_workers_at_start']} worker(s) at start) -> {out}")


def test_load_generator_quick(clean, tmp_path):
    """examples/webservice_load.py --quick: server in its own process, every answer 200, nothing left behind.

    Correctness only (no timing): each level's requests all answered 200 with the right content, the rollout
    stepped during each level, every server exited cleanly with its workers, and the report renders.
    """
    from aiovec.bench.readme import web_block

    out = tmp_path / "web.json"
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / "webservice_load.py"), "--quick", "--out", str(out)],
                          capture_output=True, text=True, timeout=90)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    r = json.loads(out.read_text())
    for key in ("machine", "server_loop", "env_id", "num_envs", "duration_s", "loop_lag_monitor", "phases"):
        assert key in r, key
    assert r["server_loop"] in ("uvloop", "asyncio") and r["quick"] is True
    assert [p["kind"] for p in r["phases"]] == ["open", "open", "open", "closed"]
    for p in r["phases"]:
        name = p["name"]
        assert p["requests"] > 0 and p["statuses"] == {"200": p["requests"]}, (name, p["statuses"])
        assert p["bad_answers"] == [], (name, p["bad_answers"])
        assert sum(e["n"] for e in p["per_endpoint"].values()) == p["requests"] == p["latency_ms"]["n"]
        assert all(e["n"] > 0 for e in p["per_endpoint"].values()), name
        for k in ("p50", "p99", "max"):
            assert 0 < p["latency_ms"][k] < 10_000, (name, p["latency_ms"])
        lag = p["server_loop_lag_ms"]
        assert lag["samples"] > 0 and lag["startup"]["samples"] > 0 and lag["max"] >= lag["p99"] >= lag["p50"] >= 0, (name, lag)
        # the window covers the load only (one sample per 50 ms at most), not the server's whole life
        assert lag["samples"] <= (p["load_s"] + 0.2) / r["loop_lag_monitor"]["interval_s"] + 1, (name, lag)
        steps = p["rollout_steps"]
        assert steps["before"] <= steps["load_start"] < steps["load_end"] <= steps["after"], (name, steps)
        assert p["stepped_during_load"] and p["steps_per_s_under_load"] > 0 and p["steps_per_s_no_load"] > 0, name
        assert p["steps_seen_in_answers"][1] > 0, name
        assert p["worker_pids"] and set(p["worker_pids"]) <= set(p["child_pids"]), name
        assert p["server_exit_code"] == 0 and p["workers_gone_at_server_exit"] and p["leftover_pids"] == [], name
        assert all(pid_gone(pid) for pid in p["child_pids"]), name
    assert "| load |" in web_block(out)
    assert_clean(clean)
