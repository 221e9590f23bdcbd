"""Journey step 1: `helm install` on a cluster that runs pods. The manager and the proxy become Running
and Ready through their own probes (nothing patches status), and the manager holds its Lease."""

from __future__ import annotations

from typing import Any

from support.real_node import NAMESPACE, RealNode, wait_for


def ready_pods(node: RealNode, component: str) -> list[dict[str, Any]]:
    pods = node.get("pods", "-n", NAMESPACE, "-l", f"app.kubernetes.io/component={component}")["items"]
    return [p for p in pods if p["status"].get("phase") == "Running" and any(
        c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions", []))]


def test_manager_and_proxy_run_ready_through_their_probes(node: RealNode, release: str) -> None:
    for component, deployment in (("manager", "flexinfer-controller"), ("proxy", "flexinfer-proxy")):
        pods = wait_for(lambda c=component: ready_pods(node, c), 120, f"a Ready {component} pod")
        assert len(pods) == 1
        status = pods[0]["status"]["containerStatuses"][0]
        assert status["ready"] and status["restartCount"] == 0 and "running" in status["state"]
        probes = node.get("deployment", deployment, "-n", NAMESPACE)["spec"]["template"]["spec"]["containers"][0]
        assert probes["readinessProbe"]["httpGet"]["path"] == "/readyz"
    image = node.get("deployment", "flexinfer-controller", "-n", NAMESPACE)
    assert image["status"]["readyReplicas"] == 1 and image["status"]["availableReplicas"] == 1


def test_the_manager_holds_its_lease(node: RealNode, release: str) -> None:
    manager = ready_pods(node, "manager")[0]["metadata"]["name"]
    lease = wait_for(lambda: node.get("lease", "flexinfer-manager", "-n", NAMESPACE)["spec"].get("holderIdentity"),
                     60, "the Lease to be held")
    assert lease == manager
