"""``aiovec.run``'s Ctrl-C handler, press by press, on a real loop and task (no signal is sent: the handler is
called as Python calls it; the scripts in ``test_exits.py`` send real ones)."""

from __future__ import annotations

import asyncio
import signal
import threading
from collections.abc import Iterator

import pytest

import aiovec
from aiovec import ctrlc as C


@pytest.fixture(autouse=True)
def python_default_sigint() -> Iterator[None]:
    """Python's own handler, as an interactive script starts with (a shell's background job inherits SIG_IGN)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def press(handler: C.CtrlC) -> bool:
    """Call the handler as the interpreter does on SIGINT; whether it raised KeyboardInterrupt."""
    try:
        handler(signal.SIGINT, None)
    except KeyboardInterrupt:
        return True
    return False


def test_presses_while_running_cancel_twice_then_raise() -> None:
    seen: list[str] = []

    async def main(handler: C.CtrlC) -> None:
        handler.start(asyncio.get_running_loop(), asyncio.current_task())
        assert not press(handler)  # first: a cancellation, delivered at the next await
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            seen.append("first cancelled")
        assert not press(handler)  # second: cancelled again
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            seen.append("second cancelled")
        seen.append("third raised" if press(handler) else "third did not raise")

    handler = C.CtrlC()
    asyncio.run(main(handler))
    assert seen == ["first cancelled", "second cancelled", "third raised"]


def test_presses_after_the_main_task_ended_are_counted_until_the_third() -> None:
    async def main() -> None:
        return None

    async def run(handler: C.CtrlC) -> None:
        task = asyncio.ensure_future(main())
        handler.start(asyncio.get_running_loop(), task)
        await task
        assert not press(handler) and not press(handler)  # the runner closing: nothing to cancel, nothing raised
        assert press(handler)

    asyncio.run(run(C.CtrlC()))


def test_a_press_before_the_main_task_started_raises_at_once() -> None:
    handler = C.CtrlC()
    handler.install()
    assert press(handler)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # given back


def test_after_an_interrupted_run_presses_are_counted_for_a_while_then_raise(monkeypatch: pytest.MonkeyPatch) -> None:
    handler = C.CtrlC()
    handler.install()
    handler.finish(interrupted=True)
    assert signal.getsignal(signal.SIGINT) is handler  # still held while the program exits
    assert not press(handler)
    monkeypatch.setattr(C, "QUIET_AFTER", 0.0)  # the window passed
    assert press(handler)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_run_that_was_not_interrupted_gives_sigint_back() -> None:
    async def main() -> int:
        assert isinstance(signal.getsignal(signal.SIGINT), C.CtrlC)
        await asyncio.sleep(0)
        return 7

    async def boom() -> None:
        raise RuntimeError("boom")

    before = signal.getsignal(signal.SIGINT)
    assert before is signal.default_int_handler
    assert aiovec.run(main()) == 7
    assert signal.getsignal(signal.SIGINT) is before
    with pytest.raises(RuntimeError, match="boom"):
        aiovec.run(boom())
    assert signal.getsignal(signal.SIGINT) is before


def _mine(signum: int, frame: object) -> None:
    pass


@pytest.mark.parametrize("theirs", [_mine, signal.SIG_IGN], ids=["own handler", "ignored"])
def test_a_handler_the_application_installed_is_left_alone(theirs: object) -> None:
    async def main() -> object:
        return signal.getsignal(signal.SIGINT)

    signal.signal(signal.SIGINT, theirs)
    assert aiovec.run(main()) is theirs
    assert signal.getsignal(signal.SIGINT) is theirs


def test_only_the_main_thread_installs() -> None:
    seen: list[bool] = []
    t = threading.Thread(target=lambda: seen.append(C.CtrlC.can_install()))
    t.start()
    t.join()
    assert seen == [False] and C.CtrlC.can_install()


def test_presses_while_a_close_waits_hurry_it_twice_then_raise() -> None:
    hurried: list[int] = []
    raised = []
    with C.hurrying(lambda: hurried.append(1)) as presses:
        handler = signal.getsignal(signal.SIGINT)
        for _ in range(3):
            try:
                handler(signal.SIGINT, None)
            except KeyboardInterrupt:
                raised.append(presses.count)
    assert hurried == [1, 1] and raised == [3] and presses.count == 3
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # given back
    assert C.owe_interrupt(presses)
    try:
        raise RuntimeError("unwinding")
    except RuntimeError:
        assert not C.owe_interrupt(presses)  # an exception is being handled: no second traceback


def test_run_called_inside_a_run_fails_and_leaves_the_outer_runs_handler() -> None:
    async def inner() -> None:
        await asyncio.sleep(0)

    async def outer() -> bool:
        mine = signal.getsignal(signal.SIGINT)
        coro = inner()
        with pytest.raises(RuntimeError, match="running event loop"):
            aiovec.run(coro)
        coro.close()
        return signal.getsignal(signal.SIGINT) is mine and isinstance(mine, C.CtrlC)

    assert aiovec.run(outer())
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
