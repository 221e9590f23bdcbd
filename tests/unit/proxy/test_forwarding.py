"""``Forwarder.relay`` (flexinfer.proxy.forwarding) against the fake OpenAI server on a real socket, with the
client side recorded send by send: a short answer that arrived whole goes out in one send (head and body
together), a stream still goes out chunk by chunk as it arrives; the base URLs of model servers that stopped
(a swap storm: each start on a new port) leave a bounded number of parsed origins behind."""

from __future__ import annotations

import asyncio
import json
import socket
from typing import Any

import pytest
from multidict import CIMultiDict

from flexinfer.core.errors import UpstreamError
from flexinfer.proxy.forwarding import Forwarder
from flexinfer.proxy.front.message import Link, ResponseWriter
from flexinfer.proxy.hooks import NullTracer
from flexinfer.proxy.streaming import Reply
from support.fake_openai import FakeOpenAI
from support.polling import eventually


class SentToClient(asyncio.Transport):
    """The client connection's transport: records every send the proxy makes."""

    def __init__(self) -> None:
        super().__init__()
        self.sends: list[bytes] = []

    def write(self, data: Any) -> None:
        self.sends.append(bytes(data))

    def writelines(self, parts: Any) -> None:
        self.sends.append(b"".join(parts))

    def is_closing(self) -> bool:
        return False


async def relay(fake: FakeOpenAI, stream: bool, transport: SentToClient) -> list[bytes]:
    writer = ResponseWriter(Link(transport), http10=False, keep_alive=True, head_only=False)
    forwarder = Forwarder(5.0)
    await forwarder.start()
    reply = Reply(writer, {"X-Request-ID": "r1"})
    body = json.dumps({"model": "alpha", "stream": stream, "messages": [{"role": "user", "content": "hi"}]})
    await forwarder.relay(reply, method="POST", base_url=fake.base_url, path="/v1/chat/completions",
                          headers=CIMultiDict({"Content-Type": "application/json"}), body=body.encode(),
                          trace=NullTracer().start_request("POST", "/v1/chat/completions", {}))
    await reply.finish()
    await forwarder.close()
    return transport.sends


async def test_a_short_answer_that_arrived_whole_is_one_send_of_head_and_body(fake: FakeOpenAI) -> None:
    [sent] = await relay(fake, stream=False, transport=SentToClient())
    head, _, body = sent.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK\r\n") and b"X-Request-ID: r1" in head
    assert f"Content-Length: {len(body)}".encode() in head
    assert json.loads(body)["object"] == "chat.completion"


async def test_a_stream_is_still_sent_as_it_arrives(fake: FakeOpenAI) -> None:
    fake.hold_after_first_chunk = asyncio.Event()
    transport = SentToClient()
    relaying = asyncio.create_task(relay(fake, stream=True, transport=transport))
    await eventually(lambda: b"tok0" in b"".join(transport.sends))
    assert b"text/event-stream" in transport.sends[0] and b"tok1" not in b"".join(transport.sends)
    fake.hold_after_first_chunk.set()
    sends = await relaying
    assert b"data: [DONE]" in b"".join(sends) and len(sends) > 1


def stopped_server_url() -> str:
    """The base URL of a model server that has stopped: a loopback port nothing listens on any more."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"


async def test_a_swap_storms_endpoints_leave_a_bounded_number_of_parsed_origins() -> None:
    """Each start of a local model server listens on a new port: after 200 of them the forwarder keeps the parsed
    origins of a few recent base URLs (at most 64), not one for every server that ever ran."""
    forwarder = Forwarder(1.0)
    await forwarder.start()
    for _ in range(200):
        reply = Reply(ResponseWriter(Link(SentToClient()), http10=False, keep_alive=True, head_only=False), {})
        with pytest.raises(UpstreamError, match="upstream unavailable"):
            await forwarder.relay(reply, method="POST", base_url=stopped_server_url(), path="/v1/completions",
                                  headers=CIMultiDict(), body=b"{}",
                                  trace=NullTracer().start_request("POST", "/v1/completions", {}))
    assert forwarder.origins() == 64
    await forwarder.close()
