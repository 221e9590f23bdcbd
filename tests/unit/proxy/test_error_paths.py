"""Every error path of the proxy answers the OpenAI envelope with the spec's status, type and code."""

from __future__ import annotations

import asyncio
from dataclasses import replace

from prometheus_client import CollectorRegistry

from flexinfer.core.arbiter.policy import ArbiterPolicy
from flexinfer.core.errors import ColdStartTimeoutError, ModelFailedError, QueueFullError, ShuttingDownError
from flexinfer.observability.metrics import ProxyMetrics
from flexinfer.proxy.config import ProxyConfig
from support.recording_engine import make_model

CHAT = "/v1/chat/completions"


async def _post(proxy, path=CHAT, json=None, **kwargs):
    async with proxy.session.post(proxy.url + path, json=json, **kwargs) as response:
        return response.status, response.headers, await response.json(content_type=None)


def _assert_envelope(body, type_, code):
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["type"] == type_
    assert body["error"]["code"] == code
    assert body["error"]["message"]


async def test_missing_model_is_400_missing_required_field(make_proxy):
    proxy = await make_proxy()
    status, _, body = await _post(proxy, json={"messages": []})
    assert status == 400
    _assert_envelope(body, "invalid_request_error", "missing_required_field")
    assert body["error"]["param"] == "model"


async def test_invalid_json_without_model_source_is_400(make_proxy):
    proxy = await make_proxy()
    status, _, body = await _post(proxy, data=b"{not json", headers={"Content-Type": "application/json"})
    assert status == 400
    _assert_envelope(body, "invalid_request_error", "invalid_request_error")


async def test_unknown_model_is_404_model_not_found(make_proxy):
    proxy = await make_proxy()
    status, _, body = await _post(proxy, json={"model": "nope"})
    assert status == 404
    _assert_envelope(body, "not_found_error", "model_not_found")
    assert body["error"]["message"] == "Model 'nope' not found"
    assert body["error"]["param"] == "model"
    assert proxy.activator.acquired == 0


async def test_parked_model_is_404_and_never_activated(make_proxy):
    proxy = await make_proxy()
    status, _, body = await _post(proxy, json={"model": "sleepy"})
    assert status == 404
    _assert_envelope(body, "not_found_error", "model_not_found")
    assert proxy.activator.timeouts == []


async def test_auth_missing_and_wrong_token_are_401(make_proxy):
    proxy = await make_proxy(auth_enabled=True, auth_token="s3cret")
    status, _, body = await _post(proxy, json={"model": "alpha"})
    assert status == 401
    _assert_envelope(body, "invalid_request_error", "invalid_api_key")
    status, _, body = await _post(proxy, json={"model": "alpha"}, headers={"Authorization": "Bearer wrong"})
    assert status == 401
    assert "s3cret" not in str(body)


async def test_auth_right_token_passes_and_is_not_forwarded(make_proxy, fake):
    proxy = await make_proxy(auth_enabled=True, auth_token="s3cret")
    status, _, _ = await _post(proxy, json={"model": "alpha"}, headers={"Authorization": "Bearer s3cret"})
    assert status == 200
    assert "Authorization" not in fake.requests[-1].headers


async def test_auth_guards_model_list(make_proxy):
    proxy = await make_proxy(auth_enabled=True, auth_token="s3cret")
    async with proxy.session.get(proxy.url + "/v1/models") as response:
        assert response.status == 401


async def test_body_over_limit_is_413(make_proxy):
    proxy = await make_proxy(max_body_bytes=1024)
    status, _, body = await _post(proxy, json={"model": "alpha", "prompt": "x" * 2000})
    assert status == 413
    _assert_envelope(body, "invalid_request_error", "request_too_large")


async def test_chunked_body_over_limit_is_413(make_proxy):
    proxy = await make_proxy(max_body_bytes=1024)

    async def chunks():
        for _ in range(4):
            yield b"x" * 512

    status, _, body = await _post(proxy, data=chunks(), headers={"X-Model-ID": "alpha"})
    assert status == 413
    _assert_envelope(body, "invalid_request_error", "request_too_large")


async def test_rate_limit_is_429_with_retry_after(make_proxy):
    proxy = await make_proxy(rate_limit_enabled=True, rate_limit_per_model=0.01, rate_limit_burst=1)
    first, _, _ = await _post(proxy, json={"model": "alpha"})
    status, headers, body = await _post(proxy, json={"model": "alpha"})
    assert (first, status) == (200, 429)
    _assert_envelope(body, "rate_limit_error", "rate_limit_exceeded")
    assert int(headers["Retry-After"]) >= 1


async def test_global_rate_limit_applies_across_models(make_proxy):
    proxy = await make_proxy(rate_limit_enabled=True, rate_limit_global=0.01, rate_limit_global_burst=1)
    first, _, _ = await _post(proxy, json={"model": "alpha"})
    status, headers, _ = await _post(proxy, json={"model": "beta"})
    assert (first, status) == (200, 429)
    assert "Retry-After" in headers


async def test_queue_full_is_503_with_retry_after(make_proxy):
    proxy = await make_proxy()
    proxy.activator.errors["alpha"] = QueueFullError("Service overloaded, please retry")
    status, headers, body = await _post(proxy, json={"model": "alpha"})
    assert status == 503
    _assert_envelope(body, "service_unavailable_error", "queue_full")
    assert headers["Retry-After"] == "1"


async def test_activation_failure_is_503_activation_failed(make_proxy):
    proxy = await make_proxy()
    proxy.activator.errors["alpha"] = ModelFailedError("Failed to activate model: exit 1")
    status, headers, body = await _post(proxy, json={"model": "alpha"})
    assert status == 503
    _assert_envelope(body, "service_unavailable_error", "activation_failed")
    assert headers["Retry-After"] == "30"


async def test_activator_shutting_down_is_503_service_unavailable(make_proxy):
    proxy = await make_proxy()
    proxy.activator.errors["alpha"] = ShuttingDownError("draining")
    status, headers, body = await _post(proxy, json={"model": "alpha"})
    assert status == 503
    _assert_envelope(body, "service_unavailable_error", "service_unavailable")
    assert "Retry-After" in headers


async def test_cold_start_timeout_is_504(make_proxy):
    proxy = await make_proxy()
    proxy.activator.errors["alpha"] = ColdStartTimeoutError("Timeout waiting for model to become ready")
    status, headers, body = await _post(proxy, json={"model": "alpha"})
    assert status == 504
    _assert_envelope(body, "timeout_error", "timeout")
    assert "Retry-After" not in headers


async def test_wait_timeout_passed_to_activator_is_larger_of_queue_and_cold_start(make_proxy):
    proxy = await make_proxy(ProxyConfig(queue_timeout=5, cold_start_timeout=90, shutdown_drain_delay=0))
    await _post(proxy, json={"model": "alpha"})
    assert proxy.activator.timeouts == [90]


async def test_upstream_down_is_502_bad_gateway_and_grant_released(make_proxy):
    proxy = await make_proxy()
    proxy.activator.base_url = "http://127.0.0.1:9"
    status, _, body = await _post(proxy, json={"model": "alpha"})
    assert status == 502
    _assert_envelope(body, "upstream_error", "bad_gateway")
    proxy.activator.assert_released_once()
    assert sum(proxy.activator.releases.values()) == 1


async def test_upstream_error_status_is_passed_through(make_proxy, fake):
    fake.script.status = 500
    proxy = await make_proxy()
    status, _, body = await _post(proxy, json={"model": "alpha"})
    assert status == 500
    assert body["error"]["message"] == "fake failure 500"


async def test_unknown_route_and_wrong_method_use_the_envelope(make_proxy):
    proxy = await make_proxy()
    async with proxy.session.get(proxy.url + "/nothing/here") as response:
        assert response.status == 404
        _assert_envelope(await response.json(), "invalid_request_error", "unknown_url")
    async with proxy.session.post(proxy.url + "/v1/models", json={"model": "alpha"}) as response:
        assert response.status == 405
        _assert_envelope(await response.json(), "invalid_request_error", "method_not_allowed")


async def test_a_request_beyond_the_models_capacity_times_out_with_504_naming_the_cap(make_proxy, fake,
                                                                                      make_dispatcher):
    """The cap is the arbiter's: a second request for a one-place model waits in the model's queue, under the one
    budget, and gets a 504 that says it waited for a free place; another model is not held up."""
    fake.hold_after_first_chunk = asyncio.Event()
    dispatcher = make_dispatcher([make_model("alpha", parallel=1), make_model("beta", parallel=1)],
                                 ArbiterPolicy(cold_start_timeout=0.2))
    proxy = await make_proxy(ProxyConfig(queue_timeout=0.2, cold_start_timeout=0.2, shutdown_drain_delay=0),
                             activator=dispatcher)
    async with proxy.session.post(proxy.url + CHAT, json={"model": "alpha", "stream": True}) as held:
        await fake.first_chunk_sent.wait()
        status, _, body = await _post(proxy, json={"model": "alpha"})
        other, _, _ = await _post(proxy, json={"model": "beta"})
        fake.hold_after_first_chunk.set()
        await held.read()
    assert status == 504 and other == 200
    _assert_envelope(body, "timeout_error", "timeout")
    assert "free slot on model 'alpha' (limit 1 concurrent request;" in body["error"]["message"]


BACKGROUND = {"X-FlexInfer-Internal-Workload-Class": "Background"}


async def test_background_request_for_a_model_that_is_not_ready_is_503_and_never_activates(make_proxy):
    registry = CollectorRegistry()
    proxy = await make_proxy(metrics=ProxyMetrics(registry, ["default/beta"]))
    proxy.catalog.views = [replace(v, phase="Idle") if v.name == "beta" else v for v in proxy.catalog.views]
    status, _, body = await _post(proxy, json={"model": "beta"}, headers=BACKGROUND)
    assert status == 503
    _assert_envelope(body, "service_unavailable_error", "model_not_ready")
    assert "'default/beta' is Idle" in body["error"]["message"]
    assert proxy.activator.timeouts == []
    labels = {"model": "beta", "namespace": "default", "status": "background_not_ready"}
    assert registry.get_sample_value("flexinfer_proxy_requests_total", labels) == 1


async def test_background_request_for_a_ready_model_is_served_and_the_class_header_is_not_forwarded(make_proxy, fake):
    proxy = await make_proxy()
    status, _, body = await _post(proxy, json={"model": "alpha"}, headers=BACKGROUND)
    assert status == 200 and body["choices"]
    assert proxy.activator.acquired == 1
    assert not any(k.lower() == "x-flexinfer-internal-workload-class" for k in fake.requests[-1].headers)
