"""charts/flexinfer against a real kube-apiserver (hack/kube-testbed): helm install, upgrade and uninstall,
CRDs installed from crds/, and `kubectl auth can-i` for the manager and proxy ServiceAccounts: each can do
exactly what the RBAC tables in support.helm_chart list, and the listed forbidden actions are refused.

There is no kubelet or scheduler, so pods stay Pending; helm runs without --wait, and `helm uninstall` without
its pre-delete hook (a Job that could never run here; tests/integration/realnode runs it). The tests share one release
and run in file order: install, the names its NOTES print, permission checks, upgrade, rollback, uninstall;
then a Flux-style revert (upgrade to the reverted chart and values) in a release of its own.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import yaml

from support.chart_version import (
    ROLLOUT_ANNOTATION,
    ROLLOUT_MARKER,
    ChartRecord,
    chart_fingerprint,
    chart_version,
    may_record,
    rollout_chart,
)
from support.helm_chart import (
    CHART_DIR,
    MANAGER_CLUSTER_PERMISSIONS,
    MANAGER_FORBIDDEN,
    MANAGER_NAMESPACE_PERMISSIONS,
    NAMESPACE,
    PROXY_FORBIDDEN,
    PROXY_PERMISSIONS,
    RELEASE,
    Helm,
    Rule,
    container,
    env_map,
    pinned_helm,
)
from support.kube_testbed import KubeTestbed

pytestmark = pytest.mark.integration

MANAGER_SA = f"system:serviceaccount:{NAMESPACE}:flexinfer-manager"
PROXY_SA = f"system:serviceaccount:{NAMESPACE}:flexinfer-proxy"


@pytest.fixture(scope="module")
def testbed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeTestbed]:
    bed = KubeTestbed(Path(tmp_path_factory.mktemp("chart")) / "kube").start()
    try:
        yield bed
    finally:
        bed.stop()


@pytest.fixture(scope="module")
def installed(testbed: KubeTestbed, tmp_path_factory: pytest.TempPathFactory) -> Helm:
    """The chart installed with its defaults into flexinfer-system (revision 1)."""
    assert testbed.kubeconfig is not None
    helm = pinned_helm(Path(tmp_path_factory.mktemp("helm-home"))).with_kubeconfig(testbed.kubeconfig)
    helm.run("install", RELEASE, str(CHART_DIR), "--namespace", NAMESPACE, "--create-namespace", timeout=300)
    return helm


def can_i(testbed: KubeTestbed, who: str, rule: Rule, namespace: str | None = None) -> bool:
    group, resource, verb = rule
    name, _, sub = resource.partition("/")
    target = f"{name}.{group}" if group else name
    args = ["auth", "can-i", verb, target, "--as", who]
    args += ["--subresource", sub] if sub else []
    args += ["-n", namespace] if namespace else ["--all-namespaces"]
    proc = testbed.kubectl(*args, check=False)
    answer = proc.stdout.strip()
    assert answer in ("yes", "no"), f"kubectl {' '.join(args)}: {proc.stdout} {proc.stderr}"
    return answer == "yes"


def answers(testbed: KubeTestbed, who: str, rules: set[Rule], namespace: str | None = None) -> dict[Rule, bool]:
    ordered = sorted(rules)
    with ThreadPoolExecutor(max_workers=8) as pool:
        results = pool.map(lambda r: can_i(testbed, who, r, namespace), ordered)
        return dict(zip(ordered, results, strict=True))


def deployment(testbed: KubeTestbed, name: str) -> dict[str, Any]:
    return testbed.kubectl_json("-n", NAMESPACE, "get", "deployment", name)


def test_install_creates_crds_and_workloads(testbed: KubeTestbed, installed: Helm) -> None:
    crd_files = sorted(CHART_DIR.glob("crds/*.yaml"))
    assert crd_files, "charts/flexinfer/crds/ is empty: run `flexinfer crds`"
    for path in crd_files:
        name = yaml.safe_load(path.read_text())["metadata"]["name"]
        testbed.kubectl("wait", "--for=condition=Established", f"crd/{name}", "--timeout=60s")
    status = installed.run("status", RELEASE, "--namespace", NAMESPACE).stdout
    assert "STATUS: deployed" in status and "REVISION: 1" in status
    manager = container(deployment(testbed, "flexinfer-controller"), "manager")
    assert env_map(manager)["DEFAULT_FLASH_LOADER_ENABLED"] == "false"
    assert deployment(testbed, "flexinfer-proxy")["spec"]["replicas"] == 1
    for sa in ("flexinfer-manager", "flexinfer-proxy"):
        testbed.kubectl("-n", NAMESPACE, "get", "serviceaccount", sa)


def test_the_notes_name_objects_that_exist(testbed: KubeTestbed, installed: Helm) -> None:
    """The commands `helm install` prints (the chart's NOTES) name the release's real objects, among them the
    manager's Deployment and metrics Service under the Go chart's names."""
    notes = installed.run("status", RELEASE, "--namespace", NAMESPACE).stdout
    named = set(re.findall(r"\b(deployment|service)/([a-z0-9-]+)", notes))
    assert {("deployment", "flexinfer-controller"), ("service", "flexinfer-controller-metrics")} <= named, notes
    for kind, name in sorted(named):
        testbed.kubectl("-n", NAMESPACE, "get", kind, name)


def test_manager_can_do_what_it_needs(testbed: KubeTestbed, installed: Helm) -> None:
    cluster = answers(testbed, MANAGER_SA, set(MANAGER_CLUSTER_PERMISSIONS))
    assert [rule for rule, ok in cluster.items() if not ok] == []
    lease = answers(testbed, MANAGER_SA, set(MANAGER_NAMESPACE_PERMISSIONS), NAMESPACE)
    assert [rule for rule, ok in lease.items() if not ok] == []


def test_manager_cannot_do_more(testbed: KubeTestbed, installed: Helm) -> None:
    refused = answers(testbed, MANAGER_SA, set(MANAGER_FORBIDDEN))
    assert [rule for rule, ok in refused.items() if ok] == []
    # the leader-election Lease is granted in the release namespace only
    elsewhere = answers(testbed, MANAGER_SA, set(MANAGER_NAMESPACE_PERMISSIONS), "default")
    assert [rule for rule, ok in elsewhere.items() if ok] == []


MODEL_WRITES: frozenset[Rule] = frozenset(
    ("ai.flexinfer", resource, verb) for resource in ("models", "models/status")
    for verb in ("create", "update", "patch", "delete"))
LEASE_ACCESS: frozenset[Rule] = frozenset(
    ("coordination.k8s.io", "leases", verb) for verb in ("get", "list", "create", "update", "patch", "delete"))
OTHER_NAMESPACE = "team-b"


@pytest.mark.parametrize("all_namespaces", [False, True], ids=["namespaced", "all-namespaces"])
def test_proxy_rbac_matrix(testbed: KubeTestbed, tmp_path_factory: pytest.TempPathFactory,
                           all_namespaces: bool) -> None:
    """The proxy reads Models and writes only its ModelDemand reports, in the release namespace (or every
    namespace with proxy.allNamespaces=true); it can never write a Model, its status, or a Lease."""
    assert testbed.kubeconfig is not None
    release = "flexinfer-wide" if all_namespaces else "flexinfer-scoped"
    helm = pinned_helm(Path(tmp_path_factory.mktemp(release))).with_kubeconfig(testbed.kubeconfig)
    helm.run("install", release, str(CHART_DIR), "--namespace", release, "--create-namespace",
             "--set", f"proxy.allNamespaces={str(all_namespaces).lower()}", timeout=300)
    testbed.kubectl("create", "namespace", OTHER_NAMESPACE, check=False)
    proxy = f"system:serviceaccount:{release}:{release}-proxy"
    try:
        own = answers(testbed, proxy, set(PROXY_PERMISSIONS), release)
        assert [rule for rule, ok in own.items() if not ok] == []
        other = answers(testbed, proxy, set(PROXY_PERMISSIONS), OTHER_NAMESPACE)
        assert {rule for rule, ok in other.items() if ok} == (set(PROXY_PERMISSIONS) if all_namespaces else set())
        everywhere = answers(testbed, proxy, set(PROXY_PERMISSIONS))
        assert all(everywhere.values()) is all_namespaces
        forbidden = MODEL_WRITES | LEASE_ACCESS | set(PROXY_FORBIDDEN)
        for namespace in (release, OTHER_NAMESPACE, NAMESPACE, None):
            refused = answers(testbed, proxy, forbidden, namespace)
            assert [rule for rule, ok in refused.items() if ok] == [], namespace
        manager = f"system:serviceaccount:{release}:{release}-manager"
        cluster = answers(testbed, manager, set(MANAGER_CLUSTER_PERMISSIONS))
        assert [rule for rule, ok in cluster.items() if not ok] == []
        assert [r for r, ok in answers(testbed, manager, set(MANAGER_FORBIDDEN)).items() if ok] == []
    finally:
        helm.run("uninstall", release, "--namespace", release, "--no-hooks", timeout=300)


LIFECYCLE = "flexinfer-lifecycle"
"""A second release (own namespace, own object names) for upgrade → rollback → uninstall, so the read-only
checks above never depend on the order tests run in."""


def test_upgrade_then_rollback_then_uninstall(testbed: KubeTestbed, tmp_path_factory: pytest.TempPathFactory) -> None:
    assert testbed.kubeconfig is not None
    helm = pinned_helm(Path(tmp_path_factory.mktemp("helm-lifecycle"))).with_kubeconfig(testbed.kubeconfig)
    ns = ("--namespace", LIFECYCLE)

    def env_of(component: str) -> dict[str, str]:
        name = f"{LIFECYCLE}-{'controller' if component == 'manager' else component}"
        body = testbed.kubectl_json("-n", LIFECYCLE, "get", "deployment", name)
        return env_map(container(body, component))

    def absent(*args: str) -> bool:
        found = testbed.kubectl(*args, check=False)
        return found.returncode != 0 and "NotFound" in found.stderr

    helm.run("install", LIFECYCLE, str(CHART_DIR), *ns, "--create-namespace", timeout=300)
    helm.run(
        "upgrade", LIFECYCLE, str(CHART_DIR), *ns, "--reuse-values",
        "--set", "controller.runtime.flashLoader.enabled=true",
        "--set", "observability.tracing.enabled=true",
        "--set", "observability.tracing.otlpEndpoint=http://otel-collector.observability:4318",
        "--set", "proxy.replicas=2",
        timeout=300,
    )  # fmt: skip
    assert "REVISION: 2" in helm.run("status", LIFECYCLE, *ns).stdout
    manager, proxy = env_of("manager"), env_of("proxy")
    assert manager["DEFAULT_FLASH_LOADER_ENABLED"] == "true"
    for env in (manager, proxy):
        assert env["FLEXINFER_OTEL_ENABLED"] == "true"
        assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://otel-collector.observability:4318"
    pdb = testbed.kubectl_json("-n", LIFECYCLE, "get", "poddisruptionbudget", f"{LIFECYCLE}-proxy")
    assert pdb["spec"]["minAvailable"] == 1

    helm.run("rollback", LIFECYCLE, "1", *ns, timeout=300)
    manager = env_of("manager")
    assert manager["DEFAULT_FLASH_LOADER_ENABLED"] == "false"
    assert "FLEXINFER_OTEL_ENABLED" not in manager
    assert absent("-n", LIFECYCLE, "get", "poddisruptionbudget", f"{LIFECYCLE}-proxy")

    helm.run("uninstall", LIFECYCLE, *ns, "--no-hooks", timeout=300)
    assert absent("-n", LIFECYCLE, "get", "deployment", f"{LIFECYCLE}-controller")
    assert absent("-n", LIFECYCLE, "get", "deployment", f"{LIFECYCLE}-proxy")
    assert absent("get", "clusterrole", f"{LIFECYCLE}-manager")
    # helm never deletes CRDs from crds/ (that would delete every Model): they stay.
    testbed.kubectl("get", "crd", "models.ai.flexinfer")
    assert LIFECYCLE not in helm.run("list", *ns, "-q").stdout.split()


REVERT = "flexinfer-revert"
DIGEST_BEFORE = "sha256:" + "a" * 64
DIGEST_ROLLOUT = "sha256:" + "b" * 64


def test_a_reverted_chart_and_image_commit_rolls_back(testbed: KubeTestbed,
                                                      tmp_path_factory: pytest.TempPathFactory) -> None:
    """What a Flux reconcile does after `git revert` of a rollout commit: upgrade the release to the chart and
    values of the reverted state (not `helm rollback`). The rollout changed templates (with the version bump the
    policy demands) and pinned a new image digest; after the revert the API server holds the objects of
    before: the new object is gone and both pod templates are byte-for-byte those of before."""
    assert testbed.kubeconfig is not None
    work = Path(tmp_path_factory.mktemp("revert"))
    helm = pinned_helm(work / "helm").with_kubeconfig(testbed.kubeconfig)
    base = work / "flexinfer"
    shutil.copytree(CHART_DIR, base)
    rollout = rollout_chart(base, work / "rollout" / "flexinfer")
    assert may_record(ChartRecord(chart_version(rollout), chart_fingerprint(helm, rollout)),
                      ChartRecord(chart_version(base), chart_fingerprint(helm, base)))
    ns = ("--namespace", REVERT)

    def state() -> dict[str, Any]:
        """The two pod templates, the FlexInfer images in them, and whether the rollout's ConfigMap exists."""
        templates = {name: testbed.kubectl_json("-n", REVERT, "get", "deployment", f"{REVERT}-{name}")
                     ["spec"]["template"] for name in ("controller", "proxy")}
        marker = testbed.kubectl("-n", REVERT, "get", "configmap", f"{REVERT}-{ROLLOUT_MARKER}", check=False)
        return {"templates": templates, "marker": marker.returncode == 0,
                "images": {c["image"] for t in templates.values() for c in t["spec"]["containers"]}}

    try:
        helm.run("install", REVERT, str(base), *ns, "--create-namespace", "--set", f"image.digest={DIGEST_BEFORE}",
                 timeout=300)
        before = state()
        assert before["images"] == {f"ghcr.io/flexinfer/flexinfer@{DIGEST_BEFORE}"} and not before["marker"]
        helm.run("upgrade", REVERT, str(rollout), *ns, "--set", f"image.digest={DIGEST_ROLLOUT}", timeout=300)
        rolled = state()
        assert rolled["images"] == {f"ghcr.io/flexinfer/flexinfer@{DIGEST_ROLLOUT}"} and rolled["marker"]
        assert rolled["templates"]["controller"]["metadata"]["annotations"] == ROLLOUT_ANNOTATION

        helm.run("upgrade", REVERT, str(base), *ns, "--set", f"image.digest={DIGEST_BEFORE}", timeout=300)
        assert state() == before
        history = helm.run("history", REVERT, *ns, "-o", "json").stdout
        charts = [entry["chart"] for entry in json.loads(history)]
        assert charts == [f"flexinfer-{chart_version(base)}", f"flexinfer-{chart_version(rollout)}",
                          f"flexinfer-{chart_version(base)}"], charts
    finally:
        helm.run("uninstall", REVERT, *ns, "--no-hooks", check=False, timeout=300)
