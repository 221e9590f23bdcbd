"""The proxy's upstream HTTP client against scripted servers on real sockets, on asyncio's loop and uvloop:
keep-alive reuse, streaming without coalescing, body framings, interim answers, stale connections, failures."""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import socket
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import pytest
import uvloop

from flexinfer.proxy.upstream_http import UpstreamBodyError, UpstreamConnectionError
from flexinfer.proxy.upstream_pool import UpstreamPool
from support.garbage import kinds, unreachable_cycles
from support.polling import eventually

Script = Callable[[asyncio.StreamReader, asyncio.StreamWriter, "Upstream"], Awaitable[None]]


class Upstream:
    """A raw TCP server running ``script`` per connection and recording the request heads it read."""

    def __init__(self, script: Script) -> None:
        self.script, self.connections, self.heads, self.bodies = script, 0, [], []
        self.server: asyncio.Server | None = None
        self.port = 0

    async def __aenter__(self) -> Upstream:
        self.server = await asyncio.start_server(self._connection, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *_: object) -> None:
        assert self.server is not None
        self.server.close()

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            await self.script(reader, writer, self)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def read_request(self, reader: asyncio.StreamReader) -> str:
        head = (await reader.readuntil(b"\r\n\r\n")).decode()
        self.heads.append(head)
        length = next((int(line.split(":")[1]) for line in head.split("\r\n")
                       if line.lower().startswith("content-length:")), 0)
        self.bodies.append(await reader.readexactly(length))
        return head


def on_both_loops(test: Callable[[], Coroutine[Any, Any, None]]) -> Callable[[str], None]:
    @pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
    def run(loop: str) -> None:
        (uvloop.run if loop == "uvloop" else asyncio.run)(asyncio.wait_for(test(), 20))

    run.__name__ = test.__name__
    return run


OK = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"


async def answer_every_request(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, up: Upstream) -> None:
    """An upstream script: ``OK`` to every request on the connection."""
    while True:
        await up.read_request(reader)
        writer.write(OK)


async def fetch(pool: UpstreamPool, port: int, method: str = "POST", body: bytes = b"{}") -> tuple[int, bytes]:
    response = await pool.request(method, "127.0.0.1", port, "/v1/chat/completions?x=1",
                                  headers=[("X-Request-ID", "r1")], body=body)
    data = b""
    while chunk := await response.read():
        data += chunk
    response.release()
    return response.status, data


@on_both_loops
async def test_keep_alive_connections_are_reused_and_requests_arrive_intact() -> None:
    big = b'{"p":"' + b"a" * 1_000_000 + b'"}'
    async with Upstream(answer_every_request) as up:
        pool = UpstreamPool(5.0)
        assert await fetch(pool, up.port) == (200, b"{}")
        assert await fetch(pool, up.port, body=big) == (200, b"{}")
        await pool.close()
    assert up.connections == 1
    assert up.heads[0].startswith("POST /v1/chat/completions?x=1 HTTP/1.1\r\n")
    assert f"Host: 127.0.0.1:{up.port}\r\n" in up.heads[0] and "X-Request-ID: r1\r\n" in up.heads[0]
    assert up.bodies == [b"{}", big]


@on_both_loops
async def test_a_chunked_stream_is_handed_over_chunk_by_chunk_as_it_arrives() -> None:
    release = asyncio.Event()

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, up: Upstream) -> None:
        await up.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
                     b"7\r\ndata: 1\r\n")
        await release.wait()  # the second chunk is only sent once the first was read
        writer.write(b"7\r\ndata: 2\r\n0\r\n\r\n")
        await reader.read()

    async with Upstream(script) as up:
        pool = UpstreamPool(5.0)
        response = await pool.request("POST", "127.0.0.1", up.port, "/", headers=[], body=b"{}")
        assert response.headers["Content-Type"] == "text/event-stream" and response.content_length is None
        assert await response.read() == b"data: 1"
        release.set()
        assert await response.read() == b"data: 2"
        assert await response.read() == b""
        response.release()
        await pool.close()


@on_both_loops
async def test_eof_delimited_bodies_interim_answers_and_head_requests() -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, up: Upstream) -> None:
        head = await up.read_request(reader)
        if head.startswith("HEAD"):
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n")
            await reader.read()
        elif "interim" in head:
            writer.write(b"HTTP/1.1 100 Continue\r\n\r\n" + OK)
            await reader.read()
        else:
            writer.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nuntil the end")

    async with Upstream(script) as up:
        pool = UpstreamPool(5.0)
        assert await fetch(pool, up.port) == (200, b"until the end")
        assert await fetch(pool, up.port, method="HEAD", body=b"") == (200, b"")
        response = await pool.request("POST", "127.0.0.1", up.port, "/interim", headers=[], body=b"{}")
        assert (response.status, await response.read()) == (200, b"{}")
        response.release()
        await pool.close()
    assert up.connections == 3  # none of these answers leaves a reusable connection but the last


@on_both_loops
async def test_a_keep_alive_connection_closed_by_the_server_is_replaced_transparently() -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, up: Upstream) -> None:
        await up.read_request(reader)
        writer.write(OK)
        await writer.drain()  # then close without saying so (an idle timeout on the model server)

    async with Upstream(script) as up:
        pool = UpstreamPool(5.0)
        for _ in range(3):
            assert await fetch(pool, up.port) == (200, b"{}")
        await pool.close()
    assert up.connections == 3 and len(up.bodies) == 3


@on_both_loops
async def test_failures_before_and_during_the_body_are_told_apart() -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, up: Upstream) -> None:
        await up.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly ten b")

    async with Upstream(script) as up:
        pool = UpstreamPool(5.0)
        response = await pool.request("POST", "127.0.0.1", up.port, "/", headers=[], body=b"{}")
        with pytest.raises(UpstreamBodyError):
            while await response.read():
                pass
        response.close()
        port = up.port
    with pytest.raises(UpstreamConnectionError):
        await pool.request("POST", "127.0.0.1", port, "/", headers=[], body=b"{}")
    await pool.close()



@on_both_loops
async def test_a_burst_shares_at_most_max_per_server_connections_and_hands_them_over() -> None:
    """Fifty requests at once with a limit of four: four connections, each reused, every request answered."""
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, up: Upstream) -> None:
        up.open = getattr(up, "open", 0) + 1  # type: ignore[attr-defined]
        up.peak = max(getattr(up, "peak", 0), up.open)  # type: ignore[attr-defined]
        try:
            while True:
                await up.read_request(reader)
                await asyncio.sleep(0.001)
                writer.write(OK)
        finally:
            up.open -= 1  # type: ignore[attr-defined]

    async with Upstream(script) as up:
        pool = UpstreamPool(5.0, max_per_server=4)
        answers = await asyncio.gather(*(fetch(pool, up.port) for _ in range(50)))
        await pool.close()
    assert answers == [(200, b"{}")] * 50
    assert up.connections == 4 and up.peak == 4  # type: ignore[attr-defined]


@on_both_loops
async def test_a_waiting_request_gets_the_place_of_a_closed_connection_or_of_one_that_gave_up() -> None:
    """Places are never lost: an abandoned wait, a connection the server closes, a failed exchange."""
    gate = asyncio.Event()

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, up: Upstream) -> None:
        head = await up.read_request(reader)
        if "slow" in head:
            await gate.wait()
        writer.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\n{}")
        await writer.drain()

    async with Upstream(script) as up:
        pool = UpstreamPool(5.0, max_per_server=1)
        slow = asyncio.create_task(pool.request("POST", "127.0.0.1", up.port, "/slow", headers=[], body=b"{}"))
        await eventually(lambda: up.connections == 1)
        abandoned = asyncio.create_task(fetch(pool, up.port))
        waiting = asyncio.create_task(fetch(pool, up.port))
        await asyncio.sleep(0.01)
        abandoned.cancel()
        assert not waiting.done()
        gate.set()
        response = await slow
        assert await response.read() == b"{}"
        response.release()  # "Connection: close": the connection goes, its place passes to the waiting one
        assert await waiting == (200, b"{}")
        assert [await fetch(pool, up.port) for _ in range(3)] == [(200, b"{}")] * 3
        await pool.close()
    assert up.connections == 5



@on_both_loops
async def test_places_are_never_lost_through_cancellations_closes_and_timeouts() -> None:
    """Requests abandoned at random points, connections the server closes with and without saying so:
    afterwards every place is usable again (a lost place would make the last requests wait out the connect
    timeout). The limit itself is checked above (here the server may still be noticing a close the client
    already made)."""
    rng = random.Random(7)

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, up: Upstream) -> None:
        while True:
            await up.read_request(reader)
            await asyncio.sleep(rng.choice((0, 0.001, 0.003)))
            ending = rng.random()
            if ending < 0.15:
                return  # gone without an answer
            writer.write(OK if ending < 0.7 else OK.replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n"))
            await writer.drain()
            if ending >= 0.7:
                return

    async def attempt() -> None:
        with contextlib.suppress(UpstreamConnectionError):
            await fetch(pool, up.port)

    async with Upstream(script) as up:
        pool = UpstreamPool(2.0, max_per_server=3)
        tasks = [asyncio.create_task(attempt()) for _ in range(80)]
        for task in rng.sample(tasks, 25):
            await asyncio.sleep(rng.choice((0, 0.001, 0.002)))
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        answered = 0
        for _ in range(12):  # sequential: each needs one place; none may wait for the connect timeout
            async with asyncio.timeout(1.5):
                with contextlib.suppress(UpstreamConnectionError):
                    await fetch(pool, up.port)
                    answered += 1
        assert answered > 0
        await pool.close()



@on_both_loops
async def test_a_connection_handed_to_a_request_abandoned_in_the_same_step_goes_to_the_next_one() -> None:
    async with Upstream(answer_every_request) as up:
        pool = UpstreamPool(0.5, max_per_server=1)
        first = await pool.request("POST", "127.0.0.1", up.port, "/", headers=[], body=b"{}")
        assert await first.read() == b"{}"
        abandoned = asyncio.create_task(fetch(pool, up.port))
        await asyncio.sleep(0)  # one step: it is now waiting for the only connection
        first.release()  # handed to the waiting request ...
        abandoned.cancel()  # ... which goes away before it could use it
        with pytest.raises(asyncio.CancelledError):
            await abandoned
        assert await fetch(pool, up.port) == (200, b"{}")  # the connection was passed on, not lost
        await pool.close()
    assert up.connections == 1


@on_both_loops
async def test_a_request_that_finds_no_free_connection_within_the_connect_timeout_fails_clearly() -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, up: Upstream) -> None:
        await up.read_request(reader)
        await reader.read()  # never answers

    async with Upstream(script) as up:
        pool = UpstreamPool(0.2, max_per_server=1)
        stuck = asyncio.create_task(pool.request("POST", "127.0.0.1", up.port, "/", headers=[], body=b"{}"))
        await eventually(lambda: bool(up.heads))
        with pytest.raises(UpstreamConnectionError, match=r"no free connection to the model server within 0\.2s"):
            await pool.request("POST", "127.0.0.1", up.port, "/", headers=[], body=b"{}")
        stuck.cancel()
        with pytest.raises(asyncio.CancelledError):
            await stuck
        await pool.close()


async def test_a_stream_with_lower_case_headers_still_ends_with_an_sse_error_event_when_cut(make_proxy):
    """Servers such as uvicorn send lower-case header names; the reply must still know it is an event stream."""

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, up: Upstream) -> None:
        await up.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
                     b"d\r\ndata: first\n\n\r\n")
        await writer.drain()  # then the server dies mid-stream

    async with Upstream(script) as up:
        proxy = await make_proxy()
        proxy.activator.base_url = f"http://127.0.0.1:{up.port}"
        request = proxy.session.post(proxy.url + "/v1/chat/completions", json={"model": "alpha", "stream": True})
        async with request as response:
            body = await response.content.read()
    events = [event for event in body.decode().split("\n\n") if event]
    assert events[0] == "data: first"
    assert json.loads(events[-1].removeprefix("data: "))["error"]["code"] == "bad_gateway"


def _syn_sent_to(port: int) -> bool:
    """A socket of this machine is in SYN_SENT towards ``port`` on 127.0.0.1 (its SYN got no answer yet)."""
    with open("/proc/net/tcp") as table:
        rows = [line.split() for line in table.readlines()[1:]]
    return any(row[2] == f"0100007F:{port:04X}" and row[3] == "02" for row in rows)


async def test_a_dropped_syn_is_sent_again_before_the_kernels_one_second_retransmission() -> None:
    """A SYN nobody answers (here: the server's accept queue is full; in a cluster: a Service whose new endpoint
    kube-proxy has not programmed yet) is retried by a new short connect attempt, so the request succeeds within
    a connect timeout shorter than the kernel's first retransmission (1 s)."""
    loop = asyncio.get_running_loop()
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)  # room for one pending connection: the filler below
    listener.setblocking(False)
    port = listener.getsockname()[1]
    filler = socket.create_connection(("127.0.0.1", port))
    pool = UpstreamPool(0.9)
    try:
        request = asyncio.create_task(pool.request("POST", "127.0.0.1", port, "/", headers=[], body=b"{}"))
        await eventually(lambda: _syn_sent_to(port))  # the first SYN was dropped: the queue is full
        (await loop.sock_accept(listener))[0].close()  # the filler leaves the queue
        server, _ = await asyncio.wait_for(loop.sock_accept(listener), 2)  # the old client had given up at 0.9 s
        with server:
            await loop.sock_recv(server, 65536)
            await loop.sock_sendall(server, b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            response = await request
            assert (response.status, await response.read()) == (200, b"ok")
            response.close()
    finally:
        filler.close()
        listener.close()
        await pool.close()


@on_both_loops
async def test_a_server_that_went_away_leaves_nothing_in_the_pool() -> None:
    """Every model server start listens on a new port: the keep-alive connections of a stopped server must
    leave the pool when they close, or a long swap storm grows the proxy's memory without bound."""
    stop = asyncio.Event()

    async def answer_until_stopped(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, up: Upstream) -> None:
        await up.read_request(reader)
        writer.write(OK)
        await stop.wait()  # then the connection closes (``Upstream._connection``), as a stopped server's do

    for limit in (0, 2):
        pool = UpstreamPool(5.0, max_per_server=limit)
        for _ in range(3):
            stop.clear()
            async with Upstream(answer_until_stopped) as up:
                answers = await asyncio.gather(fetch(pool, up.port), fetch(pool, up.port))
                assert answers == [(200, b"{}")] * 2
                assert pool.held() == 2
                stop.set()
                await eventually(lambda pool=pool: pool.held() == 0 and not pool.servers(), 5)
        await pool.close()


@on_both_loops
async def test_connections_that_closed_are_freed_without_the_cyclic_collector() -> None:
    """``serve`` runs with the cyclic collector nearly off: a connection whose model server stopped, or whose
    connect was refused, must not be a reference cycle, or every swap leaves connections (transport, parser) in
    memory for many minutes."""
    stop = asyncio.Event()

    async def answer_until_stopped(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, up: Upstream) -> None:
        await up.read_request(reader)
        writer.write(OK)
        await stop.wait()

    with unreachable_cycles() as cycles:
        pool = UpstreamPool(5.0)
        async with Upstream(answer_until_stopped) as up:
            assert list(await asyncio.gather(fetch(pool, up.port), fetch(pool, up.port))) == [(200, b"{}")] * 2
            stop.set()
            await eventually(lambda: pool.held() == 0 and not pool.servers(), 5)
        with pytest.raises(UpstreamConnectionError):
            await fetch(pool, up.port)  # nothing listens there any more
        await pool.close()
    assert not kinds(cycles) & {"Connection", "HttpResponseParser"}
