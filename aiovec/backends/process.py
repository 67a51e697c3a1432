"""Workers as processes, each backed by its own single-process ``ProcessPoolExecutor``.

The executor owns process start-up (start method, initializer); one long-lived
``serve`` task is the worker's lifetime, so its future fails with
``BrokenProcessPool`` when the process dies. One executor per worker isolates
crashes. The hot path bypasses the executor: bulk data sits in shared memory and
a socket pair carries a few bytes per command and per reply; the parent watches
the socket with ``loop.add_reader``, so it wakes once per ready worker batch and
never polls or spins.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import os
import signal
import struct
import threading
import weakref
from concurrent.futures import Future, ProcessPoolExecutor
from typing import Any

from .. import protocol as P
from .. import worker as worker_side
from ..loop import wait_done
from ..protocol import decode_reply
from ..shm import SharedBuffers
from .base import Backend, ExitCallback, ReplyCallback, WorkerHandle

_HEADER = struct.Struct("!i")  # multiprocessing.Connection's frame header
_STEP_SHARD_FRAME = _HEADER.pack(len(P.STEP_SHARD)) + P.STEP_SHARD
_FAST = struct.Struct("=Bddd")  # a fast reply: marker, cpu, wall, runq
_FAST_FRAME = struct.Struct("=4xBddd")  # a whole fast reply frame: header skipped, then the reply
_FAST_FRAME_SIZE = _FAST_FRAME.size
_live: weakref.WeakSet[ProcessWorker] = weakref.WeakSet()


_managers: weakref.WeakSet[threading.Thread] = weakref.WeakSet()  # every worker's executor thread, until it ends


def _kill_all_at_exit() -> None:
    # Runs before concurrent.futures joins its executor threads at interpreter exit;
    # without it a never-closed vector env would hang the interpreter on exit.
    for w in list(_live):
        w.kill()
    # Let each executor's thread see its process die and close its wakeup pipe before
    # concurrent.futures' own exit hook writes to that pipe: otherwise the two race and the
    # hook prints "OSError: [Errno 9] Bad file descriptor" (an executor thread that closed
    # the pipe between the hook's closed-check and its write). All of them, not only those of
    # workers still live: a close cut short (a second Ctrl-C: killed, their stop() cancelled)
    # leaves threads still reaping processes that are no longer tracked as workers.
    for thread in list(_managers):
        if thread is not threading.current_thread():
            thread.join(timeout=5.0)


threading._register_atexit(_kill_all_at_exit)  # type: ignore[attr-defined]


def get_context(name: str | None) -> Any:
    """The multiprocessing context for workers; ``fork`` is refused (see README)."""
    from ..errors import ConfigError

    name = name or ("forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn")
    if name == "fork":
        raise ConfigError(
            "context='fork' is not supported: forked workers inherit every other worker's pipes "
            "(a dead worker then hangs the parent) and are unsafe with threads; use 'forkserver' or 'spawn'"
        )
    try:
        ctx = mp.get_context(name)
    except ValueError as exc:
        raise ConfigError(f"unknown start method {name!r}: {exc}") from None
    if name == "forkserver":
        # Pre-import the worker's modules once in the fork server: new workers start in milliseconds.
        from multiprocessing import forkserver

        if getattr(forkserver._forkserver, "_forkserver_pid", None) is None:
            # The hook module first: it keeps children quiet whose parent stopped while they were being forked.
            ctx.set_forkserver_preload(["aiovec.backends.forkserver_hook", "aiovec.worker", "numpy", "gymnasium"])
    return ctx


def start_forkserver(name: str | None) -> None:
    """Start the fork server now, if ``name`` resolves to it and it is not running: its preload imports
    (~0.2 s) then run in it while the caller does other work, such as building env 0 to learn the spaces.
    Without this, the first worker start waits for them after that work."""
    ctx = get_context(name)
    if ctx.get_start_method() == "forkserver":
        from multiprocessing import forkserver

        forkserver.ensure_running()


class ProcessWorker(WorkerHandle):
    """A worker process; see the module docstring."""

    def __init__(self, worker_id: int, ctx: Any, buffers: SharedBuffers, autoreset_mode: str, spin_s: float, host_options: dict,
                 on_reply: ReplyCallback, on_exit: ExitCallback) -> None:
        self.worker_id = worker_id
        self._loop = asyncio.get_running_loop()
        self._on_reply = on_reply
        self._on_exit = on_exit
        self._exited = False
        self._closing = False
        self._eof = False  # the worker's end closed: nothing more to read
        self._reading = False  # within _on_readable (a reply handler may poll this worker again)
        self.pid: int | None = None
        self.exitcode: int | None = None
        parent_conn, child_conn = ctx.Pipe(duplex=True)
        self._conn = parent_conn
        self._executor: ProcessPoolExecutor | None = None  # made in the launch thread (its queues' semaphores take ms)
        self._served = self._loop.create_future()  # resolves (never fails) when serve ends, however
        self._started = self._loop.create_future()  # resolves once the process exists
        self._serve: Future | None = None
        self._process: Any = None
        self._manager: threading.Thread | None = None  # the executor's thread; it reaps the process
        self._kill_pending = False
        self._fd = parent_conn.fileno()
        os.set_blocking(self._fd, False)
        self._rbuf = b""
        self._schemas: dict[int, tuple] = {}  # info schemas this worker numbered (see protocol.records_reply)
        self._wbuf = bytearray()  # commands sent before the process exists wait in the socket
        self._loop.add_reader(self._fd, self._on_readable)
        _live.add(self)
        # Starting a process blocks (the fork server forks and answers with the pid): do it
        # in a short-lived thread so the event loop never waits for it.
        threading.Thread(
            target=self._launch, args=(ctx, buffers, child_conn, (autoreset_mode, spin_s, host_options)), name="aiovec-spawn",
            daemon=True,
        ).start()

    def _launch(self, ctx: Any, buffers: SharedBuffers, child_conn: Any, args: tuple) -> None:
        executor = serve = process = manager = None
        error: BaseException | None = None
        try:
            # Building the executor creates its queues' named semaphores (and, the first time, starts
            # multiprocessing's resource tracker): milliseconds that must not be the event loop's.
            executor = ProcessPoolExecutor(max_workers=1, mp_context=ctx, initializer=worker_side.initialize,
                                           initargs=(child_conn, buffers))
            serve = executor.submit(worker_side.serve, *args)
            process = next(iter(executor._processes.values()))  # type: ignore[attr-defined]
            manager = getattr(executor, "_executor_manager_thread", None)
            if manager is not None:
                _managers.add(manager)
        except BaseException as exc:
            error = exc
        finally:
            child_conn.close()  # the worker holds its own copy now; EOF then means "worker gone"
        try:
            self._loop.call_soon_threadsafe(self._launched, executor, serve, process, manager, error)
        except RuntimeError:  # the loop is gone: nobody will use this worker
            if process is not None:
                os.kill(process.pid, signal.SIGKILL)

    def _launched(self, executor: ProcessPoolExecutor | None, serve: Future | None, process: Any, manager: threading.Thread | None,
                  error: BaseException | None) -> None:
        if self._exited:  # stopped while it was starting: it must not outlive that
            if process is not None:
                try:
                    os.kill(process.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            if executor is not None:
                executor.shutdown(wait=False, cancel_futures=True)
            return
        self._executor = executor
        self._serve, self._process, self._manager = serve, process, manager
        if process is not None:
            self.pid = process.pid
        if not self._started.done():
            self._started.set_result(None)
        if error is not None or serve is None:
            self._finish(f"could not start the worker process: {type(error).__name__}: {error}", crashed=True)
            return
        # Weakly: the executor's thread holds this callback, and must not keep the whole
        # vector env alive (an env nobody closed is cleaned up when it is garbage-collected).
        ref = weakref.ref(self)
        serve.add_done_callback(lambda fut: (w := ref()) is not None and w._serve_done_threadsafe(fut))
        if self._kill_pending:
            self.kill()

    # -- hot path -----------------------------------------------------------------------
    # Frames are multiprocessing's (a 4-byte big-endian length, then the payload), so the
    # worker side keeps plain Connection.recv_bytes/send_bytes. The parent's end is
    # non-blocking: a write never stalls the loop (leftovers wait for add_writer) and one
    # read may carry several replies.
    def send(self, msg: tuple[Any, ...] | bytes) -> None:
        if self._exited:
            return
        if msg is P.STEP_SHARD:
            frame = _STEP_SHARD_FRAME
        else:
            payload = P.encode(msg)
            frame = _HEADER.pack(len(payload)) + payload
        if self._wbuf:
            self._wbuf += frame
            return
        try:
            n = os.write(self._fd, frame)
        except BlockingIOError:
            n = 0
        except OSError:
            return  # the worker is gone; its exit is reported through on_exit
        if n < len(frame):
            self._wbuf = bytearray(frame[n:])
            self._loop.add_writer(self._fd, self._flush)

    def _flush(self) -> None:
        try:
            n = os.write(self._fd, self._wbuf)
        except BlockingIOError:
            return
        except OSError:
            n = len(self._wbuf)
        del self._wbuf[:n]
        if not self._wbuf:
            self._loop.remove_writer(self._fd)

    def poll(self) -> None:
        if not self._exited and not self._eof:
            self._on_readable()

    def _on_readable(self) -> None:
        if self._reading:  # polled again from a reply handler of this very read: the outer read carries on
            return
        self._reading = True
        try:
            self._read()
        finally:
            self._reading = False

    def _read(self) -> None:
        try:
            data = os.read(self._fd, 1 << 16)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._eof = True
            self._loop.remove_reader(self._fd)
            if not self._closing:
                # Died (or is dying): the executor reports how, via the serve future.
                self._loop.call_later(2.0, self._force_exit_report)
            return
        fast = self.on_step_timing
        if len(data) == _FAST_FRAME_SIZE and data[4] == P.FAST_MARK and not self._rbuf and fast is not None:
            _, cpu, wall, runq = _FAST_FRAME.unpack(data)  # the hot path: one step reply without infos or errors
            fast(cpu, wall, runq, None)
            return
        buf = self._rbuf + data if self._rbuf else data
        view, pos, end = memoryview(buf), 0, len(buf)
        while end - pos >= 4:
            size = _HEADER.unpack_from(buf, pos)[0]
            if end - pos - 4 < size:
                break
            frame = view[pos + 4 : pos + 4 + size]
            pos += 4 + size
            mark = frame[0]
            if fast is not None and mark == P.FAST_MARK:  # the hot path: a step without infos or errors
                _, cpu, wall, runq = _FAST.unpack(frame)
                fast(cpu, wall, runq, None)
            elif fast is not None and mark == P.RECORDS_MARK:  # a step whose infos came as records
                timing, infos = P.decode_records(frame, self._schemas)
                fast(*timing, infos)
            else:
                self._on_reply(decode_reply(frame, self._schemas))
            if self._exited:
                return
        self._rbuf = buf[pos:] if pos < end else b""

    # -- lifetime -----------------------------------------------------------------------
    @property
    def alive(self) -> bool:
        return not self._exited and not self._eof  # its end closed: dead or dying, the exit report on its way

    def _serve_done_threadsafe(self, fut: Future) -> None:
        try:
            self._loop.call_soon_threadsafe(self._serve_done, fut)
        except RuntimeError:
            pass  # loop already closed; close() or the atexit hook cleans up

    def _serve_done(self, fut: Future) -> None:
        if not self._served.done():
            self._served.set_result(None)
        if self._exited:
            return
        exc = fut.exception()
        tb = None
        if exc is not None and exc.__cause__ is not None:
            tb = getattr(exc.__cause__, "tb", None)  # concurrent.futures' _RemoteTraceback
        if exc is not None:
            self.kill()  # serve raised (or the process died): make sure it is gone
        self._finish(tb if exc is not None else None, crashed=exc is not None)

    def _force_exit_report(self) -> None:
        # The pipe closed but the executor did not notice within 2 s: kill and report.
        if not self._exited:
            self.kill()
            self._finish(None, crashed=True)

    def _finish(self, tb: str | None, crashed: bool) -> None:
        if self._exited:
            return
        self._exited = True
        try:
            self._loop.remove_reader(self._fd)
            if self._wbuf:
                self._loop.remove_writer(self._fd)
        except Exception:
            pass
        self._conn.close()
        # The executor's management thread reaps the process; wait for it (its process is
        # gone or going, so this is quick) rather than racing it for the exit status.
        thread = self._manager
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
        if thread is not None and not self._closing:
            thread.join(timeout=2.0)  # crash path: the thread is finishing already
        if self._process is not None and (thread is None or not thread.is_alive()):
            self.exitcode = self._process.exitcode
        _live.discard(self)
        if crashed or not self._closing:
            self._on_exit(self.exitcode, tb)

    def kill(self) -> None:
        if self.pid is None:
            self._kill_pending = True  # still starting: killed as soon as it exists
            return
        if not self._exited:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

    async def stop(self, grace: float) -> None:
        """Called after CLOSE was sent (or the worker died): wait, then kill, then reap."""
        self._closing = True
        if not self._started.done():
            await wait_done(self._started, grace)
        if self._serve is None:  # never started (or could not): nothing to wait for
            self._finish(None, crashed=False)
            return
        if not self._exited:
            if not await wait_done(self._served, grace):
                self.kill()
        if not self._exited:
            # serve returned; let the executor tell its process to exit, within the grace period.
            self._executor.shutdown(wait=False)
            if not await _wait_exit(self._loop, self._process, grace):
                self.kill()
            self._finish(None, crashed=False)
        # close() returns only once the executor's thread (which holds the queues) is gone. The
        # process is dead or exiting by now, so this is quick, but it gets its own bound: a short
        # close_timeout must not cut it off on a loaded machine.
        thread = self._manager
        deadline = self._loop.time() + max(grace, 5.0)
        while thread is not None and thread.is_alive() and self._loop.time() < deadline:
            await asyncio.sleep(0.005)
        if thread is not None and not thread.is_alive() and self._process is not None:
            self.exitcode = self._process.exitcode
        # Drop the queues (and their named semaphores) now: the executor, its finished thread
        # object and its Process (through its args) all still reference them.
        self._executor = None  # type: ignore[assignment]
        self._manager = None
        self._serve = None
        self._process = None  # its args are the executor's queues


async def _wait_exit(loop: asyncio.AbstractEventLoop, process: Any, timeout: float) -> bool:
    """Await a process's exit by watching its sentinel fd (no polling, no thread)."""
    fut = loop.create_future()
    fd = process.sentinel

    def ready() -> None:
        loop.remove_reader(fd)
        if not fut.done():
            fut.set_result(None)

    loop.add_reader(fd, ready)
    try:
        return await wait_done(fut, timeout)
    finally:
        loop.remove_reader(fd)


class ProcessBackend(Backend):
    """The default backend: one process per worker, shared memory, fd wake-ups."""

    name = "process"
    can_spin = True

    def __init__(self, ctx: Any, buffers: SharedBuffers, autoreset_mode: str, spin_s: float = 0.0,
                 host_options: dict | None = None) -> None:
        self.host_options = host_options or {}
        self.ctx = ctx
        self.buffers = buffers
        self.autoreset_mode = autoreset_mode
        self.spin_s = spin_s  # for workers started from now on; running ones get a TUNE command

    def start_worker(self, worker_id: int, on_reply: ReplyCallback, on_exit: ExitCallback) -> WorkerHandle:
        return ProcessWorker(worker_id, self.ctx, self.buffers, self.autoreset_mode, self.spin_s, self.host_options, on_reply, on_exit)
