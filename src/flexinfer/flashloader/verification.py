"""Content and completeness checks for a staging run (only the size check runs when ``verify`` is off).

Called by ``flexinfer.flashloader.staging``: ``changed_files`` before copying (with ``verify``, a file of the
same size is skipped only when its checksum matches too) and ``check_expected`` after copying (every
expected file must exist at the destination with the source's size and, with ``verify``, its checksum).

Both report the bytes hashed (``on_bytes``), so a long checksum pass shows progress like the copy does.

Checksum: BLAKE2b from ``hashlib`` (128-bit digest). It ships with Python (no extra dependency), is one of
the fastest cryptographic hashes in pure C (~1 GB/s per core), and ``hashlib`` releases the GIL while
hashing, so the worker pool hashes files in parallel. A non-cryptographic hash (xxhash) would be faster but
is not installed here and would add a dependency for an opt-in path that is I/O-bound on real disks anyway.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Sequence
from concurrent.futures import Executor

from flexinfer.flashloader.plan import SourceFile
from flexinfer.flashloader.report import FileIssue

DIGEST_BYTES = 16


READ_BYTES = 1024 * 1024
OnBytes = Callable[[int], None]


def _ignore(nbytes: int) -> None:
    return None


def digest(path: str, on_bytes: OnBytes = _ignore) -> bytes:
    """BLAKE2b digest of a file's content (never follows a symlink at ``path``); ``on_bytes`` after each
    chunk read (progress of a long checksum pass)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    hasher = hashlib.blake2b(digest_size=DIGEST_BYTES)
    buffer = memoryview(bytearray(READ_BYTES))
    with os.fdopen(fd, "rb", buffering=0) as handle:
        while count := handle.readinto(buffer):
            hasher.update(buffer[:count])
            on_bytes(count)
    return hasher.digest()


def same_content(src_path: str, dst_path: str, on_bytes: OnBytes = _ignore) -> bool:
    """True when both files hash the same; an unreadable destination counts as different."""
    try:
        theirs = digest(dst_path, on_bytes)
    except OSError:
        return False
    return digest(src_path, on_bytes) == theirs


def changed_files(pool: Executor, files: Sequence[SourceFile], src_root: str, dst_root: str,
                  on_bytes: OnBytes = _ignore) -> list[SourceFile]:
    """Files among same-size candidates whose destination content differs (or whose source is unreadable)."""

    def differs(item: SourceFile) -> bool:
        try:
            return not same_content(os.path.join(src_root, item.src_rel), os.path.join(dst_root, item.rel),
                                    on_bytes)
        except OSError:
            return True

    return [item for item, changed in zip(files, pool.map(differs, files), strict=True) if changed]


def check_expected(
    pool: Executor, files: Sequence[SourceFile], src_root: str, dst_root: str, checksum: Sequence[SourceFile], *,
    on_bytes: OnBytes = _ignore,
) -> list[FileIssue]:
    """Every ``files`` entry present with the right size; ``checksum`` entries also compared by content."""
    problems = [issue for issue in (_size_problem(item, dst_root) for item in files) if issue is not None]
    bad = {issue.path for issue in problems}
    to_hash = [item for item in checksum if item.rel not in bad]
    for item in changed_files(pool, to_hash, src_root, dst_root, on_bytes):
        problems.append(FileIssue(item.rel, "verification failed: content differs from the source"))
    return problems


def _size_problem(item: SourceFile, dst_root: str) -> FileIssue | None:
    try:
        size = os.stat(os.path.join(dst_root, item.rel), follow_symlinks=False).st_size
    except OSError:
        return FileIssue(item.rel, "verification failed: missing at the destination")
    if size != item.size:
        return FileIssue(item.rel, f"verification failed: size {size} at the destination, {item.size} in the source")
    return None
