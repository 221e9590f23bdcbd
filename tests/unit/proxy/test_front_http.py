"""HTTP/1.1 on the proxy's front server (``flexinfer.proxy.front``), spoken as raw bytes over a real socket:
pipelined requests answered in order (proxied and control routes mixed), ``Expect: 100-continue``, HTTP/1.0,
a chunked request body, an over-long head (431), an upgrade offer, HEAD, the keep-alive idle sweep, and
connections that closed leaving nothing in memory."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Callable
from urllib.parse import urlsplit

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from flexinfer.proxy.forwarding import Forwarder
from flexinfer.proxy.front import server as front_server
from flexinfer.proxy.front.connection import FrontConnection
from support.garbage import instances, unreachable_cycles
from support.polling import eventually

BODY = b'{"model": "alpha", "messages": [{"role": "user", "content": "hi"}]}'


def _post(body: bytes = BODY, extra: bytes = b"", path: bytes = b"/v1/chat/completions") -> bytes:
    return (b"POST " + path + b" HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" + extra
            + b"Content-Length: %d\r\n\r\n" % len(body) + body)


async def _open(url: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    parts = urlsplit(url)
    return await asyncio.open_connection(parts.hostname, parts.port)


async def _answer(reader: asyncio.StreamReader) -> tuple[bytes, dict[str, str], bytes]:
    """One response with a ``Content-Length`` body: status line, headers (lower-case names), body."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    status, *lines = head.decode("latin-1").split("\r\n")[:-2]
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)}
    length = int(headers.get("content-length", "0"))
    return status.encode(), headers, await asyncio.wait_for(reader.readexactly(length), 10)


async def test_pipelined_requests_are_answered_in_order_across_proxied_and_control_routes(make_proxy) -> None:
    proxy = await make_proxy()
    reader, writer = await _open(proxy.url)
    writer.write(_post() + b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n" + _post()
                 + b"GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    answers = [await _answer(reader) for _ in range(4)]
    assert [a[0] for a in answers] == [b"HTTP/1.1 200 OK"] * 4
    assert json.loads(answers[0][2])["object"] == "chat.completion" and answers[1][2] == b"ok"
    assert json.loads(answers[2][2])["object"] == "chat.completion"
    assert [m["id"] for m in json.loads(answers[3][2])["data"]] == ["alpha", "beta"]
    assert await asyncio.wait_for(reader.read(), 10) == b""  # closed after the answer that asked for it
    writer.close()
    assert proxy.activator.acquired == 2


async def test_expect_100_continue_is_answered_before_the_body_is_sent(make_proxy) -> None:
    proxy = await make_proxy()
    reader, writer = await _open(proxy.url)
    head = _post(extra=b"Expect: 100-continue\r\n").split(b"\r\n\r\n")[0] + b"\r\n\r\n"
    writer.write(head)
    assert await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10) == b"HTTP/1.1 100 Continue\r\n\r\n"
    writer.write(BODY)
    status, _, body = await _answer(reader)
    assert status == b"HTTP/1.1 200 OK" and json.loads(body)["object"] == "chat.completion"
    writer.close()


async def test_a_body_over_the_limit_is_413_without_100_continue(make_proxy) -> None:
    proxy = await make_proxy(max_body_bytes=1000)
    reader, writer = await _open(proxy.url)
    writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n"
                 b"Content-Length: 5000\r\n\r\n")
    status, _, body = await _answer(reader)
    assert status == b"HTTP/1.1 413 Request Entity Too Large"
    assert "exceeds the limit" in json.loads(body)["error"]["message"]
    assert await asyncio.wait_for(reader.read(), 10) == b""  # the unread body ends the connection
    writer.close()


async def test_a_chunked_body_over_the_limit_is_413(make_proxy) -> None:
    proxy = await make_proxy(max_body_bytes=1000)
    reader, writer = await _open(proxy.url)
    chunk = b"a" * 600
    writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                 + (b"%x\r\n" % len(chunk) + chunk + b"\r\n") * 2 + b"0\r\n\r\n")
    status, _, _ = await _answer(reader)
    assert status == b"HTTP/1.1 413 Request Entity Too Large" and proxy.activator.acquired == 0
    writer.close()


async def test_a_chunked_request_body_is_forwarded_whole(make_proxy, fake) -> None:
    proxy = await make_proxy()
    reader, writer = await _open(proxy.url)
    pieces = [BODY[:10], BODY[10:]]
    writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                 + b"".join(b"%x\r\n" % len(p) + p + b"\r\n" for p in pieces) + b"0\r\n\r\n")
    status, _, body = await _answer(reader)
    assert status == b"HTTP/1.1 200 OK" and json.loads(body)["object"] == "chat.completion"
    assert fake.requests[-1].body["model"] == "alpha-served"
    writer.close()


async def test_http_1_0_gets_a_delimited_answer_and_the_connection_ends(make_proxy) -> None:
    proxy = await make_proxy()
    reader, writer = await _open(proxy.url)
    writer.write(_post().replace(b"HTTP/1.1", b"HTTP/1.0", 1))
    answer = await asyncio.wait_for(reader.read(), 10)
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK") and b"Transfer-Encoding" not in head
    assert json.loads(body)["object"] == "chat.completion"
    writer.close()


async def test_an_over_long_header_is_431_with_one_warning(make_proxy, caplog) -> None:
    proxy = await make_proxy()
    caplog.set_level(logging.INFO)
    reader, writer = await _open(proxy.url)
    writer.write(_post(extra=b"X-Long: " + b"a" * 9000 + b"\r\n"))
    answer = await asyncio.wait_for(reader.read(), 10)
    assert answer.startswith(b"HTTP/1.1 431 Request Header Fields Too Large") and proxy.activator.acquired == 0
    assert json.loads(answer.partition(b"\r\n\r\n")[2])["error"]["code"] == "request_header_fields_too_large"
    assert len([r for r in caplog.records if "malformed request" in r.getMessage()]) == 1
    writer.close()


async def test_an_upgrade_offer_is_answered_over_http_1_1_and_ends_the_connection(make_proxy) -> None:
    proxy = await make_proxy()
    reader, writer = await _open(proxy.url)
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\n"
                 b"HTTP2-Settings: AAMAAABkAAQCAAAAAAIAAAAA\r\n\r\n")
    status, headers, body = await _answer(reader)
    assert (status, body, headers.get("connection")) == (b"HTTP/1.1 200 OK", b"ok", "close")
    assert await asyncio.wait_for(reader.read(), 10) == b""
    writer.close()


async def test_head_gets_the_headers_without_a_body(make_proxy) -> None:
    proxy = await make_proxy()
    reader, writer = await _open(proxy.url)
    writer.write(b"HEAD /healthz HTTP/1.1\r\nHost: x\r\n\r\nGET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    assert head.startswith(b"HTTP/1.1 200 OK") and b"Content-Length: 2" in head
    status, _, body = await _answer(reader)  # the next bytes are the GET's answer, not a body
    assert (status, body) == (b"HTTP/1.1 200 OK", b"ok")
    writer.close()


async def test_an_idle_keep_alive_connection_is_closed_after_the_timeout(make_proxy, monkeypatch) -> None:
    monkeypatch.setattr(front_server, "KEEPALIVE_TIMEOUT", 0.4)
    proxy = await make_proxy()
    reader, writer = await _open(proxy.url)
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    assert (await _answer(reader))[2] == b"ok"
    assert await asyncio.wait_for(reader.read(), 10) == b""
    writer.close()


async def test_a_defect_in_a_handler_is_a_500_envelope_and_one_logged_traceback(make_proxy, caplog,
                                                                                 monkeypatch) -> None:
    proxy = await make_proxy()

    async def broken(*_: object, **__: object) -> None:
        raise RuntimeError("a defect")

    monkeypatch.setattr(Forwarder, "relay", broken)
    reader, writer = await _open(proxy.url)
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    status, _, body = await _answer(reader)
    assert status == b"HTTP/1.1 500 Internal Server Error"
    assert json.loads(body)["error"]["code"] == "server_error" and b"defect" not in body
    assert len([r for r in caplog.records if r.exc_info and "unexpected error" in r.getMessage()]) == 1
    writer.close()


@contextlib.asynccontextmanager
async def _streamed_file(make_proxy, pieces: list[bytes],
                         sent: Callable[[int], None]) -> AsyncIterator[asyncio.StreamReader]:
    """A client of the proxy that posted to an upstream streaming ``pieces`` (``sent(n)`` after each one)."""

    async def stream(request: web.Request) -> web.StreamResponse:
        await request.read()
        response = web.StreamResponse(headers={"Content-Type": "application/octet-stream"})
        await response.prepare(request)
        for n, piece in enumerate(pieces):
            await response.write(piece)
            sent(n + 1)
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_post("/v1/files", stream)
    async with TestServer(app) as upstream:
        proxy = await make_proxy()
        proxy.activator.base_url = str(upstream.make_url("")).rstrip("/")
        reader, writer = await _open(proxy.url)
        writer.write(_post(path=b"/v1/files"))
        yield reader
        writer.close()


async def _chunked_body(reader: asyncio.StreamReader) -> bytes:
    await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    body = bytearray()
    while size := int((await asyncio.wait_for(reader.readline(), 10)).strip(), 16):
        body += (await asyncio.wait_for(reader.readexactly(size + 2), 10))[:-2]
    return bytes(body)


async def test_a_client_that_stops_reading_holds_the_upstream_back(make_proxy) -> None:
    """32 MiB streamed to a client that reads nothing: the proxy must not buffer it (the upstream cannot
    finish) until the client reads, and then every byte arrives."""
    pieces, done = [b"x" * (256 << 10)] * 128, asyncio.Event()
    async with _streamed_file(make_proxy, pieces, lambda n: done.set() if n == len(pieces) else None) as reader:
        with pytest.raises(TimeoutError):  # held back by the client, not buffered in the proxy
            await asyncio.wait_for(done.wait(), 3)
        assert len(await _chunked_body(reader)) == len(pieces[0]) * len(pieces) and done.is_set()


async def test_a_large_stream_arrives_byte_for_byte_in_order(make_proxy) -> None:
    """4 MiB of numbered pieces, the client reading nothing until half were sent, arrive byte for byte in
    order."""
    pieces, half = [f"{n:08d}".encode() * 512 for n in range(1024)], asyncio.Event()
    async with _streamed_file(make_proxy, pieces, lambda n: half.set() if n > len(pieces) // 2 else None) as reader:
        await asyncio.wait_for(half.wait(), 10)  # the client has read nothing so far
        assert await _chunked_body(reader) == b"".join(pieces)


async def test_a_client_that_leaves_mid_answer_is_logged_as_499(make_proxy, fake, caplog) -> None:
    proxy = await make_proxy()
    caplog.set_level(logging.INFO, logger="flexinfer.access")
    fake.hold_after_first_chunk = asyncio.Event()
    reader, writer = await _open(proxy.url)
    writer.write(_post(BODY.replace(b'"alpha"', b'"alpha", "stream": true')))
    assert (await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)).startswith(b"HTTP/1.1 200 OK")
    writer.close()
    await eventually(lambda: [r for r in caplog.records if r.name == "flexinfer.access"])
    fake.hold_after_first_chunk.set()
    [line] = [r.getMessage() for r in caplog.records if r.name == "flexinfer.access"]
    assert " status=499 " in line and " stream=true " in line


async def test_client_connections_that_closed_are_freed_without_the_cyclic_collector(make_proxy) -> None:
    """``serve`` and ``proxy`` run with the cyclic collector nearly off: a client connection must not be a
    reference cycle once closed, or each one stays in memory (with its parser) for many minutes."""
    proxy = await make_proxy()
    with unreachable_cycles():
        for _ in range(3):
            reader, writer = await _open(proxy.url)
            writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n" + _post())
            assert [(await _answer(reader))[0] for _ in range(2)] == [b"HTTP/1.1 200 OK"] * 2
            writer.close()
        await eventually(lambda: instances(FrontConnection) == 0, 5, interval=0.05)
