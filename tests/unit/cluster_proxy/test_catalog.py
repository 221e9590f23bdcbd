"""Name resolution of the in-cluster catalog: names, keys, served model names, aliases, parking, phases."""

from __future__ import annotations

from typing import Any

import pytest

from flexinfer.api.model import Model
from flexinfer.cluster_proxy.catalog import WatchCatalog, backend_model_name
from flexinfer.cluster_proxy.model_watch import ModelStore
from flexinfer.core.errors import AmbiguousModelError
from support.fake_model_api import model_body


def model(name: str, namespace: str = "default", created: str | None = None, **spec: Any) -> Model:
    doc = model_body(name, namespace, **spec)
    if created:
        doc["metadata"]["creationTimestamp"] = created
    return Model.model_validate(doc)


def catalog(*models: Model) -> tuple[WatchCatalog, ModelStore]:
    store = ModelStore()
    store.replace_all(models)
    return WatchCatalog(store), store


def resolved(cat: WatchCatalog, name: str) -> str | None:
    found = cat.resolve(name)
    return None if found is None else f"{found.namespace}/{found.name}"


def test_resolves_name_key_served_model_name_and_aliases() -> None:
    cat, _ = catalog(model("qwen", litellm={"servedModelName": "qwen-chat", "aliases": ["gpt-4o", "q"]}))
    for name in ("qwen", "default/qwen", "qwen-chat", "gpt-4o", "q"):
        assert resolved(cat, name) == "default/qwen"
    assert cat.resolve("nope") is None


def test_own_name_beats_another_models_alias_and_the_oldest_alias_claimant_wins() -> None:
    cat, _ = catalog(
        model("young", created="2025-02-01T00:00:00Z", litellm={"aliases": ["shared", "old"]}),
        model("old", created="2025-01-01T00:00:00Z", litellm={"aliases": ["shared"]}),
    )
    assert resolved(cat, "old") == "default/old"
    assert resolved(cat, "shared") == "default/old"


def test_a_name_used_in_two_namespaces_is_ambiguous_and_each_key_resolves() -> None:
    cat, store = catalog(model("m", "a"), model("m", "b", litellm={"aliases": ["m-b"]}), model("solo", "b"),
                         model("other", "c", litellm={"aliases": ["m"]}))
    with pytest.raises(AmbiguousModelError) as ambiguous:
        cat.resolve("m")
    assert ambiguous.value.status == 409 and ambiguous.value.code == "model_ambiguous"
    assert ambiguous.value.candidates == ("a/m", "b/m") and "'a/m', 'b/m'" in str(ambiguous.value)
    assert resolved(cat, "a/m") == "a/m" and resolved(cat, "b/m") == "b/m"
    assert resolved(cat, "m-b") == "b/m"
    assert resolved(cat, "solo") == "b/solo"
    assert cat.resolve("a/solo") is None
    store.delete("a/m")
    assert resolved(cat, "m") == "b/m"


def test_parked_models_resolve_as_parked_and_phase_comes_from_status() -> None:
    parked = model("p", litellm={"enabled": False})
    live = Model.model_validate({**model_body("live"), "status": {"phase": "Ready", "endpoint": "http://x:8000"}})
    cat, _ = catalog(parked, live, model("fresh"))
    views = {v.name: v for v in cat.models()}
    assert views["p"].parked and not views["live"].parked
    assert views["live"].phase == "Ready" and views["live"].metadata["ready"] is True
    assert views["fresh"].phase == "Idle"


def test_index_follows_store_changes() -> None:
    cat, store = catalog(model("a", litellm={"aliases": ["x"]}))
    assert resolved(cat, "x") == "default/a"
    store.delete("default/a")
    assert cat.resolve("x") is None and cat.resolve("a") is None
    store.upsert(model("b", litellm={"aliases": ["x"]}))
    assert resolved(cat, "x") == "default/b"


@pytest.mark.parametrize(("backend", "source", "config", "expected"), [
    # told the model's name (--alias, --served-model-name): it answers to it, as locally
    ("llamacpp", "pvc://weights/sub/dir", {}, "m"),
    ("vllm", "HF://org/llama", {}, "m"),
    ("vllm-omni", "HF://org/llama", {}, "m"),
    ("vllm", "HF://org/llama", {"servedModelName": "llama"}, "llama"),
    ("llamacpp", "file:///models/m.gguf", {"servedModelName": "llama"}, "llama"),
    # told no name: it answers to what it loads
    ("ollama", "ollama://qwen3:8b", {}, "qwen3:8b"),
    ("mlc-llm", "HF://org/llama", {}, "org/llama"),
    ("mlc-llm", "file:///models/m", {}, "/models/m"),
    ("mlc-llm", "pvc://weights/sub/dir", {}, "/sub/dir"),
    ("ollama", "ollama://qwen3:8b", {"servedModelName": "qwen"}, "qwen"),
])
def test_backend_model_name_is_the_name_the_server_answers_to(backend: str, source: str, config: dict[str, str],
                                                              expected: str) -> None:
    spec: dict[str, Any] = {"backend": backend, "source": source, "config": config}
    assert backend_model_name(model("m", **spec)) == expected
    assert WatchCatalog(_store_with(model("m", **spec))).resolve("m").served_model_name == expected  # type: ignore[union-attr]


def _store_with(*models: Model) -> ModelStore:
    store = ModelStore()
    store.replace_all(models)
    return store


def test_a_view_is_reused_until_the_store_changes_and_then_shows_the_new_phase() -> None:
    cat, store = catalog(model("m"))
    first = cat.resolve("m")
    assert first is not None and first.phase == "Idle" and cat.resolve("default/m") is first
    ready = model_body("m")
    ready["metadata"]["resourceVersion"] = "2"
    ready["status"] = {"phase": "Ready"}
    store.upsert(Model.model_validate(ready))
    again = cat.resolve("m")
    assert again is not None and again.phase == "Ready"
