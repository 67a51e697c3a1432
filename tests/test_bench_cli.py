"""The benchmark CLI stopped by SIGTERM (kill, a CI timeout) leaves no process behind, its peers' included."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import psutil


def alive(pids: set[int]) -> list[int]:
    out = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except psutil.NoSuchProcess:
            pass
    return out


def test_sigterm_closes_every_vector_env_it_started() -> None:
    proc = subprocess.Popen([sys.executable, "-m", "aiovec.bench", "core", "--quick"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    seen: set[int] = set()
    try:
        me = psutil.Process(proc.pid)
        end = time.monotonic() + 90
        while time.monotonic() < end and proc.poll() is None:
            kids = me.children(recursive=True)
            seen |= {k.pid for k in kids}
            if len(kids) >= 6:  # a vector env's workers are up (plus fork server and resource tracker)
                break
            time.sleep(0.1)
        assert len(seen) >= 6 and proc.poll() is None, "the benchmark never started its workers"
        seen |= {k.pid for k in me.children(recursive=True)}
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 128 + signal.SIGTERM
        end = time.monotonic() + 15  # fork server and resource tracker leave when they see the parent gone
        while alive(seen) and time.monotonic() < end:
            time.sleep(0.1)
        assert alive(seen) == []
    finally:
        if proc.poll() is None:
            proc.kill()
        for pid in alive(seen):
            psutil.Process(pid).kill()
