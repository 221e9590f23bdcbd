"""Tests for flexinfer.core.device_handover: which loser's pod a winner waits for before it is scaled up."""

from __future__ import annotations

from typing import Any

from flexinfer.core.device_handover import finished, holds_device, reapable, releasing


def pod(phase: str | None, deleting: bool = False) -> dict[str, Any]:
    meta = {"name": "p", "deletionTimestamp": "2026-01-01T00:00:00Z"} if deleting else {"name": "p"}
    return {"metadata": meta, "status": {"phase": phase} if phase else {}}


def test_a_pod_holds_the_device_until_its_containers_have_finished() -> None:
    assert holds_device(pod("Running")) and holds_device(pod("Pending")) and holds_device(pod(None))
    assert holds_device(pod("Running", deleting=True)), "a terminating pod still counts on the node"
    assert not holds_device(pod("Succeeded")) and not holds_device(pod("Failed"))


def test_the_winner_waits_for_a_member_outside_the_active_set_whose_pod_holds_the_device() -> None:
    pods = {"low": [pod("Running", deleting=True)], "high": [], "mid": [pod("Failed")]}
    assert releasing("high", {"high"}, pods) == "low"
    assert releasing("high", {"high", "low"}, pods) is None, "a co-resident member of the active set"
    assert releasing("low", {"low"}, {"low": [pod("Running")]}) is None, "its own pod"
    assert releasing("high", {"high"}, {"mid": [pod("Failed")], "zeta": [pod("Pending")]}) == "zeta"
    assert releasing("high", {"high"}, {}) is None


def exited(*states: str, deleting: bool = True, init: tuple[str, ...] = ()) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "low-1", "namespace": "ns"}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {"metadata": meta, "status": {
        "phase": "Running",
        "initContainerStatuses": [{"name": f"i{n}", "state": {s: {}}} for n, s in enumerate(init)],
        "containerStatuses": [{"name": f"c{n}", "state": {s: {}}} for n, s in enumerate(states)]}}


def test_a_deleted_pod_whose_containers_have_all_exited_is_reaped_for_the_winner_waiting_for_it() -> None:
    assert finished(exited("terminated", "terminated", init=("terminated",)))
    assert not finished(exited("terminated", "running")), "one container still runs"
    assert not finished(exited("terminated", init=("running",)))
    assert not finished(exited("terminated", deleting=False)), "not being deleted: the kubelet restarts it"
    assert not finished(exited()), "no container status yet"
    pods = {"low": [exited("terminated")], "mid": [exited("running")], "high": []}
    assert reapable({"low", "mid"}, pods) == (("ns", "low-1"),)
    assert reapable(set(), pods) == ()
