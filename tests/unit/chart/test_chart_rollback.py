"""What makes a Flux revert roll back (docs/operations/rocm-gfx1100.md, "Rolling back a chart or code change"):
the runbook's HelmRelease re-renders every Git revision (`reconcileStrategy: Revision`) and its values are valid
for this chart; an `image.digest` pins every FlexInfer image (manager, proxy, flash-loader) by content, so
reverting the digest restores the previous pod templates exactly.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from flexinfer.core.controller_defaults import controller_defaults
from flexinfer.core.manifests.render import render_model
from support.helm_chart import Helm, container, env_map, find
from support.kube_testbed import REPO_ROOT
from support.resource_builders import make_model

RUNBOOK = REPO_ROOT / "docs" / "operations" / "rocm-gfx1100.md"
REPOSITORY = "ghcr.io/flexinfer/flexinfer"
DIGEST_A = "sha256:" + "a" * 64
DIGEST_B = "sha256:" + "b" * 64
WORKLOADS = (("flexinfer-controller", "manager"), ("flexinfer-proxy", "proxy"))


def yaml_blocks(text: str) -> list[Any]:
    return [yaml.safe_load(block) for block in re.findall(r"```yaml\n(.*?)```", text, flags=re.DOTALL)]


def helm_release() -> dict[str, Any]:
    releases = [b for b in yaml_blocks(RUNBOOK.read_text()) if isinstance(b, dict) and b.get("kind") == "HelmRelease"]
    assert len(releases) == 1, "the runbook has one HelmRelease example"
    release: dict[str, Any] = releases[0]
    return release


def images(docs: list[dict[str, Any]]) -> dict[str, str]:
    """Every FlexInfer image reference of a render: the two containers and the flash-loader default."""
    found = {name: container(find(docs, "Deployment", deployment), name)["image"] for deployment, name in WORKLOADS}
    manager = env_map(container(find(docs, "Deployment", "flexinfer-controller"), "manager"))
    found["flash-loader"] = manager["DEFAULT_FLASH_LOADER_IMAGE"]
    return found


def pod_templates(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return {deployment: find(docs, "Deployment", deployment)["spec"]["template"] for deployment, _ in WORKLOADS}


def test_the_helmrelease_renders_every_git_revision() -> None:
    spec = helm_release()["spec"]["chart"]["spec"]
    assert spec["reconcileStrategy"] == "Revision"
    assert spec["chart"] == "./charts/flexinfer" and spec["sourceRef"]["kind"] == "GitRepository"


def test_the_helmrelease_values_render_and_pin_the_image(helm: Helm, tmp_path: Path) -> None:
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump(helm_release()["spec"]["values"]))
    docs = helm.template(extra=["-f", str(values)])
    digest = helm_release()["spec"]["values"]["image"]["digest"]
    assert set(images(docs).values()) == {f"{REPOSITORY}@{digest}"}


def test_the_runbook_digest_snippet_is_valid(helm: Helm, tmp_path: Path) -> None:
    snippets = [b["values"] for b in yaml_blocks(RUNBOOK.read_text())
                if isinstance(b, dict) and set(b) == {"values"}]
    assert snippets, "the runbook's image pinning snippet is missing"
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump(snippets[0]))
    image = snippets[0]["image"]
    assert set(images(helm.template(extra=["-f", str(values)])).values()) == {
        f"{REPOSITORY}:{image['tag']}@{image['digest']}"}


def test_a_digest_pins_every_flexinfer_image(helm: Helm) -> None:
    assert set(images(helm.template(f"image.digest={DIGEST_A}")).values()) == {f"{REPOSITORY}@{DIGEST_A}"}
    tagged = images(helm.template(f"image.digest={DIGEST_A}", "image.tag=0.1.0"))
    assert set(tagged.values()) == {f"{REPOSITORY}:0.1.0@{DIGEST_A}"}


def test_reverting_the_digest_restores_the_pod_templates(helm: Helm) -> None:
    """A code rollout changes the digest in Git, its revert changes it back: the pods roll to the new build and
    back, and nothing but the image moves."""
    before = pod_templates(helm.template(f"image.digest={DIGEST_A}"))
    rolled_out = pod_templates(helm.template(f"image.digest={DIGEST_B}"))
    reverted = pod_templates(helm.template(f"image.digest={DIGEST_A}"))
    assert reverted == before
    assert rolled_out != before
    assert yaml.safe_dump(rolled_out).replace(DIGEST_B, DIGEST_A) == yaml.safe_dump(before)


def test_model_pods_stage_weights_with_the_pinned_image(helm: Helm) -> None:
    """The manager env the chart renders with a digest reaches the flash-loader init container of a Model pod:
    the same pinned image, run as `flexinfer flash-load`, so a revert of the digest rolls it back as well."""
    docs = helm.template(f"image.digest={DIGEST_A}", "controller.runtime.flashLoader.enabled=true")
    env = env_map(container(find(docs, "Deployment", "flexinfer-controller"), "manager"))
    defaults = controller_defaults({k: v for k, v in env.items() if isinstance(v, str)})
    model = make_model(name="m", namespace="ml", source="pvc://weights/m.gguf")
    deployment = render_model(model, [], defaults, 1)[0]
    loader = next(c for c in deployment["spec"]["template"]["spec"]["initContainers"] if c["name"] == "flash-loader")
    assert (loader["image"], loader["command"]) == (f"{REPOSITORY}@{DIGEST_A}", ["flexinfer", "flash-load"])
