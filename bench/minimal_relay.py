"""The ``floor`` target of ``bench/proxy_overhead.py`` (``--floor``): the least a Python reverse proxy for this
benchmark does, on the same machinery as FlexInfer's front server, to show what the machinery itself costs.

It parses requests with ``httptools`` on uvloop, finds the body's ``model`` and ``stream`` with FlexInfer's
one-pass scan, forwards through FlexInfer's upstream pool to one fixed upstream, and relays the answer (whole,
or chunk by chunk for a stream). Nothing else: no auth, limits, admission, metrics, request id, tracing hooks,
access log or error envelopes. ``python bench/minimal_relay.py --port N --upstream http://127.0.0.1:M``.
"""

from __future__ import annotations

import argparse
import asyncio
from urllib.parse import urlsplit

import httptools
import uvloop

from flexinfer.proxy.json_body import scan
from flexinfer.proxy.upstream_pool import UpstreamPool

_SKIPPED = {b"host", b"content-length", b"connection"}


class Relay(asyncio.Protocol):
    """One client connection; requests are answered in order (wrk does not pipeline)."""

    def __init__(self, pool: UpstreamPool, host: str, port: int) -> None:
        self._pool, self._host, self._port = pool, host, port
        self._parser = httptools.HttpRequestParser(self)
        self._url, self._headers, self._body = b"", [], []  # type: ignore[var-annotated]
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self._parser.feed_data(data)

    def on_message_begin(self) -> None:
        self._url, self._headers, self._body = b"", [], []

    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() not in _SKIPPED:
            self._headers.append((name.decode("latin-1"), value.decode("latin-1")))

    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self) -> None:
        method = self._parser.get_method().decode()
        asyncio.get_running_loop().create_task(self._answer(method, self._url.decode(), self._headers,
                                                            b"".join(self._body)))

    async def _answer(self, method: str, target: str, headers: list[tuple[str, str]], body: bytes) -> None:
        assert self._transport is not None
        scan(body)
        upstream = await self._pool.request(method, self._host, self._port, target, headers=headers, body=body)
        kind = upstream.headers.get("Content-Type", "application/json")
        if upstream.complete:
            data = upstream.drain()
            self._transport.writelines((b"HTTP/1.1 %d OK\r\nContent-Type: %s\r\nContent-Length: %d\r\n\r\n"
                                        % (upstream.status, kind.encode(), len(data)), data))
        else:
            self._transport.write(b"HTTP/1.1 %d OK\r\nContent-Type: %s\r\nTransfer-Encoding: chunked\r\n\r\n"
                                  % (upstream.status, kind.encode()))
            while chunk := await upstream.read():
                self._transport.writelines((b"%x\r\n" % len(chunk), chunk, b"\r\n"))
            self._transport.write(b"0\r\n\r\n")
        upstream.release()


async def _serve(port: int, upstream: str) -> None:
    parts = urlsplit(upstream)
    pool = UpstreamPool(5.0, max_per_server=1024)
    loop = asyncio.get_running_loop()
    await loop.create_server(lambda: Relay(pool, parts.hostname or "127.0.0.1", parts.port or 80), "127.0.0.1",
                             port, backlog=1024)
    await asyncio.Event().wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True)
    args = parser.parse_args()
    uvloop.run(_serve(args.port, args.upstream))


if __name__ == "__main__":
    main()
