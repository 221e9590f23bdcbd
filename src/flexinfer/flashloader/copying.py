"""Copying one file (or one byte range of it) with the kernel's copy paths, into ``<dst>.flash-tmp``.

Called by ``flexinfer.flashloader.staging``'s worker threads. A ``FileCopy`` is split into ranges
(``plan.split_ranges``); each range is copied by whichever worker takes it, all into ONE temp file at
matching offsets, and the worker that finishes the last range checks the source did not change, fsyncs the
temp file and renames it over the final name. Any failure removes the temp file, so a final name only
ever holds a complete copy.

Kernel paths, best first: ``copy_file_range`` (in-kernel, no user-space copy) → ``sendfile`` (kernels that
refuse cross-filesystem ``copy_file_range``) → ``preadv``/``pwrite`` with a buffer of ``buffer_kb``. The
first path that works is remembered for the whole run (``Kernel``).

fsync before rename: free on tmpfs (the usual destination: the call is a no-op there) and, on a persistent
destination, the only way a power cut cannot leave a short file under the final name. The directory is not
fsynced: losing a rename in a power cut only means the next run copies that file again.
"""

from __future__ import annotations

import contextlib
import errno
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from flexinfer.flashloader.config import TMP_SUFFIX
from flexinfer.flashloader.plan import SourceFile

FALLBACK_ERRNOS = frozenset({errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL, errno.ENOTSUP})
DONTNEED_EVERY = 64 * 1024 * 1024
COPY_FILE_RANGE, SENDFILE, READ_WRITE = 0, 1, 2
OPEN_SOURCE = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
OPEN_TMP = os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC


class CopyAborted(Exception):
    """Stop copying a range: the run was cancelled or another range of the same file failed."""


class SourceChanged(OSError):
    """The source file is not the one the walk saw, or it changed while being copied."""


@dataclass
class Kernel:
    """Which copy path works for this source/destination pair (only ever moves down the list)."""

    level: int = COPY_FILE_RANGE

    def copy(self, src_fd: int, dst_fd: int, offset: int, count: int, buffer: memoryview) -> int:
        """Copy up to ``count`` bytes at ``offset`` (same offset in both files); 0 means end of source."""
        while True:
            level = self.level
            try:
                return _copy_once(level, src_fd, dst_fd, offset=offset, count=count, buffer=buffer)
            except OSError as error:
                if error.errno not in FALLBACK_ERRNOS or level == READ_WRITE:
                    raise
                self.level = max(self.level, level + 1)


def _copy_once(level: int, src_fd: int, dst_fd: int, *, offset: int, count: int, buffer: memoryview) -> int:
    if level == COPY_FILE_RANGE:
        return os.copy_file_range(src_fd, dst_fd, count, offset, offset)
    if level == SENDFILE:
        os.lseek(dst_fd, offset, os.SEEK_SET)
        return os.sendfile(dst_fd, src_fd, offset, count)
    got = os.preadv(src_fd, [buffer[:count]], offset)
    written = 0
    while written < got:
        written += os.pwrite(dst_fd, buffer[written:got], offset + written)
    return got


@dataclass
class FileCopy:
    """One file being copied: its ranges share ``tmp_path``; the last range to finish finalizes it."""

    source: SourceFile
    src_path: str
    final_path: str
    ranges: list[tuple[int, int]]
    error: str | None = None
    _pending: int = 0
    _created: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self._pending = len(self.ranges)

    @property
    def tmp_path(self) -> str:
        return self.final_path + TMP_SUFFIX

    def open_tmp(self) -> int:
        """Open the temp file for writing; the first caller creates it (truncated, pre-sized)."""
        with self._lock:
            if not self._created:
                fd = os.open(self.tmp_path, OPEN_TMP | os.O_CREAT | os.O_TRUNC, self.source.mode or 0o644)
                if len(self.ranges) > 1:
                    os.ftruncate(fd, self.source.size)
                self._created = True
                return fd
        return os.open(self.tmp_path, OPEN_TMP)

    def fail(self, reason: str) -> None:
        with self._lock:
            if self.error is None:
                self.error = reason

    def range_done(self) -> bool:
        """Count a finished range; True for the caller that finished the last one."""
        with self._lock:
            self._pending -= 1
            return self._pending == 0

    def discard(self) -> None:
        """Remove the temp file (failure path); a missing file is fine."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.tmp_path)


@dataclass
class RangeCopier:
    """Copies ranges for the worker threads of one run (shared kernel choice, cancellation, progress)."""

    buffer_bytes: int
    cancel: threading.Event
    on_bytes: Callable[[int], None]
    kernel: Kernel = field(default_factory=Kernel)
    _local: threading.local = field(default_factory=threading.local)

    def run(self, job: FileCopy, offset: int, length: int) -> bool:
        """Copy one range; returns True when this call completed (renamed) the whole file."""
        dst_fd = -1
        try:
            if job.error is None:
                dst_fd = self._copy(job, offset, length)
        except CopyAborted:
            job.fail(job.error or "cancelled")
        except OSError as error:
            job.fail(_describe(error))
        return self._finish(job, dst_fd)

    def _copy(self, job: FileCopy, offset: int, length: int) -> int:
        src_fd = os.open(job.src_path, OPEN_SOURCE)
        try:
            _check_identity(job.source, os.fstat(src_fd))
            os.posix_fadvise(src_fd, offset, length, os.POSIX_FADV_SEQUENTIAL)
            dst_fd = job.open_tmp()
            try:
                self._pump(job, src_fd, dst_fd, offset, length)
                _check_identity(job.source, os.fstat(src_fd))
            except BaseException:
                os.close(dst_fd)
                raise
            return dst_fd
        finally:
            os.close(src_fd)

    def _pump(self, job: FileCopy, src_fd: int, dst_fd: int, offset: int, length: int) -> None:
        buffer = self._buffer()
        position, end, since_drop = offset, offset + length, 0
        while position < end:
            if self.cancel.is_set() or job.error is not None:
                raise CopyAborted
            copied = self.kernel.copy(src_fd, dst_fd, position, min(self.buffer_bytes, end - position), buffer)
            if copied == 0:
                raise SourceChanged(errno.EIO, f"source shrank during copy (ended at byte {position})")
            position += copied
            since_drop += copied
            self.on_bytes(copied)
            if since_drop >= DONTNEED_EVERY:
                os.posix_fadvise(src_fd, position - since_drop, since_drop, os.POSIX_FADV_DONTNEED)
                since_drop = 0

    def _buffer(self) -> memoryview:
        """A per-thread buffer, used only by the read/write fallback."""
        buffer: memoryview | None = getattr(self._local, "buffer", None)
        if buffer is None or len(buffer) < self.buffer_bytes:
            buffer = memoryview(bytearray(self.buffer_bytes))
            self._local.buffer = buffer
        return buffer

    def _finish(self, job: FileCopy, dst_fd: int) -> bool:
        """Count the range; the last one renames (or discards) the temp file. Closes ``dst_fd``."""
        try:
            if not job.range_done():
                return False
            if job.error is None:
                _finalize(job, dst_fd)
            if job.error is not None:
                job.discard()
            return job.error is None
        finally:
            if dst_fd >= 0:
                os.close(dst_fd)


def _finalize(job: FileCopy, dst_fd: int) -> None:
    """Check the temp file's size, fsync it and rename it over the final name (errors go to ``job``)."""
    try:
        fd = dst_fd if dst_fd >= 0 else os.open(job.tmp_path, OPEN_TMP)
        try:
            written = os.fstat(fd).st_size
            if written != job.source.size:
                raise SourceChanged(errno.EIO, f"wrote {written} bytes, expected {job.source.size}")
            os.fsync(fd)
        finally:
            if fd != dst_fd:
                os.close(fd)
        os.rename(job.tmp_path, job.final_path)
    except OSError as error:
        job.fail(_describe(error))


def _check_identity(expected: SourceFile, actual: os.stat_result) -> None:
    """The open file must be the walked file (same inode), unchanged in size and modification time."""
    if (actual.st_dev, actual.st_ino) != (expected.dev, expected.ino):
        raise SourceChanged(errno.ESTALE, "source file was replaced after the scan")
    if actual.st_size != expected.size:
        raise SourceChanged(
            errno.EIO, f"source changed during copy (size {expected.size} -> {actual.st_size} bytes)",
        )
    if actual.st_mtime_ns != expected.mtime_ns:
        raise SourceChanged(errno.EIO, "source changed during copy (modified, same size)")


def _describe(error: OSError) -> str:
    if isinstance(error, SourceChanged):
        return str(error.strerror)
    where = f" ({error.filename})" if error.filename else ""
    return f"{error.strerror or error}{where}"
