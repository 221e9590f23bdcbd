"""One quantity (and duration) rule: the generated CRD schema, the pydantic types behind ``flexinfer validate`` /
``render`` and the manager's parser accept exactly the same values; and for objects already stored with a value
the rule rejects (written before the CRD had its pattern), ``parse_stored`` ignores only that field."""

from __future__ import annotations

from typing import Any

import jsonschema
import pytest

from flexinfer.api.crds import openapi_schema
from flexinfer.api.errors import InvalidResourceError
from flexinfer.api.loading import parse_resource, parse_stored
from flexinfer.api.model import Model
from flexinfer.api.modelcache import ModelCache
from flexinfer.api.units import is_quantity, parse_duration

QUANTITIES = ["8Gi", "512Mi", "2G", "1.5Gi", "0", "1e3", "+5", ".5", "1.", "100m", "1E", "1Ei",
              "16 gigs", "8Gigs", "-5", "-1Gi", " 8Gi", "8Gi ", "1e3Gi", "Gi", "", "1.2.3", "lots", "8GB"]
DURATIONS = ["90s", "5m", "1h30m", "1.5s", "0", "250ms", "5 mins", "-5s", "90", "soon", " 5m", "1d"]


def cache_doc(**flash: Any) -> dict[str, Any]:
    return {"apiVersion": "ai.flexinfer/v1alpha1", "kind": "ModelCache", "metadata": {"name": "c", "namespace": "ns"},
            "spec": {"source": "HF://org/m", "flashLoader": {"enabled": True, "concurrency": 7, **flash}}}


def model_doc(**spec: Any) -> dict[str, Any]:
    return {"apiVersion": "ai.flexinfer/v1alpha2", "kind": "Model", "metadata": {"name": "m", "namespace": "ns"},
            "spec": {"backend": "vllm", "source": "HF://org/m", **spec}}


def schema_accepts(schema: dict[str, Any], doc: dict[str, Any]) -> bool:
    try:
        jsonschema.validate(doc, schema)
    except jsonschema.ValidationError:
        return False
    return True


@pytest.mark.parametrize("text", QUANTITIES)
def test_crd_pattern_and_parser_agree_on_quantities(text: str) -> None:
    doc = cache_doc(tmpfsSizeLimit=text)
    assert schema_accepts(openapi_schema(ModelCache), doc) is is_quantity(text)
    model = model_doc(cache={"flashLoader": {"tmpfsSizeLimit": text}, "size": text})
    assert schema_accepts(openapi_schema(Model), model) is is_quantity(text)


@pytest.mark.parametrize("number", [8589934592, 0, -5])
def test_integer_quantities_must_not_be_negative(number: int) -> None:
    assert schema_accepts(openapi_schema(ModelCache), cache_doc(tmpfsSizeLimit=number)) is (number >= 0)
    assert is_quantity(str(number)) is (number >= 0)


@pytest.mark.parametrize("text", DURATIONS)
def test_crd_pattern_and_parser_agree_on_durations(text: str) -> None:
    try:
        parse_duration(text)
        parses = True
    except ValueError:
        parses = False
    doc = model_doc(serverless={"idleTimeout": text})
    assert schema_accepts(openapi_schema(Model), doc) is parses


def test_validate_rejects_what_the_crd_rejects() -> None:
    with pytest.raises(InvalidResourceError, match=r"spec.flashLoader.tmpfsSizeLimit: invalid quantity '16 gigs'"):
        parse_resource(cache_doc(tmpfsSizeLimit="16 gigs"))


def test_a_stored_modelcache_keeps_everything_but_the_bad_field() -> None:
    stored = parse_stored(cache_doc(tmpfsSizeLimit="16 gigs"))
    assert isinstance(stored.resource, ModelCache) and stored.resource.spec.flash_loader is not None
    flash = stored.resource.spec.flash_loader
    assert (flash.enabled, flash.concurrency, flash.tmpfs_size_limit) == (True, 7, None)
    assert [str(p) for p in stored.ignored] == [
        "spec.flashLoader.tmpfsSizeLimit: invalid quantity '16 gigs' (use e.g. 8Gi, 512Mi, 2G)"]


def test_a_stored_model_ignores_each_bad_quantity_and_duration() -> None:
    stored = parse_stored(model_doc(cache={"strategy": "Local", "flashLoader": {"enabled": True,
                                                                                "tmpfsSizeLimit": "16 gigs"}},
                                    resources={"limits": {"memory": "lots", "cpu": "2"}},
                                    serverless={"idleTimeout": "5 mins"}))
    model = stored.resource
    assert isinstance(model, Model) and model.spec.cache is not None and model.spec.resources is not None
    assert model.spec.cache.flash_loader is not None and model.spec.cache.flash_loader.enabled is True
    assert dict(model.spec.resources.limits) == {"cpu": "2"}
    assert {p.path for p in stored.ignored} == {
        "spec.cache.flashLoader.tmpfsSizeLimit", "spec.resources.limits.memory", "spec.serverless.idleTimeout"}


def test_any_other_problem_still_rejects_the_stored_object() -> None:
    with pytest.raises(InvalidResourceError, match=r"spec\.source"):
        parse_stored(model_doc(source="s3://bucket", cache={"size": "16 gigs"}))
    with pytest.raises(InvalidResourceError, match="concurrency"):
        parse_stored(cache_doc(tmpfsSizeLimit="16 gigs", concurrency=99))
