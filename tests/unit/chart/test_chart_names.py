"""The names an operator types. For any release name, every object the chart creates is named as the runbook's
names table says (and nothing else is created); the manager's Deployment and metrics Service carry the Go
chart's names; the label selectors the runbook uses find exactly what they claim; and no document names a
Deployment or Service of the release `flexinfer` that the chart does not render.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from support.helm_chart import CHART_DIR, NAMESPACE, Helm, find, parse_documents
from support.kube_testbed import REPO_ROOT

RUNBOOK = REPO_ROOT / "docs" / "operations" / "rocm-gfx1100.md"
EVERY_OBJECT = ("proxy.replicas=2", "metrics.serviceMonitor.enabled=true", "metrics.podMonitor.enabled=true")
"""Values that make the chart render its optional objects (PDB, ServiceMonitors, PodMonitor)."""
LEADER_ELECTION = "-leader-election"
RELEASES = [
    ("flexinfer", (), "flexinfer"),
    ("flexinfer-prod", (), "flexinfer-prod"),
    ("prod", (), "prod-flexinfer"),
    ("prod", ("fullnameOverride=flexinfer",), "flexinfer"),
    ("prod", ("nameOverride=infer",), "prod-infer"),
    ("x" * 40, (), "x" * 40 + "-flexinfer"),
]


def cut(name: str) -> str:
    """The chart's `trunc 63 | trimSuffix "-"`."""
    return name[:63].removesuffix("-")


def expected_name(pattern: str, fullname: str) -> str:
    """A name pattern of the runbook's table for one fullname, cut as the runbook says."""
    if pattern.endswith(LEADER_ELECTION):
        return cut(pattern.removesuffix(LEADER_ELECTION).replace("<fullname>", fullname)) + LEADER_ELECTION
    return cut(pattern.replace("<fullname>", fullname))


def names_section() -> str:
    return RUNBOOK.read_text().split("## Names of the installed objects", 1)[1].split("\n## ", 1)[0]


def names_table() -> list[tuple[list[str], str, str]]:
    """(kinds, name pattern, name for release `flexinfer`) per row of the runbook's names table."""
    rows = []
    for line in names_section().splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) != 4 or cells[1] in ("Kind", "---"):
            continue
        kinds = re.findall(r"\b[A-Z][A-Za-z]+\b", cells[1])
        rows.append((kinds, cells[2].strip("`"), cells[3].strip("`")))
    assert rows, "no names table in the runbook's names section"
    return rows


def render(helm: Helm, release: str, *set_args: str) -> list[dict[str, Any]]:
    sets = [arg for value in set_args for arg in ("--set", value)]
    return parse_documents(helm.run("template", release, str(CHART_DIR), "--namespace", NAMESPACE, *sets).stdout)


def every_object(helm: Helm, release: str, *set_args: str) -> list[dict[str, Any]]:
    """The release's objects with every optional one on, the proxy's RBAC in both of its forms."""
    return [*render(helm, release, *EVERY_OBJECT, *set_args),
            *render(helm, release, *EVERY_OBJECT, *set_args, "proxy.allNamespaces=true")]


@pytest.mark.parametrize(("release", "set_args", "fullname"), RELEASES,
                         ids=["flexinfer", "contains-flexinfer", "other", "fullnameOverride", "nameOverride", "long"])
def test_every_object_is_named_as_the_runbook_says(helm: Helm, release: str, set_args: tuple[str, ...],
                                                  fullname: str) -> None:
    rendered = {(d["kind"], d["metadata"]["name"]) for d in every_object(helm, release, *set_args)}
    documented = {(kind, expected_name(pattern, fullname)) for kinds, pattern, _ in names_table() for kind in kinds}
    assert documented == rendered, f"in the table only: {documented - rendered}; rendered only: {rendered - documented}"
    services = [name for kind, name in rendered if kind == "Service"]
    assert all(len(name) <= 63 for name in services), services  # a Service name is a DNS label


def test_the_table_column_for_release_flexinfer_is_exact() -> None:
    for _, pattern, example in names_table():
        assert expected_name(pattern, "flexinfer") == example, pattern


def test_the_manager_and_its_metrics_service_carry_the_go_names(helm: Helm) -> None:
    docs = render(helm, "prod")
    deployment = find(docs, "Deployment", "prod-flexinfer-controller")
    service = find(docs, "Service", "prod-flexinfer-controller-metrics")
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    assert [p["name"] for p in service["spec"]["ports"]] == ["metrics"]


def selector_matches(selector: str, labels: dict[str, str]) -> bool:
    return all(labels.get(key) == value for key, value in (term.split("=", 1) for term in selector.split(",")))


@pytest.mark.parametrize("release", ["flexinfer", "prod", "flexinfer-prod"])
def test_the_runbook_selectors_find_the_manager_for_any_release(helm: Helm, release: str) -> None:
    section = names_section()
    manager = re.search(r"get deploy -o name -l (\S+)\)", section)
    listing = re.search(r"get deploy,svc -l (\S+)\n", section)
    assert manager and listing, "the runbook's selector commands changed: update this test"
    docs = render(helm, release)

    def selected(selector: str, kinds: tuple[str, ...]) -> set[tuple[str, str]]:
        selector = selector.replace('"$RELEASE"', release)
        return {(d["kind"], d["metadata"]["name"]) for d in docs
                if d["kind"] in kinds and selector_matches(selector, d["metadata"].get("labels", {}))}

    fullname = release if "flexinfer" in release else f"{release}-flexinfer"
    assert selected(manager.group(1), ("Deployment",)) == {("Deployment", f"{fullname}-controller")}
    assert selected(listing.group(1), ("Deployment", "Service")) == {
        (kind, name) for kind, name in ((d["kind"], d["metadata"]["name"]) for d in docs)
        if kind in ("Deployment", "Service")}


KIND_OF = {"deploy": "Deployment", "deployment": "Deployment", "svc": "Service", "service": "Service"}


def documents() -> list[Path]:
    return [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").rglob("*.md"))]


def test_every_documented_deployment_and_service_of_the_release_exists(default_docs: list[dict[str, Any]]) -> None:
    """`deploy/flexinfer-…`, `svc/flexinfer-…`, `get deploy flexinfer-…` anywhere in the docs name an object the
    chart renders for the release `flexinfer` (a renamed object leaves no stale command behind)."""
    rendered = {(d["kind"], d["metadata"]["name"]) for d in default_docs}
    pattern = re.compile(r"\b(deploy|deployment|svc|service)(?:/| )(flexinfer-[a-z0-9-]*[a-z0-9])\b")
    seen: list[tuple[str, str, str]] = []
    for path in documents():
        for match in pattern.finditer(path.read_text()):
            seen.append((path.name, KIND_OF[match.group(1)], match.group(2)))
    assert any(name == "flexinfer-controller" for _, _, name in seen), "the smoke commands were not found"
    stale = [(doc, kind, name) for doc, kind, name in seen if (kind, name) not in rendered]
    assert stale == [], f"documents name objects the chart does not create: {stale}"


def test_the_metrics_spec_names_the_service_by_the_fullname_rule() -> None:
    text = (REPO_ROOT / "docs" / "specs" / "metrics.md").read_text()
    assert "`<fullname>-controller-metrics`" in text
    assert "manager-metrics" not in text


def test_the_go_name_differences_are_one_table_linked_from_the_readme() -> None:
    readme = (REPO_ROOT / "README.md").read_text()
    documentation = readme.split("## Documentation", 1)[1]
    assert "`docs/reference/go-differences.md`" in documentation
    page = (REPO_ROOT / "docs" / "reference" / "go-differences.md").read_text()
    tables = re.findall(r"(?:^\|.*\|\n)+", page, flags=re.MULTILINE)
    assert len(tables) == 1, "the Go name differences belong in one table"
    header = tables[0].splitlines()[0]
    assert header == "| Area | Go FlexInfer | FlexInfer | What to change |"
    assert "names-of-the-installed-objects" in page and "go-differences.md" in RUNBOOK.read_text()
