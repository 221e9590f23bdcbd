"""The one rule that turns a client's model name into a key (both engines' catalogs use it)."""

from __future__ import annotations

from typing import Any

import pytest

from flexinfer.api.key import ModelKey
from flexinfer.api.model import Model
from flexinfer.core.errors import AmbiguousModelError
from flexinfer.core.model_index import ModelIndex


def model(name: str, namespace: str = "default", **litellm: Any) -> Model:
    spec: dict[str, Any] = {"backend": "vllm", "source": f"HF://org/{name}"}
    if litellm:
        spec["litellm"] = litellm
    return Model.model_validate({"metadata": {"name": name, "namespace": namespace}, "spec": spec})


def test_key_always_unique_name_and_aliases_resolve() -> None:
    index = ModelIndex.build([model("qwen", servedModelName="qwen-chat", aliases=["q"]), model("solo", "ml")])
    for name in ("qwen", "default/qwen", "qwen-chat", "q"):
        assert index.lookup(name) == ModelKey("default", "qwen")
    assert index.lookup("solo") == index.lookup("ml/solo") == ModelKey("ml", "solo")
    assert index.lookup("nope") is None and index.lookup("default/solo") is None


def test_a_name_in_two_namespaces_is_ambiguous_even_when_an_alias_claims_it() -> None:
    index = ModelIndex.build([model("chat", "team-b"), model("chat"), model("other", aliases=["chat"])])
    with pytest.raises(AmbiguousModelError) as ambiguous:
        index.lookup("chat")
    error = ambiguous.value
    assert (error.status, error.type, error.code, error.param) == (409, "invalid_request_error", "model_ambiguous",
                                                                   "model")
    assert error.candidates == ("default/chat", "team-b/chat")
    assert "'default/chat', 'team-b/chat'" in str(error) and "namespace/name" in str(error)
    assert index.lookup("team-b/chat") == ModelKey("team-b", "chat")


def test_names_beat_aliases_the_first_claimant_wins_and_a_key_beats_an_alias_with_a_slash() -> None:
    index = ModelIndex.build([
        model("first", aliases=["shared", "second", "default/third", "org/model"]),
        model("second", aliases=["shared"]),
        model("third"),
    ])
    assert index.lookup("shared") == "default/first"
    assert index.lookup("second") == "default/second"
    assert index.lookup("default/third") == "default/third"
    assert index.lookup("org/model") == "default/first"
