"""One ``os.scandir`` pass over each tree: the source (what to copy) and the destination (what is there).

Called by ``flexinfer.flashloader.staging``. The walk never descends through a symlink (``lstat``
semantics: the directory-entry type, then ``stat(follow_symlinks=False)``), so symlink loops cannot be
entered; directories are also tracked by (device, inode) so a bind-mount cycle is visited once. A symlink
that resolves to a regular file inside its scope (``flexinfer.flashloader.link_scope``: the source root, and
the Hugging Face repository folder around a root inside one) is staged as that file's content under the
link's name — a Hugging Face snapshot (``models--org--name/snapshots/<rev>/config.json`` →
``../../blobs/<hash>``) becomes the plain files the server opens, whether the source is the hub cache, the
repository folder or the snapshot directory itself; a link that leaves its scope is never followed (listed
as ignored, with its target). Entries excluded by pattern are pruned before they are stat'ed; ``.cache/``
keeps its Hugging Face hub cache, and a repository's ``blobs/`` store is staged only through its snapshots
(``excluded``).
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass, field

from flexinfer.flashloader.config import CACHE_PATTERN, TMP_SUFFIX
from flexinfer.flashloader.link_scope import LinkScope
from flexinfer.flashloader.plan import DestListing, SourceFile, in_hf_hub_cache, is_excluded, is_hf_blob_store
from flexinfer.flashloader.report import FileIssue


@dataclass
class SourceListing:
    """Regular files to consider, entries deliberately not copied, and entries that could not be read.

    ``entries`` counts every directory entry seen (excluded ones too), so an empty source can be told
    apart from one where nothing was selected."""

    files: list[SourceFile] = field(default_factory=list)
    ignored: list[FileIssue] = field(default_factory=list)
    errors: list[FileIssue] = field(default_factory=list)
    entries: int = 0
    excluded: list[str] = field(default_factory=list)


def _join(rel_dir: str, name: str) -> str:
    return f"{rel_dir}/{name}" if rel_dir else name


def _list_dir(path: str) -> list[os.DirEntry[str]]:
    with os.scandir(path) as entries:
        return list(entries)


def walk_source(root: str, exclude: Iterable[str]) -> SourceListing:
    """Every non-excluded regular file under ``root`` (a directory; pass its real path), plus symlinked
    files that resolve inside their scope (see ``_resolve_link``)."""
    patterns = tuple(exclude)
    listing = SourceListing()
    scope = LinkScope.of(root)
    repo_name = os.path.basename(root) if scope.repo == root else ""
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
        listing.entries += len(entries)
        for entry in entries:
            rel = _join(rel_dir, entry.name)
            child = _visit_source(entry, rel, patterns, seen, listing=listing, scope=scope,
                                  repo_rel=_join(repo_name, rel))
            if child is not None:
                stack.append(child)
    return listing


def excluded(rel: str, name: str, is_dir: bool, patterns: tuple[str, ...], repo_rel: str = "") -> bool:
    """The exclusion rule of the walk: the patterns, except that the always-excluded ``.cache/`` keeps the
    Hugging Face hub cache under it; a hub repository's ``blobs/`` store is staged through its snapshots.
    ``repo_rel``: the path seen from above the root when the root is a repository folder itself
    (``models--org--m/blobs`` for ``blobs``)."""
    if in_hf_hub_cache(rel, is_dir):
        patterns = tuple(p for p in patterns if p != CACHE_PATTERN)
    return is_excluded(rel, name, is_dir, patterns) or is_hf_blob_store(repo_rel or rel, is_dir)


def _visit_source(
    entry: os.DirEntry[str], rel: str, patterns: tuple[str, ...], seen: set[tuple[int, int]], *,
    listing: SourceListing, scope: LinkScope, repo_rel: str,
) -> tuple[str, str] | None:
    """Record one entry; returns ``(rel, path)`` when it is a directory to descend into."""
    try:
        if entry.is_symlink():
            if excluded(rel, entry.name, False, patterns):
                listing.excluded.append(rel)
            else:
                _resolve_link(entry.path, rel, scope, listing)
            return None
        is_dir = entry.is_dir(follow_symlinks=False)
        if excluded(rel, entry.name, is_dir, patterns, repo_rel):
            listing.excluded.append(rel + "/" if is_dir else rel)
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
        listing.files.append(_source_file(rel, info))
    else:
        listing.ignored.append(FileIssue(rel, "not a regular file (device, FIFO or socket)"))
    return None


def _source_file(rel: str, info: os.stat_result, origin: str = "") -> SourceFile:
    return SourceFile(rel, info.st_size, info.st_mtime_ns, info.st_dev, info.st_ino, info.st_mode & 0o777, origin)


def _resolve_link(path: str, rel: str, scope: LinkScope, listing: SourceListing) -> None:
    """A symlink is staged as the regular file it resolves to (its content under the link's name) only
    when that file is inside ``scope``; a link outside it, to a directory, dangling or looping is listed as
    ignored, naming where it points. ``origin`` is the file's path relative to the root (``../../blobs/<hash>``
    for a snapshot root's link into its repository's blobs)."""
    target = os.path.realpath(path)
    shown = _link_text(path)
    if not scope.allows(target):
        listing.ignored.append(FileIssue(rel, scope.refusal(shown)))
        return
    try:
        info = os.stat(target, follow_symlinks=False)
    except FileNotFoundError:
        listing.ignored.append(FileIssue(rel, f"dangling symlink to {shown} (not followed)"))
        return
    if stat.S_ISREG(info.st_mode):
        listing.files.append(_source_file(rel, info, os.path.relpath(target, scope.root).replace(os.sep, "/")))
    elif stat.S_ISDIR(info.st_mode):
        listing.ignored.append(FileIssue(rel, f"symlink to directory {shown} (not followed)"))
    elif stat.S_ISLNK(info.st_mode):
        listing.ignored.append(FileIssue(rel, f"symlink loop through {shown} (not followed)"))
    else:
        listing.ignored.append(FileIssue(rel, f"symlink to {shown}: not a regular file (not followed)"))


def _link_text(path: str) -> str:
    try:
        return os.readlink(path)
    except OSError:
        return "?"


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
