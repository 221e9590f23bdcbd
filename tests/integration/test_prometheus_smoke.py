"""Smoke test for the Prometheus helpers: promtool lints expositions, a real server scrapes a target."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest, start_http_server

from support.prometheus import PrometheusServer, check_metrics

pytestmark = pytest.mark.integration

COUNTER_WITHOUT_TOTAL = "# HELP requests Requests served.\n# TYPE requests counter\nrequests 3\n"


def _registry() -> tuple[CollectorRegistry, Counter]:
    registry = CollectorRegistry()
    requests = Counter("smoke_requests", "Requests served.", ["code"], registry=registry)
    latency = Histogram("smoke_request_duration_seconds", "Request latency.", registry=registry)
    requests.labels(code="200").inc(3)
    latency.observe(0.02)
    return registry, requests


def test_promtool_accepts_prometheus_client_exposition() -> None:
    registry, _ = _registry()
    result = check_metrics(generate_latest(registry))
    assert result.ok, result


def test_promtool_reports_counter_without_total_suffix() -> None:
    result = check_metrics(COUNTER_WITHOUT_TOTAL)
    assert not result.ok
    assert result.error is None
    assert result.findings == ('requests counter metrics should have "_total" suffix',)


def test_promtool_rejects_unparseable_exposition() -> None:
    result = check_metrics("requests_total three\n")
    assert not result.ok
    assert result.error is not None and "parsing error" in result.error


def test_prometheus_server_scrapes_a_real_target(tmp_path: Path) -> None:
    registry, _ = _registry()
    httpd, thread = start_http_server(0, addr="127.0.0.1", registry=registry)
    try:
        target = f"127.0.0.1:{httpd.server_port}"
        with PrometheusServer([target], tmp_path / "prom", job="smoke") as prom:
            pid = prom.pid
            result = prom.wait_for('smoke_requests_total{job="smoke",code="200"}', timeout=30)
            assert float(result[0]["value"][1]) == 3.0
            assert prom.targets_health() == {f"http://{target}/metrics": "up"}
        assert prom.pid is None and pid is not None
        assert not Path(f"/proc/{pid}").exists()  # stopped and reaped
    finally:
        httpd.shutdown()
        httpd.server_close()  # shutdown() only stops the serving loop; this closes the listening socket
        thread.join(timeout=5)
