"""Helm chart test support: the pinned helm binary, rendering ``charts/flexinfer``, and the RBAC contract.

Used by ``tests/unit/chart`` (lint, template, schema, validation) and ``tests/integration/test_chart_install.py``
(install/upgrade/uninstall and ``kubectl auth can-i`` against the real testbed apiserver). helm comes from
``$FLEXINFER_CACHE/bin`` (fetched by ``hack/get-helm`` when absent); a missing helm is an error, never a skip.
The permission tables below are written independently of the chart templates on purpose: a chart change that
widens or narrows RBAC must change them too.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from support.kube_testbed import HACK_DIR, REPO_ROOT, cache_dir

CHART_DIR = REPO_ROOT / "charts" / "flexinfer"
RELEASE = "flexinfer"
NAMESPACE = "flexinfer-system"
SEED_SET_ARGS = (
    "controller.runtime.flashLoader.enabled=true",
    "observability.tracing.enabled=true",
    "observability.tracing.otlpEndpoint=http://otel-collector.observability:4318",
)

Rule = tuple[str, str, str]  # (apiGroup, resource[/subresource], verb)


def _expand(group: str, resources: Iterable[str], verbs: Iterable[str]) -> set[Rule]:
    return {(group, resource, verb) for resource in resources for verb in verbs}


READ = ("get", "list", "watch")
OWNED = (*READ, "create", "patch", "delete")  # server-side apply is a PATCH; create covers apply-create

MANAGER_CLUSTER_PERMISSIONS: frozenset[Rule] = frozenset(
    _expand("ai.flexinfer", ("models",), (*READ, "patch"))
    | _expand("ai.flexinfer", ("models/status",), ("patch",))
    | _expand("ai.flexinfer", ("models/finalizers",), ("update",))
    | _expand("ai.flexinfer", ("modelcaches", "gpuleases", "modeldemands"), READ)
    | _expand("apps", ("deployments",), OWNED)
    | _expand("", ("services",), OWNED)
    | _expand("", ("pods",), (*READ, "delete"))
    | _expand("", ("pods/log",), ("get",))
    | _expand("", ("configmaps",), ("create", "patch", "delete"))
    | _expand("", ("secrets",), ("get", "create", "delete"))
    | _expand("batch", ("jobs",), ("create",))
    | _expand("", ("events",), ("create",))
    | _expand("apiextensions.k8s.io", ("customresourcedefinitions",), READ)
)
MANAGER_NAMESPACE_PERMISSIONS: frozenset[Rule] = frozenset(
    _expand("coordination.k8s.io", ("leases",), ("get", "create", "update"))
)
PROXY_PERMISSIONS: frozenset[Rule] = frozenset(
    _expand("ai.flexinfer", ("models",), READ)
    | _expand("ai.flexinfer", ("modeldemands",), ("create", "patch", "delete"))
)
"""The proxy's rules: a Role in the release namespace, or a ClusterRole with proxy.allNamespaces=true."""
UNINSTALL_CLUSTER_PERMISSIONS: frozenset[Rule] = frozenset(
    _expand("ai.flexinfer", ("models",), ("get", "list", "patch"))
    | _expand("apps", ("deployments",), ("delete",))
    | _expand("", ("services",), ("delete",))
    | _expand("", ("pods",), ("list",))
    | _expand("batch", ("jobs",), ("create", "list", "delete"))
)
UNINSTALL_NAMESPACE_PERMISSIONS: frozenset[Rule] = frozenset(_expand("apps", ("deployments",), ("get", "patch")))
"""The pre-delete hook's rules (`flexinfer uninstall`): cluster-wide, and in the release namespace (the manager's
Deployment, scaled to zero)."""
# Things each ServiceAccount must NOT be able to do (checked cluster-wide): everything the code does not
# call, next to what it does (a rule widened by a wildcard or a stray verb shows up here).
MANAGER_FORBIDDEN: tuple[Rule, ...] = (
    ("", "namespaces", "list"),
    ("", "namespaces", "watch"),
    ("", "namespaces", "delete"),
    ("", "namespaces", "create"),
    ("", "secrets", "list"),
    ("", "secrets", "update"),
    ("", "configmaps", "update"),
    ("", "pods", "create"),
    ("", "pods/exec", "create"),
    ("", "events", "patch"),
    ("", "services", "update"),
    ("apps", "deployments", "update"),
    ("batch", "jobs", "get"),
    ("batch", "jobs", "list"),
    ("batch", "jobs", "delete"),
    ("ai.flexinfer", "models", "create"),
    ("ai.flexinfer", "models", "update"),
    ("ai.flexinfer", "models", "delete"),
    ("ai.flexinfer", "models/status", "update"),
    ("ai.flexinfer", "modelcaches", "patch"),
    ("ai.flexinfer", "gpuleases", "patch"),
    ("apiextensions.k8s.io", "customresourcedefinitions", "delete"),
    ("rbac.authorization.k8s.io", "clusterroles", "create"),
    ("rbac.authorization.k8s.io", "clusterrolebindings", "create"),
    ("apps", "daemonsets", "create"),
    ("coordination.k8s.io", "leases", "delete"),
    ("coordination.k8s.io", "leases", "patch"),
)
PROXY_FORBIDDEN: tuple[Rule, ...] = (
    ("ai.flexinfer", "models", "patch"),
    ("ai.flexinfer", "models/status", "patch"),
    ("ai.flexinfer", "models/finalizers", "update"),
    ("ai.flexinfer", "modeldemands", "update"),
    ("ai.flexinfer", "modelcaches", "patch"),
    ("ai.flexinfer", "gpuleases", "create"),
    ("coordination.k8s.io", "leases", "get"),
    ("coordination.k8s.io", "leases", "update"),
    ("coordination.k8s.io", "leases", "patch"),
    ("coordination.k8s.io", "leases", "delete"),
    ("apps", "deployments", "patch"),
    ("apps", "deployments", "get"),
    ("ai.flexinfer", "models", "create"),
    ("ai.flexinfer", "models", "update"),
    ("ai.flexinfer", "models", "delete"),
    ("ai.flexinfer", "models/status", "update"),
    ("", "services", "get"),
    ("", "services", "list"),
    ("", "services", "create"),
    ("", "services", "delete"),
    ("", "secrets", "get"),
    ("", "pods", "list"),
    ("coordination.k8s.io", "leases", "create"),
)


class HelmError(AssertionError):
    """helm exited non-zero; the message carries its stderr."""


@dataclass(frozen=True)
class Helm:
    """The pinned helm binary with its cache/config/data dirs isolated under ``home``."""

    binary: Path
    home: Path
    kubeconfig: Path | None = None

    def env(self) -> dict[str, str]:
        env = {
            **os.environ,
            "HELM_CACHE_HOME": str(self.home / "cache"),
            "HELM_CONFIG_HOME": str(self.home / "config"),
            "HELM_DATA_HOME": str(self.home / "data"),
        }
        if self.kubeconfig is not None:
            env["KUBECONFIG"] = str(self.kubeconfig)
        return env

    def run(self, *args: str, check: bool = True, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            [str(self.binary), *args], capture_output=True, text=True, env=self.env(), timeout=timeout, check=False
        )
        if check and proc.returncode != 0:
            raise HelmError(f"helm {' '.join(args)} exited {proc.returncode}:\n{proc.stderr.strip()}")
        return proc

    def with_kubeconfig(self, kubeconfig: Path) -> Helm:
        return Helm(self.binary, self.home, kubeconfig)

    def template(self, *set_args: str, extra: Sequence[str] = ()) -> list[dict[str, Any]]:
        """Render the chart (release ``flexinfer`` in ``flexinfer-system``) into a list of objects."""
        return parse_documents(self.template_text(*set_args, extra=extra))

    def template_text(self, *set_args: str, extra: Sequence[str] = ()) -> str:
        sets = [arg for value in set_args for arg in ("--set", value)]
        return self.run("template", RELEASE, str(CHART_DIR), "--namespace", NAMESPACE, *sets, *extra).stdout


def pinned_helm(home: Path) -> Helm:
    """The helm from the project cache (fetching it with hack/get-helm if absent); fails when unavailable."""
    binary = cache_dir() / "bin" / "helm"
    if not os.access(binary, os.X_OK):
        fetch = subprocess.run([str(HACK_DIR / "get-helm")], capture_output=True, text=True, timeout=300, check=False)
        if fetch.returncode != 0:
            raise HelmError(f"hack/get-helm failed:\n{fetch.stderr.strip()}")
    if not os.access(binary, os.X_OK):
        raise HelmError(f"helm not found at {binary} after hack/get-helm")
    return Helm(binary, home)


def parse_documents(text: str) -> list[dict[str, Any]]:
    """Every non-empty YAML document of a multi-document stream."""
    return [doc for doc in yaml.safe_load_all(text) if doc]


def find(docs: Iterable[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    """The one object of ``kind`` named ``name``; AssertionError when absent."""
    for doc in docs:
        if doc["kind"] == kind and doc["metadata"]["name"] == name:
            return doc
    raise AssertionError(f"no {kind} named {name!r} rendered")


def container(deployment: dict[str, Any], name: str) -> dict[str, Any]:
    """A named container of a Deployment's pod template."""
    containers = deployment["spec"]["template"]["spec"]["containers"]
    return next(c for c in containers if c["name"] == name)


def env_map(c: dict[str, Any]) -> dict[str, Any]:
    """Container env as {name: value or valueFrom}; duplicate names are an error."""
    names = [e["name"] for e in c.get("env", [])]
    assert len(names) == len(set(names)), f"duplicate env names in {c['name']}: {names}"
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in c.get("env", [])}


def rule_set(role: dict[str, Any]) -> set[Rule]:
    """A Role/ClusterRole's rules flattened to (group, resource, verb) tuples."""
    return {
        (group, resource, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def dump(docs: Iterable[dict[str, Any]]) -> str:
    """A stable YAML rendering (sorted keys) for golden comparisons."""
    return yaml.safe_dump_all(list(docs), sort_keys=True, default_flow_style=False)
