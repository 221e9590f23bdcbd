"""When the manager's watch showed a pod (or Deployment) turn Ready live (``flexinfer.manager.ready_watch``, kept
by the store): only a watch event whose previous body, also kept, was not Ready is a live sighting; a listing,
the manager's own write, an object first seen already Ready or a missed flip are not."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from flexinfer.manager.store import Store

T0 = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)


def pod(rv: int, ready_since: str | None) -> dict[str, Any]:
    conditions = [{"type": "Ready", "status": "True", "lastTransitionTime": ready_since}] if ready_since else [
        {"type": "Ready", "status": "False", "lastTransitionTime": "2026-01-01T11:59:00Z"}]
    return {"metadata": {"name": "a-1", "namespace": "ns", "resourceVersion": str(rv),
                         "labels": {"flexinfer.ai/model": "a"}}, "status": {"conditions": conditions}}


def deployment(rv: int, available_since: str | None) -> dict[str, Any]:
    status = "True" if available_since else "False"
    return {"metadata": {"name": "a", "namespace": "ns", "resourceVersion": str(rv)}, "status": {"conditions": [
        {"type": "Available", "status": status, "lastTransitionTime": available_since or "2026-01-01T11:59:00Z"}]}}


def seen(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def test_a_pod_seen_turning_ready_by_the_watch_keeps_the_moment_of_that_event() -> None:
    store = Store()
    store.put("Pod", pod(1, None), seen(0.1))
    store.put("Pod", pod(2, "2026-01-01T12:00:02Z"), seen(2.811))
    assert store.ready_seen("Pod", "ns", "a-1") == seen(2.811)
    store.put("Pod", pod(3, "2026-01-01T12:00:02Z"), seen(9.0))  # a later change of the same Ready pod
    assert store.ready_seen("Pod", "ns", "a-1") == seen(2.811), "the first event that showed it decides"


def test_a_crash_and_a_second_ready_are_seen_again() -> None:
    store = Store()
    store.put("Pod", pod(1, None))  # the start-up listing
    store.put("Pod", pod(2, "2026-01-01T12:00:02Z"), seen(2.8))
    store.put("Pod", pod(3, None), seen(50.0))  # the container crashed
    assert store.ready_seen("Pod", "ns", "a-1") is None
    store.put("Pod", pod(4, "2026-01-01T12:00:57Z"), seen(57.3))
    assert store.ready_seen("Pod", "ns", "a-1") == seen(57.3)


def test_what_a_listing_or_a_first_sight_shows_was_not_seen_happening() -> None:
    listed = Store()
    listed.put("Pod", pod(1, None))
    listed.put("Pod", pod(2, "2026-01-01T12:00:02Z"))  # kopf's re-list (type None): no delivery moment
    assert listed.ready_seen("Pod", "ns", "a-1") is None
    listed.put("Pod", pod(3, "2026-01-01T12:00:02Z"), seen(4.0))
    assert listed.ready_seen("Pod", "ns", "a-1") is None, "a later event of the same transition is no witness"
    first = Store()
    first.put("Pod", pod(1, "2026-01-01T12:00:02Z"), seen(3.0))  # first body of it already Ready
    assert first.ready_seen("Pod", "ns", "a-1") is None
    missed = Store()
    missed.put("Pod", pod(1, "2026-01-01T12:00:02Z"), seen(2.5))
    missed.put("Pod", pod(2, "2026-01-01T12:01:10Z"), seen(70.4))  # the flip to not-Ready was never seen
    assert missed.ready_seen("Pod", "ns", "a-1") is None


def test_a_deployment_turning_available_is_seen_and_a_deleted_object_forgotten() -> None:
    store = Store()
    store.put("Deployment", deployment(1, None))  # the manager's own apply response: not from the watch
    store.put("Deployment", deployment(3, "2026-01-01T12:00:03Z"), seen(3.05))
    store.put("Deployment", deployment(2, None), seen(3.1))  # an older resourceVersion is ignored
    assert store.ready_seen("Deployment", "ns", "a") == seen(3.05)
    store.remove("Deployment", deployment(3, "2026-01-01T12:00:03Z"))
    assert store.ready_seen("Deployment", "ns", "a") is None
    store.put("Pod", pod(1, None), seen(1.0))
    store.put("Pod", pod(2, "2026-01-01T12:00:02Z"), seen(2.0))
    store.remove("Pod", pod(2, "2026-01-01T12:00:02Z"))
    assert store.ready_seen("Pod", "ns", "a-1") is None
