"""The event loop the long-running servers (``serve``, ``proxy``) run on: uvloop where it is installed (a
dependency on Linux and macOS), else asyncio's default loop. Called by ``local.run_local`` and
``proxy.run_proxy``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """``uvloop.new_event_loop`` when uvloop is importable, else ``None`` (asyncio's default)."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def run(main: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(main)`` on the fastest available loop."""
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        return runner.run(main)
