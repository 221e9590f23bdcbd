"""The manager's election members carry the proxies' wait markers (``flexinfer.ai/waiting-since``): a member
waiting longer than ``ElectionPolicy.max_wait`` wins against a busy higher-priority leader, a garbage
marker is ignored with one log line per value, and the reconcile timer fires when a marker crosses the bound.
The facts come from the reconciler's store (``Reconciler.facts``), the election from ``plan_unit``."""

from __future__ import annotations

import contextlib
import logging
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import pytest

from flexinfer.api.conventions import INFLIGHT_PREFIX, WAITING_SINCE_ANNOTATION
from flexinfer.cluster_proxy.demand import rfc3339
from flexinfer.core.controller_defaults import ControllerDefaults
from flexinfer.core.election import Election, ElectionPolicy
from flexinfer.core.model_status.plan import WAKE_MARGIN, ManagerPolicy, next_wakeup
from flexinfer.core.unit_plan import plan_unit
from flexinfer.manager.client import KubeApi
from flexinfer.manager.reconciler import Reconciler
from flexinfer.manager.store import Store, Unit
from support.recording_kube import RecordingKubeApi
from support.resource_builders import model_doc

NOW = datetime(2025, 6, 1, 12, 0, tzinfo=UTC)
POLICY = ManagerPolicy(election=ElectionPolicy(max_wait=2.0))
GROUP = Unit("ns", "g", True)


class Sink:
    def __getattr__(self, _name: str) -> Any:
        return lambda *_a, **_k: None


def member(store: Store, name: str, priority: int, marker: str | None = None, busy: bool = False,
           **status: Any) -> None:
    doc = model_doc(name, "ns", gpu={"shared": "g", "priority": priority})
    annotations = {WAITING_SINCE_ANNOTATION: marker} if marker is not None else {}
    if busy:  # a pre-ModelDemand proxy's in-flight report: requests are being answered
        annotations[f"{INFLIGHT_PREFIX}proxy-x"] = rfc3339(NOW - timedelta(seconds=1))
    doc["metadata"]["annotations"] = annotations
    doc["status"] = status
    store.put("Model", doc)


def reconciler(store: Store) -> Reconciler:
    return Reconciler(cast(KubeApi, RecordingKubeApi(store)), store, ControllerDefaults(), POLICY, sink=Sink(),
                      scope=lambda *_: contextlib.nullcontext(), wake=lambda *_: None,  # type: ignore[arg-type,return-value]
                      clock=lambda: NOW)


def election(store: Store) -> Election:
    elected = plan_unit(reconciler(store).facts(GROUP, NOW), ControllerDefaults(), POLICY).election
    assert elected is not None
    return elected


def models(store: Store) -> list[Any]:
    return [p.model for p in store.unit_models(GROUP) if p.model is not None]


def busy_high(store: Store) -> None:
    member(store, "high", 200, busy=True, phase="Ready", lastActiveTime=rfc3339(NOW - timedelta(seconds=1)),
           sharedGroup={"state": "Active"})


def test_a_member_waiting_past_max_wait_preempts_a_busy_higher_priority_leader() -> None:
    store = Store()
    busy_high(store)
    member(store, "low", 100, rfc3339(NOW - timedelta(seconds=3)))
    elected = election(store)
    assert (elected.leader, elected.reason) == ("low", "starvation_bound")
    assert elected.members["high"].state == "Preempted" and elected.members["high"].preempt_now


def test_a_marker_younger_than_max_wait_or_absent_leaves_the_leader() -> None:
    for marker in (rfc3339(NOW - timedelta(seconds=1)), None):
        store = Store()
        busy_high(store)
        member(store, "low", 100, marker)
        assert election(store).leader == "high"


async def test_a_garbage_marker_is_ignored_and_logged_once_per_value(caplog: pytest.LogCaptureFixture) -> None:
    store = Store()
    busy_high(store)
    member(store, "low", 100, "yesterday")
    assert election(store).leader == "high"
    subject = reconciler(store)
    with caplog.at_level(logging.WARNING, logger="flexinfer.manager"):
        for _ in range(3):
            await subject.reconcile(GROUP)
    assert [r.getMessage() for r in caplog.records if "yesterday" in r.getMessage()] == [
        f"model ns/low: ignoring annotation {WAITING_SINCE_ANNOTATION}='yesterday' (not an RFC 3339 time)"]


def test_the_reconcile_timer_fires_when_a_marker_crosses_the_bound() -> None:
    store = Store()
    since = NOW - timedelta(seconds=0.5)
    member(store, "low", 100, rfc3339(since))
    assert next_wakeup(models(store), [], NOW, POLICY) == since + timedelta(seconds=2.0) + WAKE_MARGIN
    off = ManagerPolicy(election=ElectionPolicy(max_wait=None))
    assert next_wakeup(models(store), [], NOW, off) is None
