"""Waiting for state in tests: poll a condition with a deadline, never a fixed sleep.

``eventually`` takes a plain predicate (in-process state); ``poll_until`` takes a coroutine probe (state
behind an API) and returns its first truthy result. Both fail with ``AssertionError`` after the timeout.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


async def eventually(predicate: Callable[[], bool], timeout: float = 5.0, interval: float = 0.005) -> None:
    """Poll ``predicate`` until it holds; ``AssertionError`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not reached within {timeout}s")
        await asyncio.sleep(interval)


async def poll_until(probe: Callable[[], Awaitable[T]], timeout: float, what: str = "") -> T:
    """Poll ``probe`` every 20 ms until it returns a truthy value; fail with the last value after ``timeout``."""
    deadline = time.monotonic() + timeout
    last: T | None = None
    while time.monotonic() < deadline:
        last = await probe()
        if last:
            return last
        await asyncio.sleep(0.02)
    raise AssertionError(f"timed out after {timeout}s waiting for {what or probe}: last={last!r}")


def wait_until(probe: Callable[[], T], timeout: float, message: str = "") -> T:
    """Blocking form for tests that drive child processes: poll ``probe`` every 20 ms until it returns a truthy
    value (returned); ``AssertionError`` with ``message`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {message or probe}")
        time.sleep(0.02)
