"""A scripted fake OpenAI-compatible model server for fault injection (startup delay, crash at start,
crash mid-stream, streams without any event, slow streams) with deterministic content.

In-process: ``FakeOpenAI(script).app()`` is an aiohttp application; ``FakeOpenAI.requests`` records every
request (path, headers, JSON body) and ``cancelled`` is set when a client abandons a stream. As a process:

    python -m support.fake_openai --port N [--startup-delay S] [--crash-at-start] [--crash-mid-stream]
        [--silent-stream] [--chunks K] [--chunk-interval T] [--health-path /health] [--model-name NAME]
        [--record FILE] [--status N [--error-body-file FILE] [--error-content-type TYPE]]

prints ``FAKE_OPENAI_PORT=<port>`` once listening (``--port 0`` picks a free port); with ``--record`` it appends
one JSON line per API request (``method``, ``path``, lower-cased ``headers``, ``body``) to FILE. Used by the proxy
tests and benchmarks and, as a model server process, by the local-engine tests.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web


@dataclass
class Script:
    """How the fake behaves."""

    chunks: int = 4
    chunk_interval: float = 0.0
    crash_mid_stream: bool = False
    """Stop after half the chunks: the process exits (``exit_on_crash``) or the connection is cut."""
    exit_on_crash: bool = False
    silent_stream: bool = False
    """Streams answer ``200 text/event-stream`` and end cleanly without any event, as llama.cpp's Python server
    does when the model call fails after the head: an empty body sent with the head, or, while
    ``FakeOpenAI.hold_after_first_chunk`` is set, a ``: ping`` comment, then the end once that event is set."""
    health_path: str = "/health"
    model_name: str = "fake-model"
    status: int = 200
    """Non-200 → every API call answers this status with an OpenAI error body (or ``error_body``)."""
    error_body: bytes | None = None
    """With ``status``: the raw error body to answer instead (hostile shapes: plain text, tracebacks…)."""
    error_content_type: str = "application/json"


@dataclass
class Received:
    """One request as the fake saw it."""

    method: str
    path: str
    headers: dict[str, str]
    body: dict[str, Any] | None
    raw: bytes = b""
    """The body exactly as received."""


def tokens(count: int) -> list[str]:
    """The deterministic content pieces: ``tok0 ``, ``tok1 `` …"""
    return [f"tok{i} " for i in range(count)]


@dataclass
class FakeOpenAI:
    """The fake server's state and handlers."""

    script: Script = field(default_factory=Script)
    requests: list[Received] = field(default_factory=list)
    cancelled: asyncio.Event = field(default_factory=asyncio.Event)
    first_chunk_sent: asyncio.Event = field(default_factory=asyncio.Event)
    base_url: str = ""
    """Set by whoever starts the server in-process (``http://127.0.0.1:<port>``)."""
    hold_after_first_chunk: asyncio.Event | None = None
    """When set to an Event, streams pause after the first chunk until the event is set."""
    record_file: str | None = None
    """When set, every recorded request is also appended to this file as a JSON line."""

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 2**20)  # model servers take large uploads
        app.router.add_get(self.script.health_path, self._health)
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_post("/v1/embeddings", self._embeddings)
        app.router.add_route("*", "/{tail:.*}", self._echo)
        return app

    async def _record(self, request: web.Request) -> dict[str, Any]:
        raw = await request.read()
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = None
        received = Received(request.method, request.path_qs, dict(request.headers),
                            body if isinstance(body, dict) else None, raw)
        self.requests.append(received)
        if self.record_file:
            _append_record(self.record_file, received)
        return body if isinstance(body, dict) else {}

    async def _health(self, _: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def _models(self, _: web.Request) -> web.Response:
        entry = {"id": self.script.model_name, "object": "model", "created": 0, "owned_by": "fake"}
        return web.json_response({"object": "list", "data": [entry]})

    async def _echo(self, request: web.Request) -> web.Response:
        body = await self._record(request)
        if self.script.status != 200:
            return self._error()
        return web.json_response({"path": request.path_qs, "method": request.method, "model": body.get("model")})

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        body = await self._record(request)
        if self.script.status != 200:
            return self._error()
        if body.get("stream"):
            return await self._stream(request, body, chat=True)
        text = "".join(tokens(self.script.chunks))
        choice = {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
        if self.script.crash_mid_stream:
            return await self._truncated(request, json.dumps(_envelope("chat.completion", body, [choice])).encode())
        return web.json_response(_envelope("chat.completion", body, [choice]))

    async def _truncated(self, request: web.Request, payload: bytes) -> web.StreamResponse:
        """Announce the full length, send half, then crash."""
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        response.content_length = len(payload)
        await response.prepare(request)
        await response.write(payload[: len(payload) // 2])
        self._crash(request)
        return response

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        body = await self._record(request)
        if self.script.status != 200:
            return self._error()
        if body.get("stream"):
            return await self._stream(request, body, chat=False)
        choice = {"index": 0, "text": "".join(tokens(self.script.chunks)), "finish_reason": "stop"}
        return web.json_response(_envelope("text_completion", body, [choice]))

    async def _embeddings(self, request: web.Request) -> web.Response:
        body = await self._record(request)
        if self.script.status != 200:
            return self._error()
        item = {"object": "embedding", "index": 0, "embedding": [0.25, 0.5, 0.75]}
        return web.json_response({"object": "list", "data": [item], "model": body.get("model"),
                                  "usage": {"prompt_tokens": 1, "total_tokens": 1}})

    async def _stream(self, request: web.Request, body: dict[str, Any], chat: bool) -> web.StreamResponse:
        if self.script.silent_stream:
            return await self._silent(request)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(request)
        try:
            await self._send_chunks(request, response, body, chat)
        except (asyncio.CancelledError, ConnectionError):
            self.cancelled.set()
            raise
        return response

    async def _send_chunks(self, request: web.Request, response: web.StreamResponse, body: dict[str, Any],
                           chat: bool) -> None:
        pieces = tokens(self.script.chunks)
        for index, piece in enumerate(pieces):
            if self.script.crash_mid_stream and index == len(pieces) // 2:
                self._crash(request)
                return
            await response.write(_sse_chunk(body, piece, chat))
            if index == 0:
                self.first_chunk_sent.set()
                if self.hold_after_first_chunk is not None:
                    await self.hold_after_first_chunk.wait()
            if self.script.chunk_interval:
                await asyncio.sleep(self.script.chunk_interval)
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()

    async def _silent(self, request: web.Request) -> web.StreamResponse:
        headers = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        if self.hold_after_first_chunk is None:
            return web.Response(body=b"", headers=headers)
        response = web.StreamResponse(headers=headers)
        await response.prepare(request)
        await response.write(b": ping\n\n")
        self.first_chunk_sent.set()
        await self.hold_after_first_chunk.wait()
        await response.write_eof()
        return response

    def _error(self) -> web.Response:
        if self.script.error_body is None:
            return _error(self.script.status)
        return web.Response(status=self.script.status, body=self.script.error_body,
                            headers={"Content-Type": self.script.error_content_type})

    def _crash(self, request: web.Request) -> None:
        if self.script.exit_on_crash:
            os._exit(3)
        if request.transport is not None:
            request.transport.close()


def _append_record(path: str, received: Received) -> None:
    """One JSON line per request (small local file; written before the reply, so a client sees it after)."""
    line = {"method": received.method, "path": received.path, "body": received.body,
            "headers": {key.lower(): value for key, value in received.headers.items()}}
    with open(path, "a", encoding="utf-8") as out:
        out.write(json.dumps(line) + "\n")


def _envelope(kind: str, body: dict[str, Any], choices: list[dict[str, Any]]) -> dict[str, Any]:
    usage = {"prompt_tokens": 1, "completion_tokens": len(choices), "total_tokens": 1 + len(choices)}
    return {"id": "fake-1", "object": kind, "created": 0, "model": body.get("model"), "choices": choices,
            "usage": usage}


def _sse_chunk(body: dict[str, Any], piece: str, chat: bool) -> bytes:
    if chat:
        choice: dict[str, Any] = {"index": 0, "delta": {"content": piece}, "finish_reason": None}
        payload = {"id": "fake-1", "object": "chat.completion.chunk", "created": 0, "model": body.get("model"),
                   "choices": [choice]}
    else:
        payload = {"id": "fake-1", "object": "text_completion", "created": 0, "model": body.get("model"),
                   "choices": [{"index": 0, "text": piece, "finish_reason": None}]}
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


def _error(status: int) -> web.Response:
    error = {"message": f"fake failure {status}", "type": "server_error", "param": None, "code": "fake"}
    return web.json_response({"error": error}, status=status)


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m support.fake_openai", description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--startup-delay", type=float, default=0.0, help="seconds before listening")
    parser.add_argument("--crash-at-start", action="store_true", help="exit 1 after the startup delay")
    parser.add_argument("--crash-mid-stream", action="store_true", help="exit 3 halfway through a stream")
    parser.add_argument("--silent-stream", action="store_true", help="end every stream without any event")
    parser.add_argument("--chunks", type=int, default=4)
    parser.add_argument("--chunk-interval", type=float, default=0.0)
    parser.add_argument("--health-path", default="/health")
    parser.add_argument("--model-name", default="fake-model")
    parser.add_argument("--record", default=None, help="append each API request as a JSON line to this file")
    parser.add_argument("--status", type=int, default=200, help="answer every API call with this status")
    parser.add_argument("--error-body-file", default=None, help="with --status: the raw error body to send")
    parser.add_argument("--error-content-type", default="text/plain")
    return parser.parse_args(argv)


async def _serve(args: argparse.Namespace) -> None:
    script = Script(chunks=args.chunks, chunk_interval=args.chunk_interval, crash_mid_stream=args.crash_mid_stream,
                    silent_stream=args.silent_stream,
                    exit_on_crash=True, health_path=args.health_path, model_name=args.model_name, status=args.status,
                    error_content_type=args.error_content_type, error_body=args.error_body)
    fake = FakeOpenAI(script, record_file=args.record)
    runner = web.AppRunner(fake.app(), access_log=None, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, args.host, args.port)
    await site.start()
    port = runner.addresses[0][1]
    print(f"FAKE_OPENAI_PORT={port}", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    args.error_body = Path(args.error_body_file).read_bytes() if args.error_body_file else None
    if args.startup_delay > 0:
        time.sleep(args.startup_delay)
    if args.crash_at_start:
        print("fake_openai: crashing at start as scripted", file=sys.stderr, flush=True)
        return 1
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve(args))
    return 0


if __name__ == "__main__":
    import signal

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    sys.exit(main())
