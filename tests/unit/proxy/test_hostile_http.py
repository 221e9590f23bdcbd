"""Malformed HTTP sent as raw bytes to a running proxy: a 400 and one log line, never an ERROR traceback."""

from __future__ import annotations

import asyncio
import json
import logging
from urllib.parse import urlsplit

import pytest

BODY = b'{"model": "alpha"}'
HOSTILE = {
    "bare CR in a header": b"X-Test: a\rb\r\n",
    "bare LF in a header value": b"X-Test: a\nb\r\n",
    "NUL in a header": b"X-Test: a\x00b\r\n",
    "Content-Length with chunked": b"Transfer-Encoding: chunked\r\n",
}


async def _exchange(url: str, raw: bytes) -> bytes:
    parts = urlsplit(url)
    reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
    writer.write(raw)
    await writer.drain()
    try:
        return await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()


@pytest.mark.parametrize("header", HOSTILE.values(), ids=HOSTILE.keys())
async def test_malformed_request_is_400_with_one_warning_line(make_proxy, caplog, header):
    proxy = await make_proxy()
    caplog.set_level(logging.DEBUG)
    raw = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" + header
           + b"Content-Length: %d\r\n\r\n" % len(BODY) + BODY)
    answer = await _exchange(proxy.url, raw)
    assert answer.split(b"\r\n", 1)[0].endswith(b" 400 Bad Request")
    assert proxy.activator.acquired == 0
    assert not [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR], caplog.text
    assert "Traceback" not in caplog.text
    lines = [r for r in caplog.records if "malformed request" in r.getMessage()]
    assert len(lines) == 1 and lines[0].levelno == logging.WARNING
    assert "\n" not in lines[0].getMessage()


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
