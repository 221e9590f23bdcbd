"""Malformed HTTP sent as raw bytes to a running proxy: the OpenAI error envelope (JSON, 400/414/431), one
WARNING line and a closed connection, never an ERROR traceback and never a request that reaches a model."""

from __future__ import annotations

import asyncio
import json
import logging
from urllib.parse import urlsplit

import pytest

from flexinfer.proxy.front.connection import versionless_request_line

BODY = b'{"model": "alpha"}'
HEAD = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"


def _post(extra: bytes, head: bytes = HEAD) -> bytes:
    return head + extra + b"Content-Length: %d\r\n\r\n" % len(BODY) + BODY


HOSTILE = {
    "garbage request line": (b"HELLO THERE\r\n\r\n", 400),
    "HTTP/9.9": (_post(b"", HEAD.replace(b"HTTP/1.1", b"HTTP/9.9")), 400),
    "HTTP/2.0 in an HTTP/1 request line": (b"GET /v1/models HTTP/2.0\r\nHost: x\r\n\r\n", 400),
    "HTTP/0.9 request line and a blank line": (b"GET /v1/models\r\n\r\n", 400),
    "HTTP/0.9 request line with a header": (b"GET /v1/models\r\nHost: x\r\n\r\n", 400),
    "HTTP/0.9 request line alone": (b"GET /v1/models\r\n", 400),
    "bare CR in a header": (_post(b"X-Test: a\rb\r\n"), 400),
    "bare LF in a header value": (_post(b"X-Test: a\nb\r\n"), 400),
    "NUL in a header": (_post(b"X-Test: a\x00b\r\n"), 400),
    "Content-Length with chunked": (_post(b"Transfer-Encoding: chunked\r\n"), 400),
    "negative Content-Length": (HEAD + b"Content-Length: -5\r\n\r\n" + BODY, 400),
    "a request target over 8190 bytes": (b"GET /v1/" + b"a" * 9000 + b" HTTP/1.1\r\nHost: x\r\n\r\n", 414),
    "a 9 KB header": (_post(b"X-Long: " + b"a" * 9000 + b"\r\n"), 431),
    "a 1 MB header": (_post(b"X-Long: " + b"a" * (1 << 20) + b"\r\n"), 431),
    "5,000 headers": (_post(b"".join(b"X-%d: v\r\n" % n for n in range(5000))), 431),
    "a head over 64 KB in short lines": (_post(b"".join(b"X-%d: %s\r\n" % (n, b"v" * 400) for n in range(200))),
                                         431),
}


async def _exchange(url: str, raw: bytes) -> bytes:
    """Send ``raw`` and read until the proxy closes the connection."""
    parts = urlsplit(url)
    reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
    writer.write(raw)
    try:
        await writer.drain()
        async with asyncio.timeout(10):
            return await reader.read()
    finally:
        writer.close()


def _parse(answer: bytes) -> tuple[int, dict[str, str], dict[str, object]]:
    head, _, body = answer.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)}
    assert int(headers["content-length"]) == len(body)
    return int(status_line.split()[1]), headers, json.loads(body)


@pytest.mark.parametrize(("raw", "status"), HOSTILE.values(), ids=HOSTILE.keys())
async def test_malformed_request_gets_the_openai_error_envelope_and_one_warning_line(make_proxy, caplog, raw,
                                                                                     status):
    proxy = await make_proxy()
    caplog.set_level(logging.DEBUG)
    answer = await _exchange(proxy.url, raw)  # returns once the proxy closed the connection
    got, headers, body = _parse(answer)
    assert got == status, answer[:200]
    assert headers["content-type"].startswith("application/json") and headers["connection"] == "close"
    error = body["error"]
    assert isinstance(error, dict) and set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error" and error["param"] is None
    assert isinstance(error["code"], str) and error["code"]
    assert isinstance(error["message"], str) and 0 < len(error["message"]) <= 200
    assert proxy.activator.acquired == 0
    assert not [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR], caplog.text
    assert "Traceback" not in caplog.text
    lines = [r for r in caplog.records if "malformed request" in r.getMessage()]
    assert len(lines) == 1 and lines[0].levelno == logging.WARNING
    assert "\n" not in lines[0].getMessage()


async def test_a_malformed_chunk_in_the_body_is_answered_by_its_request(make_proxy, caplog):
    """The request's handler is already waiting for its body: it answers the 400 (with its request id), then
    the connection ends."""
    proxy = await make_proxy()
    caplog.set_level(logging.DEBUG)
    raw = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
           b"Transfer-Encoding: chunked\r\n\r\n5\r\n{\"mod\r\nzz\r\nel\": \"alpha\"}\r\n0\r\n\r\n")
    status, headers, body = _parse(await _exchange(proxy.url, raw))
    assert status == 400 and "x-request-id" in headers and headers["content-type"].startswith("application/json")
    assert body["error"]["code"] == "malformed_http_request"  # type: ignore[index]
    assert proxy.activator.acquired == 0
    assert len([r for r in caplog.records if "malformed request" in r.getMessage()]) == 1
    assert not [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR], caplog.text


@pytest.mark.parametrize("pieces", [
    (b"GET /healthz", b" HTTP/1.1\r\n", b"Host: x\r\nConnection: close\r\n\r\n"),
    (b"GET /healthz HTTP/1.1\r\nX-Echo: /healthz\r\n", b"Host: x\r\nConnection: close\r\n\r\n"),
    (b"GET /healthz HTTP/1.1\r\nX-Echo: GET /healthz\r\n", b"Connection: close\r\n\r\n"),
], ids=["request line split", "header value equal to the target", "header value equal to a request line"])
async def test_a_good_request_after_a_split_head_is_not_taken_for_http_0_9(make_proxy, pieces):
    """A head that arrives in pieces is still a normal request, even when a piece ends with a header value
    llhttp has not reported yet that looks like a version-less request line."""
    proxy = await make_proxy()
    parts = urlsplit(proxy.url)
    reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
    try:
        for piece in pieces:
            writer.write(piece)
            await writer.drain()
        async with asyncio.timeout(10):
            answer = await reader.read()
    finally:
        writer.close()
    assert answer.startswith(b"HTTP/1.1 200 OK") and answer.endswith(b"ok")


async def test_undecodable_header_bytes_give_a_valid_utf8_error_body(make_proxy):
    proxy = await make_proxy()
    raw = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Model-ID: bad\xff\xfename\r\n"
           b"Content-Type: application/json\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}")
    answer = await _exchange(proxy.url, raw)
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.split(b"\r\n", 1)[0].endswith(b" 404 Not Found")
    message = json.loads(body.decode("utf-8"))["error"]["message"]
    message.encode("utf-8")
    assert message.startswith("Model 'bad")


@pytest.mark.parametrize(("read", "versionless"), [
    (b"GET /v1/models\r\n", True), (b"GET /v1/models\n", True), (b"\r\nGET /v1/models\r\n", True),
    (b'{"a": 1}\nGET /v1/models\r\n', True),
    (b"GET /v1/models HTTP/1.1\r\n", False), (b"GET /v1/models", False), (b"GET /v1/models\r", False),
    (b"GET /v1/models HTTP/1.1\r\nReferer: /v1/models\r\n", False),
    (b"GET /v1/models HTTP/1.1\r\nX-Echo: GET /v1/models\r\n", False),
])
def test_a_versionless_request_line_is_told_from_a_pending_header(read: bytes, versionless: bool) -> None:
    """llhttp reports a header only when the next line starts: a read ending with ``Referer: /v1/models\\r\\n``
    must not look like HTTP/0.9's ``GET /v1/models\\r\\n``."""
    assert versionless_request_line(read, b"GET", b"/v1/models") is versionless
