"""The staging process: clean, scan, plan, check space, copy in parallel, verify, report.

``stage()`` is the library entry point (the local engine awaits it; ``flexinfer flash-load`` runs it with
``asyncio.run``). The blocking work runs in worker threads: ``stage_blocking`` on one executor thread, and
the copy/hash units on a pool of ``settings.concurrency`` threads. Cancelling ``stage()`` stops the workers
after their current chunk and leaves no temp file under a final name.

Whole-run problems (missing source, no space, a destination path in the way, a non-empty source of which
nothing is selected) raise ``StagingError``; per-file problems are collected in ``StageReport.failures``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import stat
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from pathlib import Path

from flexinfer.core.errors import InsufficientSpaceError, StagingError
from flexinfer.flashloader.config import StageSettings
from flexinfer.flashloader.copying import FileCopy, RangeCopier
from flexinfer.flashloader.link_scope import inside
from flexinfer.flashloader.pacing import Pace, chunk_bytes
from flexinfer.flashloader.plan import CopyPlan, SourceFile, apply_variant, build_plan, demote, required_space
from flexinfer.flashloader.plan import split_ranges as _split
from flexinfer.flashloader.progress import CHECKSUMMING, NullProgress, ProgressSink
from flexinfer.flashloader.report import FileIssue, StageReport
from flexinfer.flashloader.verification import changed_files, check_expected
from flexinfer.flashloader.walk import SourceListing, walk_destination, walk_source

FreeSpace = Callable[[str], int]


def statvfs_free(path: str) -> int:
    """Bytes available to unprivileged writers on the filesystem holding ``path``."""
    info = os.statvfs(path)
    return info.f_bavail * info.f_frsize


async def stage(
    src: str | os.PathLike[str], dst: str | os.PathLike[str], settings: StageSettings | None = None,
    progress: ProgressSink | None = None, *, free_space: FreeSpace | None = None,
) -> StageReport:
    """Stage ``src`` into ``dst`` without blocking the event loop; see ``stage_blocking``."""
    cancel = threading.Event()
    call = functools.partial(stage_blocking, src, dst, settings, progress, cancel=cancel, free_space=free_space)
    future = asyncio.get_running_loop().run_in_executor(None, call)
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        cancel.set()
        with contextlib.suppress(Exception):
            await future
        raise


def within_limit(limit_bytes: int, free_space: FreeSpace) -> FreeSpace:
    """A ``FreeSpace`` for a destination capped at ``limit_bytes`` (a tmpfs size limit): the lesser of what the
    filesystem has free and what the limit leaves beside the files already under the destination."""

    def available(path: str) -> int:
        used = sum(entry.lstat().st_size for entry in Path(path).rglob("*") if stat.S_ISREG(entry.lstat().st_mode))
        return max(0, min(free_space(path), limit_bytes - used))

    return available


def worker_count(requested: int) -> int:
    """Copy threads actually used: the requested concurrency, capped at the CPUs this process may run on.

    Kernel copies are CPU-bound memcpy on tmpfs; threads beyond the CPU count only contend (measured on
    2 CPUs: concurrency 8 ran at 0.6-0.8x of concurrency 2)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    return max(1, min(requested, cpus))


def stage_blocking(
    src: str | os.PathLike[str], dst: str | os.PathLike[str], settings: StageSettings | None = None,
    progress: ProgressSink | None = None, *, cancel: threading.Event | None = None,
    free_space: FreeSpace | None = None,
) -> StageReport:
    """Copy every selected file of ``src`` into ``dst`` (incrementally); returns the report.

    Unexpected OS errors outside a single file's copy (e.g. an unreadable destination directory) become
    ``StagingError`` so callers see one error type.
    """
    try:
        return _stage(Path(src), Path(dst), settings or StageSettings(), progress or NullProgress(), cancel=cancel,
                      free_space=free_space)
    except OSError as error:
        raise StagingError(f"staging {src} -> {dst} failed: {error}") from error


def _stage(
    src: Path, dst: Path, settings: StageSettings, sink: ProgressSink, *, cancel: threading.Event | None,
    free_space: FreeSpace | None,
) -> StageReport:
    started = time.monotonic()
    src_root, dst_root = prepare_roots(src, dst)
    dest = walk_destination(dst_root)
    stale = remove_stale(dst_root, dest.stale)
    listing = walk_source(src_root, settings.exclude)
    plan = build_plan(apply_variant(listing.files, settings.variant), dest)
    run = _Run(settings, sink, cancel or threading.Event(), src_root, dst_root)
    failures = [*listing.errors, *plan.rejected]
    if not (plan.copies or plan.unchanged or failures) and listing.entries:
        raise StagingError(nothing_selected(src, listing))
    if plan.copies or settings.verify:
        with ThreadPoolExecutor(worker_count(settings.concurrency), thread_name_prefix="flash-load") as pool:
            plan, copy_failures, verified = run.execute(pool, plan, free_space or statvfs_free)
        failures.extend(copy_failures)
    else:
        verified = 0
    failed = {issue.path for issue in failures}
    copied = [item for item in plan.copies if item.rel not in failed]
    return StageReport(
        files_copied=len(copied), files_skipped=len(plan.unchanged),
        bytes_copied=sum(item.size for item in copied), bytes_skipped=sum(item.size for item in plan.unchanged),
        seconds=time.monotonic() - started, stale_removed=stale, verified=verified,
        failures=tuple(failures), ignored=tuple(listing.ignored),
    )


class _Run:
    """The threaded part of one run (checksum pass, space check, copy, verification)."""

    def __init__(
        self, settings: StageSettings, sink: ProgressSink, cancel: threading.Event, src_root: str, dst_root: str,
    ) -> None:
        self.settings, self.sink, self.cancel = settings, sink, cancel
        self.src_root, self.dst_root = src_root, dst_root

    def execute(self, pool: Executor, plan: CopyPlan, free_space: FreeSpace) -> tuple[CopyPlan, list[FileIssue], int]:
        if self.settings.verify:
            with self._checksumming(plan.unchanged):
                changed = changed_files(pool, plan.unchanged, self.src_root, self.dst_root, self.sink.advance)
            plan = demote(plan, changed)
        if plan.copies:
            check_space(self.dst_root, plan.bytes_to_copy, free_space)
            make_dirs(self.dst_root, plan.new_dirs)
        failures = self.copy_all(pool, plan.copies)
        if not self.settings.verify:
            return plan, failures, 0
        failed = {issue.path for issue in failures}
        expected = [item for item in (*plan.unchanged, *plan.copies) if item.rel not in failed]
        copied = [item for item in plan.copies if item.rel not in failed]
        with self._checksumming(copied):
            problems = check_expected(pool, expected, self.src_root, self.dst_root, copied, on_bytes=self.sink.advance)
        return plan, failures + problems, len(expected) - len(problems)

    @contextlib.contextmanager
    def _checksumming(self, items: Sequence[SourceFile]) -> Iterator[None]:
        """A checksum pass over ``items`` as one progress task (both sides of each file are read)."""
        self.sink.begin(len(items), 2 * sum(item.size for item in items), CHECKSUMMING)
        try:
            yield
        finally:
            self.sink.end()

    def copy_all(self, pool: Executor, copies: Sequence[SourceFile]) -> list[FileIssue]:
        """Copy every file, big files as ranges spread over the pool; returns per-file failures."""
        jobs = [self._job(item) for item in copies]
        units = sorted(((job, start, length) for job in jobs for start, length in job.ranges), key=lambda u: -u[2])
        copier = RangeCopier(chunk_bytes(self.settings.buffer_bytes, self.settings.max_rate), self.cancel,
                             self._on_copied())

        def run(unit: tuple[FileCopy, int, int]) -> None:
            job, start, length = unit
            if copier.run(job, start, length):
                self.sink.file_done(job.source.rel, job.source.size)

        self.sink.begin(len(jobs), sum(item.size for item in copies))
        try:
            list(pool.map(run, units))
        finally:
            self.sink.end()
        return [FileIssue(job.source.rel, job.error) for job in jobs if job.error is not None]

    def _on_copied(self) -> Callable[[int], None]:
        """Progress for each copied chunk, paced to ``settings.max_rate`` when it is set."""
        if self.settings.max_rate <= 0:
            return self.sink.advance
        pace = Pace(self.settings.max_rate, self.cancel)

        def copied(nbytes: int) -> None:
            self.sink.advance(nbytes)
            pace.after(nbytes)

        return copied

    def _job(self, item: SourceFile) -> FileCopy:
        return FileCopy(
            source=item, src_path=os.path.join(self.src_root, item.src_rel),
            final_path=os.path.join(self.dst_root, item.rel), ranges=_split(item.size, self.settings.chunk_bytes),
        )


def nothing_selected(src: Path, listing: SourceListing, shown: int = 3) -> str:
    """The error for a source that is not empty but of which nothing would be staged (a server would
    start without its weights), naming what was excluded and ignored."""
    parts = []
    if listing.excluded:
        more = f" (+{len(listing.excluded) - shown} more)" if len(listing.excluded) > shown else ""
        parts.append(f"excluded: {', '.join(listing.excluded[:shown])}{more}")
    if listing.ignored:
        more = f" (+{len(listing.ignored) - shown} more)" if len(listing.ignored) > shown else ""
        parts.append(f"ignored: {'; '.join(str(issue) for issue in listing.ignored[:shown])}{more}")
    return (f"nothing to stage: source {src} is not empty ({listing.entries} entries) but no file in it is "
            f"selected ({'; '.join(parts)}); check the source path and the exclude patterns")


def prepare_roots(src: Path, dst: Path) -> tuple[str, str]:
    """Check the source is a readable directory, refuse overlapping trees, then create the destination."""
    try:
        info = os.stat(src)
        os.listdir(src)
    except FileNotFoundError:
        raise StagingError(f"source directory {src} does not exist") from None
    except NotADirectoryError:
        raise StagingError(f"source {src} is not a directory") from None
    except OSError as error:
        raise StagingError(f"cannot read source directory {src}: {error.strerror}") from None
    if not stat.S_ISDIR(info.st_mode):
        raise StagingError(f"source {src} is not a directory")
    src_real, dst_real = os.path.realpath(src), os.path.realpath(dst)  # before creating dst: refuse first
    if inside(src_real, dst_real) or inside(dst_real, src_real):
        raise StagingError(f"source {src} and destination {dst} overlap; staging needs two separate trees")
    try:
        dst.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise StagingError(f"cannot create destination directory {dst}: {error.strerror}") from None
    return src_real, os.path.realpath(dst)


def remove_stale(dst_root: str, stale: Sequence[str]) -> int:
    """Delete leftover ``*.flash-tmp`` files from an interrupted run; returns how many were removed."""
    removed = 0
    for rel in stale:
        try:
            os.unlink(os.path.join(dst_root, rel))
            removed += 1
        except FileNotFoundError:
            continue
        except OSError as error:
            raise StagingError(f"cannot remove stale temp file {rel} in {dst_root}: {error.strerror}") from None
    return removed


def check_space(dst_root: str, bytes_to_copy: int, free_space: FreeSpace) -> None:
    """Raise ``InsufficientSpaceError`` unless the copy plus headroom fits in the destination."""
    needed = required_space(bytes_to_copy)
    available = free_space(dst_root)
    if available < needed:
        raise InsufficientSpaceError(needed, available, dst_root)


def make_dirs(dst_root: str, rels: Sequence[str]) -> None:
    """Create destination directories (parents first), refusing anything that is not a real directory."""
    for rel in rels:
        path = os.path.join(dst_root, rel)
        try:
            os.mkdir(path)
        except FileExistsError:
            if not stat.S_ISDIR(os.lstat(path).st_mode):
                raise StagingError(f"destination path {path} exists and is not a directory") from None
        except OSError as error:
            raise StagingError(f"cannot create destination directory {path}: {error.strerror}") from None
