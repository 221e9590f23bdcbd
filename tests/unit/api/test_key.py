"""``ModelKey``: the namespace/name value every layer carries after the catalog resolved a request."""

from __future__ import annotations

import copy
import json
import pickle

import pytest

from flexinfer.api.key import ModelKey
from flexinfer.api.model import Model


def test_a_key_is_its_canonical_text_with_both_parts() -> None:
    key = ModelKey("team-b", "chat")
    assert key == "team-b/chat" and hash(key) == hash("team-b/chat")
    assert (key.namespace, key.name) == ("team-b", "chat")
    assert {"team-b/chat": 1}[key] == 1 and json.dumps({"k": key}) == '{"k": "team-b/chat"}'
    assert repr(key) == "ModelKey('team-b', 'chat')"


def test_parse_accepts_only_namespace_slash_name() -> None:
    assert ModelKey.parse("team-b/chat") == ModelKey("team-b", "chat")
    for text in ("chat", "/chat", "team-b/", "a/b/c", ""):
        assert ModelKey.parse(text) is None, text
    with pytest.raises(ValueError):
        ModelKey("a/b", "c")


def test_copies_and_pickles_keep_the_type() -> None:
    key = ModelKey("team-b", "chat")
    for clone in (copy.copy(key), copy.deepcopy(key), pickle.loads(pickle.dumps(key))):
        assert isinstance(clone, ModelKey) and clone == key and clone.namespace == "team-b"


def test_a_model_key_comes_from_its_metadata() -> None:
    model = Model.model_validate({"metadata": {"name": "chat", "namespace": "team-b"},
                                  "spec": {"backend": "vllm", "source": "HF://org/chat"}})
    assert isinstance(model.key, ModelKey) and model.key == ModelKey("team-b", "chat")
