"""`flexinfer settings`: the configuration reference is complete and docs/CONFIGURATION.md matches it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from flexinfer.assembly.reference import GROUPS, helm_values
from flexinfer.cli.main import main

ROOT = Path(__file__).resolve().parents[3]
ENV_READ = re.compile(r"""(?:env(?:iron)?(?:\.get)?[(\[]|read\.[a-z]+\()\s*["']([A-Z][A-Z0-9_]{2,})["']""")
ENV_CONSTANT = re.compile(r"""^[A-Z_]*(?:ENV|ENABLED|NAMESPACE|INCOMING)[A-Z_]* = ["']([A-Z][A-Z0-9_]{2,})["']""", re.M)


def documented_names() -> set[str]:
    return {var.name for group in GROUPS.values() for var in group.table}


def test_every_environment_variable_the_code_reads_is_documented() -> None:
    read: set[str] = set()
    for path in (ROOT / "src" / "flexinfer").rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        read |= set(ENV_READ.findall(text)) | set(ENV_CONSTANT.findall(text))
    assert read, "the scan found no environment reads at all"
    missing = sorted(read - documented_names() - {"PATH", "KUBERNETES_SERVICE_HOST", "HOME", "XDG_STATE_HOME"})
    assert missing == [], f"add these to an ENV_VARS table: {missing}"


def test_configuration_doc_is_the_generated_reference(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["settings", "--markdown", "--chart", str(ROOT / "charts" / "flexinfer")]) == 0
    generated = capsys.readouterr().out
    committed = (ROOT / "docs" / "CONFIGURATION.md").read_text(encoding="utf-8")
    assert committed == generated, (
        "docs/CONFIGURATION.md is stale: run "
        "`flexinfer settings --markdown --chart charts/flexinfer > docs/CONFIGURATION.md`"
    )


def test_reference_lists_flags_of_each_long_running_command(capsys: pytest.CaptureFixture[str]) -> None:
    main(["settings", "--markdown"])
    text = capsys.readouterr().out
    for flag in ("--metrics-bind-address", "--health-probe-bind-address", "--leader-elect", "--port", "--concurrency"):
        assert f"`{flag}" in text or f", {flag}" in text, flag


def test_helm_values_carry_defaults_and_their_comments(tmp_path: Path) -> None:
    values = tmp_path / "values.yaml"
    values.write_text(
        "# -- Top level switch.\nenabled: false\nproxy:\n  # -- Queue wait.\n  timeout: 10m\n  port: 80\n"
    )
    rows = {v.key: (v.default, v.description) for v in helm_values(values)}
    assert rows == {
        "enabled": ("false", "Top level switch."),
        "proxy.timeout": ('"10m"', "Queue wait."),
        "proxy.port": ("80", ""),
    }


def test_missing_chart_directory_is_a_one_line_error(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["settings", "--chart", str(tmp_path)]) == 1
    assert "no values.yaml" in capsys.readouterr().err
