"""Staging a Hugging Face hub cache: snapshot symlinks become the files the server opens, blobs are not
copied twice, links never leave the source root (outside a hub repository; a snapshot directory as the source
is ``test_flash_hf_snapshot_source``), and a non-empty source of which nothing is selected is an error (it
used to stage "copied 0 files" and exit 0)."""

from __future__ import annotations

from pathlib import Path

import pytest

from flexinfer.core.errors import StagingError
from flexinfer.flashloader.config import StageSettings
from flexinfer.flashloader.plan import in_hf_hub_cache, is_hf_blob_store
from flexinfer.flashloader.staging import stage_blocking
from support.file_trees import read_tree, write_hf_snapshot, write_tree

REPO = "org/tiny"
REV = "0123456789abcdef0123456789abcdef01234567"
FILES = {"config.json": b'{"model_type": "llama"}', "model.safetensors": b"w" * 70_000,
         "tokenizer/tokenizer.json": b"{}"}
SNAPSHOT = f".cache/huggingface/hub/models--org--tiny/snapshots/{REV}"


def staged_snapshot(dst: Path) -> dict[str, bytes]:
    return {rel.removeprefix(SNAPSHOT + "/"): data for rel, data in read_tree(dst).items()
            if rel.startswith(SNAPSHOT + "/")}


@pytest.mark.parametrize("verify", [False, True])
def test_hf_snapshot_under_dot_cache_is_staged_as_the_files_the_server_reads(
        src: Path, dst: Path, verify: bool) -> None:
    write_hf_snapshot(src / ".cache/huggingface/hub", REPO, REV, FILES, old={"old.safetensors": b"o" * 5000})
    write_tree(src, {".cache/huggingface/download/x.metadata": b"m", ".cache/pip/wheel": b"p",
                     ".git/HEAD": b"ref"})
    report = stage_blocking(src, dst, StageSettings(verify=verify))
    assert report.ok, report.failures
    assert staged_snapshot(dst) == FILES
    staged = read_tree(dst)
    assert staged[".cache/huggingface/hub/models--org--tiny/refs/main"] == REV.encode()
    assert not [rel for rel in staged if "/blobs/" in rel or "download" in rel or "pip" in rel or ".git" in rel]
    assert report.files_copied == len(FILES) + 1 and report.bytes_copied == sum(map(len, FILES.values())) + len(REV)
    assert not any(p.is_symlink() for p in dst.rglob("*"))
    again = stage_blocking(src, dst, StageSettings(verify=verify))
    assert (again.files_copied, again.files_skipped) == (0, len(FILES) + 1)


def test_hub_cache_as_the_source_root(src: Path, dst: Path) -> None:
    write_hf_snapshot(src, REPO, REV, FILES)
    stage_blocking(src, dst)
    assert {rel.split(f"{REV}/", 1)[1]: data for rel, data in read_tree(dst).items() if REV + "/" in rel} == FILES


def test_links_leaving_the_root_are_named_and_never_followed(src: Path, dst: Path, tmp_path: Path) -> None:
    write_tree(tmp_path / "outside", {"secret.bin": b"s"})
    write_tree(src, {"real.bin": b"r"})
    (src / "secret.bin").symlink_to(tmp_path / "outside" / "secret.bin")
    (src / "up.bin").symlink_to("../outside/secret.bin")
    (src / "gone.bin").symlink_to("missing.bin")
    report = stage_blocking(src, dst)
    assert read_tree(dst) == {"real.bin": b"r"}
    reasons = {issue.path: issue.reason for issue in report.ignored}
    assert reasons["secret.bin"] == f"symlink to {tmp_path}/outside/secret.bin outside the source root (not followed)"
    assert reasons["up.bin"] == "symlink to ../outside/secret.bin outside the source root (not followed)"
    assert reasons["gone.bin"] == "dangling symlink to missing.bin (not followed)"


def test_everything_excluded_is_an_error_but_an_empty_source_is_not(src: Path, dst: Path) -> None:
    write_tree(src, {".cache/pip/wheel": b"p", ".git/HEAD": b"ref", "originals/raw.bin": b"r"})
    with pytest.raises(StagingError, match=r"nothing to stage.*excluded: .*\.cache/"):
        stage_blocking(src, dst, StageSettings(exclude=("originals/",)))
    empty = src.parent / "empty"
    empty.mkdir()
    assert stage_blocking(empty, dst).files_copied == 0


@pytest.mark.parametrize(("rel", "is_dir", "kept"), [
    (".cache", True, True), (".cache/huggingface", True, True), (".cache/huggingface/hub", True, True),
    (".cache/huggingface/hub/models--a--b/snapshots/r/x", False, True), ("sub/.cache/huggingface/hub/y", False, True),
    (".cache/huggingface", False, False), (".cache/huggingface/download", True, False), (".cache/pip", True, False),
    ("model.bin", False, False),
])
def test_which_cache_entries_are_the_hub(rel: str, is_dir: bool, kept: bool) -> None:
    assert in_hf_hub_cache(rel, is_dir) is kept


def test_blob_store_is_only_a_hub_repository_blobs_directory() -> None:
    assert is_hf_blob_store("hub/models--a--b/blobs", True)
    assert is_hf_blob_store("datasets--a--b/blobs", True)
    assert not is_hf_blob_store("weights/blobs", True)
    assert not is_hf_blob_store("models--a--b/blobs", False)
