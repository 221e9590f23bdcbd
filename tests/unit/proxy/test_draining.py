"""``DrainState.abort`` (a second shutdown signal): every request in flight ends now with a documented
``service_unavailable`` error — an SSE error event on a started stream, a 503 body otherwise — and its grant
is released once."""

from __future__ import annotations

import asyncio
import json

from flexinfer.proxy.config import ProxyConfig
from support.polling import eventually

CHAT = "/v1/chat/completions"


async def test_abort_ends_a_started_stream_with_an_error_event(make_proxy, fake):
    fake.hold_after_first_chunk = asyncio.Event()
    proxy = await make_proxy(ProxyConfig(shutdown_drain_delay=0, graceful_shutdown_timeout=60))
    response = await proxy.session.post(proxy.url + CHAT, json={"model": "alpha", "stream": True})
    await fake.first_chunk_sent.wait()
    shutdown = asyncio.ensure_future(proxy.server.shutdown())
    await eventually(lambda: not proxy.server.state.accepting)
    assert proxy.server.state.abort() == 1
    body = (await asyncio.wait_for(response.read(), 5)).decode()
    last = [line for line in body.splitlines() if line.startswith("data: ")][-1]
    assert json.loads(last[len("data: "):])["error"]["code"] == "service_unavailable"
    assert "[DONE]" not in body
    assert await asyncio.wait_for(shutdown, 5) == "completed"
    await fake.cancelled.wait()  # the upstream stream was closed too
    proxy.activator.assert_released_once()


async def test_abort_answers_a_waiting_request_with_503(make_proxy):
    proxy = await make_proxy()
    proxy.activator.gates["alpha"] = asyncio.Event()
    request = asyncio.ensure_future(proxy.session.post(proxy.url + CHAT, json={"model": "alpha"}))
    await asyncio.wait_for(proxy.activator.waiting.wait(), 5)
    assert proxy.server.state.abort() == 1
    response = await asyncio.wait_for(request, 5)
    assert response.status == 503
    assert (await response.json())["error"]["code"] == "service_unavailable"
    assert proxy.server.state.inflight == 0
    assert not proxy.activator.releases
