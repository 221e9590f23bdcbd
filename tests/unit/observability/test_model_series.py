"""Tests for flexinfer.observability.model_series and .exposition: the lifecycle metrics' zero series cost a
declared Model a few kilobytes (they were prometheus_client children, about 80 KB per Model), the text read
chunk by chunk is byte for byte prometheus_client's own and passes promtool, a scrape of thousands of Models
never holds its whole text, and writes between two chunks neither break the text nor show a series twice."""

from __future__ import annotations

import gc
import math
import tracemalloc
from collections import Counter

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from flexinfer.api.model import Model
from flexinfer.observability.exposition import exposition
from flexinfer.observability.metrics import LifecycleMetrics
from flexinfer.observability.model_series import ModelSeries, SeriesFamily
from support.prometheus import check_metrics
from support.resource_builders import make_model

GROUP_SIZE = 10


def fleet(count: int, namespace: str = "default") -> list[Model]:
    """``count`` shared Models, ten per group."""
    return [make_model(f"m{i:05d}", namespace, gpu={"vendor": "amd", "shared": f"g{i // GROUP_SIZE:04d}"})
            for i in range(count)]


def known(metrics: LifecycleMetrics, models: list[Model]) -> None:
    """What the manager's first pass does for each Model: declare it and report its phase."""
    for model in models:
        metrics.declared(model)
        metrics.phase_changed(model, None, "Idle")


def sample_keys(text: str) -> list[tuple[str, tuple[tuple[str, str], ...]]]:
    return [(s.name, tuple(sorted(s.labels.items())))
            for family in text_string_to_metric_families(text) for s in family.samples]


def test_a_declared_model_costs_a_few_kilobytes_however_many_series_it_has_at_zero() -> None:
    models = fleet(500)
    metrics = LifecycleMetrics(CollectorRegistry())
    gc.collect()
    tracemalloc.start()
    try:
        known(metrics, models)
        gc.collect()
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert held / len(models) < 8 * 1024, f"{held / len(models) / 1024:.1f} KB per declared Model"


def test_the_text_in_chunks_is_prometheus_clients_own_and_passes_promtool() -> None:
    registry = CollectorRegistry()
    metrics = LifecycleMetrics(registry)
    models = fleet(30)
    known(metrics, models)
    a, b = models[0], models[1]
    metrics.phase_changed(a, "Idle", "Loading")
    metrics.stage(a, "server_start", 2.5)
    metrics.stage(a, "health", 400.0)  # beyond the last bucket: +Inf only
    metrics.cold_start(a, 3.0)
    metrics.phase_changed(a, "Loading", "Ready")
    metrics.preempted(a, b.name)
    metrics.preempted(a, 'gpu-lease/team "x"\\night\nshift')  # a label value that needs escaping
    metrics.swap(b, 13.0)
    metrics.reconcile_duration("model", 0.2)
    text = b"".join(exposition(registry))
    assert text == generate_latest(registry)
    result = check_metrics(text)
    assert result.ok, (result.error, result.findings)
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in text_string_to_metric_families(text.decode()) for s in family.samples}
    labels = {"backend": "vllm", "model": a.name, "namespace": "default"}
    assert samples[("flexinfer_model_startup_stage_duration_seconds_bucket",
                    tuple(sorted({**labels, "stage": "health", "le": "300.0"}.items())))] == 0
    assert samples[("flexinfer_model_startup_stage_duration_seconds_bucket",
                    tuple(sorted({**labels, "stage": "health", "le": "+Inf"}.items())))] == 1
    assert samples[("flexinfer_sharedgroup_preemptions_total",
                    (("from", a.name), ("group", "g0000"), ("namespace", "default"),
                     ("to", 'gpu-lease/team "x"\\night\nshift')))] == 1


def test_a_scrape_of_thousands_of_models_never_holds_its_whole_text() -> None:
    registry = CollectorRegistry()
    known(LifecycleMetrics(registry), fleet(1000))
    gc.collect()
    tracemalloc.start()
    try:
        before, _ = tracemalloc.get_traced_memory()
        size = sum(len(chunk) for chunk in exposition(registry))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert size > 20_000_000, "about 200 series of 120 bytes per Model"
    assert peak - before < 4_000_000, f"{(peak - before) / 1e6:.1f} MB held to write {size / 1e6:.0f} MB"


def test_writes_between_chunks_neither_break_the_text_nor_show_a_series_twice() -> None:
    registry = CollectorRegistry()
    metrics = LifecycleMetrics(registry)
    models = fleet(100)
    known(metrics, models)
    chunks = exposition(registry)
    text = [next(chunks)]
    metrics.declared(make_model("late", gpu={"vendor": "amd", "shared": "g0000"}))
    for model in models[::7]:
        metrics.stage(model, "health", 1.0)
        metrics.phase_changed(model, "Idle", "Loading")
    metrics.forgotten(models[50])
    text += list(chunks)
    keys = sample_keys(b"".join(text).decode())
    assert [k for k, n in Counter(keys).items() if n > 1] == []
    assert ("flexinfer_model_phase", (("model", models[7].name), ("namespace", "default"), ("phase", "Loading")))\
        in keys, "a family written after the write shows it"


def test_a_family_counts_sums_and_forgets_what_its_owner_owns() -> None:
    family: SeriesFamily[str] = SeriesFamily("t_seconds", "Test.", "histogram", ["model"], buckets=(1.0, 2.0),
                                             zeros=lambda owner: [(owner,)])
    series = ModelSeries([family])
    series.declare("ns/a", "a")
    series.declare("ns/b", "b")
    family.observe(("a",), 1.5)
    family.observe(("a",), math.nan)  # no bucket; the sum is NaN as in prometheus_client
    series.own("ns/a", family, ("a",))
    (rendered,) = series.collect()
    values = {(s.name, s.labels.get("model"), s.labels.get("le")): s.value for s in rendered.samples}
    assert values[("t_seconds_bucket", "a", "2.0")] == 1 and values[("t_seconds_count", "a", None)] == 1
    assert math.isnan(values[("t_seconds_sum", "a", None)])
    assert values[("t_seconds_count", "b", None)] == 0
    series.forget("ns/a")
    (rendered,) = series.collect()
    assert {s.labels["model"] for s in rendered.samples} == {"b"}
