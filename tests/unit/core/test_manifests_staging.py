"""The flash-loader's init containers as rendered (spec §2.3, §2.4): only the model's own weights are staged, a
shared model's hostPath tmpfs is handed to the loader's user first; and the tmpfs cleanup Job (spec §2.5) runs
only on the node the model's pod ran on and ends on its own."""

from __future__ import annotations

from typing import Any

import pytest

from flexinfer.core.controller_defaults import controller_defaults
from flexinfer.core.manifests.render import render_model, render_tmpfs_cleanup_job, selector_labels
from support.resource_builders import make_model

ON = {"DEFAULT_FLASH_LOADER_ENABLED": "true"}
SHARED = {"gpu": {"vendor": "amd", "shared": "g"}}


def pod(**spec: Any) -> dict[str, Any]:
    deployment, _ = render_model(make_model(name="m", namespace="ml", **spec), [], controller_defaults(ON), 1)
    out: dict[str, Any] = deployment["spec"]["template"]["spec"]
    return out


def init(spec: dict[str, Any], name: str) -> dict[str, Any]:
    return next(c for c in spec["initContainers"] if c["name"] == name)


def mounts(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {m["mountPath"]: m for m in container["volumeMounts"]}


@pytest.mark.parametrize(("source", "cache", "staged"), [
    ("pvc://weights/tiny-a.gguf", None, "tiny-a.gguf"),
    ("pvc://weights/qwen/7b", None, "qwen/7b"),
    ("file:///models/tiny-a.gguf", {"strategy": "SharedPVC", "pvcName": "weights"}, "tiny-a.gguf"),
    ("file:///models/sub/dir/", {"strategy": "Local"}, "sub/dir"),
])
def test_the_loader_sees_only_the_model_s_own_weights(source: str, cache: dict[str, Any] | None,
                                                       staged: str) -> None:
    spec = pod(source=source, **({"cache": cache} if cache else {}))
    loader = init(spec, "flash-loader")
    source_mount = {"name": "model", "mountPath": f"/src/{staged}", "subPath": staged, "readOnly": True}
    assert mounts(loader) == {f"/src/{staged}": source_mount,
                              "/models": {"name": "flash-tmpfs", "mountPath": "/models"}}
    assert {e["name"]: e["value"] for e in loader["env"]}["FLASH_SRC"] == "/src"


def test_a_split_gguf_is_staged_with_its_other_parts() -> None:
    spec = pod(source="file:///models/q/m-00001-of-00003.gguf", cache={"strategy": "Local"})
    assert sorted(mounts(init(spec, "flash-loader"))) == [
        "/models", *(f"/src/q/m-0000{i}-of-00003.gguf" for i in (1, 2, 3))]


@pytest.mark.parametrize(("source", "cache"), [
    ("pvc://weights", None),                                        # the claim is the model's folder
    ("HF://org/repo", {"strategy": "Local"}),                       # a Hugging Face cache: all of it
    ("file:///var/lib/models/x.gguf", {"strategy": "SharedPVC"}),   # not below the volume's mount
])
def test_a_whole_volume_source_is_staged_whole(source: str, cache: dict[str, Any] | None) -> None:
    loader = init(pod(source=source, **({"cache": cache} if cache else {})), "flash-loader")
    assert mounts(loader)["/src"] == {"name": "model", "mountPath": "/src", "readOnly": True}


def test_the_loader_runs_as_its_own_user() -> None:
    loader = init(pod(source="pvc://weights/a.gguf"), "flash-loader")
    assert loader["securityContext"] == {"allowPrivilegeEscalation": False, "runAsUser": 65532, "runAsGroup": 65532,
                                         "runAsNonRoot": True}


def test_a_shared_model_s_host_path_is_handed_to_the_loader_first() -> None:
    spec = pod(source="pvc://weights/a.gguf", **SHARED)
    assert [c["name"] for c in spec["initContainers"]] == ["flash-tmpfs-owner", "flash-loader"]
    owner = init(spec, "flash-tmpfs-owner")
    assert owner["command"] == ["chown", "65532:65532", "/models"]
    assert owner["image"] == init(spec, "flash-loader")["image"]
    assert owner["volumeMounts"] == [{"name": "flash-tmpfs", "mountPath": "/models"}]
    assert owner["securityContext"] == {"runAsUser": 0, "runAsNonRoot": False, "allowPrivilegeEscalation": False,
                                        "capabilities": {"drop": ["ALL"], "add": ["CHOWN"]}}
    volume = next(v for v in spec["volumes"] if v["name"] == "flash-tmpfs")
    assert volume["hostPath"] == {"path": "/dev/shm/flexinfer/ml/m", "type": "DirectoryOrCreate"}


def test_an_empty_dir_tmpfs_needs_no_owner_step() -> None:
    assert [c["name"] for c in pod(source="pvc://weights/a.gguf")["initContainers"]] == ["flash-loader"]


def cleanup_job(node: str = "node-7", env: dict[str, str] | None = None, **spec: Any) -> dict[str, Any] | None:
    model = make_model(name="m", namespace="ml", **spec)
    return render_tmpfs_cleanup_job(model, node, controller_defaults(env or {}))


def test_the_cleanup_job_runs_on_the_node_the_pod_ran_on_and_ends_on_its_own() -> None:
    job = cleanup_job(env={"DEFAULT_FLASH_LOADER_IMAGE": "reg/flexinfer:9"},
                      nodeSelector={"kubernetes.io/hostname": "gfx1100-0"},
                      tolerations=[{"key": "k", "operator": "Exists"}], **SHARED)
    assert job is not None and job["metadata"]["name"] == "m-tmpfs-cleanup"
    assert "ownerReferences" not in job["metadata"]
    assert job["metadata"]["labels"]["flexinfer.ai/gpu-group"] == "g"
    assert job["metadata"]["labels"]["flexinfer.ai/tmpfs-cleanup"] == "m"  # `flexinfer uninstall` finds it so
    assert (job["spec"]["backoffLimit"], job["spec"]["activeDeadlineSeconds"],
            job["spec"]["ttlSecondsAfterFinished"]) == (1, 120, 120)
    spec = job["spec"]["template"]["spec"]
    assert spec["restartPolicy"] == "Never" and spec["automountServiceAccountToken"] is False
    assert "nodeSelector" not in spec  # the node it ran on, not the one it asked for
    assert spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"] == [
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-7"]}]}]
    assert [t["key"] for t in spec["tolerations"]] == ["dedicated", "k"]
    [cleanup] = spec["containers"]
    assert cleanup["image"] == "reg/flexinfer:9"  # the flash-loader's image: on the node already
    assert cleanup["command"] == ["rm", "-rf", "/dev/shm/flexinfer/ml/m"]
    assert cleanup["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["DAC_OVERRIDE"]}
    assert cleanup["volumeMounts"] == [{"name": "flash-tmpfs-root", "mountPath": "/dev/shm/flexinfer"}]
    assert spec["volumes"][0]["hostPath"] == {"path": "/dev/shm/flexinfer", "type": "DirectoryOrCreate"}
    assert not set(selector_labels(make_model(name="m"))).issubset(job["spec"]["template"]["metadata"]["labels"])


@pytest.mark.parametrize(("name", "node", "spec"), [
    ("exclusive model", "node-7", {"gpu": {"vendor": "amd"}}),
    ("shared model that never ran (a node selector names no node it ran on)", "",
     {**SHARED, "nodeSelector": {"kubernetes.io/hostname": "gfx1100-0"}}),
])
def test_no_cleanup_job(name: str, node: str, spec: dict[str, Any]) -> None:
    assert cleanup_job(node, **spec) is None, name
