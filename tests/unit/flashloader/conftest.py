"""Fixtures for flash-loader unit tests: build small source trees on the real filesystem."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

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


@pytest.fixture
def src(tmp_path: Path) -> Path:
    path = tmp_path / "src"
    path.mkdir()
    return path


@pytest.fixture
def dst(tmp_path: Path) -> Path:
    return tmp_path / "dst"


@pytest.fixture
def tree(src: Path) -> Callable[[Tree], Tree]:
    def make(files: Tree) -> Tree:
        write_tree(src, files)
        return files

    return make
