"""Streaming passthrough: no buffering, disconnects cancel upstream, mid-stream failures, streams ended without
any event, loading comments."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest

from flexinfer.core.errors import ModelFailedError
from flexinfer.proxy.config import ProxyConfig
from flexinfer.proxy.streaming import EventWatch
from support.polling import eventually

CHAT = "/v1/chat/completions"


async def _read_until(stream: aiohttp.StreamReader, marker: bytes) -> bytes:
    data = b""
    while marker not in data:
        chunk = await asyncio.wait_for(stream.readany(), 5)
        assert chunk, f"stream ended before {marker!r}; got {data!r}"
        data += chunk
    return data


async def test_first_chunk_reaches_client_before_upstream_finishes(make_proxy, fake):
    fake.hold_after_first_chunk = asyncio.Event()
    proxy = await make_proxy()
    async with proxy.session.post(proxy.url + CHAT, json={"model": "alpha", "stream": True}) as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/event-stream")
        first = await _read_until(response.content, b"tok0")
        assert b"tok1" not in first
        fake.hold_after_first_chunk.set()
        rest = await response.content.read()
    assert b"tok3" in rest and rest.endswith(b"data: [DONE]\n\n")
    proxy.activator.assert_released_once()


async def test_stream_is_not_compressed_and_carries_request_id(make_proxy):
    proxy = await make_proxy()
    rid = "0b4c7a3e-5f1d-4e8a-9c2b-7d6e5f4a3b21"
    headers = {"Accept-Encoding": "identity", "X-Request-ID": rid}
    async with proxy.session.post(proxy.url + CHAT, json={"model": "alpha", "stream": True},
                                  headers=headers) as response:
        await response.read()
    assert "Content-Encoding" not in response.headers
    assert response.headers["X-Request-ID"] == rid


async def test_client_disconnect_cancels_upstream_and_releases_grant(make_proxy, fake):
    fake.hold_after_first_chunk = asyncio.Event()
    proxy = await make_proxy()
    response = await proxy.session.post(proxy.url + CHAT, json={"model": "alpha", "stream": True})
    await _read_until(response.content, b"tok0")
    response.close()
    await asyncio.wait_for(fake.cancelled.wait(), 5)
    await proxy.activator.wait_released(1)
    proxy.activator.assert_released_once()


async def test_mid_stream_upstream_crash_ends_with_error_event(make_proxy, fake):
    fake.script.crash_mid_stream = True
    proxy = await make_proxy()
    async with proxy.session.post(proxy.url + CHAT, json={"model": "alpha", "stream": True}) as response:
        body = await response.content.read()
    events = [line for line in body.decode().split("\n\n") if line]
    assert b"tok0" in body and b"tok3" not in body
    error = json.loads(events[-1].removeprefix("data: "))
    assert error["error"]["code"] == "bad_gateway"
    proxy.activator.assert_released_once()


@pytest.mark.parametrize(("pieces", "seen"), [
    ([b'data: {"a": 1}\n\n'], True), ([b"da", b"ta", b": [DONE]\n\n"], True), ([b": ping\n\n", b"\n"], False),
    ([b"event: x\n", b"d", b"ata:1\n\n"], True), ([], False),
])
def test_event_watch_sees_a_data_field_even_split_across_pieces(pieces: list[bytes], seen: bool) -> None:
    watch = EventWatch()
    for piece in pieces:
        watch.feed(piece)
    assert watch.seen is seen


def _last_event(body: bytes) -> dict:
    return json.loads(body.decode().strip().split("\n\n")[-1].removeprefix("data: "))


async def test_an_event_stream_ending_without_any_event_is_a_502_before_the_head(make_proxy, fake):
    """llama.cpp's Python server answers ``200 text/event-stream`` and ends the stream empty when the model
    call fails after its head; the client must not get an empty 200 stream."""
    fake.script.silent_stream = True
    proxy = await make_proxy()
    async with proxy.session.post(proxy.url + CHAT, json={"model": "alpha", "stream": True}) as response:
        body = await response.json()
    assert response.status == 502 and response.headers["Content-Type"].startswith("application/json")
    assert body["error"]["code"] == "bad_gateway" and "without sending any event" in body["error"]["message"]
    proxy.activator.assert_released_once()


async def test_an_event_stream_ending_without_any_event_after_its_head_ends_with_an_error_event(make_proxy, fake):
    fake.script.silent_stream = True
    fake.hold_after_first_chunk = asyncio.Event()
    proxy = await make_proxy()
    async with proxy.session.post(proxy.url + CHAT, json={"model": "alpha", "stream": True}) as response:
        assert response.status == 200
        seen = await _read_until(response.content, b": ping")  # a comment is not an event
        fake.hold_after_first_chunk.set()
        seen += await response.content.read()
    assert seen.startswith(b": ping\n\n") and seen.count(b"data: ") == 1
    error = _last_event(seen)["error"]
    assert error["code"] == "bad_gateway" and "without sending any event" in error["message"]
    assert set(error) == {"message", "type", "param", "code"}
    proxy.activator.assert_released_once()


async def test_a_silent_stream_after_loading_comments_ends_with_an_error_event(make_proxy, fake):
    fake.script.silent_stream = True
    proxy = await make_proxy()
    status, body = await _stream_after_loading(proxy)
    assert status == 200 and _last_event(body)["error"]["code"] == "bad_gateway"
    proxy.activator.assert_released_once()


async def test_mid_body_crash_on_plain_response_cuts_the_connection(make_proxy, fake):
    fake.script.crash_mid_stream = True
    proxy = await make_proxy()
    async with proxy.session.post(proxy.url + CHAT, json={"model": "alpha"}) as response:
        assert response.status == 200
        with pytest.raises(aiohttp.ClientPayloadError):
            await response.read()
    await proxy.activator.wait_released(1)
    proxy.activator.assert_released_once()


async def test_loading_comments_while_waiting_then_stream(make_proxy):
    proxy = await make_proxy()
    gate = proxy.activator.gates["alpha"] = asyncio.Event()
    async with proxy.session.post(proxy.url + CHAT, json={"model": "alpha", "stream": True}) as response:
        assert response.status == 200
        seen = await _read_until(response.content, b": loading alpha")
        seen += await _read_until(response.content, b": loading alpha")
        gate.set()
        seen += await response.content.read()
    assert seen.count(b": loading alpha") >= 2
    assert seen.index(b": loading") < seen.index(b"tok0")
    assert seen.endswith(b"data: [DONE]\n\n")
    proxy.activator.assert_released_once()


async def test_activation_failure_after_loading_comments_is_an_sse_error_event(make_proxy):
    proxy = await make_proxy()
    gate = proxy.activator.gates["alpha"] = asyncio.Event()
    proxy.activator.errors["alpha"] = ModelFailedError("Failed to activate model: crashed")
    async with proxy.session.post(proxy.url + CHAT, json={"model": "alpha", "stream": True}) as response:
        await _read_until(response.content, b": loading alpha")
        gate.set()
        body = await response.content.read()
    error = json.loads(body.decode().strip().split("\n\n")[-1].removeprefix("data: "))
    assert error["error"]["code"] == "activation_failed"
    assert response.status == 200
    assert not proxy.activator.releases


async def test_upstream_error_after_loading_is_an_sse_error_event(make_proxy, fake):
    fake.script.status = 503
    proxy = await make_proxy()
    status, body = await _stream_after_loading(proxy)
    assert status == 200  # the head went out with the loading comments
    error = json.loads(body.decode().strip().split("\n\n")[-1].removeprefix("data: "))
    assert error["error"]["code"] == "fake"  # the upstream's own OpenAI error is relayed
    assert error["error"]["message"] == "fake failure 503"
    proxy.activator.assert_released_once()


async def test_non_streaming_wait_sends_nothing_until_granted(make_proxy):
    proxy = await make_proxy()
    gate = proxy.activator.gates["alpha"] = asyncio.Event()
    request = asyncio.ensure_future(proxy.session.post(proxy.url + CHAT, json={"model": "alpha"}))
    await asyncio.wait_for(proxy.activator.waiting.wait(), 5)
    assert not request.done()
    gate.set()
    async with await request as response:
        body = await response.json()
    assert body["choices"][0]["message"]["content"] == "tok0 tok1 tok2 tok3 "


async def test_client_gone_while_waiting_withdraws_the_request(make_proxy):
    proxy = await make_proxy(ProxyConfig(shutdown_drain_delay=0, loading_comment_interval=0.05))
    proxy.activator.gates["alpha"] = asyncio.Event()
    for stream in (False, True):
        proxy.activator.waiting.clear()
        task = asyncio.ensure_future(proxy.session.post(proxy.url + CHAT, json={"model": "alpha", "stream": stream}))
        await asyncio.wait_for(proxy.activator.waiting.wait(), 5)
        if stream:
            response = await task
            await _read_until(response.content, b": loading")
            response.close()
        else:
            task.cancel()
    await eventually(lambda: proxy.activator.withdrawn >= 2)
    assert not proxy.activator.releases


async def _stream_after_loading(proxy) -> tuple[int, bytes]:
    """A stream for ``alpha`` that waits for its activation (loading comments sent), then is granted; returns
    the status and the whole body."""
    gate = proxy.activator.gates["alpha"] = asyncio.Event()
    async with proxy.session.post(proxy.url + CHAT, json={"model": "alpha", "stream": True}) as response:
        await _read_until(response.content, b": loading alpha")
        gate.set()
        return response.status, await response.content.read()
