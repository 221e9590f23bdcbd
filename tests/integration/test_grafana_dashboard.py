"""The Grafana dashboard (docs/grafana/flexinfer.json) against a real Prometheus scraping a real
``flexinfer serve``: after a cold start and a swap, every panel query parses and returns data."""

from __future__ import annotations

import json
import re
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from support.local_serve import ServeProcess, fake_server_command, model_manifest, serve_env, write_manifests
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
    weights = tmp_path / "weights.bin"
    weights.write_bytes(b"w")
    documents = [model_manifest(m, weights, "gpu0", {"command": fake_server_command("--model-name", m)})
                 for m in ("left", "right")]
    manifests = write_manifests(tmp_path / "models" / "models.yaml", documents)
    process = ServeProcess.start(manifests.parent, serve_env(tmp_path / "state", PROXY_COLD_START_TIMEOUT="60s"))
    yield process
    assert process.stop() == 0, process.log


def chat(base_url: str, model: str) -> None:
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}]}).encode()
    request = urllib.request.Request(f"{base_url}/v1/chat/completions", data=body,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        assert response.status == 200


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
