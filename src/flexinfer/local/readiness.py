"""Readiness detection: probe a model server's health endpoint with a fast backoff until it answers 2xx.

Probes start 2 ms apart and back off to at most 25 ms, so a server is seen Ready within ~25 ms of being
ready; a refused connection costs microseconds. The wait ends early if the process exits (``ServerExited``)
and is bounded by a deadline (``NotReady``). A probe is a plain HTTP/1.1 GET over an asyncio stream (no
client session to set up). Used by ``flexinfer.local.engine``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass

FIRST_DELAY = 0.002
MAX_DELAY = 0.025
BACKOFF = 1.5
PROBE_TIMEOUT = 2.0


class NotReady(Exception):
    """The server did not answer its health check before the deadline."""


class ServerExited(Exception):
    """The server process exited before it became ready."""


@dataclass(frozen=True)
class ProbeResult:
    """``connected``: something accepted the connection; ``status``: the HTTP status, if one was read."""

    connected: bool
    status: int | None = None

    @property
    def ready(self) -> bool:
        return self.status is not None and 200 <= self.status < 300


async def probe(host: str, port: int, path: str, timeout: float = PROBE_TIMEOUT) -> ProbeResult:
    """One GET ``path``; never raises for network trouble (that is ``connected=False`` or ``status=None``)."""
    try:
        async with asyncio.timeout(timeout):
            reader, writer = await asyncio.open_connection(host, port)
    except (OSError, TimeoutError):
        return ProbeResult(connected=False)
    try:
        writer.write(f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nConnection: close\r\n\r\n".encode("ascii"))
        await writer.drain()
        async with asyncio.timeout(timeout):
            line = await reader.readline()
        return ProbeResult(connected=True, status=parse_status_line(line))
    except (OSError, TimeoutError):
        return ProbeResult(connected=True)
    finally:
        writer.close()


def parse_status_line(line: bytes) -> int | None:
    """The status code of ``HTTP/1.1 200 OK``; ``None`` when it is not an HTTP status line."""
    parts = line.split(None, 2)
    if len(parts) >= 2 and parts[0].startswith(b"HTTP/") and parts[1].isdigit():
        return int(parts[1])
    return None


def delays(first: float = FIRST_DELAY, cap: float = MAX_DELAY, factor: float = BACKOFF) -> list[float]:
    """The start of the backoff sequence (for documentation and tests); the last value repeats."""
    out, delay = [first], first
    while delay < cap:
        delay = min(delay * factor, cap)
        out.append(delay)
    return out


async def wait_ready(host: str, port: int, path: str, *, timeout: float, exited: asyncio.Event,
                     on_connected: Callable[[], None] | None = None) -> float:
    """Probe until 2xx; returns the seconds waited. Raises ``ServerExited`` / ``NotReady``.

    ``on_connected`` is called once, when the server first accepts a connection (it is up, maybe loading).
    """
    start = time.monotonic()
    deadline = start + timeout
    delay, connected = FIRST_DELAY, False
    while True:
        if exited.is_set():
            raise ServerExited()
        left = deadline - time.monotonic()
        if left <= 0:
            raise NotReady()
        result = await probe(host, port, path, min(PROBE_TIMEOUT, left))
        if result.connected and not connected:
            connected = True
            if on_connected is not None:
                on_connected()
        if result.ready:
            return time.monotonic() - start
        await sleep_or_exit(min(delay, max(0.0, deadline - time.monotonic())), exited)
        delay = min(delay * BACKOFF, MAX_DELAY)


async def sleep_or_exit(seconds: float, exited: asyncio.Event) -> None:
    """Sleep ``seconds`` but wake as soon as the process exits."""
    if exited.is_set():
        return
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            await exited.wait()
