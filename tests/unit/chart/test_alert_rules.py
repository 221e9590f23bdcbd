"""The example Prometheus rules in docs/alerts pass `promtool check rules` and their own `promtool test rules`
unit tests, and every metric they use is one documented in docs/specs/metrics.md.

promtool comes from Debian's `prometheus` package (hack/install-system-deps); missing promtool is a failure.
"""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from support.kube_testbed import REPO_ROOT

ALERTS_DIR = REPO_ROOT / "docs" / "alerts"
RULES = ALERTS_DIR / "flexinfer-rules.yml"
RULE_TESTS = ALERTS_DIR / "flexinfer-rules.test.yml"
METRICS_DOC = REPO_ROOT / "docs" / "specs" / "metrics.md"


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    binary = shutil.which("promtool")
    if binary is None:
        pytest.fail("promtool not found: run hack/install-system-deps (Debian package `prometheus`)")
    return subprocess.run([binary, *args], capture_output=True, text=True, timeout=120, check=False, cwd=ALERTS_DIR)


def test_rules_pass_promtool_check() -> None:
    proc = promtool("check", "rules", RULES.name)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS: 11 rules found" in proc.stdout


def test_rule_unit_tests_pass() -> None:
    proc = promtool("test", "rules", RULE_TESTS.name)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout


def test_rules_only_use_documented_metrics() -> None:
    used = set(re.findall(r"\b(flexinfer_[a-z_]+?)(?:_bucket|_count|_sum)?\b(?=[\[{(\s)])", RULES.read_text()))
    documented = set(re.findall(r"`(flexinfer_[a-z_]+)", METRICS_DOC.read_text()))
    assert used, "no metrics found in the rules"
    assert used <= documented, f"undocumented metrics in rules: {sorted(used - documented)}"
