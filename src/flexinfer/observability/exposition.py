"""The /metrics text of a registry, in chunks: ``exposition(registry)``.

Families that format themselves (``flexinfer.observability.model_series.RenderedFamily``: the per-model lifecycle
series) give their text directly; every other family goes through prometheus_client's ``generate_latest`` on its
own. The result is the text format prometheus_client serves (``CONTENT_TYPE_LATEST``), produced piece by piece so
that a server can write it out without holding all of it, and let other work run between pieces. Bound to the
manager's registry by ``flexinfer.assembly.manager`` for its ``/metrics`` endpoint.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from flexinfer.observability.model_series import RenderedFamily


class _One(Collector):
    """A collector of one already collected family (``generate_latest`` formats collectors)."""

    def __init__(self, metric: Metric) -> None:
        self._metric = metric

    def collect(self) -> list[Metric]:
        return [self._metric]


def exposition(registry: Collector) -> Iterator[bytes]:
    """The registry's families as Prometheus text, one or more chunks per family."""
    for metric in registry.collect():
        if isinstance(metric, RenderedFamily):
            yield from metric.chunks()
        else:
            yield generate_latest(_One(metric))
