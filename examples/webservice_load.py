"""Load-test examples/webservice.py from a separate process: request latency, server loop lag, env steps/s.

    python examples/webservice_load.py --out bench-results/web.json     # ~55 s
    python examples/webservice_load.py --quick                           # ~15 s smoke run

The server runs as its own process (``python examples/webservice.py``, on its default loop: uvloop where
installed) and this process is only the load generator (an aiohttp client on uvloop), so the numbers are
the server's, not a mix of client and server work on one loop. For each load level a *fresh* server is
started, one rollout (CartPole-v1, 8 envs, lock-step; ``--mode recv``: first-finished) is launched over HTTP
and, once it steps:

1. ``--settle`` / 2 s with no HTTP load (env steps/s without load, first part of the baseline);
2. ``--duration`` s of load: a mix of the GETs a dashboard makes (``/stats?history=120``,
   ``/rollouts/{id}``, ``/rollouts/{id}/episodes?limit=20``, in turn). Paced levels are open-loop: request
   ``i`` is sent at ``t0 + i / rate`` whether or not earlier ones were answered, and its latency is counted
   from that scheduled time, so queueing (in the server or the client) is included. The saturating level is
   closed-loop: ``--clients`` loops each send the next request when the last is answered;
3. ``--settle`` s with no load again (the rest of the baseline), then SIGTERM, and a check that the
   server, its fork server, resource tracker and env workers are all gone.

A fresh server per level keeps the levels apart (no rollout history, episodes or JSON sizes carried over).
Loop lag is the server's own monitor (``LoopLag``: how late a 50 ms timer fires, measured with
``time.perf_counter``) over exactly the load's window (``/stats?lag_window_s=``); the server's start-up and
settle are summarised apart (``startup``). A sample is the timer's overshoot to within the loop's timer
granularity (uvloop: 1 ms), so lags under ~1 ms are at the noise floor.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import psutil

import aiovec
from aiovec.bench.core import machine

HERE = Path(__file__).resolve().parent
SERVER = HERE / "webservice.py"
ENV_ID, NUM_ENVS = "CartPole-v1", 8
LAG_INTERVAL_S = 0.05  # examples/webservice.py: LoopLag(interval=0.05)
REQUEST_TIMEOUT_S = 10.0


# -- the server process -----------------------------------------------------------------
def free_port(host: str) -> int:
    """A port nobody listens on now (bind to port 0, read it, close): the server has no "pick one" option."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _sigterm_when_parent_dies() -> None:
    """In the server (before exec): SIGTERM it if this load generator dies, even from SIGKILL (Linux only)."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG


def start_server(host: str, port: int) -> subprocess.Popen:
    # Its own session: a Ctrl-C in the terminal reaches only this process, which then stops the server with
    # SIGTERM (the server handles it like Ctrl-C: every rollout is stopped and its workers joined).
    return subprocess.Popen(
        [sys.executable, str(SERVER), "--host", host, "--port", str(port)],
        stdout=subprocess.DEVNULL, start_new_session=True,
        preexec_fn=_sigterm_when_parent_dies if sys.platform.startswith("linux") else None,
    )


def descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def alive(pids: list[int]) -> list[int]:
    out = []
    for pid in pids:
        with contextlib.suppress(psutil.NoSuchProcess):
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
    return out


def stop_server(proc: subprocess.Popen, known: list[int], timeout: float = 20.0) -> dict[str, Any]:
    """SIGTERM the server, wait for it, and report which of its processes outlived it (killing them)."""
    known = sorted(set(known) | {p.pid for p in descendants(proc.pid)})
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        rc = proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        rc = proc.wait()
    at_exit = alive(known)  # env workers must be gone now: the server joins them before it exits
    end = time.monotonic() + 5.0  # its fork server and resource tracker exit when they see it gone
    left = at_exit
    while left and time.monotonic() < end:
        time.sleep(0.05)
        left = alive(left)
    for pid in left:
        with contextlib.suppress(psutil.Error):
            psutil.Process(pid).kill()
    return {"server_exit_code": rc, "child_pids": known, "alive_at_server_exit": at_exit, "leftover_pids": left}


def cpu_s(p: psutil.Process) -> float:
    with contextlib.suppress(psutil.Error):
        t = p.cpu_times()
        return t.user + t.system
    return 0.0


def machine_busy_s() -> float:
    """CPU seconds the whole machine has been busy (all CPUs, every process), for the share not ours."""
    t = psutil.cpu_times()
    return sum(t) - t.idle - getattr(t, "iowait", 0.0)


def worker_cpu(server_pid: int) -> dict[int, float]:
    """CPU seconds of each env worker now: the children of the server's fork server."""
    out = {}
    for p in descendants(server_pid):
        with contextlib.suppress(psutil.Error):
            if p.ppid() != server_pid:  # the fork server and resource tracker are the server's own children
                out[p.pid] = cpu_s(p)
    return out


# -- HTTP ---------------------------------------------------------------------------------
async def get_json(s: aiohttp.ClientSession, url: str) -> Any:
    async with s.get(url) as resp:
        resp.raise_for_status()
        return await resp.json()


async def wait_up(s: aiohttp.ClientSession, base: str, proc: subprocess.Popen, timeout: float = 60.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with code {proc.returncode} before answering")
        with contextlib.suppress(aiohttp.ClientError, OSError):
            await get_json(s, f"{base}/stats?history=0")
            return
        await asyncio.sleep(0.05)
    raise TimeoutError(f"the server did not answer {base}/stats within {timeout} s")


async def start_rollout(s: aiohttp.ClientSession, base: str, mode: str, timeout: float = 60.0) -> dict[str, Any]:
    body = {"env_id": ENV_ID, "num_envs": NUM_ENVS, "mode": mode}
    async with s.post(f"{base}/rollouts", json=body) as resp:
        info = await resp.json()
        if resp.status != 201:
            raise RuntimeError(f"POST /rollouts answered {resp.status}: {info}")
    rid = info["id"]
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        st = await get_json(s, f"{base}/rollouts/{rid}?history=0")
        if st["state"] == "running" and st["steps"] > 0:
            return st
        if st["state"] not in ("starting", "running"):
            raise RuntimeError(f"rollout {rid} is {st['state']}: {st.get('error')}")
        await asyncio.sleep(0.05)
    raise TimeoutError(f"rollout {rid} did not step within {timeout} s")


async def snap(s: aiohttp.ClientSession, base: str, rid: int, lag_window_s: float | None = None) -> dict[str, Any]:
    """The rollout's step count and the server's own clock for it, plus the server's loop-lag summary
    (over the last ``lag_window_s`` seconds, or all it keeps)."""
    window = f"&lag_window_s={lag_window_s:.3f}" if lag_window_s else ""
    st = await get_json(s, f"{base}/stats?history=0{window}")
    (ro,) = [r for r in st["rollouts"] if r["id"] == rid]
    return {"steps": ro["steps"], "elapsed_s": ro["elapsed_s"], "state": ro["state"], "num_workers": ro["num_workers"],
            "worker_pids": ro["worker_pids"], "loop_lag": st["server"]["loop_lag"]}


def rate(a: dict[str, Any], b: dict[str, Any]) -> float:
    dt = b["elapsed_s"] - a["elapsed_s"]
    return (b["steps"] - a["steps"]) / dt if dt > 0 else 0.0


class Recorder:
    """Per-request outcomes of one phase."""

    def __init__(self, rid: int) -> None:
        self.rid = rid
        self.latency: dict[str, list[float]] = {"stats": [], "rollout": [], "episodes": []}
        self.bytes: dict[str, list[int]] = {k: [] for k in self.latency}
        self.send_lag: list[float] = []  # open loop: how late the client sent, past the schedule
        self.statuses: dict[str, int] = {}
        self.bad: list[str] = []  # answered 200 but not what it should be (first few)
        self.steps_seen: list[int] = []

    def check(self, kind: str, body: Any) -> None:
        ok = True
        if kind == "stats":
            ros = [r for r in body["rollouts"] if r["id"] == self.rid]
            ok = len(ros) == 1 and ros[0]["state"] == "running" and "samples" in body["server"]["loop_lag"]
            if ok:
                self.steps_seen.append(ros[0]["steps"])
        elif kind == "rollout":
            ok = body["id"] == self.rid and body["state"] == "running" and body["steps"] > 0
            self.steps_seen.append(body["steps"])
        else:
            ok = body["rollout"] == self.rid and len(body["episodes"]) <= 20
        if not ok and len(self.bad) < 5:
            self.bad.append(f"{kind}: {str(body)[:200]}")

    async def request(self, s: aiohttp.ClientSession, kind: str, url: str, t_start: float) -> None:
        try:
            async with s.get(url) as resp:
                raw = await resp.read()
                t = time.perf_counter() - t_start
                status = str(resp.status)
        except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as exc:
            self.statuses[type(exc).__name__] = self.statuses.get(type(exc).__name__, 0) + 1
            return
        self.statuses[status] = self.statuses.get(status, 0) + 1
        self.latency[kind].append(t)
        self.bytes[kind].append(len(raw))
        if status == "200":
            try:
                self.check(kind, json.loads(raw))
            except (ValueError, KeyError, TypeError) as exc:
                if len(self.bad) < 5:
                    self.bad.append(f"{kind}: {type(exc).__name__}: {exc}")


def pct_ms(xs: list[float]) -> dict[str, Any]:
    if not xs:
        return {"n": 0}
    a = np.asarray(xs) * 1000.0
    p50, p90, p99 = np.percentile(a, (50, 90, 99))
    return {"n": int(a.size), "p50": float(p50), "p90": float(p90), "p99": float(p99), "max": float(a.max())}


async def open_loop(s: aiohttp.ClientSession, urls: list[tuple[str, str]], rec: Recorder, rps: float, duration: float) -> float:
    tasks = []
    t0 = time.perf_counter()
    i = 0
    while True:
        due = t0 + i / rps
        if due >= t0 + duration:
            break
        delay = due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        rec.send_lag.append(max(0.0, time.perf_counter() - due))
        kind, url = urls[i % len(urls)]
        tasks.append(asyncio.ensure_future(rec.request(s, kind, url, due)))  # latency from the scheduled time
        i += 1
    await asyncio.gather(*tasks)
    return time.perf_counter() - t0  # until the last answer: the window the server's loop lag is read for


async def closed_loop(s: aiohttp.ClientSession, urls: list[tuple[str, str]], rec: Recorder, clients: int, duration: float) -> float:
    t0 = time.perf_counter()
    end = t0 + duration

    async def client(k: int) -> None:
        i = k
        while time.perf_counter() < end:
            kind, url = urls[i % len(urls)]
            i += 1
            await rec.request(s, kind, url, time.perf_counter())

    await asyncio.gather(*(client(k) for k in range(clients)))
    return time.perf_counter() - t0


# -- one load level -------------------------------------------------------------------------
async def phase(level: dict[str, Any], host: str, settle: float, duration: float, mode: str) -> dict[str, Any]:
    port = free_port(host)
    base = f"http://{host}:{port}"
    proc = start_server(host, port)
    known: list[int] = []
    out: dict[str, Any] = {**level, "port": port}
    try:
        timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
        async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=100)) as s:
            t_launch = time.perf_counter()
            await wait_up(s, base, proc)
            st = await start_rollout(s, base, mode)
            rid = st["id"]
            out["server_start_s"] = time.perf_counter() - t_launch
            server = psutil.Process(proc.pid)
            kids = descendants(proc.pid)
            known = [p.pid for p in kids]

            a = await snap(s, base, rid)  # baseline, first part (short: it is in the load's loop-lag window too)
            await asyncio.sleep(settle / 2)
            b = await snap(s, base, rid)

            urls = [("stats", f"{base}/stats?history=120"), ("rollout", f"{base}/rollouts/{rid}"),
                    ("episodes", f"{base}/rollouts/{rid}/episodes?limit=20")]
            rec = Recorder(rid)
            t_load = time.perf_counter()
            c0 = (time.process_time(), cpu_s(server), worker_cpu(proc.pid), time.perf_counter(), machine_busy_s())
            if level["kind"] == "open":
                wall = await open_loop(s, urls, rec, level["target_rps"], duration)
            else:
                wall = await closed_loop(s, urls, rec, level["clients"], duration)
            c1 = (time.process_time(), cpu_s(server), worker_cpu(proc.pid), time.perf_counter(), machine_busy_s())
            c = await snap(s, base, rid, lag_window_s=time.perf_counter() - t_load)  # loop lag during the load only

            await asyncio.sleep(settle)  # baseline, the rest
            d = await snap(s, base, rid)

        lat_all = [x for v in rec.latency.values() for x in v]
        n = sum(rec.statuses.values())
        lag = c["loop_lag"]
        el = c1[3] - c0[3]
        cpu = {"server": 100 * (c1[1] - c0[1]) / el, "env_workers": 100 * sum(t - c0[2].get(pid, 0.0) for pid, t in c1[2].items()) / el,
               "load_generator": 100 * (c1[0] - c0[0]) / el, "machine": 100 * (c1[4] - c0[4]) / el}
        cpu["other_processes"] = max(0.0, cpu["machine"] - cpu["server"] - cpu["env_workers"] - cpu["load_generator"])
        out.update({
            "rollout_id": rid, "num_workers": c["num_workers"], "worker_pids": sorted(set(st["worker_pids"]) | set(d["worker_pids"])),
            "load_s": round(wall, 3), "requests": n, "requests_per_s": n / wall, "statuses": rec.statuses,
            "bad_answers": rec.bad, "steps_seen_in_answers": [min(rec.steps_seen, default=0), max(rec.steps_seen, default=0)],
            "latency_ms": pct_ms(lat_all),
            "per_endpoint": {k: {**pct_ms(v), "mean_bytes": float(np.mean(rec.bytes[k])) if rec.bytes[k] else None}
                             for k, v in rec.latency.items()},
            "client_send_lag_ms": pct_ms(rec.send_lag) if level["kind"] == "open" else None,
            "server_loop_lag_ms": {  # the load's window only
                "samples": lag.get("samples", 0),
                **{k[:-2]: v * 1000.0 for k in ("p50_s", "p99_s", "max_s") if (v := lag.get(k)) is not None},
                "startup": {"samples": b["loop_lag"].get("samples", 0),  # start-up and settle, before the load
                            **{k[:-2]: v * 1000.0 for k in ("p50_s", "p99_s", "max_s") if (v := b["loop_lag"].get(k)) is not None}},
            },
            "rollout_steps": {"before": a["steps"], "load_start": b["steps"], "load_end": c["steps"], "after": d["steps"]},
            "stepped_during_load": c["steps"] > b["steps"] and c["state"] == "running",
            "steps_per_s_under_load": rate(b, c),
            "steps_per_s_before_load": rate(a, b), "steps_per_s_after_load": rate(c, d),
            "steps_per_s_no_load": ((b["steps"] - a["steps"]) + (d["steps"] - c["steps"]))
                                   / max(1e-9, (b["elapsed_s"] - a["elapsed_s"]) + (d["elapsed_s"] - c["elapsed_s"])),
            "cpu_percent": cpu,  # of one CPU, during the load
        })
    finally:
        out.update(stop_server(proc, known))
        out["workers_gone_at_server_exit"] = not (set(out.get("worker_pids", ())) & set(out["alive_at_server_exit"]))
    return out


def levels(clients: int) -> list[dict[str, Any]]:
    return [
        {"name": "none (10 req/s probe)", "kind": "open", "target_rps": 10},
        {"name": "paced 50 req/s", "kind": "open", "target_rps": 50},
        {"name": "paced 200 req/s", "kind": "open", "target_rps": 200},
        {"name": f"saturating, {clients} clients", "kind": "closed", "clients": clients},
    ]


def summary_line(p: dict[str, Any]) -> str:
    lat, lag = p["latency_ms"], p["server_loop_lag_ms"]
    return (f"{p['name']:<26} {p['requests_per_s']:7.1f} req/s  latency p50 {lat['p50']:6.2f} ms p99 {lat['p99']:7.2f} ms "
            f"max {lat['max']:7.2f} ms | server loop lag p50 {lag.get('p50', float('nan')):.0f} ms p99 {lag.get('p99', float('nan')):.1f} ms "
            f"| steps/s {p['steps_per_s_under_load']:,.0f} under load, {p['steps_per_s_no_load']:,.0f} without "
            f"| CPU% server {p['cpu_percent']['server']:.0f} workers {p['cpu_percent']['env_workers']:.0f} "
            f"client {p['cpu_percent']['load_generator']:.0f} others {p['cpu_percent']['other_processes']:.0f}")


async def run_all(args: argparse.Namespace) -> dict[str, Any]:
    t0 = time.perf_counter()
    report: dict[str, Any] = {
        "machine": machine(),
        "server_loop": "uvloop" if aiovec.loop.has_uvloop() else "asyncio",  # aiovec.run's default in the server
        "load_generator_loop": type(asyncio.get_running_loop()).__module__.split(".")[0],
        "python": platform.python_version(), "aiohttp": aiohttp.__version__,
        "env_id": ENV_ID, "num_envs": NUM_ENVS, "mode": "lock-step" if args.mode == "step" else "first-finished",
        "quick": args.quick, "settle_s": args.settle, "duration_s": args.duration,
        "endpoints": ["/stats?history=120", "/rollouts/{id}", "/rollouts/{id}/episodes?limit=20"],
        "loop_lag_monitor": {"interval_s": LAG_INTERVAL_S, "clock": "time.perf_counter",
                             "timer_granularity_ms": 1.0 if aiovec.loop.has_uvloop() else None,  # libuv timers: whole ms
                             "window": "the load only (/stats?lag_window_s=); start-up apart"},
        "load_average_start": os.getloadavg(),
        "phases": [],
    }
    for level in levels(args.clients):
        p = await phase(level, args.host, args.settle, args.duration, args.mode)
        report["phases"].append(p)
        print(summary_line(p), flush=True)
    report["load_average_end"] = os.getloadavg()
    report["total_s"] = time.perf_counter() - t0
    return report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", metavar="PATH", help="write the JSON report here (default: print only)")
    ap.add_argument("--quick", action="store_true", help="short phases: a smoke run of ~15 s (default: off, ~1 minute)")
    ap.add_argument("--duration", type=float, metavar="SECONDS", help="seconds of load per level (default: 10; 1 with --quick)")
    ap.add_argument("--settle", type=float, metavar="SECONDS",
                    help="seconds without load after each level, half that before (default: 1.5; 0.4 with --quick)")
    ap.add_argument("--clients", type=int, default=16, help="concurrent request loops of the saturating level (default: %(default)s)")
    ap.add_argument("--host", default="127.0.0.1", help="address the server listens on and the client connects to (default: %(default)s)")
    ap.add_argument("--mode", choices=["step", "recv"], default="step",
                    help="the server's rollout: step = lock-step, recv = first-finished, half the envs per recv (default: %(default)s)")
    args = ap.parse_args(argv)
    args.duration = args.duration or (1.0 if args.quick else 10.0)
    args.settle = args.settle or (0.4 if args.quick else 1.5)
    print(f"# {machine()}\n# server: {SERVER.name} in its own process, one fresh server per level; "
          f"{args.duration:g} s of load per level", flush=True)
    try:
        report = aiovec.run(run_all(args))
    except KeyboardInterrupt:  # the server of the current level was stopped in phase()'s finally
        print("interrupted", file=sys.stderr)
        return 130
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(report, indent=1))
        print(f"-> {args.out}")
    ok = all(p["requests"] > 0 and p["statuses"] == {"200": p["requests"]} and not p["bad_answers"] and p["stepped_during_load"]
             and not p["leftover_pids"] and p["server_exit_code"] == 0 for p in report["phases"])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
