"""``flexinfer uninstall`` (the chart's pre-delete hook) against a real kube-apiserver.

There is no kubelet: the cleanup Job it creates never runs, so the run ends at its deadline, deletes the Job
anyway and reports it (exit 1). What it must leave: the manager's Deployment at zero replicas, no model
Deployment or Service, no cleanup Job, and every Model still there without the finalizer, so that deleting it
takes effect at once (the defect: after `helm uninstall`, `kubectl delete mdl` hung on the finalizer).
"""

from __future__ import annotations

import logging
import os
import socket
from pathlib import Path
from typing import Any

import pytest
from lightkube.resources.apps_v1 import Deployment
from lightkube.resources.batch_v1 import Job
from lightkube.types import PatchType

from flexinfer.core.controller_defaults import controller_defaults
from flexinfer.manager.client import ModelResource
from flexinfer.manager.uninstall import Uninstall, UninstallPlan
from support.cli_process import CliProcess
from support.manager_harness import cluster, kube_testbed, manager_config, start_manager

pytestmark = pytest.mark.integration
__all__ = ["kube_testbed"]

SHARED: dict[str, Any] = {"gpu": {"vendor": "amd", "shared": "g1"}, "cache": {"strategy": "Local"}}
MANAGER = "flexinfer-controller"


def stand_in_manager(namespace: str) -> dict[str, Any]:
    """The chart's manager Deployment as far as the hook sees it (no pod ever runs on the testbed)."""
    labels = {"app.kubernetes.io/component": "manager"}
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": MANAGER, "namespace": namespace},
            "spec": {"replicas": 1, "selector": {"matchLabels": labels}, "template": {
                "metadata": {"labels": labels},
                "spec": {"containers": [{"name": "manager", "image": "ghcr.io/flexinfer/flexinfer:0.1.0"}]}}}}


async def test_uninstall_stops_every_model_and_leaves_them_deletable(kube_testbed: Any,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    async with cluster(kube_testbed) as c:
        running = await start_manager(manager_config(c))
        try:
            await c.create_model("ran", **SHARED)
            await c.create_model("pinned", serverless={"enabled": False})
            await c.phase_is("ran", "Idle")
            await c.replicas_are("pinned", 1)
            await c.client.patch(ModelResource.Status, "ran", {"status": {"gpu": {"node": "node-3"}}},
                                 namespace=c.namespace, patch_type=PatchType.MERGE)
            for name in ("ran", "pinned"):
                assert "flexinfer.ai/model-cleanup" in (await c.model(name))["metadata"]["finalizers"]
        finally:
            await running.close()  # the hook scales the chart's manager down; here it runs in the test
        await c.client.create(Deployment.from_dict(stand_in_manager(c.namespace)))

        plan = UninstallPlan(namespace=c.namespace, manager=MANAGER, timeout=3.0,
                             defaults=controller_defaults({"DEFAULT_FLASH_LOADER_IMAGE": "reg/flexinfer:9"}),
                             model_namespaces=(c.namespace,))
        with caplog.at_level(logging.INFO, logger="flexinfer.manager"):
            code = await Uninstall(c.client, plan).run()

        assert code == 1  # the cleanup Job could not run here: named, and deleted all the same
        assert f"{c.namespace}/ran-tmpfs-cleanup" in caplog.text
        manager = await c.client.get(Deployment, MANAGER, namespace=c.namespace)
        assert manager.spec is not None and manager.spec.replicas == 0
        for name in ("ran", "pinned"):
            assert await c.deployment(name) is None and await c.service(name) is None
            assert "flexinfer.ai/model-cleanup" not in ((await c.model(name))["metadata"].get("finalizers") or [])
        assert [j async for j in c.client.list(Job, namespace=c.namespace)] == []
        assert "created Job ran-tmpfs-cleanup on node node-3" in caplog.text

        for name in ("ran", "pinned"):  # no manager runs: without the finalizer the deletion is immediate
            await c.client.delete(ModelResource, name, namespace=c.namespace)
        assert [m async for m in c.client.list(ModelResource, namespace=c.namespace)] == []


async def test_uninstall_without_a_manager_or_models_succeeds(kube_testbed: Any) -> None:
    async with cluster(kube_testbed) as c:
        plan = UninstallPlan(namespace=c.namespace, manager=MANAGER, timeout=3.0, defaults=controller_defaults({}),
                             model_namespaces=(c.namespace,))
        assert await Uninstall(c.client, plan).run() == 0


def kubeconfig_with(path: Path, server: str, token: str) -> Path:
    path.write_text(f"""apiVersion: v1
kind: Config
clusters: [{{name: c, cluster: {{server: "{server}", insecure-skip-tls-verify: true}}}}]
users: [{{name: u, user: {{token: {token}}}}}]
contexts: [{{name: c, context: {{cluster: c, user: u}}}}]
current-context: c
""")
    return path


def uninstall_command(kubeconfig: Path) -> tuple[int, str]:
    command = CliProcess(["uninstall", "--namespace", "flexinfer-system", "--manager", MANAGER, "--timeout", "5s",
                          "--kubeconfig", str(kubeconfig)], dict(os.environ))
    return command.finish(), command.log


def test_an_unreachable_api_is_one_line_and_exit_1(tmp_path: Path) -> None:
    with socket.socket() as closed:  # a loopback port nothing listens on
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    code, log = uninstall_command(kubeconfig_with(tmp_path / "kc", f"https://127.0.0.1:{port}", "t"))
    assert code == 1 and "cannot reach the Kubernetes API" in log, log
    assert "Traceback" not in log, log


def test_a_refused_request_names_the_status_and_exits_1(kube_testbed: Any, tmp_path: Path) -> None:
    code, log = uninstall_command(kubeconfig_with(tmp_path / "kc", kube_testbed.server, "not-a-token"))
    assert code == 1 and "the Kubernetes API refused a request (401)" in log, log
    assert "Traceback" not in log, log
