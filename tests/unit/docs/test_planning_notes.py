"""docs/planning: the slice's planning note and its index exist and pass the note's own validation commands.

The design note this slice started from validates its documents with ``git diff --check`` and
``rg 'Readiness|Implementation Slices|Rollout' docs/planning/rocm-gfx1100-deploy-swap-tracing-slice.md``. That
``rg`` command runs here verbatim with the real ripgrep (``hack/install-system-deps`` installs it), as do the
other ``rg`` checks the note lists; ``git diff --check`` is applied to the notes themselves (as additions), so
it does not depend on what else the working tree holds. The note must also name every field and kind the CRDs
add beyond the Go API, since it explains each departure from the plan's "no new CRD fields".
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]
PLANNING = ROOT / "docs" / "planning"
NOTE = PLANNING / "rocm-gfx1100-deploy-swap-tracing-slice.md"
SEED_VALIDATION = "rg 'Readiness|Implementation Slices|Rollout' docs/planning/rocm-gfx1100-deploy-swap-tracing-slice.md"
"""The design note's validation command, verbatim."""
GO_FIELD_NAMES = ROOT / "tests" / "unit" / "api" / "data" / "go_field_names.yaml"
REPO_PATH = re.compile(r"`((?:src|tests|docs|charts|hack|bench|examples|images)/[^`\s]*)`")


def ripgrep() -> str:
    found = shutil.which("rg")
    assert found, "ripgrep (rg) is not installed: run hack/install-system-deps (Debian package `ripgrep`)"
    return found


def sh(command: str) -> subprocess.CompletedProcess[str]:
    ripgrep()
    return subprocess.run(["bash", "-c", command], cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)


def validation_commands() -> list[str]:
    """The command lines of the note's "Validation" section (its first code block)."""
    section = NOTE.read_text().split("\n## Validation", 1)[1].split("\n## ", 1)[0]
    block = section.split("```sh\n", 1)[1].split("```", 1)[0]
    return [line.strip() for line in block.splitlines() if line.strip()]


def test_the_design_notes_validation_command_passes() -> None:
    assert SEED_VALIDATION in validation_commands()
    result = sh(SEED_VALIDATION)
    assert result.returncode == 0, result.stderr
    headings = [line for line in result.stdout.splitlines() if line.startswith("#")]
    for word in ("Readiness", "Implementation Slices", "Rollout"):
        assert any(word in heading for heading in headings), f"no heading with {word!r}: {headings}"


@pytest.mark.parametrize("command", [c for c in validation_commands() if c.startswith("rg ")])
def test_every_rg_check_of_the_note_finds_its_pattern(command: str) -> None:
    result = sh(command)
    assert result.returncode == 0, f"{command!r} found nothing: {result.stderr}"


@pytest.mark.parametrize("path", [NOTE, PLANNING / "README.md"], ids=lambda p: p.name)
def test_the_planning_documents_pass_git_diff_check(path: Path) -> None:
    """``git diff --check`` on the document as a new file: trailing whitespace, space before tab, blank lines
    at the end are all reported."""
    result = subprocess.run(["git", "diff", "--no-index", "--check", "/dev/null", str(path.relative_to(ROOT))],
                            cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode in (0, 1) and result.stdout == "", result.stdout


def test_the_index_lists_every_note() -> None:
    index = (PLANNING / "README.md").read_text()
    notes = sorted(p.name for p in PLANNING.glob("*.md") if p.name != "README.md")
    assert notes == ["rocm-gfx1100-deploy-swap-tracing-slice.md"]
    assert all(f"]({name})" in index for name in notes)


def test_the_note_explains_every_crd_addition_beyond_the_go_api() -> None:
    departures = NOTE.read_text().split("## Departures from the plan", 1)[1].split("\n## ", 1)[0]
    additions = yaml.safe_load(GO_FIELD_NAMES.read_text())
    for kind, names in additions.items():
        for path in names["flexinfer_only"]:
            leaf = re.escape(path.rsplit(".", 1)[-1])
            assert re.search(rf"[`.]{leaf}[`.]", departures), f"{kind}.{path} is not explained in the departures"
    new_kinds = [kind for kind, names in additions.items() if not names["go"]]
    assert new_kinds == ["ModelDemand"] and "`ModelDemand`" in departures


def test_every_path_the_note_cites_exists() -> None:
    cited = set(REPO_PATH.findall(NOTE.read_text()))
    assert cited, "the note cites no files"
    missing = sorted(path for path in cited if not (ROOT / path.rstrip("/")).exists())
    assert missing == [], f"the note cites paths that do not exist: {missing}"
