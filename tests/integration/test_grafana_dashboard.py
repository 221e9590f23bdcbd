"""The Grafana dashboard (docs/grafana/flexinfer.json) against a real Prometheus scraping a real
``flexinfer serve``: after a cold start and a swap, every panel query parses and returns data."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from support.local_serve import ServeProcess, chat, start_shared_pair
from support.prometheus import PrometheusServer

pytestmark = pytest.mark.integration

DASHBOARD = Path(__file__).resolve().parents[2] / "docs" / "grafana" / "flexinfer.json"
GRAFANA_VARIABLES = {"$__rate_interval": "1m"}
"""Grafana fills these in; any other ``$variable`` in a query would be unresolved here."""


def panel_queries() -> list[tuple[str, str]]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [(panel["title"], target["expr"]) for panel in dashboard["panels"] if panel["type"] != "row"
            for target in panel["targets"]]


def resolved(expr: str) -> str:
    for name, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(name, value)
    assert not re.search(r"\$\w", expr), f"unresolved variable in {expr}"
    return expr


def test_every_panel_has_a_datasource_and_unique_id() -> None:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    for panel in panels:
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
            assert panel["targets"], panel["title"]


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[ServeProcess]:
    process = start_shared_pair(tmp_path, "gpu0")
    yield process
    assert process.stop() == 0, process.log




def test_every_panel_query_returns_data_after_a_swap(serve: ServeProcess, tmp_path: Path) -> None:
    target = serve.url.removeprefix("http://")
    with PrometheusServer([target], tmp_path / "prom", job="serve", scrape_interval="200ms") as prom:
        prom.wait_for('flexinfer_proxy_requests_total{job="serve"}', timeout=30)
        chat(serve.url, "left")
        chat(serve.url, "right")  # swaps left out of gpu0
        prom.wait_for("sum(flexinfer_model_swap_duration_seconds_count) == 1", timeout=30)
        prom.wait_for('flexinfer_sharedgroup_state{model="right",state="Active"} == 1', timeout=30)
        queries = panel_queries()
        assert len(queries) >= 15
        empty = [(title, expr) for title, expr in queries if not prom.query(resolved(expr))]
        assert not empty, f"panels without data: {empty}"
