"""Small file trees on the real filesystem for flash-loader tests: write one, read one back."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

Tree = dict[str, bytes]


def write_tree(root: Path, files: Tree) -> None:
    """Create ``files`` (relative path → content) under ``root``."""
    for rel, content in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)


def read_tree(root: Path) -> Tree:
    """Every regular file under ``root`` (symlinks not followed) → content."""
    found: Tree = {}
    for dirpath, _dirs, names in os.walk(root):
        for name in names:
            path = Path(dirpath) / name
            if path.is_file() and not path.is_symlink():
                found[path.relative_to(root).as_posix()] = path.read_bytes()
    return found


def write_hf_snapshot(hub: Path, repo: str, revision: str, files: Tree, *, old: Tree | None = None) -> Path:
    """A Hugging Face hub cache entry as ``huggingface_hub`` lays it out: content-addressed files in
    ``models--<org>--<name>/blobs/<hash>``, ``snapshots/<revision>/<file>`` symlinks to ``../../blobs/<hash>``
    (relative, one ``..`` per directory level) and ``refs/main`` holding the revision. ``old``: blobs of an
    earlier revision that no snapshot links to any more. Returns the snapshot directory."""
    repo_dir = hub / ("models--" + repo.replace("/", "--"))
    blobs, snapshot = repo_dir / "blobs", repo_dir / "snapshots" / revision
    blobs.mkdir(parents=True, exist_ok=True)
    for content in (old or {}).values():
        (blobs / hashlib.sha256(content).hexdigest()).write_bytes(content)
    for rel, content in files.items():
        digest = hashlib.sha256(content).hexdigest()
        (blobs / digest).write_bytes(content)
        link = snapshot / rel
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blobs / digest, link.parent))
    (repo_dir / "refs").mkdir(exist_ok=True)
    (repo_dir / "refs" / "main").write_text(revision)
    return snapshot
