"""file:// sources and the tmpfs staging layout."""

from __future__ import annotations

from pathlib import Path

import pytest

from flexinfer.core.errors import EngineError
from flexinfer.local.sources import existing_source, source_path, staging_plan
from support.local_processes import make_model


def test_absolute_file_uri(tmp_path: Path) -> None:
    assert source_path(make_model("a", "file:///srv/models/x.gguf"), tmp_path) == Path("/srv/models/x.gguf")


def test_relative_file_uri_resolves_against_base_dir(tmp_path: Path) -> None:
    assert source_path(make_model("a", "file://models/x.gguf"), tmp_path) == tmp_path / "models/x.gguf"


def test_percent_encoding_and_localhost(tmp_path: Path) -> None:
    assert source_path(make_model("a", "file://localhost/a%20b.gguf"), tmp_path) == Path("/a b.gguf")


@pytest.mark.parametrize("source", ["hf://org/model", "ollama://llama3", "pvc://cache/models"])
def test_other_schemes_say_what_to_do(source: str, tmp_path: Path) -> None:
    with pytest.raises(EngineError, match=r"local mode cannot fetch; download the weights.*file:///"):
        source_path(make_model("a", source), tmp_path)


def test_missing_weights(tmp_path: Path) -> None:
    with pytest.raises(EngineError, match=r"weights not found at .*absent\.gguf"):
        existing_source(make_model("a", (tmp_path / "absent.gguf").as_uri()), tmp_path)


def test_staging_plan_for_a_file_and_a_tree(tmp_path: Path) -> None:
    file = tmp_path / "w.gguf"
    file.write_bytes(b"x")
    model = make_model("m", file.as_uri())
    plan = staging_plan(model, file, Path("/shm/flexinfer"))
    assert plan.src == tmp_path
    assert plan.dst == Path("/shm/flexinfer/default/m") and plan.served_path == plan.dst / "w.gguf"
    tree = staging_plan(model, tmp_path, Path("/shm/flexinfer"))
    assert tree.src == tmp_path and tree.served_path == tree.dst == Path("/shm/flexinfer/default/m")
