"""Manifest rendering (spec §1.4, §2.3 to §2.5): Deployment, Service and the tmpfs cleanup Job."""

from __future__ import annotations

from typing import Any

import pytest

from flexinfer.core.controller_defaults import controller_defaults
from flexinfer.core.errors import ConfigError
from flexinfer.core.manifests.render import render_model, selector_labels
from support.resource_builders import make_cache, make_model

ON = {"DEFAULT_FLASH_LOADER_ENABLED": "true"}
AMD_SHARED_LOCAL: dict[str, Any] = {
    "gpu": {"vendor": "amd", "shared": "gfx1100-0", "vramEstimateMB": 9000}, "cache": {"strategy": "Local"},
    "nodeSelector": {"kubernetes.io/hostname": "n1"},
}


def render(env: dict[str, str] | None = None, replicas: int = 1, caches: tuple[Any, ...] = (),
           **spec: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    model = make_model(name="m", namespace="ml", **spec)
    deployment, service = render_model(model, list(caches), controller_defaults(env or {}), replicas)
    return deployment, service


def pod(deployment: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = deployment["spec"]["template"]["spec"]
    return spec


def container(deployment: dict[str, Any], name: str = "model") -> dict[str, Any]:
    every = pod(deployment)["containers"] + pod(deployment).get("initContainers", [])
    return next(c for c in every if c["name"] == name)


def volumes(deployment: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {v["name"]: v for v in pod(deployment)["volumes"]}


def mounts(deployment: dict[str, Any], name: str = "model") -> dict[str, dict[str, Any]]:
    return {m["mountPath"]: m for m in container(deployment, name)["volumeMounts"]}


def env_of(deployment: dict[str, Any], name: str = "model") -> dict[str, str]:
    return {e["name"]: e["value"] for e in container(deployment, name).get("env", [])}


def test_labels_selector_and_annotations() -> None:
    deployment, service = render(backend="llama.cpp", **AMD_SHARED_LOCAL)
    selector = {"app.kubernetes.io/name": "model", "app.kubernetes.io/instance": "m",
                "app.kubernetes.io/managed-by": "flexinfer", "flexinfer.ai/model": "m",
                "flexinfer.ai/backend": "llamacpp"}
    assert deployment["spec"]["selector"]["matchLabels"] == selector == service["spec"]["selector"]
    labels = {**selector, "flexinfer.ai/gpu-group": "gfx1100-0"}
    assert deployment["metadata"]["labels"] == labels == deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["template"]["metadata"]["annotations"] == {
        "flexinfer.ai/model": "m", "flexinfer.ai/backend": "llamacpp", "flexinfer.ai/gpu.vram-estimate-mb": "9000"}


def test_exclusive_model_has_no_group_label() -> None:
    deployment, _ = render()
    assert "flexinfer.ai/gpu-group" not in deployment["metadata"]["labels"]


def test_shm_volume_uses_the_controller_default() -> None:
    deployment, _ = render(env={"DEFAULT_SHM_SIZE_LIMIT": "16Gi"})
    assert volumes(deployment)["shm"] == {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "16Gi"}}
    assert mounts(deployment)["/dev/shm"]["name"] == "shm"


def test_flash_loader_for_shared_local_model() -> None:
    deployment, _ = render(config={"useFp16": "1"}, **AMD_SHARED_LOCAL)
    loader = container(deployment, "flash-loader")
    assert loader["imagePullPolicy"] == "IfNotPresent" and loader["command"] == ["flexinfer", "flash-load"]
    assert (loader["terminationMessagePath"], loader["terminationMessagePolicy"]) == ("/dev/termination-log", "File")
    assert env_of(deployment, "flash-loader") == {
        "FLASH_SRC": "/src", "FLASH_DST": "/models", "FLASH_CONCURRENCY": "4", "FLASH_BUFFER_KB": "4096",
        "FLASH_VERIFY": "false", "FLASH_EXCLUDE": "", "FLASH_VARIANT": "fp16"}
    assert mounts(deployment, "flash-loader") == {
        "/src": {"name": "model", "mountPath": "/src", "readOnly": True},
        "/models": {"name": "flash-tmpfs", "mountPath": "/models"}}
    assert mounts(deployment)["/models"]["name"] == "flash-tmpfs"
    assert volumes(deployment)["flash-tmpfs"]["hostPath"] == {
        "path": "/dev/shm/flexinfer/ml/m", "type": "DirectoryOrCreate"}
    assert volumes(deployment)["model"]["hostPath"]["path"] == "/var/lib/flexinfer/models/ml/m"


def test_the_controller_rate_cap_reaches_the_flash_loader() -> None:
    deployment, _ = render(env={"DEFAULT_FLASH_LOADER_MAX_RATE": "200Mi"}, **AMD_SHARED_LOCAL)
    assert env_of(deployment, "flash-loader")["FLASH_MAX_RATE"] == "200Mi"


def test_fp16_variant_only_for_the_string_one() -> None:
    deployment, _ = render(config={"useFp16": 1}, **AMD_SHARED_LOCAL)
    assert env_of(deployment, "flash-loader")["FLASH_VARIANT"] == ""


def test_non_shared_tmpfs_is_a_sized_memory_empty_dir() -> None:
    deployment, _ = render(env={**ON, "DEFAULT_FLASH_LOADER_TMPFS_SIZE_LIMIT": "20Gi"}, gpu={"vendor": "amd"})
    assert volumes(deployment)["flash-tmpfs"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "20Gi"}


def test_shared_tmpfs_ignores_the_size_limit() -> None:
    deployment, _ = render(env={"DEFAULT_FLASH_LOADER_TMPFS_SIZE_LIMIT": "20Gi"}, **AMD_SHARED_LOCAL)
    assert "emptyDir" not in volumes(deployment)["flash-tmpfs"]


def test_pvc_sub_path_is_preserved_on_the_renamed_mount() -> None:
    deployment, _ = render(env=ON, source="pvc://weights/qwen/7b")
    assert mounts(deployment)["/models"] == {"name": "flash-tmpfs", "mountPath": "/models", "subPath": "qwen/7b"}
    assert volumes(deployment)["model"]["persistentVolumeClaim"] == {"claimName": "weights"}
    assert mounts(deployment, "flash-loader")["/src/qwen/7b"] == {
        "name": "model", "mountPath": "/src/qwen/7b", "subPath": "qwen/7b", "readOnly": True}
    assert container(deployment)["args"][:2] == ["--model", "/models"]


def test_model_cache_overrides_reach_the_init_container() -> None:
    cache = make_cache(name="m-cache", namespace="ml", flash_loader={"enabled": True, "concurrency": 8,
                                                                     "image": "reg/fl:9"})
    deployment, _ = render(caches=(cache,))
    loader = container(deployment, "flash-loader")
    assert loader["image"] == "reg/fl:9" and "command" not in loader
    assert env_of(deployment, "flash-loader")["FLASH_CONCURRENCY"] == "8"


@pytest.mark.parametrize(("name", "spec", "volume"), [
    ("SharedPVC default uses <model>-cache", {}, {"persistentVolumeClaim": {"claimName": "m-cache"}}),
    ("SharedPVC named claim", {"cache": {"pvcName": "c"}}, {"persistentVolumeClaim": {"claimName": "c"}}),
    ("Memory", {"cache": {"strategy": "Memory"}}, {"emptyDir": {"medium": "Memory"}}),
    ("None", {"cache": {"strategy": "None"}}, {"emptyDir": {}}),
    ("Local", {"cache": {"strategy": "Local", "hostPath": "/d"}},
     {"hostPath": {"path": "/d/ml/m", "type": "DirectoryOrCreate"}}),
])
def test_model_volume_by_strategy(name: str, spec: dict[str, Any], volume: dict[str, Any]) -> None:
    deployment, _ = render(**spec)
    assert volumes(deployment)["model"] == {"name": "model", **volume}, name
    assert "initContainers" not in pod(deployment)


def test_backend_without_volume_gets_no_loader_even_when_enabled() -> None:
    deployment, _ = render(env=ON, backend="ollama", source="ollama://qwen:7b")
    assert "initContainers" not in pod(deployment) and "model" not in volumes(deployment)


def test_amd_gpu_pod() -> None:
    deployment, _ = render(gpu={"vendor": "amd", "count": 2})
    assert deployment["spec"]["strategy"] == {"type": "RollingUpdate",
                                              "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}}
    assert pod(deployment)["tolerations"][0] == {"key": "dedicated", "operator": "Equal", "value": "gpu",
                                                 "effect": "NoSchedule"}
    assert pod(deployment)["securityContext"] == {"supplementalGroups": [109, 992]}
    assert container(deployment)["resources"]["limits"] == {"amd.com/gpu": "2"}
    assert env_of(deployment)["HSA_OVERRIDE_GFX_VERSION"] == "11.0.0"
    assert container(deployment)["image"] == "rocm/vllm:latest"


def test_nvidia_gpu_pod() -> None:
    deployment, _ = render(gpu={"vendor": "nvidia"}, tolerations=[{"key": "k", "operator": "Exists"}])
    assert pod(deployment)["runtimeClassName"] == "nvidia"
    assert container(deployment)["resources"]["limits"] == {"nvidia.com/gpu": "1"}
    assert pod(deployment)["tolerations"][1] == {"key": "k", "operator": "Exists"}
    assert "securityContext" not in pod(deployment)


def test_cpu_pod_has_no_gpu_settings() -> None:
    deployment, _ = render(backend="llamacpp", source="file:///m/tiny.gguf", resources={"limits": {"cpu": "2"}})
    spec = pod(deployment)
    assert "strategy" not in deployment["spec"] and "tolerations" not in spec and "runtimeClassName" not in spec
    assert container(deployment)["resources"] == {"limits": {"cpu": "2"}}
    assert container(deployment)["image"] == "ghcr.io/ggml-org/llama.cpp:server"
    assert container(deployment)["args"] == ["--model", "/m/tiny.gguf", "--host", "0.0.0.0", "--port", "8080",
                                             "--alias", "m", "--verbosity", "4", "--parallel", "1"]


@pytest.mark.parametrize(("backend", "config", "expected"), [
    ("llamacpp", {}, ["--parallel", "1"]),  # one slot: the proxy lets one request through at a time
    ("llamacpp", {"parallel": 4}, ["--parallel", "4"]),
    ("llamacpp", {"args": ["-np", "3"]}, ["-np", "3"]),  # the args' own flag is not doubled
    ("llamacpp", {"args": ["--ctx-size", 512, "--threads", "2"]}, ["--parallel", "1", "--ctx-size", "512",
                                                                    "--threads", "2"]),
    ("vllm", {}, []),  # vLLM schedules any number itself
    ("vllm", {"parallel": 16}, ["--max-num-seqs", "16"]),
])
def test_server_is_told_its_parallel_capacity(backend: str, config: dict[str, Any], expected: list[str]) -> None:
    """The same capacity the arbiter enforces (``Slot.capacity``) reaches the server's command line."""
    args = container(render(backend=backend, source="file:///m/x.gguf", config=config)[0])["args"]
    logged = 2 if backend == "llamacpp" else 0  # llama.cpp's --verbosity 4 (its buffer sizes) comes first
    assert args[8 + logged:] == expected  # after --model, --host, --port, the served name and the log level


@pytest.mark.parametrize("config", [{"parallel": 0}, {"parallel": "two"}, {"parallel": 2, "args": ["--parallel", "3"]},
                                    {"args": "--ctx-size 512"}, {"args": [True]}])
def test_invalid_parallel_capacity_names_the_field(config: dict[str, Any]) -> None:
    with pytest.raises(ConfigError, match=r"spec\.config\.(parallel|args)"):
        render(backend="llamacpp", source="file:///m/x.gguf", config=config)


def test_image_precedence() -> None:
    assert container(render(env={"DEFAULT_VLLM_IMAGE": "env/vllm"})[0])["image"] == "env/vllm"
    assert container(render(env={"DEFAULT_VLLM_IMAGE": "env/vllm"}, image="own/img")[0])["image"] == "own/img"


@pytest.mark.parametrize(("raw", "policy"), [(None, "Always"), ("IfNotPresent", "IfNotPresent"),
                                             ("Never", "Never"), ("never", "Never")])
def test_model_image_pull_policy_comes_from_the_controller_default(raw: str | None, policy: str) -> None:
    env = {} if raw is None else {"DEFAULT_MODEL_IMAGE_PULL_POLICY": raw}
    assert container(render(env=env)[0])["imagePullPolicy"] == policy


def test_an_unknown_model_image_pull_policy_is_an_error_naming_the_variable() -> None:
    with pytest.raises(ConfigError, match="DEFAULT_MODEL_IMAGE_PULL_POLICY='bogus'"):
        render(env={"DEFAULT_MODEL_IMAGE_PULL_POLICY": "bogus"})


def test_main_container_is_locked_down_and_explicit() -> None:
    deployment, _ = render()
    main = container(deployment)
    assert main["securityContext"] == {"allowPrivilegeEscalation": False}
    assert main["imagePullPolicy"] == "Always" and main["terminationMessagePolicy"] == "File"
    assert main["ports"] == [{"name": "http", "containerPort": 8000, "protocol": "TCP"}]
    assert main["readinessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    assert pod(deployment)["automountServiceAccountToken"] is False


def test_startup_timeout_sets_the_probe_budget() -> None:
    main = container(render(config={"startupTimeout": "30m"})[0])
    assert main["startupProbe"]["failureThreshold"] * main["startupProbe"]["periodSeconds"] == 1800


def test_the_startup_probe_asks_every_second_within_the_default_budget() -> None:
    """A server that listens 0.1 s after it starts is seen started about a second later, not one long readiness
    period later; a slow big model still gets the whole default budget (15 minutes) before the kubelet kills it."""
    main = container(render()[0])
    startup, readiness = main["startupProbe"], main["readinessProbe"]
    assert startup["periodSeconds"] == 1 and startup["failureThreshold"] == 900
    assert readiness["periodSeconds"] <= 2
    assert readiness["periodSeconds"] * readiness["failureThreshold"] >= 30  # a busy server is not dropped
    assert "livenessProbe" not in main


def test_replicas_and_multi_replica_spread() -> None:
    one, _ = render(replicas=0)
    assert one["spec"]["replicas"] == 0 and "affinity" not in pod(one)
    many, _ = render(replicas=3)
    term = pod(many)["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0]
    assert term["labelSelector"]["matchLabels"] == selector_labels(make_model(name="m", namespace="ml"))
    assert pod(many)["topologySpreadConstraints"][0]["whenUnsatisfiable"] == "ScheduleAnyway"


def test_owner_reference_only_with_uid() -> None:
    model = make_model(name="m", uid="1234")
    deployment, service = render_model(model, [], controller_defaults({}), 1)
    owner = {"apiVersion": "ai.flexinfer/v1alpha2", "kind": "Model", "name": "m", "uid": "1234",
             "controller": True, "blockOwnerDeletion": True}
    assert deployment["metadata"]["ownerReferences"] == [owner] == service["metadata"]["ownerReferences"]
    assert "ownerReferences" not in render()[0]["metadata"]


def test_service() -> None:
    _, service = render(backend="ollama", source="ollama://q:7b", serviceLabels=["code", "chat"],
                        litellm={"servedModelName": "q", "aliases": ["a", "b"], "copilotAlias": "c"})
    assert service["spec"]["type"] == "ClusterIP"
    assert service["spec"]["ports"] == [{"name": "http", "port": 11434, "targetPort": 11434, "protocol": "TCP"}]
    assert service["metadata"]["annotations"] == {
        "litellm.flexinfer.ai/served-model": "q", "litellm.flexinfer.ai/aliases": "a,b",
        "litellm.flexinfer.ai/copilot-model": "c", "flexinfer.ai/service-labels": "code,chat"}
