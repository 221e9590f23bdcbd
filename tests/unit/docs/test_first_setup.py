"""docs/testing.md's "First set-up" is what a fresh machine needs before ``hack/kube-node up``.

Every prerequisite the node's own check (``check_tools`` in hack/kube-node) refuses to start without is listed
there with the script that provides it, and the long compilations announce their duration by pointing at that
section's measured table rather than a figure of their own (a fresh 2-core machine once took 17.5 and 27.7
minutes where the scripts and the page said about 8 and 6).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
KUBE_NODE = ROOT / "hack" / "kube-node"
FIRST_SETUP = "## First set-up"
COMPILATIONS = {"hack/kube-testbed": "hack/kube-testbed build", "hack/build-llamacpp": "hack/build-llamacpp"}
"""The compiling scripts and the name of their step in the section's table."""


def first_setup() -> str:
    text = (ROOT / "docs" / "testing.md").read_text(encoding="utf-8")
    assert FIRST_SETUP in text, "docs/testing.md has no 'First set-up' section"
    return text.split(FIRST_SETUP, 1)[1].split("\n## ", 1)[0]


def node_checks() -> str:
    """The body of hack/kube-node's ``check_tools`` (what ``up`` verifies before changing the host)."""
    script = KUBE_NODE.read_text(encoding="utf-8")
    match = re.search(r"^check_tools\(\) \{\n(.*?)^\}", script, re.S | re.M)
    assert match, "hack/kube-node has no check_tools function"
    return match.group(1)


def test_every_script_the_node_check_sends_an_operator_to_is_listed() -> None:
    providers = set(re.findall(r"run (hack/[\w-]+(?: build)?)", node_checks()))
    assert {"hack/install-system-deps", "hack/get-helm", "hack/kube-testbed build"} <= providers
    section = first_setup()
    assert [p for p in sorted(providers) if f"`{p}`" not in section] == []


def test_the_python_module_the_node_s_dns_needs_is_listed() -> None:
    assert "import dnslib" in node_checks()
    section = first_setup()
    assert "`dnslib`" in section and "FLEXINFER_NODE_PYTHON" in section


@pytest.mark.parametrize("script", sorted(COMPILATIONS))
def test_a_compilation_announces_its_time_from_the_measured_table(script: str) -> None:
    step = COMPILATIONS[script]
    table = [line for line in first_setup().splitlines() if line.startswith("| `")]
    assert any(line.startswith(f"| `{step}`") for line in table), f"no row for {step}"
    announced = [line for line in (ROOT / script).read_text(encoding="utf-8").splitlines()
                 if re.search(r'log "building .*\bmin\b', line)]
    assert announced, f"{script} does not say how long its build takes"
    assert all("docs/testing.md" in line for line in announced), announced
