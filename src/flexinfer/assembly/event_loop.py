"""The event loop the long-running servers (``serve``, ``proxy``) run on: uvloop where it is installed (a
dependency on Linux and macOS), else asyncio's default loop, with the garbage collector tuned for a proxy.
Called by ``local.run_local`` and ``proxy.run_proxy``.

Garbage collection: the proxy's per-request objects are freed by reference counting, so the cyclic
collector mostly walks live objects for nothing. With CPython's default thresholds (a young collection every
700 allocations) the objects of requests in flight survive into the oldest generation, and full collections
then walk every waiting request's objects: with 5,000 requests queued for a cold model, 7 full collections
of ~180 ms each, ~40 % of the process's CPU while the queue drained. ``run`` freezes what start-up created
(never walked again) and collects the young generation every ``GC_THRESHOLDS[0]`` allocations, so most
request objects die before any collection sees them (docs/performance.md). The price: what a reference cycle
keeps alive waits for that young collection (many minutes at a few requests a second), so the request and swap
paths must make no cycles (a connection and its parser holding each other, a timer closure that re-arms itself:
docs/performance.md, "Soak"; the tests use ``tests/support/garbage.py``).

Allocator: on glibc, ``run`` keeps freed memory in the process (``mallopt``: trim threshold
``TRIM_THRESHOLD``, mmap threshold ``MMAP_THRESHOLD``) unless the operator set glibc's own ``MALLOC_*_`` or
``GLIBC_TUNABLES`` variables. glibc's defaults hand every large freed block back to the kernel, so each large
request body (its bytes, the decoded text, the parsed prompt) was faulted in page by page again: a 1 MB prompt
cost ~900 page faults and more system than user time. The price is up to ``TRIM_THRESHOLD`` bytes of freed
memory kept resident after a burst of large bodies.
"""

from __future__ import annotations

import asyncio
import ctypes
import gc
from collections.abc import Callable, Coroutine, Mapping
from typing import Any, TypeVar

T = TypeVar("T")
GC_THRESHOLDS = (50_000, 20, 10)
"""``gc.set_threshold`` while a server runs (CPython's default: 700, 10, 10)."""
TRIM_THRESHOLD = 64 << 20
MMAP_THRESHOLD = 32 << 20
"""glibc's largest allowed mmap threshold on 64-bit systems."""
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_GLIBC_DEFAULT = 128 << 10
_OPERATOR_TUNABLES = ("GLIBC_TUNABLES", "MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TOP_PAD_")


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """``uvloop.new_event_loop`` when uvloop is importable, else ``None`` (asyncio's default)."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def set_allocator(trim: int, mmap: int) -> bool:
    """Set glibc's trim and mmap thresholds; False where ``mallopt`` is not available (not glibc)."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(_M_TRIM_THRESHOLD, trim)) and bool(mallopt(_M_MMAP_THRESHOLD, mmap))


def run(main: Coroutine[Any, Any, T], env: Mapping[str, str]) -> T:
    """``asyncio.run(main)`` on the fastest available loop, with the server's collector and allocator settings
    (restored when ``main`` returns; the allocator's only where ``env`` has no glibc tunables)."""
    previous = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)
    allocator = not any(name in env for name in _OPERATOR_TUNABLES) and set_allocator(TRIM_THRESHOLD, MMAP_THRESHOLD)
    try:
        with asyncio.Runner(loop_factory=loop_factory()) as runner:
            return runner.run(main)
    finally:
        gc.set_threshold(*previous)
        gc.unfreeze()
        if allocator:
            set_allocator(_GLIBC_DEFAULT, _GLIBC_DEFAULT)
