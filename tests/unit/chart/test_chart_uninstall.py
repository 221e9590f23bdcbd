"""The chart's pre-delete hook: `helm uninstall` first runs `flexinfer uninstall` (stop the manager and every
model, clean up), with exactly the permissions that needs, as Helm hooks removed once they succeed; it can be
turned off, and an upgrade with `--reuse-values` from a chart without the `uninstall` block still renders it."""

from __future__ import annotations

from typing import Any

from support.helm_chart import (
    NAMESPACE,
    UNINSTALL_CLUSTER_PERMISSIONS,
    UNINSTALL_NAMESPACE_PERMISSIONS,
    Helm,
    env_map,
    find,
    rule_set,
)

NAME = "flexinfer-uninstall"
HOOK_KINDS = ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "Job")


def hook_objects(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [d for d in docs if (d["metadata"].get("annotations") or {}).get("helm.sh/hook")]


def test_every_hook_object_is_a_pre_delete_hook_removed_on_success(default_docs: list[dict[str, Any]]) -> None:
    hooks = hook_objects(default_docs)
    assert sorted((d["kind"], d["metadata"]["name"]) for d in hooks) == sorted((k, NAME) for k in HOOK_KINDS)
    for doc in hooks:
        annotations = doc["metadata"]["annotations"]
        assert annotations["helm.sh/hook"] == "pre-delete"
        assert annotations["helm.sh/hook-delete-policy"] == "before-hook-creation,hook-succeeded"
    weights = {d["kind"]: int(d["metadata"]["annotations"]["helm.sh/hook-weight"]) for d in hooks}
    assert max(weights[k] for k in HOOK_KINDS if k != "Job") < weights["Job"]  # permissions exist first


def test_the_hook_job_runs_flexinfer_uninstall_within_its_deadline(default_docs: list[dict[str, Any]]) -> None:
    job = find(default_docs, "Job", NAME)
    assert (job["spec"]["backoffLimit"], job["spec"]["activeDeadlineSeconds"]) == (0, 300)
    pod = job["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == NAME and pod["restartPolicy"] == "Never"
    assert pod["securityContext"]["runAsNonRoot"] is True
    [c] = pod["containers"]
    assert c["args"] == ["uninstall", f"--namespace={NAMESPACE}", "--manager=flexinfer-controller", "--timeout=240s"]
    assert c["image"] == "ghcr.io/flexinfer/flexinfer:0.1.0"
    # The cleanup Jobs it creates use the flash-loader image, as the manager's would.
    assert env_map(c)["DEFAULT_FLASH_LOADER_IMAGE"] == "ghcr.io/flexinfer/flexinfer:0.1.0"
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert {"name": "tmp", "mountPath": "/tmp"} in c["volumeMounts"]


def test_the_hook_has_exactly_the_permissions_it_uses(default_docs: list[dict[str, Any]]) -> None:
    assert rule_set(find(default_docs, "ClusterRole", NAME)) == UNINSTALL_CLUSTER_PERMISSIONS
    role = find(default_docs, "Role", NAME)
    assert role["metadata"]["namespace"] == NAMESPACE and rule_set(role) == UNINSTALL_NAMESPACE_PERMISSIONS
    for kind in ("ClusterRoleBinding", "RoleBinding"):
        binding = find(default_docs, kind, NAME)
        assert binding["roleRef"]["name"] == NAME
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": NAME, "namespace": NAMESPACE}]


def test_the_hook_can_be_turned_off_and_its_timeout_set(helm: Helm) -> None:
    assert not hook_objects(helm.template("uninstall.hook=false"))
    job = find(helm.template("uninstall.timeoutSeconds=90"), "Job", NAME)
    assert job["spec"]["activeDeadlineSeconds"] == 150
    assert job["spec"]["template"]["spec"]["containers"][0]["args"][-1] == "--timeout=90s"


def test_values_without_the_uninstall_block_still_render_the_hook(helm: Helm) -> None:
    """What `helm upgrade --reuse-values` from chart 0.2.0 passes: its values, which have no `uninstall`."""
    job = find(helm.template("uninstall=null"), "Job", NAME)
    assert job["spec"]["template"]["spec"]["containers"][0]["args"][-1] == "--timeout=240s"
