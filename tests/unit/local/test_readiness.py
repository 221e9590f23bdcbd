"""Readiness probing: status-line parsing, backoff shape, ready/exit/timeout outcomes against real sockets."""

from __future__ import annotations

import asyncio
import itertools

import pytest
from aiohttp import web

from flexinfer.local.ports import probe_free_port
from flexinfer.local.readiness import (
    FIRST_DELAY,
    MAX_DELAY,
    NotReady,
    ServerExited,
    delays,
    parse_status_line,
    probe,
    sleep_or_exit,
    wait_ready,
)


def test_parse_status_line() -> None:
    assert parse_status_line(b"HTTP/1.1 200 OK\r\n") == 200
    assert parse_status_line(b"HTTP/1.0 503 Service Unavailable\r\n") == 503
    assert parse_status_line(b"garbage\r\n") is None
    assert parse_status_line(b"") is None


def test_backoff_starts_at_2ms_and_caps_at_25ms() -> None:
    sequence = delays()
    assert sequence[0] == FIRST_DELAY == 0.002
    assert sequence[-1] == MAX_DELAY == 0.025
    assert all(b >= a for a, b in itertools.pairwise(sequence))


async def serve(ready: asyncio.Event) -> tuple[web.AppRunner, int]:
    async def health(_: web.Request) -> web.Response:
        return web.json_response({}, status=200 if ready.is_set() else 503)

    app = web.Application()
    app.router.add_get("/health", health)
    runner = web.AppRunner(app)
    await runner.setup()
    port = probe_free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner, port


async def test_probe_outcomes() -> None:
    port = probe_free_port()
    assert not (await probe("127.0.0.1", port, "/health")).connected
    ready = asyncio.Event()
    runner, port = await serve(ready)
    try:
        result = await probe("127.0.0.1", port, "/health")
        assert result.connected and result.status == 503 and not result.ready
        ready.set()
        assert (await probe("127.0.0.1", port, "/health")).ready
    finally:
        await runner.cleanup()


async def test_wait_ready_reports_connection_then_returns_when_healthy() -> None:
    ready = asyncio.Event()
    runner, port = await serve(ready)
    connected = asyncio.Event()
    try:
        waiter = asyncio.create_task(wait_ready("127.0.0.1", port, "/health", timeout=10, exited=asyncio.Event(),
                                                on_connected=connected.set))
        await asyncio.wait_for(connected.wait(), 5)
        assert not waiter.done()
        ready.set()
        assert await asyncio.wait_for(waiter, 5) >= 0
    finally:
        await runner.cleanup()


async def test_wait_ready_stops_when_the_process_exits() -> None:
    exited = asyncio.Event()
    waiter = asyncio.create_task(wait_ready("127.0.0.1", probe_free_port(), "/", timeout=10, exited=exited))
    await asyncio.sleep(0)  # one loop turn: the exit comes after the wait began (the order under test)
    exited.set()
    with pytest.raises(ServerExited):
        await asyncio.wait_for(waiter, 5)


async def test_wait_ready_times_out() -> None:
    with pytest.raises(NotReady):
        await wait_ready("127.0.0.1", probe_free_port(), "/", timeout=0.05, exited=asyncio.Event())


async def test_a_cancel_in_the_tick_the_process_exits_is_not_swallowed() -> None:
    """Python 3.11's ``asyncio.wait_for`` drops a cancellation that lands in the same loop tick as the awaited
    event (python/cpython#86296); a start cancelled then would keep waiting for a server nobody wants."""
    exited = asyncio.Event()
    waiter = asyncio.create_task(sleep_or_exit(10, exited))
    await asyncio.sleep(0)  # one loop turn: the waiter is now parked on the event
    exited.set()
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
