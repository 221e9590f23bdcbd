"""Journey step 8: the backout of docs/operations/rocm-gfx1100.md for a chart change, as Flux does it after
`git revert`: the release is upgraded to the chart of the reverted state with the HelmRelease's values (not
`helm rollback`). The rollout commit adds an object and a manager pod annotation and bumps the chart version,
as the chart's version policy demands; its upgrade rolls the manager's pod. The revert removes the object,
rolls the manager back to the pod template it had, and leaves the release on the chart as installed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from support.chart_version import ROLLOUT_ANNOTATION, ROLLOUT_MARKER, chart_version, rollout_chart
from support.helm_chart import CHART_DIR, Helm
from support.real_node import NAMESPACE, RELEASE, RealNode, wait_for

WORKLOADS = (f"{RELEASE}-controller", f"{RELEASE}-proxy")


def pod_templates(node: RealNode) -> dict[str, Any]:
    return {name: node.get("deployment", name, "-n", NAMESPACE)["spec"]["template"] for name in WORKLOADS}


def manager_pods(node: RealNode) -> set[str]:
    """The live (not terminating) manager pods."""
    pods = node.get("pods", "-n", NAMESPACE, "-l", "app.kubernetes.io/component=manager")["items"]
    return {p["metadata"]["name"] for p in pods if not p["metadata"].get("deletionTimestamp")}


def marker_exists(node: RealNode) -> bool:
    return node.kubectl("get", "configmap", f"{RELEASE}-{ROLLOUT_MARKER}", "-n", NAMESPACE, check=False).returncode == 0


def upgrade(helm: Helm, chart: Path, values: Path) -> None:
    """What helm-controller does for a HelmRelease: the chart of the Git revision with the release's values."""
    helm.run("upgrade", RELEASE, str(chart), "-n", NAMESPACE, "-f", str(values), "--wait", "--timeout", "300s",
             timeout=330)


def test_a_reverted_chart_commit_rolls_the_release_back(node: RealNode, helm: Helm, release: str,
                                                        tmp_path: Path) -> None:
    values = tmp_path / "values.json"
    values.write_text(helm.run("get", "values", RELEASE, "-n", NAMESPACE, "-o", "json").stdout)
    before, pods = pod_templates(node), manager_pods(node)
    assert not marker_exists(node)
    rollout = rollout_chart(CHART_DIR, tmp_path / "rollout" / "flexinfer")

    upgrade(helm, rollout, values)
    rolled = pod_templates(node)
    assert rolled[f"{RELEASE}-controller"]["metadata"]["annotations"] == ROLLOUT_ANNOTATION and marker_exists(node)
    wait_for(lambda: not pods & manager_pods(node), 60, "the rollout to replace the manager pod")
    rolled_pods = manager_pods(node)

    upgrade(helm, CHART_DIR, values)
    assert pod_templates(node) == before
    assert not marker_exists(node)
    wait_for(lambda: not rolled_pods & manager_pods(node), 60, "the revert to replace the manager pod")
    history = json.loads(helm.run("history", RELEASE, "-n", NAMESPACE, "-o", "json").stdout)
    assert [entry["chart"] for entry in history[-2:]] == [f"flexinfer-{chart_version(rollout)}",
                                                          f"flexinfer-{chart_version()}"]
