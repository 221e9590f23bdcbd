"""Metrics Prometheus can trust: a real ``flexinfer serve`` (two fake model servers sharing one GPU group)
scraped by a real Prometheus every 200 ms. Requests alternate between the two models, so every request
after the first swaps the GPU; ``increase()`` over the run must count every swap, preemption, cold start,
activation wait and request. A series that appeared with its first event would hide that event (one per
model and metric), so this fails when per-model series are created lazily."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from support.local_serve import ServeProcess, chat, start_shared_pair
from support.prometheus import PrometheusServer

pytestmark = pytest.mark.integration

MODELS = ("left", "right")
REQUESTS = 7
"""Alternating requests: the first cold-starts ``left`` on the idle GPU, each later one is a swap."""
SWAPS = REQUESTS - 1
UNDER = 0.5
"""increase() may miss nothing: a series that appears with its first event (the old lazy series) hides that
event, so the count falls a whole event short (4.36 of 6 swaps)."""
OVER = 1.0
"""increase() extrapolates to the end of its range by up to about one scrape interval, so it may read a little
above the real count (6.51 of 6 seen in a full run)."""


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[ServeProcess]:
    process = start_shared_pair(tmp_path, "pair", MODELS)
    yield process
    assert process.stop() == 0, process.log




def total(prom: PrometheusServer, expr: str) -> float:
    result = prom.query(f"sum({expr})")
    return float(result[0]["value"][1]) if result else 0.0


def test_increase_counts_every_swap_activation_and_request(serve: ServeProcess, tmp_path: Path) -> None:
    target = serve.url.removeprefix("http://")
    with PrometheusServer([target], tmp_path / "prom", job="serve", scrape_interval="200ms") as prom:
        prom.wait_for('flexinfer_proxy_requests_total{job="serve",model="left",status="success"}', timeout=30)
        for i in range(REQUESTS):
            chat(serve.url, MODELS[i % 2])
        # The raw counters are exact; once Prometheus holds the final values, increase() must agree.
        prom.wait_for(f'sum(flexinfer_proxy_requests_total{{job="serve",status="success"}}) == {REQUESTS}',
                      timeout=30)
        prom.wait_for(f'sum(flexinfer_model_swap_duration_seconds_count{{job="serve"}}) == {SWAPS}', timeout=30)
        expected = {
            "flexinfer_model_swap_duration_seconds_count": SWAPS,
            "flexinfer_sharedgroup_preemptions_total": SWAPS,
            "flexinfer_model_cold_start_duration_seconds_count": REQUESTS,
            'flexinfer_model_startup_stage_duration_seconds_count{stage="server_start"}': REQUESTS,
            'flexinfer_proxy_activation_duration_seconds_count{result="success"}': REQUESTS,
            "flexinfer_proxy_queue_wait_duration_seconds_count": REQUESTS,
            "flexinfer_proxy_queued_requests_total": REQUESTS,
            'flexinfer_proxy_requests_total{status="success"}': REQUESTS,
            "flexinfer_proxy_request_duration_seconds_count": REQUESTS,
        }
        measured = {name: total(prom, f"increase({name}[5m])") for name in expected}
        wrong = {name: (round(measured[name], 2), count) for name, count in expected.items()
                 if not count - UNDER <= measured[name] <= count + OVER}
        assert not wrong, f"increase() (measured, real) per metric: {wrong}"
