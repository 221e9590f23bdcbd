"""The memory metrics of groups that pack by memory, read from the dispatcher at scrape time.

- ``flexinfer_sharedgroup_memory_budget_bytes``, ``..._used_bytes`` (what Ready or draining members hold),
  ``..._reserved_bytes`` (what is reserved for members loading), by ``group`` and ``namespace``;
- ``flexinfer_sharedgroup_evictions_total`` by ``group``, ``namespace`` and ``reason`` (``make_room``: for
  another member that did not fit; ``out_of_memory``: after another member's start ran out of memory), every
  reason of every such group from zero;
- ``flexinfer_model_memory_need_bytes`` by ``model``, ``namespace`` and ``source`` (``measured``,
  ``declared``, ``estimated``, ``unknown``): what a model takes of its group's budget, for every model with a
  figure (one series per model; its ``source`` label changes when a better figure arrives).

Labels are bounded: groups and models come from the declared manifests, ``reason`` and ``source`` from fixed
sets. A ``prometheus_client`` collector over two callables (the dispatcher's ``memory_report`` and
``snapshot``; the manager's ``MemoryReport.groups`` and ``needs``); registered by ``flexinfer.assembly.run_local``
and ``run_manager`` on the registry ``/metrics`` serves.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from flexinfer.core.memory_need import MIB

GROUP_LABELS = ["group", "namespace"]


class NeedSource(Protocol):
    """What the collector reads of a model (the dispatcher's ``ModelState``, the manager's ``NeedRow``)."""

    @property
    def name(self) -> str: ...
    @property
    def namespace(self) -> str: ...
    @property
    def need_mib(self) -> float | None: ...
    @property
    def need_source(self) -> str | None: ...


class MemoryMetrics:
    """A collector: ``registry.register(MemoryMetrics(dispatcher.memory_report, dispatcher.snapshot))``."""

    def __init__(self, groups: Callable[[], Sequence[dict[str, Any]]],
                 models: Callable[[], Sequence[NeedSource]]) -> None:
        self._groups, self._models = groups, models

    def register(self, registry: CollectorRegistry) -> MemoryMetrics:
        registry.register(self)
        return self

    def describe(self) -> list[Metric]:
        """The metric families without samples (so registering never calls the dispatcher)."""
        return list(self._families())

    def collect(self) -> Iterator[Metric]:
        budget, used, reserved, evictions, need = self._families()
        for group in self._groups():
            namespace, _, name = str(group["group"]).partition("/")
            labels = [name, namespace]
            budget.add_metric(labels, float(group["budget_mib"]) * MIB)
            used.add_metric(labels, float(group["used_mib"]) * MIB)
            reserved.add_metric(labels, float(group["reserved_mib"]) * MIB)
            for reason, count in dict(group["evictions"]).items():
                evictions.add_metric([*labels, str(reason)], float(count))
        for model in self._models():
            if model.need_mib is not None:
                need.add_metric([model.name, model.namespace, model.need_source or "unknown"], model.need_mib * MIB)
        yield from (budget, used, reserved, evictions, need)

    @staticmethod
    def _families() -> tuple[GaugeMetricFamily, GaugeMetricFamily, GaugeMetricFamily, CounterMetricFamily,
                             GaugeMetricFamily]:
        return (
            GaugeMetricFamily("flexinfer_sharedgroup_memory_budget_bytes",
                              "Memory budget of a shared GPU group that packs by memory.", labels=GROUP_LABELS),
            GaugeMetricFamily("flexinfer_sharedgroup_memory_used_bytes",
                              "Memory its Ready (or draining) members hold.", labels=GROUP_LABELS),
            GaugeMetricFamily("flexinfer_sharedgroup_memory_reserved_bytes",
                              "Memory reserved for its members that are loading.", labels=GROUP_LABELS),
            CounterMetricFamily("flexinfer_sharedgroup_evictions", "Members evicted for memory, by reason.",
                                labels=[*GROUP_LABELS, "reason"]),
            GaugeMetricFamily("flexinfer_model_memory_need_bytes", "What a model takes of its group's memory "
                              "budget, and where the figure comes from.", labels=["model", "namespace", "source"]),
        )
