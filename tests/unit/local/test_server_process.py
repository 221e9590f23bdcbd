"""``ServerProcess`` shutdown paths that must never hang: the exit watcher cancelled (what ``asyncio.run``
does to every task when ``serve`` is interrupted), a hurried stop, and the parent-death signal."""

from __future__ import annotations

import asyncio
import os
import signal
import sys

from flexinfer.local.logs import ModelLog
from flexinfer.local.process import ServerProcess, last_server_line
from support.local_processes import alive
from support.polling import eventually

SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)"]
LINGERING = [sys.executable, "-c", (
    "import signal, sys, time\n"
    "def term(*_):\n"  # like uvicorn: wait for requests still running (here: abandoned, 30 s of work)
    "    signal.signal(signal.SIGINT, lambda *_: sys.exit(0))\n"  # ... unless interrupted again
    "    time.sleep(30)\n"
    "    sys.exit(0)\n"
    "signal.signal(signal.SIGTERM, term)\n"
    "print('ready', flush=True)\n"
    "time.sleep(60)\n")]
STUBBORN = [sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "print('ready', flush=True); time.sleep(60)"]


async def test_terminate_ends_after_every_other_task_was_cancelled() -> None:
    process = await ServerProcess.spawn(SLEEPER, os.environ, ModelLog())
    me = asyncio.current_task()
    for task in asyncio.all_tasks():
        if task is not me:
            task.cancel()  # the log pump and the exit watcher, as asyncio.run's final cancellation does
    await asyncio.sleep(0)  # one loop turn delivers those cancellations, as asyncio.run does before it returns
    async with asyncio.timeout(5):
        assert await process.terminate(2.0) == -signal.SIGTERM
    assert not alive(process.pid)


async def test_terminate_does_not_wait_the_grace_for_work_nobody_waits_for() -> None:
    """A server only stops once its requests are over, so what it still finishes on SIGTERM was abandoned by
    its client; the follow-up SIGINT makes it quit instead of holding the stop for the whole grace."""
    output = ModelLog()
    process = await ServerProcess.spawn(LINGERING, os.environ, output)
    await eventually(lambda: "ready" in output.tail(5), 10)
    started = asyncio.get_running_loop().time()
    assert await process.terminate(10.0) == 0
    assert asyncio.get_running_loop().time() - started < 5


async def test_hurry_kills_a_server_that_ignores_sigterm_after_the_grace() -> None:
    output = ModelLog()
    process = await ServerProcess.spawn(STUBBORN, os.environ, output)
    await eventually(lambda: "ready" in output.tail(5), 10)
    process.hurry(0.2)
    async with asyncio.timeout(5):
        assert await process.wait() == -signal.SIGKILL


async def test_a_child_started_after_its_parent_died_ends_itself() -> None:
    """The parent-death signal is armed in the child; a parent that is already gone is not waited for."""
    from flexinfer.local.process import die_with_parent

    preexec = die_with_parent(os.getpid() + 1_000_000)  # a parent that is not ours
    assert preexec is not None
    proc = await asyncio.create_subprocess_exec(*SLEEPER, preexec_fn=preexec)
    async with asyncio.timeout(5):
        assert await proc.wait() == -signal.SIGKILL


def test_last_server_line_is_the_servers_own_last_words() -> None:
    started = "--- flexinfer: starting llama-server --bogus-flag"
    exited = "--- flexinfer: process 7 exited with status 1"
    assert last_server_line([started, "error: invalid argument: --bogus-flag", "  ", exited]) == (
        "error: invalid argument: --bogus-flag")
    assert last_server_line([started, exited]) is None
    assert last_server_line(["x" * 20], limit=10) == "x" * 9 + "…"
