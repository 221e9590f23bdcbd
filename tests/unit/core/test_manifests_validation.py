"""Every rendered object passes ``kubernetes-validate --strict`` for Kubernetes 1.30, over a matrix of models."""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest

from flexinfer.core.controller_defaults import controller_defaults
from flexinfer.core.manifests.render import render_model, render_tmpfs_cleanup_job
from support.resource_builders import make_cache, make_model

K8S_VERSION = "1.30.0"
ENV = {"DEFAULT_FLASH_LOADER_ENABLED": "true", "DEFAULT_FLASH_LOADER_TMPFS_SIZE_LIMIT": "16Gi"}
MATRIX: dict[str, dict[str, Any]] = {
    "amd shared Local": {"gpu": {"vendor": "amd", "shared": "g", "priority": 200}, "cache": {"strategy": "Local"},
                         "nodeSelector": {"kubernetes.io/hostname": "n"}, "config": {"useFp16": "1"}},
    "nvidia exclusive SharedPVC": {"gpu": {"vendor": "nvidia", "count": 2}, "resources": {"limits": {"cpu": "4"}}},
    "cpu llamacpp file": {"backend": "llamacpp", "source": "file:///m/t.gguf", "cache": {"strategy": "None"}},
    "ollama Memory": {"backend": "ollama", "source": "ollama://qwen:7b", "cache": {"strategy": "Memory"}},
    "pvc source with sub path": {"source": "pvc://w/a/b", "gpu": {"vendor": "amd"},
                                 "tolerations": [{"key": "x", "operator": "Exists", "effect": "NoExecute"}]},
    "auto vendor with compile cache": {"gpu": {"shared": "g"}, "cache": {"strategy": "Local",
                                                                         "compilationCache": {"enabled": True}}},
    "comfyui": {"backend": "comfyui", "source": "HF://a/b"},
    "mlc-llm litellm": {"backend": "mlc", "litellm": {"aliases": ["x"]}, "serviceLabels": ["textgen"]},
}


@pytest.mark.parametrize("replicas", [0, 1, 2])
@pytest.mark.parametrize("case", list(MATRIX))
def test_rendered_objects_validate_strictly(case: str, replicas: int) -> None:
    model = make_model(name="m-1", namespace="team-a", uid="0f3c", **MATRIX[case])
    cache = make_cache(name="m-1-cache", namespace="team-a", flash_loader={"enabled": True, "concurrency": 8})
    docs = render_model(model, [cache], controller_defaults(ENV), replicas)
    job = render_tmpfs_cleanup_job(model, "node-1", controller_defaults(ENV))
    objects = [*docs, *([job] if job else [])]
    for doc in objects:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)  # raises ValidationError on any problem
    assert {doc["kind"] for doc in objects} >= {"Deployment", "Service"}


def test_validator_catches_a_broken_object() -> None:
    deployment, _ = render_model(make_model(), [], controller_defaults({}), 1)
    deployment["spec"]["template"]["spec"]["containers"][0]["imagePullPolicy"] = 7
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, K8S_VERSION, strict=True)
