"""``flexinfer crds``: writes the generated CRD files; ``--check`` reports drift."""

from __future__ import annotations

from pathlib import Path

import pytest

from flexinfer.api.crds import crd_files
from flexinfer.cli.main import main


def test_writes_every_crd_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "crds"
    assert main(["crds", "--out", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == sorted(crd_files())
    assert (out / "ai.flexinfer_models.yaml").read_text() == crd_files()["ai.flexinfer_models.yaml"]
    assert capsys.readouterr().out.count("wrote ") == 4


def test_check_passes_when_current_and_names_stale_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["crds", "--out", str(tmp_path)]) == 0
    assert main(["crds", "--out", str(tmp_path), "--check"]) == 0
    (tmp_path / "ai.flexinfer_models.yaml").write_text("edited by hand\n")
    capsys.readouterr()
    assert main(["crds", "--out", str(tmp_path), "--check"]) == 1
    assert capsys.readouterr().out.splitlines() == [
        f"stale: {tmp_path / 'ai.flexinfer_models.yaml'} (run `flexinfer crds --out {tmp_path}`)"]


def test_unwritable_output_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert main(["crds", "--out", str(blocker / "sub")]) == 1
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith(f"error: --out {blocker / 'sub'}: cannot write")
