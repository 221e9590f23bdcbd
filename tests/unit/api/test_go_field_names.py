"""Go compatibility of the generated CRDs: every property name is spelled as the Go API's JSON field.

The Go names live in ``data/go_field_names.yaml`` (copied from the Go types and CRDs). A generated name that
is neither a Go name nor a listed FlexInfer extension fails, so a spelling drift such as ``p2PPort`` for Go's
``p2pPort`` (pydantic's camelCase of ``p2p_port``) cannot return.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from flexinfer.api.crds import crd_documents

NAMES = yaml.safe_load((Path(__file__).parent / "data" / "go_field_names.yaml").read_text(encoding="utf-8"))
ENVELOPE = {"apiVersion", "kind", "metadata", "spec", "status"}


def property_paths(node: dict[str, Any], path: str = "") -> Iterator[str]:
    """Dotted paths of every property below ``node`` (``[]`` for list items)."""
    for name, child in node.get("properties", {}).items():
        child_path = f"{path}.{name}" if path else name
        yield child_path
        yield from property_paths(child, child_path)
    if isinstance(node.get("items"), dict):
        yield from property_paths(node["items"], f"{path}[]")


def generated() -> dict[str, set[str]]:
    return {doc["spec"]["names"]["kind"]: set(property_paths(doc["spec"]["versions"][0]["schema"]["openAPIV3Schema"]))
            for doc in crd_documents()}


@pytest.mark.parametrize("kind", sorted(generated()))
def test_every_generated_property_has_its_go_name(kind: str) -> None:
    assert kind in NAMES, f"{kind}: add its Go field names to data/go_field_names.yaml"
    known = set(NAMES[kind]["go"]) | set(NAMES[kind]["flexinfer_only"]) | ENVELOPE
    unknown = sorted(generated()[kind] - known)
    by_lower = {name.lower(): name for name in NAMES[kind]["go"]}
    hints = [f"{name} (Go: {by_lower[name.lower()]})" if name.lower() in by_lower else name for name in unknown]
    assert not unknown, f"{kind}: properties not named as in the Go API: {', '.join(hints)}"


def test_modelcache_flash_loader_p2p_fields_use_go_spelling() -> None:
    flash = generated()["ModelCache"]
    assert {"spec.flashLoader.p2p", "spec.flashLoader.p2pPort"} <= flash


def test_go_manifest_with_p2p_fields_loads() -> None:
    from flexinfer.api.loading import parse_resource
    from flexinfer.api.modelcache import ModelCache

    cache = parse_resource({
        "apiVersion": "ai.flexinfer/v1alpha1", "kind": "ModelCache", "metadata": {"name": "c"},
        "spec": {"source": "HF://org/m", "flashLoader": {"enabled": True, "p2p": True, "p2pPort": 9000}},
    })
    assert isinstance(cache, ModelCache) and cache.spec.flash_loader is not None
    assert (cache.spec.flash_loader.p2p, cache.spec.flash_loader.p2p_port) == (True, 9000)
    assert cache.to_dict()["spec"]["flashLoader"]["p2pPort"] == 9000


def test_flexinfer_extensions_are_not_go_names() -> None:
    for kind, names in NAMES.items():
        assert not set(names["go"]) & set(names["flexinfer_only"]), kind
