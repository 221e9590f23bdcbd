"""The event loop the long-running servers (``serve``, ``proxy``) run on: uvloop where it is installed (a
dependency on Linux and macOS), else asyncio's default loop, with the garbage collector tuned for a proxy.
Called by ``local.run_local`` and ``proxy.run_proxy``.

Garbage collection: the proxy's per-request objects are freed by reference counting, so the cyclic
collector mostly walks live objects for nothing. With CPython's default thresholds (a young collection every
700 allocations) the objects of requests in flight survive into the oldest generation, and full collections
then walk every waiting request's objects: with 5,000 requests queued for a cold model, 7 full collections
of ~180 ms each, ~40 % of the process's CPU while the queue drained. ``run`` freezes what start-up created
(never walked again) and collects the young generation every ``GC_THRESHOLDS[0]`` allocations, so most
request objects die before any collection sees them (docs/performance.md).
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")
GC_THRESHOLDS = (50_000, 20, 10)
"""``gc.set_threshold`` while a server runs (CPython's default: 700, 10, 10)."""


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """``uvloop.new_event_loop`` when uvloop is importable, else ``None`` (asyncio's default)."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def run(main: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(main)`` on the fastest available loop, with the server's collector settings (restored
    when ``main`` returns)."""
    previous = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)
    try:
        with asyncio.Runner(loop_factory=loop_factory()) as runner:
            return runner.run(main)
    finally:
        gc.set_threshold(*previous)
        gc.unfreeze()
