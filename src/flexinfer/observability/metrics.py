"""Every FlexInfer Prometheus metric, defined once, on an injected ``CollectorRegistry`` (no global state).

- ``LifecycleMetrics``: model lifecycle and shared-GPU metrics (cold start, swap, phase, transitions,
  group state, preemptions, startup stages) plus the reconcile metrics. It satisfies
  ``flexinfer.runtime.observer.LifecycleObserver`` (the dispatcher calls it) and is called directly by the
  Kubernetes engine; ``observability.tracing.reconcile_span`` calls ``reconcile_duration``/``reconcile_error``.
- ``ProxyMetrics``: the proxy metrics of spec §4.3 that FlexInfer keeps; satisfies
  ``flexinfer.proxy.hooks.ProxyMetrics``.

Label bounds: ``model`` values come only from declared Models, always with their ``namespace`` label (a name
used in several namespaces stays two series). ``LifecycleMetrics`` is only ever given Model objects;
``ProxyMetrics`` is given model keys (``namespace/name``), labels a key only after ``declare_models`` and
counts anything else under ``model="", namespace=""`` (an unknown, ambiguous or missing model). ``stage``,
``phase``, ``state``, ``status``, ``outcome`` take values from fixed sets; others are dropped. Built by
``flexinfer.assembly``.

Series exist before their first event: declaring a model (``LifecycleMetrics.declared``,
``ProxyMetrics.declare_models``) creates every counter and histogram series of it at zero, for every value
of the bounded labels (a series that appears with its first event hides that event from ``increase()``
and ``rate()``). Values that are not known in advance (a GPULease owner as preemption target) appear with
their first event. Forgetting a model removes all its series. The lifecycle zero series are not stored: a
``flexinfer.observability.model_series.ModelSeries`` derives them from the declared Models when it is read.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from flexinfer.api.model import Model
from flexinfer.core.cache_strategy import effective_cache_strategy
from flexinfer.core.lifecycle_clock import STAGE_NAMES
from flexinfer.core.phases import PHASES
from flexinfer.observability.model_series import ModelSeries, SeriesFamily
from flexinfer.runtime.observer import NO_CAUSE, ActivationRecord, PhaseCause

COLD_START_BUCKETS = (0.5, 1, 2, 3, 5, 8, 13, 21, 34, 55, 89, 120, 180, 300)
SWAP_BUCKETS = (0.25, 0.5, 1, 2, 3, 5, 8, 13, 21, 34, 55, 89, 120)
STAGE_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 3, 5, 8, 13, 21, 34, 55, 89, 120, 180, 300)
RECONCILE_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30)
QUEUE_WAIT_BUCKETS = (0.1, 0.5, 1, 2, 5, 10, 20, 30, 60)
ACTIVATION_BUCKETS = (1, 5, 10, 30, 60, 120, 180, 300, 600, 900)
SHUTDOWN_BUCKETS = (0.1, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600)
REQUEST_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 90, 120, 180, 300, 450, 600, 900, 1200, 1800)
"""Proxied requests, from an embedding call (tens of ms) to a stream that runs for many minutes."""
TRANSITION_REASON = "reconcile"
GROUP_STATES = ("Active", "Queued", "Preempted")
UNKNOWN_MODEL = ""
"""The model key (and so the ``model`` and ``namespace`` label values) of requests whose model is unknown or
undeclared."""


class _SeriesBook:
    """Remembers which label sets were written per model so forgetting a model removes exactly those."""

    def __init__(self) -> None:
        self._series: dict[str, set[tuple[Counter | Gauge | Histogram, tuple[str, ...]]]] = defaultdict(set)

    def note(self, owner: str, metric: Counter | Gauge | Histogram, labels: tuple[str, ...]) -> None:
        self._series[owner].add((metric, labels))

    def forget(self, owner: str) -> None:
        for metric, labels in self._series.pop(owner, set()):
            with contextlib.suppress(KeyError):
                metric.remove(*labels)


@dataclass(frozen=True)
class Declared:
    """A declared Model's label values: its zero series follow from them (``LifecycleMetrics``)."""

    name: str
    namespace: str
    backend: str
    cache_strategy: str
    group: str


TRANSITION_PAIRS = tuple((old, new) for old in PHASES for new in PHASES if old != new)


class LifecycleMetrics:
    """Model lifecycle, shared-group and reconcile metrics (see the module docstring). The per-model families are
    a ``ModelSeries``: a declared Model's zero series are derived from its ``Declared`` labels, not stored."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self._declared: dict[str, Declared] = {}
        self._members: dict[tuple[str, str], dict[str, str]] = defaultdict(dict)
        """``(namespace, group)`` → member name → model key, for the preemption pairs."""
        self._cold_start: SeriesFamily[Declared] = SeriesFamily(
            "flexinfer_model_cold_start_duration_seconds", "Duration from model activation to Ready.", "histogram",
            ["model", "namespace", "backend", "cache_strategy"], buckets=COLD_START_BUCKETS,
            zeros=lambda d: [(d.name, d.namespace, d.backend, d.cache_strategy)])
        self._swap: SeriesFamily[Declared] = SeriesFamily(
            "flexinfer_model_swap_duration_seconds",
            "Duration from the swap decision (the incumbent lost the GPU) to this model Ready.", "histogram",
            ["model", "namespace", "backend", "group"], buckets=SWAP_BUCKETS,
            zeros=lambda d: [(d.name, d.namespace, d.backend, d.group)] if d.group else [])
        self._phase: SeriesFamily[Declared] = SeriesFamily(
            "flexinfer_model_phase", "Current model phase (one-hot).", "gauge", ["model", "namespace", "phase"])
        self._transitions: SeriesFamily[Declared] = SeriesFamily(
            "flexinfer_model_transitions_total", "Model phase transitions.", "counter",
            ["model", "namespace", "from", "to", "reason"],
            zeros=lambda d: [(d.name, d.namespace, old, new, TRANSITION_REASON) for old, new in TRANSITION_PAIRS])
        self._group_state: SeriesFamily[Declared] = SeriesFamily(
            "flexinfer_sharedgroup_state", "Shared-group state of a member (one-hot).", "gauge",
            ["group", "model", "namespace", "state"])
        self._preemptions: SeriesFamily[Declared] = SeriesFamily(
            "flexinfer_sharedgroup_preemptions_total", "Members that lost their shared GPU.", "counter",
            ["group", "namespace", "from", "to"], zeros=self._member_pairs)
        self._stage: SeriesFamily[Declared] = SeriesFamily(
            "flexinfer_model_startup_stage_duration_seconds", "Duration of one startup stage of an activation.",
            "histogram", ["model", "namespace", "backend", "stage"], buckets=STAGE_BUCKETS,
            zeros=lambda d: [(d.name, d.namespace, d.backend, stage) for stage in STAGE_NAMES])
        self._series = ModelSeries([self._cold_start, self._swap, self._phase, self._transitions, self._group_state,
                                    self._preemptions, self._stage])
        registry.register(self._series)
        self._reconcile = Histogram("flexinfer_reconcile_duration_seconds", "Duration of one reconcile.",
                                    ["controller"], buckets=RECONCILE_BUCKETS, registry=registry)
        self._reconcile_errors = Counter("flexinfer_reconcile_errors_total", "Reconciles that failed.",
                                         ["controller"], registry=registry)

    def _member_pairs(self, declared: Declared) -> list[tuple[str, ...]]:
        """The zero preemption series of a member: one per other member of its group it could lose to."""
        if not declared.group:
            return []
        members = self._members.get((declared.namespace, declared.group), {})
        return [(declared.group, declared.namespace, declared.name, other) for other in members
                if other != declared.name]

    # LifecycleObserver ------------------------------------------------------

    def cold_start(self, model: Model, seconds: float) -> None:
        labels = (model.name, model.namespace, model.backend, effective_cache_strategy(model))
        self._cold_start.observe(labels, seconds)
        self._series.own(model.key, self._cold_start, labels)

    def swap(self, model: Model, seconds: float) -> None:
        labels = (model.name, model.namespace, model.backend, model.group or "")
        self._swap.observe(labels, seconds)
        self._series.own(model.key, self._swap, labels)

    def stage(self, model: Model, stage: str, seconds: float) -> None:
        if stage not in STAGE_NAMES:
            return
        labels = (model.name, model.namespace, model.backend, stage)
        self._stage.observe(labels, seconds)
        self._series.own(model.key, self._stage, labels)

    def phase_changed(self, model: Model, old: str | None, new: str, cause: PhaseCause = NO_CAUSE) -> None:
        """One-hot phase gauge; a transition when ``old`` is set and differs; group state for shared models."""
        if new not in PHASES:
            return
        for phase in PHASES:
            labels: tuple[str, ...] = (model.name, model.namespace, phase)
            self._phase.set(labels, 1 if phase == new else 0)
            self._series.own(model.key, self._phase, labels)
        if old is not None and old != new:
            moved = (model.name, model.namespace, old, new, TRANSITION_REASON)
            self._transitions.inc(moved)
            self._series.own(model.key, self._transitions, moved)
        if model.group:
            state = "Active" if new in ("Loading", "Ready") else "Preempted" if new == "Preempted" else "Queued"
            self.group_state(model, state)

    def group_state(self, model: Model, state: str) -> None:
        """One-hot ``flexinfer_sharedgroup_state`` for a shared member."""
        if state not in GROUP_STATES or not model.group:
            return
        for candidate in GROUP_STATES:
            labels = (model.group, model.name, model.namespace, candidate)
            self._group_state.set(labels, 1 if candidate == state else 0)
            self._series.own(model.key, self._group_state, labels)

    def preempted(self, loser: Model, by: str) -> None:
        """``loser`` lost its group's GPU to ``by`` (a member name, or ``gpu-lease/<owner>``); the series goes
        with either member."""
        labels = (loser.group or "", loser.namespace, loser.name, by)
        self._preemptions.inc(labels)
        self._series.own(loser.key, self._preemptions, labels)
        winner = self._members.get((loser.namespace, loser.group or ""), {}).get(by)
        if winner is not None:
            self._series.own(winner, self._preemptions, labels)

    def activation(self, record: ActivationRecord) -> None:
        """Activation records feed traces, not metrics (the samples arrive via cold_start/swap/stage)."""
        return None

    def declared(self, model: Model) -> None:
        """Every counter and histogram series of ``model`` exists at zero from now on (idempotent; after a spec
        change that moves its backend, cache strategy or group, the zero series follow the new labels)."""
        declared = Declared(model.name, model.namespace, model.backend, effective_cache_strategy(model),
                            model.group or "")
        if self._declared.get(model.key) == declared:
            return
        self._leave_group(model.key)
        self._declared[model.key] = declared
        self._series.declare(model.key, declared)
        if declared.group:
            self._members[(model.namespace, declared.group)][model.name] = model.key

    def _leave_group(self, key: str) -> None:
        declared = self._declared.pop(key, None)
        if declared is None or not declared.group:
            return
        members = self._members.get((declared.namespace, declared.group), {})
        if members.get(declared.name) == key:
            del members[declared.name]
        if not members:
            self._members.pop((declared.namespace, declared.group), None)

    def forgotten(self, model: Model) -> None:
        """Remove every series of a deleted model."""
        self._leave_group(model.key)
        self._series.forget(model.key)

    # Reconcile (called by observability.tracing.reconcile_span) ------------

    def reconcile_duration(self, controller: str, seconds: float) -> None:
        self._reconcile.labels(controller).observe(seconds)

    def reconcile_error(self, controller: str) -> None:
        self._reconcile_errors.labels(controller).inc()


REQUEST_STATUSES = ("success", "error", "cancelled", "rate_limited", "parked", "endpoint_unsupported",
                    "admission_rejected", "background_not_ready", "parked_behind_primary")
"""The ``status`` values of ``flexinfer_proxy_requests_total``; ``cancelled``: the client went away."""
WAIT_OUTCOMES = frozenset({"granted", "timeout", "rejected", "failed", "cancelled"})
ACTIVATION_RESULTS = ("success", "failure")
RATE_LIMIT_SCOPES = ("model", "global")


class ProxyMetrics:
    """The proxy's metrics (``flexinfer_proxy_*``); see ``flexinfer.proxy.hooks.ProxyMetrics``. Calls take a
    model key (``namespace/name``), labelled as ``model`` and ``namespace``."""

    def __init__(self, registry: CollectorRegistry, models: Iterable[str] = ()) -> None:
        self.registry = registry
        self._declared: set[str] = set()
        self._book = _SeriesBook()
        self._hot: dict[tuple[str, str], tuple[Any, Any]] = {}
        """The labelled children every request uses, per (model key, status) (status ``""``: the connections
        gauge), so a request does no label lookup; cleared whenever the declared models change. Keys come
        from the catalog, so the cache is as bounded as the series themselves."""
        per_model = ["model", "namespace"]
        self._requests = Counter("flexinfer_proxy_requests_total", "Proxied requests by final status.",
                                 [*per_model, "status"], registry=registry)
        self._duration = Histogram("flexinfer_proxy_request_duration_seconds", "Proxied request duration.",
                                   per_model, buckets=REQUEST_BUCKETS, registry=registry)
        self._depth = Gauge("flexinfer_proxy_queue_depth",
                            "Requests waiting for their model (an activation or a per-model concurrency slot).",
                            per_model, registry=registry)
        self._wait = Histogram("flexinfer_proxy_queue_wait_duration_seconds", "Time a request waited for its model.",
                               per_model, buckets=QUEUE_WAIT_BUCKETS, registry=registry)
        self._queued = Counter("flexinfer_proxy_queued_requests_total", "Requests that had to wait.",
                               per_model, registry=registry)
        self._rejected = Counter("flexinfer_proxy_queue_rejected_total", "Requests rejected by a full queue.",
                                 per_model, registry=registry)
        self._activation = Histogram("flexinfer_proxy_activation_duration_seconds",
                                     "Time a waiting request spent until its model was Ready (or it gave up).",
                                     [*per_model, "result"], buckets=ACTIVATION_BUCKETS, registry=registry)
        self._connections = Gauge("flexinfer_proxy_active_connections", "Requests being forwarded.",
                                  per_model, registry=registry)
        self._rate_limited = Counter("flexinfer_proxy_rate_limited_total", "Requests refused by a rate limit.",
                                     [*per_model, "scope"], registry=registry)
        self._shutdowns = Counter("flexinfer_proxy_shutdowns_total", "Proxy shutdowns by result.",
                                  ["result"], registry=registry)
        self._shutdown_duration = Histogram("flexinfer_proxy_shutdown_duration_seconds",
                                            "Duration of a graceful proxy shutdown.",
                                            buckets=SHUTDOWN_BUCKETS, registry=registry)
        self._tasks = Gauge("flexinfer_proxy_event_loop_tasks",
                            "asyncio tasks alive in the proxy's event loop (steady under steady load; growth is a "
                            "leak).", registry=registry)
        self._tasks.set_function(_task_counter())
        self._zero_series(UNKNOWN_MODEL)
        self.declare_models(models)

    def declare_models(self, keys: Iterable[str]) -> None:
        """Set the declared model keys: new ones get zero series, dropped ones lose all their series."""
        wanted = set(keys) - {UNKNOWN_MODEL}
        self._hot.clear()
        for gone in self._declared - wanted:
            self._book.forget(gone)
        for key in sorted(wanted - self._declared):
            self._zero_series(key)
        self._declared = wanted

    def _zero_series(self, key: str) -> None:
        """Every series of one model key at zero, for every value of the bounded labels (the unknown model
        ``""`` only has request and rate-limit series: it never waits or connects)."""
        labels = model_labels(key)
        for status in REQUEST_STATUSES:
            self._note(key, self._requests, (*labels, status))
        for scope in RATE_LIMIT_SCOPES:
            self._note(key, self._rate_limited, (*labels, scope))
        self._note(key, self._duration, labels)
        if key == UNKNOWN_MODEL:
            return
        for result in ACTIVATION_RESULTS:
            self._note(key, self._activation, (*labels, result))
        for metric in (self._wait, self._queued, self._rejected, self._depth, self._connections):
            self._note(key, metric, labels)

    def _label(self, model: str | None) -> str:
        return model if model is not None and model in self._declared else UNKNOWN_MODEL

    def _note(self, model: str, metric: Counter | Gauge | Histogram, labels: tuple[str, ...]) -> None:
        metric.labels(*labels)
        if model:
            self._book.note(model, metric, labels)

    def _request_children(self, model: str | None, status: str) -> tuple[Any, Any]:
        hot = self._hot.get((model or "", status))
        if hot is None:
            key = self._label(model)
            labels = model_labels(key)
            known = status if status in REQUEST_STATUSES else "error"
            self._note(key, self._requests, (*labels, known))
            self._note(key, self._duration, labels)
            hot = self._hot[(model or "", status)] = (self._requests.labels(*labels, known),
                                                      self._duration.labels(*labels))
        return hot

    def _connections_child(self, model: str) -> Any:
        hot = self._hot.get((model, ""))
        if hot is None:
            key = self._label(model)
            self._note(key, self._connections, model_labels(key))
            hot = self._hot[(model, "")] = (self._connections.labels(*model_labels(key)), None)
        return hot[0]

    def request_finished(self, model: str | None, status: str, seconds: float) -> None:
        requests, duration = self._request_children(model, status)
        requests.inc()
        duration.observe(seconds)

    def connection_opened(self, model: str) -> None:
        self._connections_child(model).inc()

    def connection_closed(self, model: str) -> None:
        self._connections_child(model).dec()

    def wait_started(self, model: str) -> None:
        key = self._label(model)
        self._note(key, self._queued, model_labels(key))
        self._queued.labels(*model_labels(key)).inc()
        self._depth.labels(*model_labels(key)).inc()

    def wait_finished(self, model: str, seconds: float, outcome: str) -> None:
        key = self._label(model)
        labels = model_labels(key)
        self._depth.labels(*labels).dec()
        self._note(key, self._wait, labels)
        self._wait.labels(*labels).observe(seconds)
        if outcome == "rejected":
            self._rejected.labels(*labels).inc()

    def activation_finished(self, model: str, seconds: float, outcome: str) -> None:
        if outcome == "cancelled":
            return
        key = self._label(model)
        result = "success" if outcome == "granted" else "failure"
        self._note(key, self._activation, (*model_labels(key), result))
        self._activation.labels(*model_labels(key), result).observe(seconds)

    def rate_limited(self, model: str | None, scope: str) -> None:
        key = self._label(model)
        scope = scope if scope in RATE_LIMIT_SCOPES else "global"
        self._note(key, self._rate_limited, (*model_labels(key), scope))
        self._rate_limited.labels(*model_labels(key), scope).inc()

    def shutdown(self, result: str, seconds: float) -> None:
        self._shutdowns.labels(result if result in ("started", "completed", "timeout") else "timeout").inc()
        if result == "completed":
            self._shutdown_duration.observe(seconds)


def _task_counter() -> Callable[[], float]:
    """Counts the tasks of the event loop running where the metrics were made (0 without one)."""
    try:
        loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
    except RuntimeError:
        loop = None
    return lambda: float(len(asyncio.all_tasks(loop))) if loop is not None and not loop.is_closed() else 0.0


def model_labels(key: str) -> tuple[str, str]:
    """A model key ``namespace/name`` → the (``model``, ``namespace``) label values (``""`` → both empty)."""
    namespace, _, name = key.partition("/")
    return name, namespace
