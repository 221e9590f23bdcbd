"""``flexinfer validate`` (a real subprocess) runs every check ``serve`` and ``render`` run, naming file, line and
column:
a string ``spec.config.command``, an uninstalled backend, missing ``file://`` weights (skipped by
``--offline``), a ``startupTimeout`` that is no duration, alias collisions and duplicate names across files
(both files named), a negative ``tmpfsSizeLimit``; ``render`` and ``serve`` report the same problems."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from support.cli_process import CliProcess
from support.local_serve import ServeProcess, fake_server_command, model_manifest, serve_env, write_manifests

COMMAND = [sys.executable, "-c", "pass", "{port}"]


def _env(tmp_path: Path) -> dict[str, str]:
    empty = tmp_path / "empty-path"
    empty.mkdir(exist_ok=True)
    return {**os.environ, "PATH": str(empty)}


def _run(tmp_path: Path, *args: str) -> tuple[int, list[str]]:
    command = CliProcess(args, _env(tmp_path))
    code = command.finish()
    return code, command.log.splitlines()


def _model(tmp_path: Path, name: str, **spec: Any) -> dict[str, Any]:
    weights = tmp_path / "w.gguf"
    weights.write_bytes(b"x")
    spec.setdefault("config", {"command": COMMAND})
    return model_manifest(name, weights, **spec)


def _at(path: Path, needle: str, last: bool = False) -> str:
    """``line:column`` of the field on the (first or last) line holding ``needle``: where its key, or its list
    item, starts."""
    found = [(i, text) for i, text in enumerate(path.read_text().splitlines(), 1) if needle in text]
    line, text = found[-1] if last else found[0]
    return f"{line}:{1 + len(text) - len(text.lstrip(' -'))}"


def test_valid_manifests_are_ok(tmp_path: Path) -> None:
    write_manifests(tmp_path / "m" / "a.yaml", [_model(tmp_path, "a"), _model(tmp_path, "b")])
    assert _run(tmp_path, "validate", "-f", str(tmp_path / "m")) == (0, ["ok: 2 resources"])


@pytest.mark.parametrize(("spec", "needle", "expected"), [
    ({"config": {"command": "my-server --port {port}"}}, "command:",
     "spec.config.command must be a non-empty list of strings"),
    ({"config": {"command": COMMAND, "startupTimeout": "soon"}}, "startupTimeout:",
     "spec.config.startupTimeout: invalid duration 'soon'"),
    ({"cache": {"flashLoader": {"enabled": True, "tmpfsSizeLimit": "-1Gi"}}}, "tmpfsSizeLimit:",
     "spec.cache.flashLoader.tmpfsSizeLimit: invalid quantity '-1Gi'"),
], ids=["command-string", "startup-timeout", "negative-tmpfs"])
def test_manifest_problems_fail_validate_and_render_with_file_and_at(tmp_path: Path, spec: dict[str, Any],
                                                                      needle: str, expected: str) -> None:
    path = write_manifests(tmp_path / "m" / "a.yaml", [_model(tmp_path, "ok"), _model(tmp_path, "bad", **spec)])
    where = f"error: {path}:{_at(path, needle, last=True)}: "
    for args in (("validate", "-f", str(path)), ("validate", "--offline", "-f", str(path)),
                 ("render", "-f", str(path))):
        code, lines = _run(tmp_path, *args)
        assert code == 1, lines
        assert len(lines) == 1 and lines[0].startswith(where + expected), lines


def test_machine_problems_fail_validate_unless_offline(tmp_path: Path) -> None:
    docs = [model_manifest("gone", tmp_path / "gone.gguf", config={"command": COMMAND}),
            _model(tmp_path, "novllm", backend="vllm", config={}),
            model_manifest("remote", tmp_path)]
    docs[2]["spec"]["source"] = "hf://org/m"  # for Kubernetes: not checked against this machine
    path = write_manifests(tmp_path / "m" / "a.yaml", docs)
    code, lines = _run(tmp_path, "validate", "-f", str(path))
    assert code == 1
    assert lines == [
        f"error: {path}:{_at(path, 'gone.gguf')}: weights not found at {tmp_path / 'gone.gguf'} "
        f"(spec.source {(tmp_path / 'gone.gguf').as_uri()!r})",
        f"error: {path}:{_at(path, 'backend: vllm')}: no vllm backend is installed on this machine; install vLLM "
        "so that `vllm` is on PATH, or set spec.config.command",
    ]
    assert _run(tmp_path, "validate", "--offline", "-f", str(path)) == (0, ["ok: 3 resources"])


def test_alias_collisions_and_duplicates_name_both_files(tmp_path: Path) -> None:
    first = write_manifests(tmp_path / "m" / "a.yaml", [
        _model(tmp_path, "one", litellm={"aliases": ["shared"]}), _model(tmp_path, "dup")])
    second = write_manifests(tmp_path / "m" / "b.yaml", [
        _model(tmp_path, "two", litellm={"aliases": ["one", "shared"]})])
    code, lines = _run(tmp_path, "validate", "--offline", "-f", str(tmp_path / "m"))
    assert code == 1
    shared_at, one_at = f"{first}:{_at(first, '- shared')}", f"{first}:{_at(first, 'name: one')}"
    assert lines == [
        f"error: {second}:{_at(second, '- one')}: spec.litellm.aliases[0]: 'one' is the name of model "
        f"default/one ({one_at}); a name routes to one model",
        f"error: {second}:{_at(second, '- shared')}: spec.litellm.aliases[1]: 'shared' is also claimed by model "
        f"default/one ({shared_at}); a name routes to one model",
    ]
    third = write_manifests(tmp_path / "m" / "c.yaml", [_model(tmp_path, "dup")])
    code, lines = _run(tmp_path, "validate", "--offline", "-f", str(first), "-f", str(third))
    assert code == 1
    assert lines == [f"error: {third}:{_at(third, 'name: dup')}: metadata.name: duplicate Model default/dup "
                     f"(first defined at {first}:{_at(first, 'name: dup')})"]


def test_serve_reports_the_same_problems(tmp_path: Path) -> None:
    good = model_manifest("good", tmp_path, config={"command": fake_server_command()})
    bad = _model(tmp_path, "bad", config={"command": COMMAND, "startupTimeout": "soon"})
    path = write_manifests(tmp_path / "m" / "a.yaml", [good, bad])
    serve = ServeProcess.start(path, serve_env(tmp_path / "state"))
    try:
        expected = f"{path}:{_at(path, 'startupTimeout')}: spec.config.startupTimeout: invalid duration 'soon'"
        assert expected in serve.log
    finally:
        serve.stop()


def test_examples_validate_offline(tmp_path: Path) -> None:
    examples = Path(__file__).resolve().parents[3] / "examples"
    code, lines = _run(tmp_path, "validate", "--offline", "-f", str(examples))
    assert (code, lines) == (0, [f"ok: {len(list(yaml.safe_load_all(_all_yaml(examples))))} resources"])


def _all_yaml(root: Path) -> str:
    return "\n---\n".join(p.read_text() for p in sorted(root.rglob("*.yaml")))


CARELESS = """\
apiVersion: ai.flexinfer/v1alpha2
kind: Model
metadata:
  name: careless
spec:
  backend: llamacpp
  gpu:
    shared: g
    priorty: 5
    count: many
  serverless:
    idleTimeout: 5 minutes
  tolerations:
    - key: gpu
    - operator: Sometimes
  litellm:
    aliases: [chat, {name: code}]
"""


def test_a_careless_manifest_gets_file_line_column_per_field_in_every_command(tmp_path: Path) -> None:
    """Schema errors (pydantic ``loc`` mapped to the YAML node marks) read the same from ``validate``,
    ``render`` and ``serve``: one ``file:line:column: field: message`` line each, exit 1, no traceback."""
    path = tmp_path / "m" / "careless.yaml"
    path.parent.mkdir()
    path.write_text(CARELESS)
    expected = [
        f"error: {path}:5:1: spec.source: required field is missing",
        f"error: {path}:9:5: spec.gpu.priorty: unknown field",
        f"error: {path}:10:5: spec.gpu.count: Input should be a valid integer, unable to parse string as an integer",
        f"error: {path}:12:5: spec.serverless.idleTimeout: invalid duration '5 minutes' (use e.g. 90s, 5m, 1h30m)",
        f"error: {path}:15:7: spec.tolerations[1].operator: must be one of 'Exists' or 'Equal', got 'Sometimes'",
        f"error: {path}:17:21: spec.litellm.aliases[1]: Input should be a valid string",
    ]
    for args in (("validate", "-f", str(path)), ("render", "-f", str(path)),
                 ("serve", "--port", "0", "-f", str(path.parent))):
        code, lines = _run(tmp_path, *args)
        assert (code, [line for line in lines if line.startswith("error: ")]) == (1, expected), lines
        assert not any("Traceback" in line for line in lines), lines
