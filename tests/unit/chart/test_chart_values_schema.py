"""values.schema.json of charts/flexinfer: helm rejects wrong types, unknown keys and out-of-range values
with a message naming the key, and the schema itself is closed (additionalProperties) everywhere.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import jsonschema
import pytest
import yaml

from support.helm_chart import CHART_DIR, Helm, HelmError

SCHEMA = json.loads((CHART_DIR / "values.schema.json").read_text())
# Kubernetes-defined structures passed through verbatim; the API server validates them.
OPEN_OBJECTS = {
    "definitions.envList.items.properties.valueFrom",
    "definitions.affinity.properties.nodeAffinity",
    "definitions.affinity.properties.podAffinity",
    "definitions.affinity.properties.podAntiAffinity",
}
# Free-form string maps (labels, annotations, nodeSelector): any key, string values only.
STRING_MAPS = {"definitions.stringMap"}
ENUM_MAPS = {"properties.controller.properties.groupStrategies"}
"""Maps whose values are one of a few words (the value schema names them)."""


@pytest.mark.parametrize(
    ("set_arg", "message"),
    [
        ("proxy.replicas=abc", "proxy.replicas: Invalid type. Expected: integer"),
        ("proxy.replicas=0", "proxy.replicas: Must be greater than or equal to 1"),
        ("controller.bogus=1", "controller: Additional property bogus is not allowed"),
        ("bogusTopLevel=1", "Additional property bogusTopLevel is not allowed"),
        ("proxy.timeouts.extra=1m", "proxy.timeouts: Additional property extra is not allowed"),
        ("observability.tracing.enabled=yes", "observability.tracing.enabled: Invalid type. Expected: boolean"),
        ("observability.tracing.otlpEndpoint=collector:4318", "observability.tracing.otlpEndpoint: Does not match"),
        ("controller.runtime.flashLoader.enabled=maybe", "flashLoader.enabled: Invalid type. Expected: boolean"),
        ("controller.runtime.flashLoader.concurrency=0", "concurrency: Must be greater than or equal to 1"),
        ("controller.runtime.flashLoader.concurrency=many", "concurrency: Invalid type"),
        ("controller.runtime.flashLoader.tmpfsSizeLimit=lots", "tmpfsSizeLimit: Does not match pattern"),
        ("controller.runtime.flashLoader.maxRate=fast", "maxRate: Does not match pattern"),
        ("proxy.timeouts.stall=later", "proxy.timeouts.stall: Does not match pattern"),
        ("controller.runtime.shmSizeLimit=8 GB", "shmSizeLimit: Does not match pattern"),
        ("proxy.timeouts.queue=10x", "proxy.timeouts.queue: Does not match pattern"),
        ("proxy.service.type=Ingress", "proxy.service.type: proxy.service.type must be one of the following"),
        ("image.pullPolicy=Sometimes", "image.pullPolicy: image.pullPolicy must be one of the following"),
        ("image.digest=latest", "image.digest: Does not match pattern"),
        ("image.digest=sha256:abc", "image.digest: Does not match pattern"),
        ("metrics.serviceMonitor.enabled=1", "metrics.serviceMonitor.enabled: Invalid type. Expected: boolean"),
        ("controller.resources.requests.gpu=1", "controller.resources.requests: Additional property gpu"),
        ("controller.ports.metrics=80", "controller.ports.metrics: Must be greater than or equal to 1024"),
    ],
)
def test_schema_rejects_bad_values_naming_the_key(helm: Helm, set_arg: str, message: str) -> None:
    with pytest.raises(HelmError) as failure:
        helm.template(set_arg)
    assert "values don't meet the specifications of the schema" in str(failure.value)
    assert message in str(failure.value)


def test_string_values_for_booleans_are_rejected(helm: Helm) -> None:
    with pytest.raises(
        HelmError, match=re.escape("flashLoader.enabled: Invalid type. Expected: boolean, given: string")
    ):
        helm.template(extra=["--set-string", "controller.runtime.flashLoader.enabled=true"])


def test_default_values_satisfy_the_schema() -> None:
    values = yaml.safe_load((CHART_DIR / "values.yaml").read_text())
    jsonschema.Draft7Validator.check_schema(SCHEMA)
    jsonschema.Draft7Validator(SCHEMA).validate(values)


def _objects(node: Any, path: str) -> Iterator[tuple[str, dict[str, Any]]]:
    if isinstance(node, dict):
        types = node.get("type")
        if types == "object" or (isinstance(types, list) and "object" in types):
            yield path, node
        for key, child in node.items():
            yield from _objects(child, f"{path}.{key}" if path else key)
    elif isinstance(node, list):
        for index, child in enumerate(node):
            yield from _objects(child, f"{path}[{index}]")


def test_every_object_in_the_schema_is_closed() -> None:
    seen = set()
    for path, node in _objects(SCHEMA, ""):
        seen.add(path)
        assert "additionalProperties" in node, f"{path or '<root>'} must declare additionalProperties"
        extra = node["additionalProperties"]
        if path in OPEN_OBJECTS:
            assert extra is True
        elif path in STRING_MAPS:
            assert extra == {"type": "string"}
        elif path in ENUM_MAPS:
            assert extra["type"] == "string" and extra["enum"]
        else:
            assert extra is False, f"{path} must set additionalProperties: false"
    assert seen >= OPEN_OBJECTS | STRING_MAPS


def test_every_leaf_has_a_type_and_description() -> None:
    for path, node in _objects(SCHEMA, ""):
        for key, prop in node.get("properties", {}).items():
            if "$ref" in prop:
                continue
            assert "type" in prop, f"{path}.{key} has no type"
            assert prop.get("description"), f"{path}.{key} has no description"
