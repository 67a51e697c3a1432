"""Every way a script can end leaves a quiet terminal and a clean machine.

Each exit path runs as a real script in its own interpreter and session: with the synchronous
facade (``aiovec.VectorEnv``) and with ``AsyncVecEnv`` under ``aiovec.run``, a script that closes,
forgets to close, raises, gets SIGINT, gets SIGTERM, or lacks the ``__main__`` guard. Checked on
each: the exit status, stderr exactly (no ``resource_tracker`` warning, at most the one traceback
the script itself earned), no process of its session left (workers, fork server, resource
tracker), and none of the named semaphores it created left in ``/dev/shm``.

By hand, N runs of every path with counts: ``python tests/test_exits.py 20``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import default_signals

pytestmark = [pytest.mark.subprocess, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[1]

# Records every named semaphore a process (the script, its fork server, its workers) registers with
# the resource tracker, so the test can look for exactly those in /dev/shm afterwards.
SITECUSTOMIZE = """
import os
from multiprocessing import resource_tracker as _rt
_register = _rt.register
def register(name, rtype):
    fd = os.open(os.environ["AIOVEC_TEST_SEMS"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, (name + "\\n").encode())
    finally:
        os.close(fd)
    return _register(name, rtype)
_rt.register = register
"""

SYNC = """
import numpy as np
import aiovec

def main():
    envs = aiovec.make_vec("CartPole-v1", 4, num_workers=2)
    envs.reset(seed=0)
    for _ in range(5):
        envs.step(np.zeros(4, dtype=np.int64))
    {body}

{entry}
"""

ASYNC = """
import numpy as np
import aiovec

async def main():
    venv = aiovec.make("CartPole-v1", 4, num_workers=2)
    await venv.start()
    await venv.reset(seed=0)
    for _ in range(5):
        await venv.step(np.zeros(4, dtype=np.int64))
    {body}

{entry}
"""

BODIES = {
    "close": {"sync": "envs.close()", "async": "await venv.close()"},
    "no_close": {"sync": "pass", "async": "pass"},
    "raise": {"sync": "raise RuntimeError('boom')", "async": "raise RuntimeError('boom')"},
    "signal": {
        "sync": "print('ready', flush=True)\n    while True:\n        envs.step(np.zeros(4, dtype=np.int64))",
        "async": "print('ready', flush=True)\n    while True:\n        await venv.step(np.zeros(4, dtype=np.int64))",
    },
}
ENTRY = {"sync": 'if __name__ == "__main__":\n    main()', "async": 'if __name__ == "__main__":\n    aiovec.run(main())'}
NO_GUARD_ENTRY = {"sync": "main()", "async": "aiovec.run(main())"}
PATHS = ["close", "no_close", "raise", "sigint", "sigterm", "no_guard"]


@dataclass
class Outcome:
    returncode: int
    stderr: str
    leftover_processes: list[str]
    leftover_semaphores: list[str]
    semaphores_created: int


def script_for(api: str, path: str) -> str:
    body = BODIES["signal" if path in ("sigint", "sigterm") else "close" if path == "no_guard" else path][api]
    entry = NO_GUARD_ENTRY[api] if path == "no_guard" else ENTRY[api]
    return textwrap.dedent((SYNC if api == "sync" else ASYNC).format(body=body, entry=entry))


def _session_processes(sid: int) -> list[str]:
    out = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            if int(fields[3]) == sid and fields[0] != "Z":
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
                out.append(f"{pid}: {cmd[:100]}")
        except (OSError, IndexError, ValueError):
            pass
    return out


def _reap(proc: subprocess.Popen) -> list[str]:
    """After a script in its own session ended (or timed out: killed): what of its session outlived it.

    The fork server and the resource tracker leave once they see the script gone: they get a moment; whatever
    is left after it is reported, then killed."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    end = time.monotonic() + 10.0
    while (left := _session_processes(proc.pid)) and time.monotonic() < end:
        time.sleep(0.05)
    if left:
        os.killpg(proc.pid, signal.SIGKILL)
    return left


def run_path(tmp: Path, api: str, path: str, timeout: float = 90.0, script: Path | None = None) -> Outcome:
    """Run one exit path as a script in its own session; report what it left behind."""
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "sitecustomize.py").write_text(SITECUSTOMIZE)
    if script is None:
        script = tmp / f"{api}_{path}.py"
        script.write_text(script_for(api, path))
    sems = tmp / f"{api}_{path}.sems"
    sems.unlink(missing_ok=True)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp), str(ROOT), os.environ.get("PYTHONPATH", "")]),
               AIOVEC_TEST_SEMS=str(sems), PYTHONUNBUFFERED="1")
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                            cwd=tmp, start_new_session=True, preexec_fn=default_signals)
    try:
        if path in ("sigint", "sigterm"):
            line = proc.stdout.readline()
            assert line.strip() == b"ready", (line, proc.stderr.read().decode(errors="replace") if proc.poll() is not None else "")
            time.sleep(0.2)  # stepping
            proc.send_signal(signal.SIGINT if path == "sigint" else signal.SIGTERM)
        _, err = proc.communicate(timeout=timeout)
    finally:
        left = _reap(proc)
    names = sems.read_text().split() if sems.exists() else []
    leaked = [n for n in names if os.path.exists("/dev/shm/sem." + n.lstrip("/"))]
    return Outcome(proc.returncode, err.decode(errors="replace"), left, leaked, len(names))


def problems(api: str, path: str, o: Outcome) -> list[str]:
    """What is wrong with one outcome (empty: a clean, quiet exit)."""
    bad = []
    if o.leftover_processes:
        bad.append(f"processes left: {o.leftover_processes}")
    if o.leftover_semaphores:
        bad.append(f"semaphores left in /dev/shm: {o.leftover_semaphores}")
    if "resource_tracker" in o.stderr or "Exception ignored" in o.stderr or "Warning" in o.stderr:
        bad.append("warning on stderr")
    tracebacks = o.stderr.count("Traceback (most recent call last)")
    want_rc, want_tb, last = {
        "close": (0, 0, None),
        "no_close": (0, 0, None),
        "raise": (1, 1, "RuntimeError: boom"),
        "sigint": (1 if api == "sync" else 130, 1, "KeyboardInterrupt"),
        "sigterm": (143, 0, None),
        "no_guard": (1, 0, "        main()"),
    }[path]
    if path == "sigint" and o.returncode in (1, 130, -signal.SIGINT):
        want_rc = o.returncode  # Python exits 1 or dies by SIGINT after KeyboardInterrupt, depending on the path
    if o.returncode != want_rc:
        bad.append(f"exit status {o.returncode}, expected {want_rc}")
    if tracebacks != want_tb:
        bad.append(f"{tracebacks} tracebacks, expected {want_tb}")
    lines = o.stderr.rstrip().splitlines()
    if last is None and o.stderr.strip():
        bad.append("stderr not empty")
    if last is not None and (not lines or lines[-1] != last):
        bad.append(f"last line of stderr {lines[-1] if lines else ''!r}, expected {last!r}")
    if path == "no_guard" and (len(lines) > 8 or "if __name__ == \"__main__\":" not in o.stderr):
        bad.append("the missing-guard message is not the short one")
    if bad:
        bad.append("stderr:\n" + o.stderr[-3000:])
    return bad


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("api", ["sync", "async"])
def test_exit_path_is_quiet_and_clean(tmp_path: Path, api: str, path: str) -> None:
    o = run_path(tmp_path, api, path)
    assert o.semaphores_created >= 10 or path == "no_guard", f"the script should have started 2 workers: {o}"
    assert not problems(api, path, o), "\n".join(problems(api, path, o))



@pytest.mark.parametrize("path", ["no_close", "raise"])
@pytest.mark.parametrize("placement", ["inline", "hybrid"])
def test_in_process_placements_exit_quietly_too(tmp_path: Path, placement: str, path: str) -> None:
    """Envs stepped in this process: a vector env never closed is collected after its loop has ended."""
    options = 'placement="inline"' if placement == "inline" else 'placement="hybrid", num_workers=2'
    script = tmp_path / f"{placement}_{path}.py"
    script.write_text(script_for("async", path).replace("num_workers=2", options))
    o = run_path(tmp_path, "async", path, script=script)
    assert not problems("async", path, o), "\n".join(problems("async", path, o))

def test_missing_guard_under_plain_asyncio_run_is_the_same_short_message(tmp_path: Path) -> None:
    # aiovec.run and the facade refuse in the worker before anything starts; plain asyncio.run
    # reaches the worker's own start-up failure, which the excepthook catches instead.
    tmp_path.mkdir(parents=True, exist_ok=True)
    script = tmp_path / "plain_asyncio.py"
    script.write_text(script_for("async", "no_guard").replace("aiovec.run(main())", "import asyncio\nasyncio.run(main())"))
    o = run_path(tmp_path, "async", "no_guard", script=script)
    assert not problems("async", "no_guard", o), "\n".join(problems("async", "no_guard", o))


def test_missing_guard_message_names_the_script(tmp_path: Path) -> None:
    o = run_path(tmp_path, "sync", "no_guard")
    assert str(tmp_path / "sync_no_guard.py") in o.stderr
    assert o.stderr.strip().endswith('if __name__ == "__main__":\n        main()')


if __name__ == "__main__":  # python tests/test_exits.py [N]: N runs of every path, with counts
    import tempfile

    n = int(sys.argv[1]) if len(sys.argv) > 1 else 20
    with tempfile.TemporaryDirectory() as d:
        for api in ("sync", "async"):
            for path in PATHS:
                bad_runs, kinds = 0, {}
                for _ in range(n):
                    found = [p for p in problems(api, path, run_path(Path(d), api, path)) if not p.startswith("stderr")]
                    bad_runs += bool(found)
                    for p in found:
                        kinds[p[:60]] = kinds.get(p[:60], 0) + 1
                print(f"{api:5s} {path:9s}: {n - bad_runs}/{n} clean {kinds or ''}", flush=True)


DOUBLE_SIGINT_SCRIPT = """
import numpy as np
import aiovec

async def main():
    print("starting", flush=True)
    async with aiovec.make("aiovec/Busy-v0", 8, num_workers=4, placement="process") as venv:
        await venv.reset(seed=0)
        while True:
            await venv.step(np.zeros(8, dtype=np.int64))

if __name__ == "__main__":
    aiovec.run(main())
"""


def test_ctrl_c_twice_while_workers_start_prints_only_the_interrupt(tmp_path: Path) -> None:
    """Ctrl-C twice while the workers are being forked: the parent releases the executors' semaphores before some
    workers have attached to them, and those fork-server children died printing ``FileNotFoundError`` tracebacks
    (4 of them at one of five delays on this VM). They are dropped (``aiovec.backends.forkserver_hook``); the
    script's own ``KeyboardInterrupt`` is all that is printed, and nothing of its session is left."""
    script = tmp_path / "double_sigint.py"
    script.write_text(DOUBLE_SIGINT_SCRIPT)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]), PYTHONUNBUFFERED="1")
    for delay in (0.0, 0.03, 0.06, 0.1, 0.15, 0.2, 0.3):
        proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                                cwd=tmp_path, start_new_session=True, preexec_fn=default_signals)
        try:
            assert proc.stdout.readline().strip() == b"starting"
            time.sleep(delay)
            proc.send_signal(signal.SIGINT)
            time.sleep(0.03)
            proc.send_signal(signal.SIGINT)
            _, err = proc.communicate(timeout=60)
        finally:
            left = _reap(proc)
        text = err.decode(errors="replace")
        assert not left, (delay, left)
        assert "FileNotFoundError" not in text and text.count("Traceback (most recent call last)") <= 1, (delay, text[-3000:])
        assert not text.strip() or text.rstrip().splitlines()[-1] == "KeyboardInterrupt", (delay, text[-3000:])


def _start_script(tmp_path: Path, name: str, text: str) -> subprocess.Popen:
    script = tmp_path / name
    script.write_text(textwrap.dedent(text))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]), PYTHONUNBUFFERED="1")
    return subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                            cwd=tmp_path, start_new_session=True, preexec_fn=default_signals)


def _only_the_interrupt(err: bytes) -> str:
    text = err.decode(errors="replace")
    assert text.count("Traceback (most recent call last)") == 1 and "Exception ignored" not in text, text[-3000:]
    assert text.rstrip().splitlines()[-1] == "KeyboardInterrupt", text[-3000:]
    return text


def _interrupted(proc: subprocess.Popen, presses: Callable[[], None]) -> tuple[bytes, str]:
    """Press Ctrl-C at the started script (``presses``), let it end, check that nothing of its session is left and
    that it printed only the one ``KeyboardInterrupt``; its stdout and stderr."""
    try:
        presses()
        out, err = proc.communicate(timeout=60)
    finally:
        left = _reap(proc)
    assert not left, left
    return out, _only_the_interrupt(err)


def test_a_second_ctrl_c_after_run_raised_lets_the_exit_finish(tmp_path: Path) -> None:
    """The second Ctrl-C of a double press often lands once ``aiovec.run`` has raised already, while the script's own
    ``finally`` blocks, multiprocessing's finalizers and the interpreter's exit run: it is only counted there, so
    they finish and nothing but the one ``KeyboardInterrupt`` is printed (it raised inside them before)."""
    proc = _start_script(tmp_path, "after_run.py", """
        import time
        import numpy as np
        import aiovec

        async def main():
            async with aiovec.make("CartPole-v1", 4, num_workers=2, placement="process") as venv:
                await venv.reset(seed=0)
                print("stepping", flush=True)
                while True:
                    await venv.step(np.zeros(4, dtype=np.int64))

        if __name__ == "__main__":
            try:
                aiovec.run(main())
            finally:
                print("run ended", flush=True)
                time.sleep(0.5)  # stands for an exit that takes a while: saving a checkpoint, joining threads
                print("exit went on", flush=True)
    """)

    def presses() -> None:
        assert proc.stdout.readline().strip() == b"stepping"
        proc.send_signal(signal.SIGINT)
        assert proc.stdout.readline().strip() == b"run ended"
        proc.send_signal(signal.SIGINT)

    out, _ = _interrupted(proc, presses)
    assert b"exit went on" in out, out


def test_a_second_ctrl_c_kills_workers_that_do_not_close(tmp_path: Path) -> None:
    """First Ctrl-C: the vector env closes with its grace (here 10 minutes, its workers hung in a step); the second:
    it kills them at once and the script ends, saying only ``KeyboardInterrupt``."""
    proc = _start_script(tmp_path, "hurry.py", """
        import numpy as np
        import aiovec

        async def main():
            async with aiovec.make("aiovec/Fault-v0", 2, num_workers=2, placement="process", close_timeout=600.0,
                                   fault="hang", at_step=1, hang_s=600.0) as venv:
                await venv.reset(seed=0)
                print("stepping", flush=True)
                await venv.step(np.zeros(2, dtype=np.int64))

        if __name__ == "__main__":
            aiovec.run(main())
    """)

    def presses() -> None:
        assert proc.stdout.readline().strip() == b"stepping"
        time.sleep(0.3)  # the step hangs in both workers
        proc.send_signal(signal.SIGINT)
        time.sleep(0.5)  # closing: waiting out the grace
        assert proc.poll() is None, "the first Ctrl-C did not wait for the workers to close"
        proc.send_signal(signal.SIGINT)

    _interrupted(proc, presses)


def test_a_third_ctrl_c_interrupts_a_loop_that_never_yields(tmp_path: Path) -> None:
    """Code that blocks the event loop cannot be cancelled: the first two presses only cancel the main task (nothing
    happens yet), the third raises ``KeyboardInterrupt`` where the main thread is, as Python's own handler does."""
    proc = _start_script(tmp_path, "blocked.py", """
        import time
        import aiovec

        async def main():
            print("blocking", flush=True)
            time.sleep(600)  # never yields

        if __name__ == "__main__":
            aiovec.run(main())
    """)

    def presses() -> None:
        assert proc.stdout.readline().strip() == b"blocking"
        for _ in range(2):
            proc.send_signal(signal.SIGINT)
            time.sleep(0.3)
            assert proc.poll() is None, "a first or second Ctrl-C raised inside the blocking call"
        proc.send_signal(signal.SIGINT)

    _interrupted(proc, presses)


def test_ctrl_c_during_a_synchronous_close_kills_the_workers_and_raises_after(tmp_path: Path) -> None:
    """``VectorEnv.close()`` waits out the grace for workers hung in a step (10 minutes here). A Ctrl-C meanwhile kills
    them at once; the close still runs to its end (the facade's loop was stopped mid-close before: a close task
    destroyed pending, its workers' semaphores left to the tracker), then the ``KeyboardInterrupt`` is raised."""
    proc = _start_script(tmp_path, "sync_close.py", """
        import numpy as np
        import aiovec

        if __name__ == "__main__":
            envs = aiovec.make_vec("aiovec/Fault-v0", 2, num_workers=2, placement="process", close_timeout=600.0,
                                   fault="hang", at_step=1, hang_s=600.0)
            envs.reset(seed=0)
            envs.step_async(np.zeros(2, dtype=np.int64))
            print("closing", flush=True)
            try:
                envs.close()
            finally:
                print(f"closed: {envs.closed}", flush=True)
    """)

    def presses() -> None:
        assert proc.stdout.readline().strip() == b"closing"
        time.sleep(0.5)  # waiting out the grace
        assert proc.poll() is None, "close() did not wait for the hung workers"
        proc.send_signal(signal.SIGINT)

    out, err = _interrupted(proc, presses)
    assert b"closed: True" in out, out
    assert "Task was destroyed" not in err and "resource_tracker" not in err, err
