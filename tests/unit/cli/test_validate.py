"""``flexinfer validate``: ``ok: N resources`` or one line per problem and exit 1, never a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from flexinfer.cli.main import main

REPO = Path(__file__).resolve().parents[3]


def test_examples_validate(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", "--offline", "-f", str(REPO / "examples")]) == 0  # example weights are elsewhere
    assert capsys.readouterr().out == "ok: 6 resources\n"


def test_broken_manifest_names_file_document_and_field(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("""\
apiVersion: ai.flexinfer/v1alpha2
kind: Model
metadata: {name: ok}
spec: {backend: vllm, source: "HF://a/b"}
---
apiVersion: ai.flexinfer/v1alpha2
kind: Model
metadata: {name: bad}
spec: {backend: vllm, source: "HF://a/b", gpu: {priority: 5000}, cache: {strategy: Memory}, colour: red}
""")
    assert main(["validate", "-f", str(bad)]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.splitlines() == [
        f"error: {bad}:9:49: spec.gpu.priority: must be ≤ 1000, got 5000",
        f"error: {bad}:9:93: spec.colour: unknown field",
    ]


def test_unknown_runtime_profile_is_reported(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "m.yaml").write_text("""\
apiVersion: ai.flexinfer/v1alpha2
kind: Model
metadata: {name: m}
spec: {backend: vllm, source: "HF://a/b", config: {runtimeProfile: tpu-v5}}
""")
    assert main(["validate", "-f", str(tmp_path)]) == 1
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith(f"error: {tmp_path / 'm.yaml'}:4:52: spec.config.runtimeProfile: unknown profile 'tpu-v5'")


def test_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", "-f", str(tmp_path / "none.yaml")]) == 1
    assert capsys.readouterr().err == f"error: {tmp_path / 'none.yaml'}: no such file or directory\n"
