"""``flexinfer render``: the manifests the manager would apply, for every Model in the inputs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from flexinfer.cli.main import main

REPO = Path(__file__).resolve().parents[3]
EXAMPLES = REPO / "examples"


def render(capsys: pytest.CaptureFixture[str], *args: str) -> list[dict[str, Any]]:
    assert main(["render", *args]) == 0
    return [d for d in yaml.safe_load_all(capsys.readouterr().out) if d]


def by_kind_name(docs: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(d["kind"], d["metadata"]["name"]): d for d in docs}


def test_examples_render_shm_flash_loader_and_rocm_profile(capsys: pytest.CaptureFixture[str]) -> None:
    docs = by_kind_name(render(capsys, "-f", str(EXAMPLES)))
    assert set(docs) == {(k, n) for k in ("Deployment", "Service")
                         for n in ("qwen25-7b-chat", "qwen25-coder-7b", "tinyllama-cpu", "tiny-a", "tiny-b")}
    pod = docs["Deployment", "qwen25-7b-chat"]["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["shm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "8Gi"}
    assert volumes["flash-tmpfs"]["hostPath"]["path"] == "/dev/shm/flexinfer/default/qwen25-7b-chat"
    assert [c["name"] for c in pod["initContainers"]] == ["flash-tmpfs-owner", "flash-loader"]
    main_container = pod["containers"][0]
    assert {"name": "HSA_OVERRIDE_GFX_VERSION", "value": "11.0.0"} in main_container["env"]
    assert main_container["resources"]["limits"]["amd.com/gpu"] == "1"
    assert pod["securityContext"]["supplementalGroups"] == [109, 992]
    for doc in docs.values():
        kubernetes_validate.validate(doc, "1.30.0", strict=True)


def test_example_model_cache_overrides_the_coder_loader(capsys: pytest.CaptureFixture[str]) -> None:
    docs = by_kind_name(render(capsys, "-f", str(EXAMPLES)))
    coder_loader = docs["Deployment", "qwen25-coder-7b"]["spec"]["template"]["spec"]["initContainers"][-1]
    chat_loader = docs["Deployment", "qwen25-7b-chat"]["spec"]["template"]["spec"]["initContainers"][-1]
    assert {"name": "FLASH_CONCURRENCY", "value": "8"} in coder_loader["env"]
    assert {"name": "FLASH_CONCURRENCY", "value": "4"} in chat_loader["env"]


def test_cpu_example_has_no_gpu_or_loader(capsys: pytest.CaptureFixture[str]) -> None:
    docs = by_kind_name(render(capsys, "-f", str(EXAMPLES / "local")))
    pod = docs["Deployment", "tinyllama-cpu"]["spec"]["template"]["spec"]
    assert "initContainers" not in pod and "tolerations" not in pod
    assert pod["containers"][0]["args"][:2] == ["--model", "/var/lib/flexinfer/models/tinyllama-1.1b-chat.Q4_K_M.gguf"]


def test_env_file_and_replicas(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    env = tmp_path / "controller.env"
    env.write_text("# controller\nDEFAULT_SHM_SIZE_LIMIT=2Gi\nexport DEFAULT_FLASH_LOADER_IMAGE='reg/fl:7'\n")
    docs = by_kind_name(render(capsys, "-f", str(EXAMPLES / "gfx1100-shared"), "--env-file", str(env),
                               "--replicas", "0"))
    deployment = docs["Deployment", "qwen25-7b-chat"]
    assert deployment["spec"]["replicas"] == 0
    pod = deployment["spec"]["template"]["spec"]
    assert {v["name"]: v for v in pod["volumes"]}["shm"]["emptyDir"]["sizeLimit"] == "2Gi"
    assert pod["initContainers"][0]["image"] == "reg/fl:7"


def test_cleanup_jobs_flag(capsys: pytest.CaptureFixture[str]) -> None:
    docs = by_kind_name(render(capsys, "-f", str(EXAMPLES), "--cleanup-jobs"))
    # The shared examples pinned by kubernetes.io/hostname; the cpu-node pair names no node.
    assert {n for k, n in docs if k == "Job"} == {"qwen25-7b-chat-tmpfs-cleanup", "qwen25-coder-7b-tmpfs-cleanup"}
    docs = by_kind_name(render(capsys, "-f", str(EXAMPLES / "cpu-node"), "--cleanup-jobs", "--node", "n1"))
    job = docs["Job", "tiny-a-tmpfs-cleanup"]["spec"]["template"]["spec"]
    assert job["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"] == [
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}]


@pytest.mark.parametrize(("content", "message"), [
    (None, "error: --env-file {path}: [Errno 2] No such file or directory"),
    ("NOT A PAIR\n", "error: --env-file {path}: {path}:1: expected KEY=VALUE"),
])
def test_bad_env_file_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str | None,
                                  message: str) -> None:
    path = tmp_path / "bad.env"
    if content is not None:
        path.write_text(content)
    assert main(["render", "-f", str(EXAMPLES), "--env-file", str(path)]) == 1
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith(message.format(path=path))


def test_invalid_input_fails_with_field_path(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "m.yaml").write_text("apiVersion: ai.flexinfer/v1alpha2\nkind: Model\nmetadata: {name: m}\n"
                                     "spec: {backend: vllm, source: 'HF://a/b', gpu: {count: 9}}\n")
    assert main(["render", "-f", str(tmp_path)]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == f"error: {tmp_path / 'm.yaml'}:4:49: spec.gpu.count: must be ≤ 8, got 9\n"


def test_negative_replicas_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["render", "-f", str(EXAMPLES), "--replicas", "-1"])
    assert info.value.code == 2
    assert "must be ≥ 0, got -1" in capsys.readouterr().err
