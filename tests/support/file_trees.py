"""Small file trees on the real filesystem for flash-loader tests: write one, read one back."""

from __future__ import annotations

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
