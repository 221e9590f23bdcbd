"""The local-mode Catalog: names, namespace/name, aliases, parking and phases."""

from __future__ import annotations

import pytest

from flexinfer.api.key import ModelKey
from flexinfer.core.errors import AmbiguousModelError
from flexinfer.local.catalog import ManifestCatalog
from support.local_processes import make_model


def catalog() -> ManifestCatalog:
    models = [
        make_model("alpha", "file:///a", litellm={"servedModelName": "gpt-small", "aliases": ["a", "shared"]},
                   gpu={"shared": "g"}),
        make_model("beta", "file:///b", {"servedModelName": "beta-upstream"}, litellm={"aliases": ["shared", "alpha"]}),
        make_model("parked", "file:///p", litellm={"enabled": False}),
    ]
    return ManifestCatalog(models, {"default/alpha": "Ready"}.get)


def test_resolution_by_name_key_and_alias() -> None:
    cat = catalog()
    assert cat.resolve("alpha").name == "alpha"
    assert cat.resolve("default/beta").name == "beta"
    assert cat.resolve("gpt-small").name == "alpha"
    assert cat.resolve("a").name == "alpha"
    assert cat.resolve("nope") is None


def test_first_claimant_wins_and_names_beat_aliases() -> None:
    cat = catalog()
    assert cat.resolve("shared").name == "alpha"
    assert cat.key("alpha") == "default/alpha"


def test_view_fields() -> None:
    cat = catalog()
    alpha, beta = cat.resolve("alpha"), cat.resolve("beta")
    assert alpha.phase == "Ready" and alpha.group == "g" and alpha.served_model_name == "alpha"
    assert alpha.aliases == ("gpt-small", "a", "shared")
    assert beta.phase == "Idle" and beta.served_model_name == "beta-upstream"
    assert cat.resolve("parked").parked
    assert [v.name for v in cat.models()] == ["alpha", "beta", "parked"]


def test_same_name_in_two_namespaces_is_ambiguous_and_each_key_resolves() -> None:
    a = make_model("same", "file:///a")
    b = a.model_copy(update={"metadata": a.metadata.model_copy(update={"namespace": "other"})})
    cat = ManifestCatalog([a, b])
    with pytest.raises(AmbiguousModelError) as ambiguous:
        cat.resolve("same")
    assert ambiguous.value.candidates == ("default/same", "other/same")
    with pytest.raises(AmbiguousModelError):
        cat.key("same")
    assert cat.resolve("other/same").key == "other/same"
    assert cat.resolve("default/same").key == "default/same"
    assert cat.key("other/same") == ModelKey("other", "same")
