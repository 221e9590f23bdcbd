"""A Hugging Face snapshot directory (``…/models--org--m/snapshots/<rev>``, what a model server is pointed at)
as the flash-loader's source: its links into ``../../blobs/`` stay inside the repository folder, so they are
staged as their blobs' contents under the snapshot's names; links that leave the repository folder and
dangling links are named and not followed. Built on a real hub-cache tree (``support.file_trees``) and, for
the command, through ``flexinfer flash-load`` in a child process configured by ``FLASH_SRC``/``FLASH_DST``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from flexinfer.core.errors import StagingError
from flexinfer.flashloader.config import StageSettings
from flexinfer.flashloader.staging import stage_blocking
from support.file_trees import read_tree, write_hf_snapshot, write_tree

REV = "0123456789abcdef0123456789abcdef01234567"
REV2 = "89abcdef0123456789abcdef0123456789abcdef"
FILES = {"config.json": b'{"model_type": "llama"}', "model.safetensors": b"w" * 70_000,
         "tokenizer/tokenizer.json": b'{"v": 1}'}


def hub_with_bad_links(tmp_path: Path) -> tuple[Path, Path]:
    """The hub cache of ``org/m`` (plus ``org/other``), whose snapshot also holds a link out of the repository
    folder into a sibling repository, one to a file outside the hub, and one to a blob that is not there."""
    hub = tmp_path / "hub"
    snapshot = write_hf_snapshot(hub, "org/m", REV, FILES, old={"old.safetensors": b"o" * 5000})
    write_hf_snapshot(hub, "org/other", REV, {"secret.bin": b"other repository"})
    write_tree(tmp_path, {"outside/passwd": b"root:x:0:0"})
    other_blob = next((hub / "models--org--other" / "blobs").iterdir())
    (snapshot / "sibling.bin").symlink_to(os.path.relpath(other_blob, snapshot))
    (snapshot / "escape.txt").symlink_to(tmp_path / "outside" / "passwd")
    (snapshot / "partial.safetensors").symlink_to("../../blobs/" + "f" * 64)
    return hub, snapshot


@pytest.mark.parametrize("verify", [False, True])
def test_snapshot_directory_stages_its_blobs_under_the_snapshot_names(tmp_path: Path, verify: bool) -> None:
    hub, snapshot = hub_with_bad_links(tmp_path)
    dst = tmp_path / "dst"
    report = stage_blocking(snapshot, dst, StageSettings(verify=verify))
    assert report.ok, report.failures
    assert read_tree(dst) == FILES
    assert not [path for path in dst.rglob("*") if path.is_symlink()]
    assert (report.files_copied, report.bytes_copied) == (len(FILES), sum(map(len, FILES.values())))
    assert report.verified == (len(FILES) if verify else 0)
    repo = hub.resolve() / "models--org--m"
    reasons = {issue.path: issue.reason for issue in report.ignored}
    sibling = os.readlink(snapshot / "sibling.bin")
    assert reasons == {
        "sibling.bin": f"symlink to {sibling} outside the source root and its Hugging Face repository folder "
                       f"{repo} (not followed)",
        "escape.txt": f"symlink to {tmp_path}/outside/passwd outside the source root and its Hugging Face "
                      f"repository folder {repo} (not followed)",
        "partial.safetensors": f"dangling symlink to ../../blobs/{'f' * 64} (not followed)",
    }
    again = stage_blocking(snapshot, dst, StageSettings(verify=verify))
    assert (again.files_copied, again.files_skipped, again.bytes_copied) == (0, len(FILES), 0)
    assert again.verified == (len(FILES) if verify else 0)


def test_a_new_revision_copies_only_the_blobs_that_changed(tmp_path: Path) -> None:
    hub = tmp_path / "hub"
    dst = tmp_path / "dst"
    stage_blocking(write_hf_snapshot(hub, "org/m", REV, FILES), dst)
    changed = {**FILES, "config.json": b'{"model_type": "llama", "rope": 2}'}
    report = stage_blocking(write_hf_snapshot(hub, "org/m", REV2, changed), dst, StageSettings(verify=True))
    assert (report.files_copied, report.files_skipped) == (1, len(FILES) - 1)
    assert read_tree(dst) == changed


def test_a_snapshot_whose_every_link_leaves_the_repository_is_still_an_error(tmp_path: Path) -> None:
    write_tree(tmp_path, {"elsewhere/weights.bin": b"w"})
    snapshot = tmp_path / "hub" / "models--org--m" / "snapshots" / REV
    snapshot.mkdir(parents=True)
    (snapshot / "weights.bin").symlink_to("../../../../elsewhere/weights.bin")
    with pytest.raises(StagingError, match=r"nothing to stage: .*weights\.bin: symlink to \.\./\.\./\.\./\.\./"
                                           r"elsewhere/weights\.bin outside the source root and its Hugging Face "
                                           r"repository folder .*/models--org--m \(not followed\)"):
        stage_blocking(snapshot, tmp_path / "dst")


def test_the_repository_folder_as_the_source_stages_snapshots_and_refs_but_not_blobs(tmp_path: Path) -> None:
    snapshot = write_hf_snapshot(tmp_path / "hub", "org/m", REV, FILES, old={"old.safetensors": b"o" * 5000})
    report = stage_blocking(snapshot.parent.parent, tmp_path / "dst")
    staged = read_tree(tmp_path / "dst")
    assert staged == {**{f"snapshots/{REV}/{rel}": data for rel, data in FILES.items()}, "refs/main": REV.encode()}
    assert report.ok and not report.ignored


def test_flash_load_command_stages_a_snapshot_reached_through_a_linked_cache_dir(tmp_path: Path) -> None:
    hub, snapshot = hub_with_bad_links(tmp_path)
    (tmp_path / "cache-link").symlink_to(hub, target_is_directory=True)
    src = tmp_path / "cache-link" / snapshot.relative_to(hub)
    env = {**os.environ, "FLASH_SRC": str(src), "FLASH_DST": str(tmp_path / "tmpfs")}
    done = subprocess.run([sys.executable, "-m", "flexinfer.cli.main", "flash-load", "--quiet"], env=env,
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert read_tree(tmp_path / "tmpfs") == FILES
    assert "flash-load: copied 3 files" in done.stdout
    ignored = sorted(line.split(":", 2)[1].strip() for line in done.stderr.splitlines() if "ignored" in line)
    assert ignored == ["ignored escape.txt", "ignored partial.safetensors", "ignored sibling.bin"]
    assert f"repository folder {hub.resolve()}/models--org--m (not followed)" in done.stderr
