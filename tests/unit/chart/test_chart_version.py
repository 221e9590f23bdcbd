"""The chart's version policy: a change to what charts/flexinfer renders comes with a new chart `version`, so a
Flux reconcile (and its revert) re-renders it; `appVersion` is the package version, the default image tag.

The record (`chart_version.yaml` here) holds the version and the fingerprint of the chart at that version
(tests/support/chart_version.py). After bumping `version` in Chart.yaml, record the new fingerprint with
``FLEXINFER_UPDATE_GOLDEN=1 pytest tests/unit/chart`` (it refuses to record a change under the old version).
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest

from support.chart_version import (
    ChartRecord,
    chart_fingerprint,
    chart_version,
    may_record,
    policy_problem,
    read_record,
    semver,
    write_record,
)
from support.helm_chart import CHART_DIR, Helm

FIRST_VERSION = "0.1.0"
"""The version every template change before this policy shipped under: the chart must be past it."""


def copy_chart(tmp_path: Path) -> Path:
    target = tmp_path / "flexinfer"
    shutil.copytree(CHART_DIR, target)
    return target


def set_version(chart_dir: Path, version: str) -> None:
    chart = chart_dir / "Chart.yaml"
    chart.write_text(re.sub(r"^version: .*$", f"version: {version}", chart.read_text(), flags=re.MULTILINE))


def test_the_chart_version_moves_with_what_it_renders(helm: Helm) -> None:
    current = ChartRecord(chart_version(), chart_fingerprint(helm))
    recorded = read_record()
    if os.environ.get("FLEXINFER_UPDATE_GOLDEN") == "1" and may_record(current, recorded):
        write_record(current)
        recorded = read_record()
    problem = policy_problem(current, recorded)
    assert problem is None, problem


def test_the_version_is_past_the_one_the_earlier_templates_shipped_under() -> None:
    assert semver(chart_version()) > semver(FIRST_VERSION)


@pytest.mark.parametrize(("relative", "edit"), [
    ("templates/extra.yaml", "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: extra\n"),
    ("values.yaml", "\nextraDefault: true\n"),
    ("templates/NOTES.txt", "\nOne more line.\n"),
    ("crds/ai.flexinfer_models.yaml", "\n# a CRD edit\n"),
], ids=["new-template", "values", "notes", "crd"])
def test_a_chart_change_without_a_bump_is_refused(helm: Helm, tmp_path: Path, relative: str, edit: str) -> None:
    chart = copy_chart(tmp_path)
    before = ChartRecord(chart_version(chart), chart_fingerprint(helm, chart))
    target = chart / relative
    schema = chart / "values.schema.json"
    if relative == "values.yaml":  # the schema is closed: let the new key through
        schema.write_text(schema.read_text().replace('"additionalProperties": false,', "", 1))
    target.write_text((target.read_text() if target.exists() else "") + edit)
    changed = ChartRecord(before.version, chart_fingerprint(helm, chart))
    assert changed.fingerprint != before.fingerprint
    problem = policy_problem(changed, before)
    assert problem is not None and "Bump `version` in charts/flexinfer/Chart.yaml" in problem
    assert not may_record(changed, before)

    major, minor, patch = semver(before.version)
    set_version(chart, f"{major}.{minor}.{patch + 1}")
    bumped = ChartRecord(chart_version(chart), chart_fingerprint(helm, chart))
    assert bumped.fingerprint == changed.fingerprint  # the version itself is not part of the fingerprint
    assert may_record(bumped, before)
    assert policy_problem(bumped, bumped) is None


def test_a_revert_of_change_and_bump_matches_the_record_again(helm: Helm, tmp_path: Path) -> None:
    """`git revert` of a chart commit restores both the files and the version: the record of the earlier version
    holds again (and Flux sees a different chart version, so it re-renders)."""
    chart = copy_chart(tmp_path)
    before = ChartRecord(chart_version(chart), chart_fingerprint(helm, chart))
    notes = chart / "templates" / "NOTES.txt"
    original = notes.read_text()
    notes.write_text(original + "\nchanged\n")
    set_version(chart, "99.0.0")
    notes.write_text(original)
    set_version(chart, before.version)
    assert ChartRecord(chart_version(chart), chart_fingerprint(helm, chart)) == before


def test_the_fingerprint_covers_the_render_not_the_version(helm: Helm, tmp_path: Path) -> None:
    chart = copy_chart(tmp_path)
    first = chart_fingerprint(helm, chart)
    set_version(chart, "7.7.7")
    assert chart_fingerprint(helm, chart) == first
    (chart / "values.yaml").write_text((chart / "values.yaml").read_text().replace("port: 80\n", "port: 81\n", 1))
    assert chart_fingerprint(helm, chart) != first


def test_versions_must_be_plain_semver() -> None:
    assert semver("0.2.0") == (0, 2, 0)
    with pytest.raises(ValueError, match=r"MAJOR\.MINOR\.PATCH"):
        semver("0.2")
    assert not may_record(ChartRecord("0.10.0", "a"), ChartRecord("0.10.0", "b"))
    assert may_record(ChartRecord("0.10.0", "a"), ChartRecord("0.9.9", "b"))
