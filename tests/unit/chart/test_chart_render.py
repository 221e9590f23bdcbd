"""Render tests for charts/flexinfer: helm lint, golden renders, the env contract, RBAC, strict k8s validation.

Runs the pinned helm (``hack/get-helm``) offline; no cluster needed. Goldens live in ``golden/``; regenerate
them after a deliberate chart change with ``FLEXINFER_UPDATE_GOLDEN=1 pytest tests/unit/chart``.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest

from flexinfer.core.gpu_profiles import GPUProfile, parse_gpu_profiles
from support.helm_chart import (
    CHART_DIR,
    MANAGER_CLUSTER_PERMISSIONS,
    MANAGER_NAMESPACE_PERMISSIONS,
    NAMESPACE,
    PROXY_PERMISSIONS,
    SEED_SET_ARGS,
    Helm,
    HelmError,
    container,
    dump,
    env_map,
    find,
    parse_documents,
    rule_set,
)

GOLDEN_DIR = Path(__file__).parent / "golden"
IMAGE = "ghcr.io/flexinfer/flexinfer:0.1.0"
TRACING_ENV = ("FLEXINFER_OTEL_ENABLED", "OTEL_EXPORTER_OTLP_ENDPOINT", "FLEXINFER_OTEL_SERVICE_NAMESPACE")
LOG_ENV = {"FLEXINFER_LOG_LEVEL": "INFO", "FLEXINFER_LOG_FORMAT": "text"}
SWAP_ENV = {"FLEXINFER_SWAP_MIN_HOLD": "15s", "FLEXINFER_SWAP_MAX_WAIT": "30s"}
POD_NAMESPACE = {"fieldRef": {"fieldPath": "metadata.namespace"}}
POD_NAME = {"fieldRef": {"fieldPath": "metadata.name"}}
EVERYTHING_ON = (
    *SEED_SET_ARGS,
    "observability.tracing.serviceNamespace=flexinfer-system",
    "controller.runtime.flashLoader.tmpfsSizeLimit=16Gi",
    "proxy.replicas=3",
    "proxy.rateLimit.enabled=true",
    "proxy.auth.enabled=true",
    "proxy.auth.tokenSecretName=proxy-token",
    "metrics.serviceMonitor.enabled=true",
    "metrics.podMonitor.enabled=true",
    "imagePullSecrets[0].name=registry",
    "controller.nodeSelector.kubernetes\\.io/os=linux",
    "proxy.tolerations[0].key=dedicated",
    "proxy.tolerations[0].operator=Exists",
)
# Prometheus Operator kinds: kubernetes-validate ships no schema for them, so they are skipped by name.
NO_SCHEMA_KINDS = {"ServiceMonitor", "PodMonitor"}


def manager_env(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return env_map(container(find(docs, "Deployment", "flexinfer-controller"), "manager"))


def proxy_env(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return env_map(container(find(docs, "Deployment", "flexinfer-proxy"), "proxy"))


@pytest.mark.parametrize("set_args", [(), SEED_SET_ARGS, EVERYTHING_ON], ids=["defaults", "seed", "everything-on"])
def test_helm_lint_strict_passes(helm: Helm, set_args: tuple[str, ...]) -> None:
    sets = [arg for value in set_args for arg in ("--set", value)]
    out = helm.run("lint", "--strict", str(CHART_DIR), *sets).stdout
    assert "1 chart(s) linted, 0 chart(s) failed" in out


@pytest.mark.parametrize(("name", "set_args"), [("defaults", ()), ("seed", SEED_SET_ARGS)])
def test_render_matches_golden(helm: Helm, name: str, set_args: tuple[str, ...]) -> None:
    rendered = dump(helm.template(*set_args))
    golden = GOLDEN_DIR / f"{name}.yaml"
    if os.environ.get("FLEXINFER_UPDATE_GOLDEN") == "1":
        golden.write_text(rendered)
    assert golden.exists(), f"missing {golden}; run with FLEXINFER_UPDATE_GOLDEN=1"
    assert rendered == golden.read_text(), f"render differs from {golden.name}; review, then FLEXINFER_UPDATE_GOLDEN=1"


def test_default_render_has_the_expected_objects(default_docs: list[dict[str, Any]]) -> None:
    kinds = sorted((d["kind"], d["metadata"]["name"]) for d in default_docs)
    assert kinds == [
        ("ClusterRole", "flexinfer-manager"),
        ("ClusterRole", "flexinfer-uninstall"),
        ("ClusterRoleBinding", "flexinfer-manager"),
        ("ClusterRoleBinding", "flexinfer-uninstall"),
        ("Deployment", "flexinfer-controller"),
        ("Deployment", "flexinfer-proxy"),
        ("Job", "flexinfer-uninstall"),
        ("Role", "flexinfer-manager-leader-election"),
        ("Role", "flexinfer-proxy"),
        ("Role", "flexinfer-uninstall"),
        ("RoleBinding", "flexinfer-manager-leader-election"),
        ("RoleBinding", "flexinfer-proxy"),
        ("RoleBinding", "flexinfer-uninstall"),
        ("Service", "flexinfer-controller-metrics"),
        ("Service", "flexinfer-proxy"),
        ("ServiceAccount", "flexinfer-manager"),
        ("ServiceAccount", "flexinfer-proxy"),
        ("ServiceAccount", "flexinfer-uninstall"),
    ]  # the *-uninstall objects are the pre-delete hook's (test_chart_uninstall.py)
    namespaced = [d for d in default_docs if not d["kind"].startswith("Cluster")]
    assert {d["metadata"]["namespace"] for d in namespaced} == {NAMESPACE}


def test_manager_deployment_contract(default_docs: list[dict[str, Any]]) -> None:
    deployment = find(default_docs, "Deployment", "flexinfer-controller")
    manager = container(deployment, "manager")
    assert manager["image"] == IMAGE
    assert manager["args"][0] == "manager" and "--leader-elect" in manager["args"]
    assert {p["name"]: p["containerPort"] for p in manager["ports"]} == {"metrics": 8080, "health": 8081}
    assert manager["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert manager["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "health"}
    assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == "flexinfer-manager"
    service = find(default_docs, "Service", "flexinfer-controller-metrics")
    assert service["spec"]["ports"] == [{"name": "metrics", "port": 8080, "targetPort": "metrics", "protocol": "TCP"}]
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]


def test_default_manager_env_is_exact(default_docs: list[dict[str, Any]]) -> None:
    assert manager_env(default_docs) == {
        "POD_NAMESPACE": POD_NAMESPACE,
        "POD_NAME": POD_NAME,
        **SWAP_ENV,
        "DEFAULT_SHM_SIZE_LIMIT": "8Gi",
        "DEFAULT_FLASH_LOADER_ENABLED": "false",
        "DEFAULT_FLASH_LOADER_IMAGE": IMAGE,
        "DEFAULT_FLASH_LOADER_CONCURRENCY": "4",
        **LOG_ENV,
        "FLEXINFER_POD_ENDPOINTS": "true",
    }


def test_seed_command_renders_flash_loader_and_tracing_on_manager(seed_docs: list[dict[str, Any]]) -> None:
    assert manager_env(seed_docs) == {
        "POD_NAMESPACE": POD_NAMESPACE,
        "POD_NAME": POD_NAME,
        **SWAP_ENV,
        "DEFAULT_SHM_SIZE_LIMIT": "8Gi",
        "DEFAULT_FLASH_LOADER_ENABLED": "true",
        "DEFAULT_FLASH_LOADER_IMAGE": IMAGE,
        "DEFAULT_FLASH_LOADER_CONCURRENCY": "4",
        "FLEXINFER_OTEL_ENABLED": "true",
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://otel-collector.observability:4318",
        **LOG_ENV,
        "FLEXINFER_POD_ENDPOINTS": "true",
    }


def test_seed_command_renders_tracing_on_proxy(seed_docs: list[dict[str, Any]]) -> None:
    env = proxy_env(seed_docs)
    assert env["FLEXINFER_OTEL_ENABLED"] == "true"
    assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://otel-collector.observability:4318"
    assert "FLEXINFER_OTEL_SERVICE_NAMESPACE" not in env


def test_log_values_reach_both_deployments(helm: Helm, default_docs: list[dict[str, Any]]) -> None:
    assert proxy_env(default_docs)["FLEXINFER_ACCESS_LOG"] == "true"
    assert "FLEXINFER_ACCESS_LOG" not in manager_env(default_docs)
    docs = helm.template("controller.logging.format=json", "controller.logging.level=DEBUG",
                         "proxy.logging.format=json", "proxy.logging.accessLog=false")
    manager, proxy = manager_env(docs), proxy_env(docs)
    assert (manager["FLEXINFER_LOG_FORMAT"], manager["FLEXINFER_LOG_LEVEL"]) == ("json", "DEBUG")
    assert (proxy["FLEXINFER_LOG_FORMAT"], proxy["FLEXINFER_ACCESS_LOG"]) == ("json", "false")


def test_tracing_env_absent_on_both_when_disabled(helm: Helm, default_docs: list[dict[str, Any]]) -> None:
    endpoint_but_off = helm.template(
        "observability.tracing.otlpEndpoint=http://collector:4318", "observability.tracing.serviceNamespace=ns"
    )
    for docs in (default_docs, endpoint_but_off):
        for env in (manager_env(docs), proxy_env(docs)):
            assert not set(TRACING_ENV) & set(env)


def test_tracing_service_namespace_on_both_when_set(helm: Helm) -> None:
    docs = helm.template(
        "observability.tracing.enabled=true", "observability.tracing.serviceNamespace=flexinfer-system"
    )
    for env in (manager_env(docs), proxy_env(docs)):
        assert env["FLEXINFER_OTEL_ENABLED"] == "true"
        assert env["FLEXINFER_OTEL_SERVICE_NAMESPACE"] == "flexinfer-system"
        assert "OTEL_EXPORTER_OTLP_ENDPOINT" not in env


@pytest.mark.parametrize("tracing", ["true", "false"])
def test_trust_incoming_false_renders_on_the_proxy_only(helm: Helm, tracing: str) -> None:
    docs = helm.template(f"observability.tracing.enabled={tracing}", "observability.tracing.trustIncoming=false")
    assert proxy_env(docs)["FLEXINFER_OTEL_TRUST_INCOMING"] == "false"
    assert "FLEXINFER_OTEL_TRUST_INCOMING" not in manager_env(docs)
    assert ("FLEXINFER_OTEL_ENABLED" in proxy_env(docs)) == (tracing == "true")


def test_trust_incoming_default_renders_nothing(helm: Helm, seed_docs: list[dict[str, Any]]) -> None:
    explicit = helm.template("observability.tracing.enabled=true", "observability.tracing.trustIncoming=true")
    for docs in (seed_docs, explicit):
        for env in (manager_env(docs), proxy_env(docs)):
            assert "FLEXINFER_OTEL_TRUST_INCOMING" not in env


def test_trust_incoming_must_be_a_boolean(helm: Helm) -> None:
    with pytest.raises(HelmError, match="trustIncoming"):
        helm.template("observability.tracing.trustIncoming=nope")


def test_optional_runtime_env_only_when_set(helm: Helm) -> None:
    unset = manager_env(
        helm.template("controller.runtime.shmSizeLimit=", "controller.runtime.flashLoader.concurrency=null")
    )
    assert "DEFAULT_SHM_SIZE_LIMIT" not in unset and "DEFAULT_FLASH_LOADER_CONCURRENCY" not in unset
    assert unset["DEFAULT_FLASH_LOADER_ENABLED"] == "false"
    custom = manager_env(
        helm.template(
            "controller.runtime.flashLoader.tmpfsSizeLimit=16Gi",
            "controller.runtime.flashLoader.concurrency=8",
            "controller.runtime.flashLoader.image=registry.lan/flexinfer:dev",
            "controller.runtime.flashLoader.maxRate=200Mi",
        )
    )
    assert "DEFAULT_FLASH_LOADER_MAX_RATE" not in unset and custom["DEFAULT_FLASH_LOADER_MAX_RATE"] == "200Mi"
    assert custom["DEFAULT_FLASH_LOADER_TMPFS_SIZE_LIMIT"] == "16Gi"
    assert custom["DEFAULT_FLASH_LOADER_CONCURRENCY"] == "8"
    assert custom["DEFAULT_FLASH_LOADER_IMAGE"] == "registry.lan/flexinfer:dev"


def test_image_tag_defaults_to_app_version_and_is_shared(helm: Helm) -> None:
    docs = helm.template("image.tag=1.2.3")
    images = {container(find(docs, "Deployment", name), c)["image"]
              for name, c in (("flexinfer-controller", "manager"), ("flexinfer-proxy", "proxy"))}
    assert images == {"ghcr.io/flexinfer/flexinfer:1.2.3"}
    assert manager_env(docs)["DEFAULT_FLASH_LOADER_IMAGE"] == "ghcr.io/flexinfer/flexinfer:1.2.3"


def test_backend_images_and_model_pull_policy_reach_the_manager(helm: Helm, default_docs: list[dict[str, Any]]) -> None:
    defaults = manager_env(default_docs)
    assert not {k for k in defaults if k.endswith("_IMAGE") and k != "DEFAULT_FLASH_LOADER_IMAGE"}
    assert "DEFAULT_MODEL_IMAGE_PULL_POLICY" not in defaults
    env = manager_env(helm.template("controller.runtime.backendImages.llamacpp=local/llama:1",
                                    "controller.runtime.backendImages.mlc-llm=local/mlc:2",
                                    "controller.runtime.backendImages.vllm=",
                                    "controller.runtime.modelImagePullPolicy=IfNotPresent"))
    assert (env["DEFAULT_LLAMACPP_IMAGE"], env["DEFAULT_MLC_LLM_IMAGE"]) == ("local/llama:1", "local/mlc:2")
    assert "DEFAULT_VLLM_IMAGE" not in env
    assert env["DEFAULT_MODEL_IMAGE_PULL_POLICY"] == "IfNotPresent"


def test_model_pull_policy_and_backend_keys_are_validated(helm: Helm) -> None:
    bad_policy = helm.run("template", "x", str(CHART_DIR), "--set", "controller.runtime.modelImagePullPolicy=Sometimes",
                          check=False)
    assert bad_policy.returncode != 0 and "modelImagePullPolicy" in bad_policy.stderr
    bad_backend = helm.run("template", "x", str(CHART_DIR), "--set", "controller.runtime.backendImages.llama=x",
                           check=False)
    assert bad_backend.returncode != 0 and "llama" in bad_backend.stderr


def test_default_proxy_env_is_exact(default_docs: list[dict[str, Any]]) -> None:
    assert proxy_env(default_docs) == {
        "POD_NAMESPACE": POD_NAMESPACE,
        "POD_NAME": POD_NAME,
        "POD_UID": {"fieldRef": {"fieldPath": "metadata.uid"}},
        "PROXY_QUEUE_TIMEOUT": "10m",
        "PROXY_COLD_START_TIMEOUT": "10m",
        "PROXY_STALL_TIMEOUT": "2m",
        "PROXY_MAX_QUEUE_SIZE": "100",
        **SWAP_ENV,
        **LOG_ENV,
        "FLEXINFER_ACCESS_LOG": "true",
    }
    proxy = container(find(default_docs, "Deployment", "flexinfer-proxy"), "proxy")
    assert proxy["args"] == ["proxy"]
    assert proxy["ports"] == [{"name": "http", "containerPort": 8080, "protocol": "TCP"}]
    service = find(default_docs, "Service", "flexinfer-proxy")
    assert service["spec"]["ports"] == [{"name": "http", "port": 80, "targetPort": "http", "protocol": "TCP"}]


def test_the_swap_knobs_reach_the_manager_and_the_proxy_alike(helm: Helm) -> None:
    docs = helm.template("swap.minHold=5s", "swap.maxWait=1m")
    for env in (manager_env(docs), proxy_env(docs)):
        assert (env["FLEXINFER_SWAP_MIN_HOLD"], env["FLEXINFER_SWAP_MAX_WAIT"]) == ("5s", "1m")
    bad = helm.run("template", "x", str(CHART_DIR), "--set", "swap.maxWait=soon", check=False)
    assert bad.returncode != 0 and "maxWait" in bad.stderr


def test_gpu_profiles_reach_the_manager_as_the_json_it_reads(helm: Helm, default_docs: list[dict[str, Any]]) -> None:
    assert "FLEXINFER_GPU_PROFILES" not in manager_env(default_docs)
    docs = helm.template("controller.gpuProfiles[0].architecture=gfx1100", "controller.gpuProfiles[0].vendor=amd",
                         "controller.gpuProfiles[0].vramMB=24576", "controller.gpuProfiles[0].features.multiModel=true")
    assert parse_gpu_profiles(manager_env(docs)["FLEXINFER_GPU_PROFILES"]) == (
        GPUProfile("gfx1100", 24576, multi_model=True, vendor="amd"),)
    assert "FLEXINFER_GPU_PROFILES" not in proxy_env(docs)
    for bad in ("controller.gpuProfiles[0].vramGB=24", "controller.gpuProfiles[0].vramMB=24Gi"):
        done = helm.run("template", "x", str(CHART_DIR), "--set", "controller.gpuProfiles[0].architecture=gfx1100",
                        "--set", bad, check=False)
        assert done.returncode != 0 and "gpuProfiles" in done.stderr, bad


def test_proxy_rate_limit_and_auth_env(helm: Helm) -> None:
    env = proxy_env(helm.template(*EVERYTHING_ON))
    assert {k: v for k, v in env.items() if k.startswith("PROXY_RATE_LIMIT_")} == {
        "PROXY_RATE_LIMIT_ENABLED": "true",
        "PROXY_RATE_LIMIT_PER_MODEL": "100",
        "PROXY_RATE_LIMIT_BURST": "50",
        "PROXY_RATE_LIMIT_GLOBAL": "1000",
        "PROXY_RATE_LIMIT_GLOBAL_BURST": "200",
    }
    assert env["PROXY_AUTH_ENABLED"] == "true"
    assert env["PROXY_AUTH_TOKEN"] == {"secretKeyRef": {"name": "proxy-token", "key": "token"}}


def test_proxy_all_namespaces_is_opt_in(helm: Helm, default_docs: list[dict[str, Any]]) -> None:
    assert "FLEXINFER_PROXY_ALL_NAMESPACES" not in proxy_env(default_docs)
    assert proxy_env(helm.template("proxy.allNamespaces=true"))["FLEXINFER_PROXY_ALL_NAMESPACES"] == "true"


def test_proxy_auth_without_secret_is_refused(helm: Helm) -> None:
    with pytest.raises(HelmError, match=re.escape("proxy.auth.tokenSecretName must name an existing Secret")):
        helm.template("proxy.auth.enabled=true")


def test_proxy_disabled_renders_no_proxy_objects(helm: Helm) -> None:
    docs = helm.template("proxy.enabled=false", "proxy.replicas=3", "metrics.serviceMonitor.enabled=true")
    assert not [d for d in docs if d["metadata"]["name"].startswith("flexinfer-proxy")]
    assert find(docs, "Deployment", "flexinfer-controller")


@pytest.mark.parametrize(("replicas", "expect_pdb"), [(1, False), (2, True)])
def test_proxy_pdb_only_with_several_replicas(helm: Helm, replicas: int, expect_pdb: bool) -> None:
    docs = helm.template(f"proxy.replicas={replicas}")
    pdbs = [d for d in docs if d["kind"] == "PodDisruptionBudget"]
    assert bool(pdbs) is expect_pdb
    if expect_pdb:
        proxy = find(docs, "Deployment", "flexinfer-proxy")
        assert pdbs[0]["apiVersion"] == "policy/v1"
        assert pdbs[0]["spec"] == {"minAvailable": 1, "selector": proxy["spec"]["selector"]}


def test_monitors_only_when_enabled(helm: Helm, default_docs: list[dict[str, Any]]) -> None:
    assert not [d for d in default_docs if d["kind"] in NO_SCHEMA_KINDS]
    docs = helm.template("metrics.serviceMonitor.enabled=true", "metrics.podMonitor.enabled=true")
    monitors = find(docs, "ServiceMonitor", "flexinfer-manager")
    assert monitors["spec"]["endpoints"][0]["port"] == "metrics"
    assert find(docs, "ServiceMonitor", "flexinfer-proxy")["spec"]["endpoints"][0]["port"] == "http"
    ports = [e["port"] for e in find(docs, "PodMonitor", "flexinfer")["spec"]["podMetricsEndpoints"]]
    assert ports == ["metrics", "http"]


def test_security_contexts_and_resources(default_docs: list[dict[str, Any]]) -> None:
    for deployment, name in (("flexinfer-controller", "manager"), ("flexinfer-proxy", "proxy")):
        pod = find(default_docs, "Deployment", deployment)["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["runAsUser"] == 65532
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        c = container(find(default_docs, "Deployment", deployment), name)
        assert c["securityContext"] == {
            "runAsNonRoot": True,
            "readOnlyRootFilesystem": True,
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
        }
        assert set(c["resources"]) == {"requests", "limits"}
        assert {"name": "tmp", "mountPath": "/tmp"} in c["volumeMounts"]


def test_rbac_grants_exactly_the_documented_verbs(default_docs: list[dict[str, Any]]) -> None:
    assert rule_set(find(default_docs, "ClusterRole", "flexinfer-manager")) == MANAGER_CLUSTER_PERMISSIONS
    assert rule_set(find(default_docs, "Role", "flexinfer-manager-leader-election")) == MANAGER_NAMESPACE_PERMISSIONS
    assert rule_set(find(default_docs, "Role", "flexinfer-proxy")) == PROXY_PERMISSIONS
    for doc in default_docs:
        for rule in doc.get("rules", []):
            assert "*" not in rule["apiGroups"] + rule["resources"] + rule["verbs"], doc["metadata"]["name"]


def test_rbac_bindings_name_the_right_service_accounts(default_docs: list[dict[str, Any]]) -> None:
    for kind, name, sa in (
        ("ClusterRoleBinding", "flexinfer-manager", "flexinfer-manager"),
        ("RoleBinding", "flexinfer-manager-leader-election", "flexinfer-manager"),
        ("RoleBinding", "flexinfer-proxy", "flexinfer-proxy"),
    ):
        binding = find(default_docs, kind, name)
        assert binding["roleRef"]["name"] == name
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": sa, "namespace": NAMESPACE}]


@pytest.mark.parametrize(("all_namespaces", "kind"), [(False, "Role"), (True, "ClusterRole")])
def test_proxy_rbac_is_namespaced_unless_all_namespaces(helm: Helm, all_namespaces: bool, kind: str) -> None:
    docs = helm.template(f"proxy.allNamespaces={str(all_namespaces).lower()}")
    proxy_roles = [d for d in docs if d["kind"] in ("Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding")
                   and d["metadata"]["name"] == "flexinfer-proxy"]
    assert sorted(d["kind"] for d in proxy_roles) == sorted([kind, f"{kind}Binding"])
    role = find(docs, kind, "flexinfer-proxy")
    assert rule_set(role) == PROXY_PERMISSIONS
    assert ("namespace" in role["metadata"]) is (kind == "Role")
    assert not {r for r in rule_set(role) if r[1].startswith("models") and r[2] not in ("get", "list", "watch")}


@pytest.mark.parametrize("set_args", [(), SEED_SET_ARGS, EVERYTHING_ON], ids=["defaults", "seed", "everything-on"])
def test_every_rendered_object_passes_strict_kubernetes_validation(helm: Helm, set_args: tuple[str, ...]) -> None:
    docs = parse_documents(helm.template_text(*set_args, extra=["--include-crds"]))
    validated = 0
    for doc in docs:
        if doc["kind"] in NO_SCHEMA_KINDS:
            continue  # custom resources of the Prometheus Operator: no schema in kubernetes-validate
        kubernetes_validate.validate(doc, "1.30.0", strict=True)
        validated += 1
    assert validated >= 12
