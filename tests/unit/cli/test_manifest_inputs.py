"""Manifest inputs and ``-o`` of ``validate`` and ``render``: ``-f -`` (stdin), ``kind: List``, objects of other
kinds (an error naming file:line:column and kind, or skipped and reported with ``--skip-unknown-kinds``), and the
JSON/YAML outputs."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import yaml

from flexinfer.cli.main import main

CONFIGMAP = """\
apiVersion: v1
kind: ConfigMap
metadata: {name: notes}
data: {owner: me}
"""
LIST = """\
apiVersion: v1
kind: List
items:
- apiVersion: ai.flexinfer/v1alpha2
  kind: Model
  metadata: {name: first}
  spec: {backend: vllm, source: "HF://a/b"}
- apiVersion: ai.flexinfer/v1alpha2
  kind: Model
  metadata: {name: second}
  spec: {backend: vllm, source: "HF://a/c", gpu: {priority: 5000}}
"""


def test_stdin_and_list_items_keep_their_lines(monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO(LIST))
    assert main(["validate", "--offline", "-f", "-"]) == 1
    assert capsys.readouterr().err == "error: <stdin>:11:51: spec.gpu.priority: must be ≤ 1000, got 5000\n"
    monkeypatch.setattr("sys.stdin", io.StringIO(LIST.replace("5000", "5")))
    assert main(["validate", "--offline", "-f", "-", "-o", "json"]) == 0
    body = json.loads(capsys.readouterr().out)
    assert body["ok"] is True and [r["name"] for r in body["resources"]] == ["first", "second"]
    assert body["resources"][1]["source"] == "<stdin>:8:3"


def test_other_kinds_fail_by_default_and_are_skipped_with_the_flag(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "a-config.yaml").write_text(CONFIGMAP)
    (tmp_path / "models.yaml").write_text(LIST.replace("5000", "5"))
    assert main(["validate", "--offline", "-f", str(tmp_path)]) == 1
    assert capsys.readouterr().err == (f"error: {tmp_path / 'a-config.yaml'}:2:1: kind: ConfigMap (v1) is not a "
                                       "FlexInfer kind (--skip-unknown-kinds leaves out objects of other kinds)\n")
    assert main(["validate", "--offline", "--skip-unknown-kinds", "-f", str(tmp_path)]) == 0
    captured = capsys.readouterr()
    assert captured.out == "ok: 2 resources\n"
    assert captured.err == f"skipped: {tmp_path / 'a-config.yaml'}:2:1: kind: ConfigMap (v1) is not a FlexInfer kind\n"


def test_a_typo_in_a_flexinfer_kind_is_never_skipped(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "m.yaml").write_text("apiVersion: ai.flexinfer/v1alpha2\nkind: Modle\nmetadata: {name: m}\n")
    assert main(["validate", "--offline", "--skip-unknown-kinds", "-f", str(tmp_path)]) == 1
    assert "unknown kind 'Modle'" in capsys.readouterr().err


def test_render_json_and_yaml(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "all.yaml").write_text(CONFIGMAP + "---\n" + LIST.replace("5000", "5"))
    assert main(["render", "--skip-unknown-kinds", "-f", str(tmp_path), "-o", "json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert listed["kind"] == "List"
    assert [d["kind"] for d in listed["items"]] == ["Deployment", "Service", "Deployment", "Service"]
    assert main(["render", "--skip-unknown-kinds", "-f", str(tmp_path)]) == 0
    assert list(yaml.safe_load_all(capsys.readouterr().out)) == listed["items"]
