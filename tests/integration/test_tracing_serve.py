"""Tracing end to end through ``flexinfer serve`` (``start_local``), with the real OTLP/HTTP receiver and the
scripted fake OpenAI server as the model server process.

- A request with a client ``traceparent`` for a cold model: ``proxy.handle_request`` continues the client's
  trace (parent = the client's span) with the HTTP attributes and a bounded ``http.route``;
  ``proxy.cold_start`` and ``proxy.upstream`` are its children; the model server received a ``traceparent``
  in the same trace whose parent is the upstream span; ``model.activation`` is its own trace, linked to the
  request span, with one child per stage; every span's resource has ``service.name``/``service.namespace``.
- A model that crashes at start: the 5xx request span, the wait and the activation all have status ERROR.
- ``FLEXINFER_OTEL_TRUST_INCOMING=false``: the client's trace id is ignored everywhere, also upstream; with
  tracing off as well, the client's ``traceparent``/``baggage`` still never reach the model server.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from flexinfer.assembly.local import LocalServer, start_local
from support.local_serve import fake_server_command, model_manifest, serve_env, write_manifests
from support.otlp_receiver import OTLPReceiver, ReceivedSpan

pytestmark = pytest.mark.integration

CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"
TRACEPARENT = f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"
INTERNAL, SERVER, CLIENT = 1, 2, 3
UNSET, ERROR = 0, 2

Starter = Callable[..., Any]


@pytest.fixture
def receiver() -> Iterator[OTLPReceiver]:
    with OTLPReceiver() as running:
        yield running


@pytest.fixture
async def start_serve(tmp_path: Path, receiver: OTLPReceiver) -> AsyncIterator[Starter]:
    """Start ``serve`` in process over ``documents`` with tracing on (extra env from keyword arguments)."""
    servers: list[LocalServer] = []

    async def start(documents: list[dict[str, Any]], **extra: str) -> LocalServer:
        manifests = write_manifests(tmp_path / "models" / "models.yaml", documents)
        env = serve_env(tmp_path / "state", FLEXINFER_OTEL_ENABLED="true",
                        OTEL_EXPORTER_OTLP_ENDPOINT=receiver.endpoint, FLEXINFER_OTEL_SERVICE_NAMESPACE="test",
                        PROXY_COLD_START_TIMEOUT="60s")
        env.update(extra)
        env.pop("OTEL_SERVICE_NAME", None)
        env.pop("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", None)
        server = await start_local([manifests.parent], host="127.0.0.1", port=0, env=env, base_dir=tmp_path)
        servers.append(server)
        return server

    yield start
    for server in servers:
        if not server.proxy.closed:
            await server.close()


def fake_model(name: str, tmp_path: Path, *extra: str) -> dict[str, Any]:
    weights = tmp_path / "weights.bin"
    weights.write_bytes(b"w")
    return model_manifest(name, weights, None, {"command": fake_server_command("--model-name", name, *extra)})


async def chat(url: str, model: str, headers: dict[str, str]) -> int:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
    async with aiohttp.ClientSession() as session, \
            session.post(url + "/v1/chat/completions", json=body, headers=headers,
                         timeout=aiohttp.ClientTimeout(total=90)) as response:
        await response.read()
        return response.status


def upstream_requests(record: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in record.read_text().splitlines()]


def by_name(spans: list[ReceivedSpan], name: str) -> list[ReceivedSpan]:
    return [span for span in spans if span.name == name]


async def test_cold_start_request_is_one_trace_from_client_to_model_server(
    start_serve: Starter, receiver: OTLPReceiver, tmp_path: Path,
) -> None:
    record = tmp_path / "upstream.jsonl"
    server = await start_serve([fake_model("cold", tmp_path, "--record", str(record))])
    assert await chat(server.url, "cold", {"traceparent": TRACEPARENT}) == 200
    await server.close()  # flushes every queued span

    handle, wait, call = (receiver.span(n) for n in ("proxy.handle_request", "proxy.cold_start", "proxy.upstream"))
    assert (handle.trace_id, handle.parent_span_id, handle.kind) == (CLIENT_TRACE, CLIENT_SPAN, SERVER)
    assert handle.attributes["http.request.method"] == "POST"
    assert handle.attributes["http.route"] == "/v1/chat/completions"
    assert handle.attributes["url.path"] == "/v1/chat/completions"
    assert handle.attributes["http.response.status_code"] == 200
    assert handle.attributes["flexinfer.model"] == "cold" and handle.status_code == UNSET
    assert (wait.trace_id, wait.parent_span_id, wait.kind) == (CLIENT_TRACE, handle.span_id, INTERNAL)
    assert wait.attributes["flexinfer.model"] == "cold" and wait.attributes["flexinfer.outcome"] == "granted"
    assert (call.trace_id, call.parent_span_id, call.kind) == (CLIENT_TRACE, handle.span_id, CLIENT)
    assert call.attributes["http.response.status_code"] == 200

    [forwarded] = [r for r in upstream_requests(record) if r["path"] == "/v1/chat/completions"]
    _, trace_id, parent_id, _ = forwarded["headers"]["traceparent"].split("-")
    assert (trace_id, parent_id) == (CLIENT_TRACE, call.span_id)

    root = receiver.span("model.activation")
    assert root.trace_id != CLIENT_TRACE and root.parent_span_id == ""
    assert root.links == [(CLIENT_TRACE, handle.span_id)]
    assert root.attributes["flexinfer.model"] == "cold" and root.attributes["flexinfer.outcome"] == "ready"
    assert root.attributes["flexinfer.activation.kind"] == "cold_start"
    stages = [s for s in receiver.spans() if s.name.startswith("activation.")]
    assert {"activation.server_start", "activation.health"} <= {s.name for s in stages}
    assert all((s.trace_id, s.parent_span_id) == (root.trace_id, root.span_id) for s in stages)
    for span in receiver.spans():
        assert (span.resource["service.name"], span.resource["service.namespace"]) == ("flexinfer", "test"), span


async def test_model_that_crashes_at_start_gives_error_spans(
    start_serve: Starter, receiver: OTLPReceiver, tmp_path: Path,
) -> None:
    server = await start_serve([fake_model("broken", tmp_path, "--crash-at-start")])
    status = await chat(server.url, "broken", {"traceparent": TRACEPARENT})
    assert status >= 500
    await server.close()

    handle, wait = receiver.span("proxy.handle_request"), receiver.span("proxy.cold_start")
    assert handle.status_code == ERROR and handle.attributes["http.response.status_code"] == status
    assert handle.attributes["flexinfer.error"]
    assert wait.status_code == ERROR and wait.attributes["flexinfer.outcome"] == "failed"
    assert by_name(receiver.spans(), "proxy.upstream") == []
    root = receiver.span("model.activation")
    assert root.status_code == ERROR and root.attributes["flexinfer.outcome"] == "failed"
    assert root.links == [(CLIENT_TRACE, handle.span_id)]


async def test_untrusted_incoming_context_starts_a_new_trace(
    start_serve: Starter, receiver: OTLPReceiver, tmp_path: Path,
) -> None:
    record = tmp_path / "upstream.jsonl"
    server = await start_serve([fake_model("cold", tmp_path, "--record", str(record))],
                               FLEXINFER_OTEL_TRUST_INCOMING="false")
    headers = {"traceparent": TRACEPARENT, "baggage": "tenant=evil"}
    assert await chat(server.url, "cold", headers) == 200
    await server.close()

    handle, call = receiver.span("proxy.handle_request"), receiver.span("proxy.upstream")
    assert handle.trace_id != CLIENT_TRACE and handle.parent_span_id == ""
    assert all(span.trace_id != CLIENT_TRACE for span in receiver.spans())
    [forwarded] = [r for r in upstream_requests(record) if r["path"] == "/v1/chat/completions"]
    _, trace_id, parent_id, _ = forwarded["headers"]["traceparent"].split("-")
    assert (trace_id, parent_id) == (handle.trace_id, call.span_id)
    assert "baggage" not in forwarded["headers"]


async def test_untrusted_incoming_context_is_dropped_even_with_tracing_off(
    start_serve: Starter, receiver: OTLPReceiver, tmp_path: Path,
) -> None:
    record = tmp_path / "upstream.jsonl"
    server = await start_serve([fake_model("cold", tmp_path, "--record", str(record))],
                               FLEXINFER_OTEL_ENABLED="false", FLEXINFER_OTEL_TRUST_INCOMING="false")
    assert await chat(server.url, "cold", {"traceparent": TRACEPARENT, "baggage": "tenant=evil"}) == 200
    await server.close()
    [forwarded] = [r for r in upstream_requests(record) if r["path"] == "/v1/chat/completions"]
    assert "traceparent" not in forwarded["headers"] and "baggage" not in forwarded["headers"]
    assert receiver.spans() == []


async def test_trusted_incoming_context_passes_through_with_tracing_off(
    start_serve: Starter, receiver: OTLPReceiver, tmp_path: Path,
) -> None:
    record = tmp_path / "upstream.jsonl"
    server = await start_serve([fake_model("cold", tmp_path, "--record", str(record))],
                               FLEXINFER_OTEL_ENABLED="false")
    assert await chat(server.url, "cold", {"traceparent": TRACEPARENT}) == 200
    await server.close()
    [forwarded] = [r for r in upstream_requests(record) if r["path"] == "/v1/chat/completions"]
    assert forwarded["headers"]["traceparent"] == TRACEPARENT  # a plain header, forwarded untouched
    assert receiver.spans() == []
