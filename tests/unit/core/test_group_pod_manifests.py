"""The group pod's manifests (issue 28): who may join, what its ``serve`` reads, ConfigMap, Deployment, Service."""

from __future__ import annotations

import re
from typing import Any

import pytest

from flexinfer.api.loading import parse_documents
from flexinfer.api.model import Model
from flexinfer.api.modelcache import ModelCache
from flexinfer.core.controller_defaults import ControllerDefaults, controller_defaults
from flexinfer.core.errors import ConfigError
from flexinfer.core.flashloader_settings import resolve_flash_loader
from flexinfer.core.manifests.group_members import GROUP_POD_BACKENDS
from flexinfer.core.manifests.group_pod import (
    GROUP_POD_LABEL,
    MANIFEST_KEY,
    GroupPodPlan,
    group_manifest_text,
    group_members_problems,
    group_pod_name,
    render_group_pod,
)
from flexinfer.local.memory_budget import parse_entries
from flexinfer.local.profiles import PROFILES
from support.resource_builders import make_cache, model_doc

Json = dict[str, Any]
NS = "ml"
GROUP = "gfx1100-0"
LLAMA = "localhost/flexinfer/llamacpp-server:1"
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def member(name: str, created: str | None = None, uid: str | None = None, **spec: Any) -> Model:
    """A llama.cpp member of ``GROUP`` reading its own Local directory, unless ``spec`` says otherwise."""
    body: Json = {"backend": "llamacpp", "source": "file:///models/model.gguf", "image": LLAMA,
                  "gpu": {"vendor": "amd", "shared": GROUP}, "cache": {"strategy": "Local"}}
    body.update(spec)
    doc = model_doc(name, NS, uid, **body)
    if created is not None:
        doc["metadata"]["creationTimestamp"] = created
    return Model.model_validate(doc)


def plan(strategy: str = "TimeSliced", budget: float | None = None, group: str = GROUP) -> GroupPodPlan:
    return GroupPodPlan(namespace=NS, group=group, strategy=strategy, replicas=1, budget_mib=budget,
                        token_secret="flexinfer-group-admin")


def render(members: list[Model], caches: tuple[ModelCache, ...] = (), env: dict[str, str] | None = None,
           **plan_args: Any) -> tuple[Json, Json, Json]:
    configmap, deployment, service = render_group_pod(plan(**plan_args), members, list(caches),
                                                      controller_defaults(env or {}))
    return configmap, deployment, service


def pod_spec(deployment: Json) -> Json:
    spec: Json = deployment["spec"]["template"]["spec"]
    return spec


def container(deployment: Json) -> Json:
    found: Json = pod_spec(deployment)["containers"][0]
    return found


def env_of(deployment: Json) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container(deployment)["env"]}


def mounts_of(deployment: Json) -> dict[str, Json]:
    return {m["mountPath"]: m for m in container(deployment)["volumeMounts"]}


def volumes_of(deployment: Json) -> dict[str, Json]:
    return {v["name"]: v for v in pod_spec(deployment)["volumes"]}


def served(text: str) -> dict[str, Model]:
    return {r.name: r for r in parse_documents(text) if isinstance(r, Model)}


# Who may join -------------------------------------------------------------------------------------------------------

def test_the_oldest_member_sets_the_image_and_the_other_is_named() -> None:
    older = member("b", created="2026-01-01T00:00:00Z")
    newer = member("a", created="2026-02-01T00:00:00Z", image="localhost/other:2")
    image, problems = group_members_problems([newer, older], ControllerDefaults())
    assert image == LLAMA
    assert problems == {"a": f"model a runs image localhost/other:2 but group {GROUP}'s pod runs {LLAMA} (the image "
                             f"of its oldest member b): group-pod mode runs every member in one image"}


def test_without_timestamps_the_name_decides_and_a_member_that_cannot_join_sets_nothing() -> None:
    image, problems = group_members_problems([member("b", image="img:b"), member("a", image="img:a")],
                                             ControllerDefaults())
    assert image == "img:a" and list(problems) == ["b"] and "(the image of its oldest member a)" in problems["b"]
    hub = member("a", created="2026-01-01T00:00:00Z", image="img:a", source="hf://org/model")
    image, problems = group_members_problems([hub, member("b", created="2026-03-01T00:00:00Z", image="img:b")],
                                             ControllerDefaults())
    assert image == "img:b" and list(problems) == ["a"]


def test_the_resolved_image_is_the_one_default_mode_runs() -> None:
    defaults = controller_defaults({"DEFAULT_LLAMACPP_IMAGE": LLAMA})
    image, problems = group_members_problems([member("a", image=None), member("b")], defaults)
    assert (image, problems) == (LLAMA, {})
    image, problems = group_members_problems([member("a", image=None), member("b")], ControllerDefaults())
    assert image == "ghcr.io/ggml-org/llama.cpp:server-rocm" and list(problems) == ["b"]


def test_sources_and_backends_the_local_engine_cannot_run_are_named() -> None:
    members = [member("hub", source="HF://org/model"), member("empty", cache={"strategy": "Memory"}),
               member("ollama", backend="ollama", source="ollama://llama3"),
               member("custom", backend="diffusers", config={"command": ["srv", "--port", "{port}"]}),
               member("typo", config={"runtimeProfile": "rocm-gfx9000"}), member("ok")]
    image, problems = group_members_problems(members, ControllerDefaults())
    assert image == LLAMA and set(problems) == {"hub", "empty", "ollama", "typo"}
    assert "source 'HF://org/model'" in problems["hub"] and "pvc://" in problems["hub"]
    assert "cache strategy Memory leaves empty" in problems["empty"] and "Local or SharedPVC" in problems["empty"]
    assert "backend 'ollama'" in problems["ollama"] and "spec.config.command" in problems["ollama"]
    assert "spec.config.runtimeProfile" in problems["typo"]


def test_the_backends_are_the_local_engines_launch_profiles() -> None:
    assert set(GROUP_POD_BACKENDS) == set(PROFILES)


# The manifests serve reads ------------------------------------------------------------------------------------------

def test_sources_are_rewritten_to_where_the_pod_mounts_them() -> None:
    members = [member("local"), member("claim", source="pvc://weights/qwen/q4.gguf", cache=None),
               member("shared", cache={"strategy": "SharedPVC", "pvcName": "weights"},
                      source="file:///models/llama/l.gguf"),
               member("baked", source="file:///opt/w/x.gguf", cache=None)]
    models = served(group_manifest_text(plan(), members, []))
    assert {name: m.spec.source for name, m in models.items()} == {
        "local": "file:///models/local/model.gguf", "claim": "file:///pvc/weights/qwen/q4.gguf",
        "shared": "file:///pvc/weights/llama/l.gguf", "baked": "file:///opt/w/x.gguf"}
    assert models["claim"].spec.cache is not None and models["claim"].spec.cache.strategy == "SharedPVC"
    _, deployment, _ = render(members)
    mounts = mounts_of(deployment)
    assert mounts["/models/local"]["readOnly"] and mounts["/pvc/weights"]["readOnly"]
    assert volumes_of(deployment)[mounts["/pvc/weights"]["name"]]["persistentVolumeClaim"] == {
        "claimName": "weights", "readOnly": True}
    assert volumes_of(deployment)[mounts["/models/local"]["name"]]["hostPath"]["path"] == \
        "/var/lib/flexinfer/models/ml/local"
    weight_volumes = [v for v in pod_spec(deployment)["volumes"] if v["name"].startswith("model-")]
    assert len(weight_volumes) == 2  # one claim for two members, one Local directory, nothing for the image's file


def test_the_text_is_deterministic_and_parses_back_into_the_members() -> None:
    a = member("a", uid="u-a", config={"args": ["--ctx-size", 2048]}, resources={"requests": {"memory": "1Gi"}})
    b = member("b", uid="u-b", gpu={"vendor": "amd", "shared": GROUP, "priority": 300})
    busy = b.model_copy(update={"metadata": b.metadata.model_copy(update={
        "annotations": {"inflight.flexinfer.ai/proxy-0": "2026-01-01T00:00:00Z"}})})
    caches = [make_cache("b-cache", NS, flash_loader={"enabled": True, "concurrency": 2}),
              make_cache("unrelated", NS, flash_loader={"enabled": True})]
    text = group_manifest_text(plan(), [a, b], caches)
    assert group_manifest_text(plan(), [busy, a], list(reversed(caches))).encode() == text.encode()
    resources = parse_documents(text)
    assert [(type(r).__name__, r.name) for r in resources] == [("Model", "a"), ("Model", "b"),
                                                               ("ModelCache", "b-cache")]
    for original in (a, b):
        parsed = served(text)[original.name]
        assert parsed.spec == original.spec.model_copy(update={"source": f"file:///models/{original.name}/model.gguf"})
        assert (parsed.namespace, parsed.metadata.annotations) == (NS, {})


def test_the_configmap_holds_the_text() -> None:
    members = [member("a"), member("b")]
    configmap, _, _ = render(members)
    assert configmap["data"] == {MANIFEST_KEY: group_manifest_text(plan(), members, [])}


# The objects --------------------------------------------------------------------------------------------------------

def test_the_gpu_is_requested_once_with_the_largest_count() -> None:
    members = [member("a"), member("b", gpu={"vendor": "amd", "shared": GROUP, "count": 2}),
               member("c", gpu={"vendor": "cpu", "shared": GROUP}, config={"runtimeProfile": "cpu"})]
    _, deployment, _ = render(members)
    resources = container(deployment)["resources"]
    assert resources == {"limits": {"amd.com/gpu": "2"}}
    assert pod_spec(deployment)["securityContext"] == {"supplementalGroups": [109, 992]}
    assert env_of(deployment)["HSA_OVERRIDE_GFX_VERSION"] == "11.0.0"
    assert [e["name"] for e in container(deployment)["env"]].count("HSA_OVERRIDE_GFX_VERSION") == 1
    assert pod_spec(deployment)["tolerations"] == [
        {"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}]
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}


def test_a_cpu_only_group_requests_no_gpu() -> None:
    cpu = {"vendor": "cpu", "shared": GROUP}
    _, deployment, _ = render([member("a", gpu=cpu, config={"runtimeProfile": "cpu"}),
                               member("b", gpu=cpu, config={"runtimeProfile": "cpu"})])
    assert "resources" not in container(deployment) or not container(deployment)["resources"]
    assert "tolerations" not in pod_spec(deployment) and "securityContext" not in pod_spec(deployment)


def test_requests_add_up_and_a_limit_only_when_every_member_has_one() -> None:
    members = [member("a", resources={"requests": {"cpu": "500m", "memory": "512Mi"}, "limits": {"memory": "1Gi"}}),
               member("b", resources={"requests": {"cpu": "1", "memory": "1536Mi"}, "limits": {"cpu": "2"}})]
    _, deployment, _ = render(members)
    assert container(deployment)["resources"] == {
        "requests": {"cpu": "1500m", "memory": "2Gi"}, "limits": {"amd.com/gpu": "1"}}
    both = [member("a", resources={"limits": {"memory": "1Gi"}}), member("b", resources={"limits": {"memory": "1"}})]
    _, deployment, _ = render(both)
    assert container(deployment)["resources"]["limits"] == {"memory": str((1 << 30) + 1), "amd.com/gpu": "1"}


def test_node_selectors_and_tolerations_of_every_member_the_oldest_winning() -> None:
    toleration = {"key": "team", "operator": "Exists", "effect": "NoSchedule"}
    members = [member("a", created="2026-01-01T00:00:00Z", nodeSelector={"kubernetes.io/hostname": "n1"}),
               member("b", created="2026-02-01T00:00:00Z", tolerations=[toleration],
                      nodeSelector={"kubernetes.io/hostname": "n2", "disk": "ssd"})]
    _, deployment, _ = render(members)
    assert pod_spec(deployment)["nodeSelector"] == {"disk": "ssd", "kubernetes.io/hostname": "n1"}
    assert pod_spec(deployment)["tolerations"][1:] == [toleration]


@pytest.mark.parametrize(("budget", "flag"), [(24576.0, "ml/gfx1100-0=24576Mi"), (1536.5, "ml/gfx1100-0=1536.5Mi"),
                                              (None, "ml/gfx1100-0=auto")])
def test_memory_shared_passes_the_group_budget_to_serve(budget: float | None, flag: str) -> None:
    _, deployment, _ = render([member("a")], strategy="MemoryShared", budget=budget)
    command = container(deployment)["command"]
    assert command[-2:] == ["--group-memory", flag]
    assert parse_entries([flag], "--group-memory") == {"ml/gfx1100-0": budget}


def test_time_sliced_runs_serve_over_the_configmap() -> None:
    _, deployment, _ = render([member("a")], budget=4096.0)
    assert container(deployment)["command"] == [
        "flexinfer", "serve", "-f", "/etc/flexinfer/group/models.yaml", "--no-watch", "--host", "0.0.0.0",
        "--port", "8080"]
    assert mounts_of(deployment)["/etc/flexinfer/group"] == {"name": "manifests", "mountPath": "/etc/flexinfer/group",
                                                             "readOnly": True}
    assert volumes_of(deployment)["manifests"] == {"name": "manifests",
                                                   "configMap": {"name": "flexinfer-group-gfx1100-0"}}
    assert container(deployment)["ports"] == [{"name": "http", "containerPort": 8080, "protocol": "TCP"}]


def test_the_admin_token_comes_from_the_secret() -> None:
    _, deployment, _ = render([member("a")])
    assert container(deployment)["env"][0] == {
        "name": "FLEXINFER_ADMIN_TOKEN",
        "valueFrom": {"secretKeyRef": {"name": "flexinfer-group-admin", "key": "token"}}}


def test_probes_grace_and_replicas() -> None:
    _, deployment, _ = render([member("a")])
    web = container(deployment)
    assert web["readinessProbe"] == {"httpGet": {"path": "/readyz", "port": "http"}, "periodSeconds": 1}
    assert web["startupProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert web["startupProbe"]["periodSeconds"] == 1
    assert web["livenessProbe"] == {"httpGet": {"path": "/healthz", "port": "http"}, "periodSeconds": 10,
                                    "failureThreshold": 6}
    assert pod_spec(deployment)["terminationGracePeriodSeconds"] == 30 + 10 + 10
    assert (env_of(deployment)["FLEXINFER_DRAIN_TIMEOUT"], env_of(deployment)["FLEXINFER_STOP_GRACE"]) == ("30s", "10s")
    longer = GroupPodPlan(namespace=NS, group=GROUP, strategy="TimeSliced", replicas=0, budget_mib=None,
                          token_secret="t", drain_timeout_s=60.0)
    _, deployment, _ = render_group_pod(longer, [member("a")], [], ControllerDefaults())
    assert (deployment["spec"]["replicas"], pod_spec(deployment)["terminationGracePeriodSeconds"]) == (0, 80)
    assert env_of(deployment)["FLEXINFER_DRAIN_TIMEOUT"] == "1m"


def test_labels_selector_and_owner_references() -> None:
    members = [member("b", uid="uid-b"), member("a", uid="uid-a"), member("c")]
    objects = render(members)
    name = "flexinfer-group-gfx1100-0"
    labels = {"app.kubernetes.io/name": "flexinfer-group", "app.kubernetes.io/instance": name,
              "app.kubernetes.io/managed-by": "flexinfer", "flexinfer.ai/gpu-group": GROUP,
              GROUP_POD_LABEL: GROUP, "flexinfer.ai/model": name}
    owners = [{"apiVersion": "ai.flexinfer/v1alpha2", "kind": "Model", "name": n, "uid": f"uid-{n}",
               "controller": False, "blockOwnerDeletion": False} for n in ("a", "b")]
    for obj in objects:
        assert obj["metadata"] == {"name": name, "namespace": NS, "labels": labels, "ownerReferences": owners}
    _, deployment, service = objects
    selector = {"app.kubernetes.io/name": "flexinfer-group", "app.kubernetes.io/instance": name,
                GROUP_POD_LABEL: GROUP}
    assert deployment["spec"]["selector"] == {"matchLabels": selector} and service["spec"]["selector"] == selector
    assert deployment["spec"]["template"]["metadata"]["labels"] == labels
    assert service["spec"]["type"] == "ClusterIP"
    assert service["spec"]["ports"] == [{"name": "http", "port": 8080, "targetPort": 8080, "protocol": "TCP"}]


def test_long_group_names_stay_valid_labels() -> None:
    long_group = "g" * 40 + "-" + "x" * 22
    other = "g" * 40 + "-" + "y" * 22
    name = group_pod_name(long_group)
    assert len(name) <= 63 and DNS_LABEL.match(name) and name.startswith("flexinfer-group-ggg")
    assert group_pod_name(long_group) == name != group_pod_name(other)
    cut_at_dash = "a" * 46 + "-" + "b" * 16
    assert DNS_LABEL.match(group_pod_name(cut_at_dash)) and len(group_pod_name(cut_at_dash)) <= 63
    assert group_pod_name("gpu0") == "flexinfer-group-gpu0"
    member_of_long = member("a", gpu={"vendor": "amd", "shared": long_group})
    for obj in render([member_of_long], group=long_group):
        assert all(len(value) <= 63 for value in obj["metadata"]["labels"].values())


def test_staged_members_get_the_nodes_shared_tmpfs() -> None:
    _, deployment, _ = render([member("a"), member("b")])
    assert volumes_of(deployment)["flash-tmpfs"] == {
        "name": "flash-tmpfs", "hostPath": {"path": "/dev/shm/flexinfer/ml", "type": "DirectoryOrCreate"}}
    assert mounts_of(deployment)["/flash/ml"]["name"] == "flash-tmpfs"
    assert env_of(deployment)["FLEXINFER_SHM_ROOT"] == "/flash"
    owner = pod_spec(deployment)["initContainers"][0]
    assert owner["name"] == "flash-tmpfs-owner" and owner["command"] == ["chown", "65532:65532", "/models"]


def test_the_pod_resolves_staging_as_the_manager_does() -> None:
    """A claim's member is staged in default mode when the controller turns the flash-loader on; the pod, given
    the controller's defaults in its environment and the rewritten manifest, decides the same."""
    claim = member("claim", source="pvc://weights/q4.gguf", cache=None)
    for env, staged in (({}, False), ({"DEFAULT_FLASH_LOADER_ENABLED": "true", "DEFAULT_FLASH_LOADER_MAX_RATE": "1Mi"},
                                      True)):
        defaults = controller_defaults(env)
        configmap, deployment, _ = render([claim], env=env)
        pod_env = {k: v for k, v in env_of(deployment).items() if isinstance(v, str)}
        in_pod = served(configmap["data"][MANIFEST_KEY])["claim"]
        assert resolve_flash_loader(defaults, claim).enabled is staged
        assert resolve_flash_loader(controller_defaults(pod_env), in_pod).enabled is staged
        assert ("flash-tmpfs" in volumes_of(deployment)) is staged


def test_nothing_to_render_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="strategy 'Exclusive' has no group pod"):
        render([member("a")], strategy="Exclusive")
    with pytest.raises(ConfigError, match="no member can run in its group pod; model a: source 'hf://org/m'"):
        render([member("a", source="hf://org/m")])
