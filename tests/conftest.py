"""Hygiene for every test: a test that leaves an asyncio task, a thread or a child process behind fails.

The check runs after the test and every fixture it requested have been torn down (this autouse fixture is set up
first, so it is torn down last). What is left must be gone within a short grace, polled with a deadline: a task
that was cancelled needs a loop turn or two to finish, a thread that was told to stop needs a moment to return.
Only long-lived threads that libraries start once per process are allowed, by name.
"""

from __future__ import annotations

import asyncio
import contextlib
import glob
import os
import signal
import threading
import time
from collections.abc import AsyncIterator, Callable
from typing import TypeVar

import hypothesis  # noqa: F401  (see below)
import pytest

# hypothesis is imported here, at start-up, not lazily by its plugin's end-of-session summary: CPython 3.11.7
# raises "SystemError: AST constructor recursion depth mismatch" from pytest's assertion rewriter when that late
# import runs after some integration tests (CPython gh-106905, fixed in 3.11.8), failing a green session.

# Threads that libraries start once per process and keep for its lifetime; they are not a test's to stop.
LONG_LIVED_THREAD_PREFIXES = (
    "asyncio_",  # the loop's default executor; shut down below, before the check
)
GRACE_S = 2.0
T = TypeVar("T")


def _threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.is_alive() and not t.name.startswith(LONG_LIVED_THREAD_PREFIXES)}


def _children(pid: int | None = None) -> set[int]:
    """Live descendants of this test process, by pid, from ``/proc`` (cheap: no scan of every process)."""
    found: set[int] = set()
    for tasks in glob.glob(f"/proc/{pid or os.getpid()}/task/*/children"):
        try:
            with open(tasks) as listing:
                direct = {int(child) for child in listing.read().split()}
        except OSError:
            continue
        for child in direct:
            if _state(child) not in ("", "Z"):
                found |= {child} | _children(child)
    return found


def _state(pid: int) -> str:
    """The process state letter from ``/proc/PID/stat`` ("" once it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""


def _describe_children(pids: set[int]) -> list[str]:
    described = []
    for pid in sorted(pids):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
                command = cmdline.read().replace(b"\0", b" ").decode(errors="replace")
            described.append(f"{pid}: {command[:200]}")
        except OSError:
            continue
    return described


async def _left_after_grace(now: Callable[[], set[T]], before: set[T]) -> set[T]:
    """Poll ``now()`` until nothing in it is outside ``before``, or the grace ends; return what is left."""
    deadline = time.monotonic() + GRACE_S
    while True:
        left = now() - before
        if not left or time.monotonic() > deadline:
            return left
        await asyncio.sleep(0.01)


@pytest.fixture(autouse=True)
async def no_leaks() -> AsyncIterator[None]:
    """Fail the test if it leaks asyncio tasks, threads or child processes."""
    threads_before, children_before = _threads(), _children()
    yield
    problems = []
    current = asyncio.current_task()
    tasks = await _left_after_grace(lambda: {t for t in asyncio.all_tasks() if t is not current}, set())
    for task in tasks:
        task.cancel()
    if tasks:
        problems.append(f"asyncio tasks still pending: {sorted(repr(t) for t in tasks)}")
    await asyncio.get_running_loop().shutdown_default_executor()
    threads = await _left_after_grace(_threads, threads_before)
    if threads:
        problems.append(f"threads still running: {sorted(t.name for t in threads)}")
    children = await _left_after_grace(_children, children_before)
    if children:
        problems.append(f"child processes still running: {_describe_children(children)}")
        for pid in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    if problems:
        pytest.fail("test leaked resources:\n  " + "\n  ".join(problems), pytrace=False)
