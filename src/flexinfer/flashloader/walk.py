"""One ``os.scandir`` pass over each tree: the source (what to copy) and the destination (what is there).

Called by ``flexinfer.flashloader.staging``. Symlinks are never followed (``lstat`` semantics: the
directory-entry type, then ``stat(follow_symlinks=False)``), so symlink loops and links pointing outside the
source cannot be entered; directories are also tracked by (device, inode) so a bind-mount cycle is
visited once. Entries excluded by pattern are pruned before they are stat'ed.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable
from dataclasses import dataclass, field

from flexinfer.flashloader.config import TMP_SUFFIX
from flexinfer.flashloader.plan import DestListing, SourceFile, is_excluded
from flexinfer.flashloader.report import FileIssue


@dataclass
class SourceListing:
    """Regular files to consider, entries deliberately not copied, and entries that could not be read."""

    files: list[SourceFile] = field(default_factory=list)
    ignored: list[FileIssue] = field(default_factory=list)
    errors: list[FileIssue] = field(default_factory=list)


def _join(rel_dir: str, name: str) -> str:
    return f"{rel_dir}/{name}" if rel_dir else name


def _list_dir(path: str) -> list[os.DirEntry[str]]:
    with os.scandir(path) as entries:
        return list(entries)


def walk_source(root: str, exclude: Iterable[str]) -> SourceListing:
    """Every non-excluded regular file under ``root`` (which must be a directory; symlinks not followed)."""
    patterns = tuple(exclude)
    listing = SourceListing()
    root_stat = os.stat(root)
    seen = {(root_stat.st_dev, root_stat.st_ino)}
    stack: list[tuple[str, str]] = [("", root)]
    while stack:
        rel_dir, path = stack.pop()
        try:
            entries = _list_dir(path)
        except OSError as error:
            listing.errors.append(FileIssue(rel_dir or ".", f"cannot list directory: {error.strerror}"))
            continue
        for entry in entries:
            child = _visit_source(entry, _join(rel_dir, entry.name), patterns, seen, listing)
            if child is not None:
                stack.append(child)
    return listing


def _visit_source(
    entry: os.DirEntry[str], rel: str, patterns: tuple[str, ...], seen: set[tuple[int, int]],
    listing: SourceListing,
) -> tuple[str, str] | None:
    """Record one entry; returns ``(rel, path)`` when it is a directory to descend into."""
    try:
        if entry.is_symlink():
            if not is_excluded(rel, entry.name, False, patterns):
                listing.ignored.append(FileIssue(rel, "symlink (not followed)"))
            return None
        is_dir = entry.is_dir(follow_symlinks=False)
        if is_excluded(rel, entry.name, is_dir, patterns):
            return None
        info = entry.stat(follow_symlinks=False)
    except OSError as error:
        listing.errors.append(FileIssue(rel, f"cannot stat: {error.strerror}"))
        return None
    if is_dir:
        key = (info.st_dev, info.st_ino)
        if key in seen:
            listing.ignored.append(FileIssue(rel, "directory already visited (mount loop)"))
            return None
        seen.add(key)
        return rel, entry.path
    if entry.is_file(follow_symlinks=False):
        listing.files.append(
            SourceFile(rel, info.st_size, info.st_mtime_ns, info.st_dev, info.st_ino, info.st_mode & 0o777)
        )
    else:
        listing.ignored.append(FileIssue(rel, "not a regular file (device, FIFO or socket)"))
    return None


def walk_destination(root: str) -> DestListing:
    """Regular-file sizes, real directories and leftover ``*.flash-tmp`` files under ``root``."""
    listing = DestListing()
    stack: list[tuple[str, str]] = [("", root)]
    while stack:
        rel_dir, path = stack.pop()
        try:
            entries = _list_dir(path)
        except FileNotFoundError:
            continue
        for entry in entries:
            rel = _join(rel_dir, entry.name)
            if entry.is_dir(follow_symlinks=False):
                listing.dirs.add(rel)
                stack.append((rel, entry.path))
            elif entry.name.endswith(TMP_SUFFIX):
                listing.stale.append(rel)
            elif entry.is_file(follow_symlinks=False):
                _record_size(listing, rel, entry)
    return listing


def _record_size(listing: DestListing, rel: str, entry: os.DirEntry[str]) -> None:
    with contextlib.suppress(FileNotFoundError):
        listing.sizes[rel] = entry.stat(follow_symlinks=False).st_size
