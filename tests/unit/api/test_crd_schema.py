"""Generated CRDs: structural (Kubernetes 1.20-acceptable) schemas, names/columns, no drift, and a
jsonschema cross-check that every example manifest validates against the generated openAPIV3Schema."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from flexinfer.api.crds import CRD_SPECS, crd_documents, crd_files, openapi_schema
from flexinfer.api.field_docs import field_description
from flexinfer.api.model import GPUSpec, Model
from flexinfer.api.modelcache import ModelCache

REPO = Path(__file__).resolve().parents[3]
COMMITTED = REPO / "charts" / "flexinfer" / "crds"
EXAMPLES = REPO / "examples"
FREE_FORM_PATHS = {
    "spec.config",
    "spec.quantization", "spec.abliteration", "spec.finetune", "spec.publish", "spec.download",
}
FORBIDDEN_KEYS = {"$ref", "$defs", "title", "oneOf", "allOf", "not", "const", "x-kubernetes-validations"}


def walk(node: dict[str, Any], path: str) -> Iterator[tuple[str, dict[str, Any]]]:
    yield path, node
    for name, child in node.get("properties", {}).items():
        yield from walk(child, f"{path}.{name}" if path else name)
    if isinstance(node.get("items"), dict):
        yield from walk(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from walk(node["additionalProperties"], f"{path}{{}}")


def schemas() -> list[tuple[str, dict[str, Any]]]:
    return [(doc["spec"]["names"]["kind"], doc["spec"]["versions"][0]["schema"]["openAPIV3Schema"])
            for doc in crd_documents()]


@pytest.mark.parametrize(("kind", "schema"), schemas())
def test_schema_is_structural(kind: str, schema: dict[str, Any]) -> None:
    for path, node in walk(schema, ""):
        assert not FORBIDDEN_KEYS & node.keys(), f"{kind} {path}: {FORBIDDEN_KEYS & node.keys()}"
        if node.get("x-kubernetes-int-or-string"):
            assert node["anyOf"] == [{"type": "integer"}, {"type": "string"}] and "type" not in node
            continue
        assert "anyOf" not in node, f"{kind} {path}: anyOf outside int-or-string"
        assert "type" in node, f"{kind} {path}: untyped"
        assert not ("properties" in node and "additionalProperties" in node), f"{kind} {path}"
        assert node.get("additionalProperties") is not False, f"{kind} {path}: additionalProperties false"
        assert "default" not in node or node["default"] is not None, f"{kind} {path}: null default"
        if node.get("x-kubernetes-preserve-unknown-fields"):
            assert path in FREE_FORM_PATHS, f"{kind} {path}: preserve-unknown-fields outside free-form blocks"


def test_status_has_no_defaults() -> None:
    for kind, schema in schemas():
        for path, node in walk(schema["properties"].get("status", {}), "status"):
            assert "default" not in node, f"{kind} {path}"


def test_model_schema_carries_defaults_enums_and_bounds() -> None:
    gpu = openapi_schema(Model)["properties"]["spec"]["properties"]["gpu"]["properties"]
    assert gpu["priority"] == {"default": 100, "maximum": 1000, "minimum": 0, "type": "integer",
                               "description": field_description(GPUSpec, "priority")}
    assert gpu["vendor"]["enum"] == ["auto", "nvidia", "amd", "cpu"] and gpu["vendor"]["default"] == "auto"
    spec = openapi_schema(Model)["properties"]["spec"]
    assert spec["required"] == ["backend", "source"]
    assert spec["properties"]["serviceLabels"]["maxItems"] == 10
    assert spec["properties"]["cache"]["properties"]["strategy"]["enum"] == ["Memory", "SharedPVC", "Local", "None"]
    flash = spec["properties"]["cache"]["properties"]["flashLoader"]["properties"]
    assert flash["tmpfsSizeLimit"]["x-kubernetes-int-or-string"] is True
    assert (flash["bufferSizeKB"]["minimum"], flash["bufferSizeKB"]["maximum"]) == (32, 16384)


def test_names_short_names_status_and_columns() -> None:
    by_kind = {doc["spec"]["names"]["kind"]: doc for doc in crd_documents()}
    model = by_kind["Model"]
    assert model["metadata"]["name"] == "models.ai.flexinfer"
    assert model["spec"]["names"]["shortNames"] == ["mdl"]
    version = model["spec"]["versions"][0]
    assert version["name"] == "v1alpha2" and version["subresources"] == {"status": {}}
    columns = [(c["name"], c["jsonPath"], c.get("priority", 0)) for c in version["additionalPrinterColumns"]]
    assert columns == [
        ("Backend", ".spec.backend", 0), ("Phase", ".status.phase", 0),
        ("Reason", '.status.conditions[?(@.type=="Ready")].reason', 0), ("Shared", ".spec.gpu.shared", 1),
        ("Priority", ".spec.gpu.priority", 1), ("NeedMiB", ".status.sharedGroup.memoryNeedMiB", 0),
        ("NeedSource", ".status.sharedGroup.memoryNeedSource", 1), ("TPS", ".status.metrics.tokensPerSecond", 0),
        ("Age", ".metadata.creationTimestamp", 0), ("Message", ".status.message", 0),
    ]
    assert by_kind["ModelCache"]["spec"]["versions"][0]["name"] == "v1alpha1"
    assert [c["name"] for c in by_kind["GPULease"]["spec"]["versions"][0]["additionalPrinterColumns"]] == [
        "Group", "Owner", "Node", "Expires", "Age",
    ]


def test_printer_columns_point_at_fields_in_the_schema() -> None:
    for doc in crd_documents():
        version = doc["spec"]["versions"][0]
        schema = version["schema"]["openAPIV3Schema"]
        for column in version["additionalPrinterColumns"]:
            node = schema
            for part in re.sub(r"\[\?\(.*?\)\]", "", column["jsonPath"]).strip(".").split("."):
                if part in ("metadata",):
                    break
                node = node["properties"][part]
                node = node.get("items", node)  # a filtered list: the field of its items
            else:
                types = {"date": "string", "integer": "integer", "number": "number", "string": "string"}
                expected = types[column["type"]]
                assert node["type"] == expected, column


def test_committed_crds_match_the_generator() -> None:
    generated = crd_files()
    assert sorted(generated) == ["ai.flexinfer_gpuleases.yaml", "ai.flexinfer_modelcaches.yaml",
                                 "ai.flexinfer_modeldemands.yaml", "ai.flexinfer_models.yaml"]
    stale = [name for name, text in generated.items()
             if not (COMMITTED / name).is_file() or (COMMITTED / name).read_text(encoding="utf-8") != text]
    assert not stale, f"CRDs drifted from flexinfer.api: {stale}; run `flexinfer crds` and commit the result"


def test_generated_files_parse_back_to_the_documents() -> None:
    assert [yaml.safe_load(text) for text in crd_files().values()] == crd_documents()


def example_documents() -> list[tuple[str, dict[str, Any]]]:
    docs = []
    for path in sorted(EXAMPLES.rglob("*.yaml")):
        docs += [(f"{path.relative_to(REPO)}[{i}]", d) for i, d in enumerate(yaml.safe_load_all(path.read_text())) if d]
    return docs


@pytest.mark.parametrize(("where", "doc"), example_documents())
def test_examples_validate_against_generated_schema(where: str, doc: dict[str, Any]) -> None:
    spec = next(s for s in CRD_SPECS if s.kind == doc["kind"])
    errors = [e.message for e in jsonschema.Draft7Validator(openapi_schema(spec.resource)).iter_errors(doc)]
    assert errors == [], where


@pytest.mark.parametrize(("field", "value"), [("backend", "tgi"), ("gpu", {"priority": 5000}),
                                              ("cache", {"strategy": "Disk"}), ("gpu", {"count": 0})])
def test_generated_schema_rejects_what_the_types_reject(field: str, value: Any) -> None:
    doc = {"apiVersion": "ai.flexinfer/v1alpha2", "kind": "Model", "metadata": {"name": "m"},
           "spec": {"backend": "vllm", "source": "HF://a/b", field: value}}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(doc, openapi_schema(Model))


def test_model_cache_schema_accepts_numeric_quantities() -> None:
    doc = {"spec": {"source": "HF://a/b", "storageSize": 1073741824, "flashLoader": {"tmpfsSizeLimit": "8Gi"}}}
    assert jsonschema.Draft7Validator(openapi_schema(ModelCache)).is_valid(doc)
