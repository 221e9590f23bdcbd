"""Start-up notes for `serve`: problems are reported, never fatal."""

from __future__ import annotations

from pathlib import Path

from flexinfer.local.validation import check_models
from support.local_processes import make_model


class Nothing:
    python = "/py"

    def which(self, name: str) -> str | None:
        return None

    def has_module(self, name: str) -> bool:
        return False


def test_notes_name_each_problem(tmp_path: Path) -> None:
    weights = tmp_path / "w.gguf"
    weights.write_bytes(b"x")
    models = [
        make_model("ok", weights.as_uri(), {"command": ["srv", "{port}"]}),
        make_model("remote", "hf://org/m", {"command": ["srv"]}),
        make_model("gone", (tmp_path / "gone.gguf").as_uri(), {"command": ["srv"]}),
        make_model("nobackend", weights.as_uri()),
        make_model("ok", weights.as_uri(), {"command": ["srv", "{port}"]}),
    ]
    notes = check_models(models, Nothing(), tmp_path)
    assert [n.model for n in notes] == ["default/remote", "default/gone", "default/nobackend", "default/ok"]
    assert "local mode cannot fetch" in notes[0].message
    assert "weights not found" in notes[1].message
    assert "no llamacpp backend is installed" in notes[2].message
    assert "defined more than once" in notes[3].message
