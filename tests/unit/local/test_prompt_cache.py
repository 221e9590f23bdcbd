"""Prompt-cache settings, where a cache lives, what it is valid for, and the removal of undeclared models'
caches, and a manifest written without reference cycles (the save/restore round trip with the real server:
tests/integration/test_prompt_cache.py)."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import pytest

from flexinfer.core.errors import ConfigError
from flexinfer.local.prompt_cache import (
    MANIFEST,
    FileIdentity,
    Identity,
    PromptCaches,
    SavedSlot,
    cache_dir,
    cache_settings,
    has_saved,
    mismatch,
    read_manifest,
    write_manifest,
)
from support.garbage import unreachable_cycles
from support.local_processes import make_model


def test_settings_default_on_with_a_2gi_cap() -> None:
    settings = cache_settings(make_model("a", "file:///m.gguf"))
    assert settings.enabled and settings.max_bytes == 2 * 1024**3
    settings = cache_settings(make_model("a", "file:///m.gguf", {"promptCache": False, "promptCacheMaxSize": "512Mi"}))
    assert not settings.enabled and settings.max_bytes == 512 * 1024**2


@pytest.mark.parametrize(("config", "field"), [({"promptCache": "no"}, "promptCache"),
                                               ({"promptCacheMaxSize": "-1Gi"}, "promptCacheMaxSize"),
                                               ({"promptCacheMaxSize": True}, "promptCacheMaxSize")])
def test_bad_settings_name_the_field(config: dict[str, object], field: str) -> None:
    with pytest.raises(ConfigError, match=rf"default/a: spec\.config\.{field} must be"):
        cache_settings(make_model("a", "file:///m.gguf", config))


def test_a_staged_model_keeps_its_cache_beside_the_copy(tmp_path: Path) -> None:
    model = make_model("a", "file:///m.gguf")
    assert cache_dir(model, tmp_path / "shm" / "default" / "a", tmp_path / "state") == \
        tmp_path / "shm" / "default" / "a.prompt-cache"
    assert cache_dir(model, None, tmp_path / "state") == tmp_path / "state" / "default" / "a"
    assert cache_dir(model, None, None) is None


def test_a_cache_is_valid_for_its_model_file_and_server_only(tmp_path: Path) -> None:
    weights, server = tmp_path / "m.gguf", tmp_path / "llama-server"
    weights.write_bytes(b"w" * 10)
    server.write_bytes(b"s")
    identity = Identity(FileIdentity.of(weights), FileIdentity.of(server))
    manifest = {**asdict(identity), "slots": []}
    assert mismatch(manifest, identity) is None
    weights.write_bytes(b"w" * 11)
    assert "another model file" in str(mismatch(manifest, Identity(FileIdentity.of(weights), identity.server)))
    assert "another server binary" in str(mismatch(manifest, Identity(identity.model, FileIdentity.of(weights))))


def test_an_unreadable_manifest_is_a_value_error(tmp_path: Path) -> None:
    assert read_manifest(tmp_path) is None and not has_saved(tmp_path)
    (tmp_path / MANIFEST).write_text("{not json")
    with pytest.raises(ValueError):
        read_manifest(tmp_path)
    (tmp_path / MANIFEST).write_text('{"slots": 3}')
    with pytest.raises(ValueError, match="not a prompt-cache manifest"):
        read_manifest(tmp_path)


def test_prune_removes_only_the_caches_of_undeclared_models(tmp_path: Path) -> None:
    state, shm = tmp_path / "state", tmp_path / "shm"
    for directory in (state / "default" / "kept", state / "default" / "gone", shm / "default" / "gone.prompt-cache",
                      shm / "default" / "kept.prompt-cache", shm / "default" / "gone", state / "team" / "other"):
        directory.mkdir(parents=True)
        (directory / "slot-0.bin").write_bytes(b"kv")
    (state / "team" / "other" / "notes.txt").write_text("not ours")
    removed = PromptCaches(state, shm).prune({"default/kept"})
    assert sorted(removed) == [shm / "default" / "gone.prompt-cache", state / "default" / "gone"]
    assert (shm / "default" / "gone").exists()  # staged weights: not a cache
    assert (state / "team" / "other").exists()  # holds a file the cache never writes


def test_a_manifest_is_written_without_reference_cycles(tmp_path: Path) -> None:
    """Every swap saves the outgoing server's cache: its manifest must not leave cycles for the collector."""
    weights = tmp_path / "m.gguf"
    weights.write_bytes(b"w")
    identity = Identity(FileIdentity.of(weights), FileIdentity.of(weights))
    with unreachable_cycles() as cycles:
        for _ in range(3):
            write_manifest(tmp_path, identity, [SavedSlot(0, "slot-0.bin", 47, 1024)])
    assert cycles == []
    manifest = read_manifest(tmp_path)
    assert manifest is not None and mismatch(manifest, identity) is None and len(manifest["slots"]) == 1  # type: ignore[arg-type]
