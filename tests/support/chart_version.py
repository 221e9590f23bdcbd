"""The chart's version policy: every change to what ``charts/flexinfer`` renders comes with a new chart ``version``.

Flux builds a chart from a Git source once per chart version (``reconcileStrategy: ChartVersion``, its default),
and ``helm upgrade`` of a packaged chart is keyed by the version too, so a template change, or the revert of
one, that keeps the version never reaches a cluster. The policy is checked against a record kept next to the
chart tests (``tests/unit/chart/chart_version.yaml``): the version and a fingerprint of the chart at that version
(every file of the chart, ``Chart.yaml`` without its ``version`` line, plus the default render with the CRDs).
A fingerprint that moved while the version did not is the error this module describes.

Used by ``tests/unit/chart/test_chart_version.py`` and the chart-revert tests (``rollout_chart``: a chart
commit to roll out and revert).
"""

from __future__ import annotations

import hashlib
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import yaml

from support.helm_chart import CHART_DIR, NAMESPACE, RELEASE, Helm
from support.kube_testbed import REPO_ROOT

RECORD = REPO_ROOT / "tests" / "unit" / "chart" / "chart_version.yaml"
UPDATE_COMMAND = "FLEXINFER_UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/unit/chart"
_VERSION_LINE = re.compile(rb"^version:.*$", re.MULTILINE)
_SEMVER = re.compile(r"^(\d+)\.(\d+)\.(\d+)$")
_HEADER = """\
# The chart version and the fingerprint of charts/flexinfer at that version (tests/support/chart_version.py).
# A change to anything the chart renders needs a new `version` in charts/flexinfer/Chart.yaml; then record it:
#   FLEXINFER_UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/unit/chart
"""


@dataclass(frozen=True)
class ChartRecord:
    """A chart version and the fingerprint of the chart's content at that version."""

    version: str
    fingerprint: str


def chart_version(chart_dir: Path = CHART_DIR) -> str:
    """The ``version`` field of ``Chart.yaml``."""
    return str(yaml.safe_load((chart_dir / "Chart.yaml").read_text(encoding="utf-8"))["version"])


def semver(version: str) -> tuple[int, int, int]:
    """``MAJOR.MINOR.PATCH`` as a tuple; ``ValueError`` for anything else (the chart uses plain releases)."""
    match = _SEMVER.match(version)
    if match is None:
        raise ValueError(f"chart version {version!r} is not MAJOR.MINOR.PATCH")
    major, minor, patch = (int(part) for part in match.groups())
    return major, minor, patch


def chart_fingerprint(helm: Helm, chart_dir: Path = CHART_DIR) -> str:
    """``sha256:…`` over every file of the chart (``Chart.yaml`` without its ``version`` line) and the default
    render including the CRDs (the chart label's version replaced by a placeholder)."""
    digest = hashlib.sha256()
    for path in sorted(p for p in chart_dir.rglob("*") if p.is_file()):
        relative = path.relative_to(chart_dir).as_posix()
        data = path.read_bytes()
        if relative == "Chart.yaml":
            data = _VERSION_LINE.sub(b"version: <version>", data)
        digest.update(b"file\0" + relative.encode() + b"\0" + hashlib.sha256(data).digest())
    name = yaml.safe_load((chart_dir / "Chart.yaml").read_text(encoding="utf-8"))["name"]
    rendered = helm.run("template", RELEASE, str(chart_dir), "--namespace", NAMESPACE, "--include-crds").stdout
    rendered = rendered.replace(f"{name}-{chart_version(chart_dir)}", f"{name}-<version>")
    digest.update(b"render\0" + rendered.encode())
    return f"sha256:{digest.hexdigest()}"


def read_record(path: Path = RECORD) -> ChartRecord:
    """The recorded version and fingerprint."""
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    return ChartRecord(str(data["version"]), str(data["fingerprint"]))


def write_record(record: ChartRecord, path: Path = RECORD) -> None:
    """Record ``record`` (only ever for a version newer than the one recorded: see ``may_record``)."""
    path.write_text(_HEADER + yaml.safe_dump({"version": record.version, "fingerprint": record.fingerprint},
                                             sort_keys=False), encoding="utf-8")


def may_record(current: ChartRecord, recorded: ChartRecord) -> bool:
    """Whether ``current`` may replace ``recorded``: only under a newer version (a changed chart cannot be
    recorded under the version it already shipped as)."""
    return semver(current.version) > semver(recorded.version)


def policy_problem(current: ChartRecord, recorded: ChartRecord) -> str | None:
    """What is wrong with the chart against its record, as a message for the developer; ``None`` when it holds."""
    if current == recorded:
        return None
    if semver(current.version) <= semver(recorded.version):
        if current.fingerprint == recorded.fingerprint:
            return (f"charts/flexinfer/Chart.yaml says version {current.version} but {RECORD.name} records "
                    f"{recorded.version} for the same content: restore {recorded.version}, or bump above it")
        return (
            f"charts/flexinfer renders differently from what version {recorded.version} recorded "
            f"(tests/unit/chart/{RECORD.name}), but Chart.yaml's `version` is {current.version}. Flux "
            "(reconcileStrategy ChartVersion) and `helm upgrade` only re-render a chart under a new version, so "
            "this change, and a later revert of it, would never reach a cluster. Bump `version` in "
            "charts/flexinfer/Chart.yaml above "
            f"{recorded.version} (PATCH for a fix, MINOR for a new value, object or behaviour, MAJOR for a removed "
            f"or renamed value; appVersion stays the package version), then record it: {UPDATE_COMMAND}"
        )
    return (f"charts/flexinfer is now version {current.version} (recorded: {recorded.version}); record its "
            f"fingerprint: {UPDATE_COMMAND}")


ROLLOUT_MARKER = "rollout-marker"
"""The ConfigMap ``rollout_chart`` adds: ``<release>-rollout-marker`` in the release namespace."""
ROLLOUT_ANNOTATION = {"rollout": "2"}
"""The manager pod annotation ``rollout_chart`` makes a default."""


def rollout_chart(base: Path, target: Path) -> Path:
    """A copy of the chart at ``base`` with what a chart commit could change: a new object (a ConfigMap), a new
    default on the manager's pod template (``ROLLOUT_ANNOTATION``), and the patch version bumped as the policy
    demands. Returns ``target``."""
    shutil.copytree(base, target)
    (target / "templates" / f"{ROLLOUT_MARKER}.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n"
        f"  name: {{{{ .Release.Name }}}}-{ROLLOUT_MARKER}\n  namespace: {{{{ .Release.Namespace }}}}\n")
    values = target / "values.yaml"
    annotations = "".join(f'    {key}: "{value}"\n' for key, value in ROLLOUT_ANNOTATION.items())
    text = values.read_text()
    assert "  podAnnotations: {}\n" in text, "values.yaml changed: update rollout_chart"
    values.write_text(text.replace("  podAnnotations: {}\n", f"  podAnnotations:\n{annotations}", 1))
    major, minor, patch = semver(chart_version(base))
    chart = target / "Chart.yaml"
    chart.write_text(re.sub(r"^version: .*$", f"version: {major}.{minor}.{patch + 1}", chart.read_text(),
                            flags=re.MULTILINE))
    return target
