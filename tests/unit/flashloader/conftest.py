"""Fixtures for flash-loader unit tests: build small source trees on the real filesystem."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from support.file_trees import Tree, read_tree, write_tree

__all__ = ["Tree", "read_tree", "write_tree"]


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
