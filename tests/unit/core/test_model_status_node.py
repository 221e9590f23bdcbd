"""``status.gpu.node``: the node the model's pod is bound to, kept while none is (where a shared model's persistent
tmpfs stays after a swap-out), and written by the manager's status patch."""

from __future__ import annotations

from typing import Any

from flexinfer.api.model import GPUStatus, ModelStatus
from flexinfer.core.model_status.build import placed_on, status_patch


def pod(node: str | None) -> dict[str, Any]:
    return {"metadata": {"name": "m-1"}, "spec": {"nodeName": node} if node else {}}


def test_a_bound_pod_sets_the_node_and_keeps_the_rest_of_gpu() -> None:
    old = ModelStatus(gpu=GPUStatus(node="a", vendor="amd"))
    new = placed_on(old, pod("b"))
    assert new.gpu == GPUStatus(node="b", vendor="amd")
    assert status_patch(old, new) == {"gpu": {"node": "b"}}


def test_without_a_bound_pod_the_last_node_stays() -> None:
    old = ModelStatus(gpu=GPUStatus(node="a"))
    for newest in (None, pod(None)):
        assert placed_on(old, newest) is old
    assert placed_on(ModelStatus(), None).gpu is None


def test_an_unchanged_node_writes_nothing() -> None:
    old = ModelStatus(gpu=GPUStatus(node="a"))
    assert status_patch(old, placed_on(old, pod("a"))) == {}
