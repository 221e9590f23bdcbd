"""Kernel copy paths and their fallbacks, range copies into one temp file, atomic finalize."""

from __future__ import annotations

import errno
import os
import threading
from pathlib import Path

import pytest

from flexinfer.flashloader import copying
from flexinfer.flashloader.copying import COPY_FILE_RANGE, READ_WRITE, SENDFILE, FileCopy, Kernel, RangeCopier
from flexinfer.flashloader.plan import SourceFile, split_ranges


def job_for(src_file: Path, dst_file: Path, chunk: int) -> FileCopy:
    info = src_file.stat()
    source = SourceFile(src_file.name, info.st_size, info.st_mtime_ns, info.st_dev, info.st_ino, 0o644)
    return FileCopy(source, str(src_file), str(dst_file), split_ranges(info.st_size, chunk))


def copy_all(job: FileCopy, kernel: Kernel, buffer: int = 4096) -> tuple[bool, list[int]]:
    seen: list[int] = []
    copier = RangeCopier(buffer, threading.Event(), seen.append, kernel=kernel)
    done = [copier.run(job, offset, length) for offset, length in reversed(job.ranges)]
    return done[-1], seen


@pytest.mark.parametrize("level", [COPY_FILE_RANGE, SENDFILE, READ_WRITE])
def test_each_kernel_path_copies_ranges_exactly(tmp_path: Path, level: int) -> None:
    data = os.urandom(40_000)
    (tmp_path / "a.bin").write_bytes(data)
    job = job_for(tmp_path / "a.bin", tmp_path / "out.bin", chunk=9_000)
    completed, seen = copy_all(job, Kernel(level))
    assert completed and (tmp_path / "out.bin").read_bytes() == data and sum(seen) == len(data)
    assert not (tmp_path / "out.bin.flash-tmp").exists()


@pytest.mark.parametrize("code", [errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL])
def test_falls_back_when_copy_file_range_refuses(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int) -> None:
    def refuse(*_args: object) -> int:
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(copying.os, "copy_file_range", refuse)
    data = os.urandom(10_000)
    (tmp_path / "a.bin").write_bytes(data)
    kernel = Kernel()
    completed, _ = copy_all(job_for(tmp_path / "a.bin", tmp_path / "out.bin", chunk=4096), kernel)
    assert completed and kernel.level == SENDFILE and (tmp_path / "out.bin").read_bytes() == data


def test_falls_back_to_read_write_when_sendfile_refuses(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*_args: object) -> int:
        raise OSError(errno.EINVAL, "nope")

    monkeypatch.setattr(copying.os, "copy_file_range", refuse)
    monkeypatch.setattr(copying.os, "sendfile", refuse)
    data = os.urandom(10_000)
    (tmp_path / "a.bin").write_bytes(data)
    kernel = Kernel()
    completed, _ = copy_all(job_for(tmp_path / "a.bin", tmp_path / "out.bin", chunk=4096), kernel, buffer=1000)
    assert completed and kernel.level == READ_WRITE and (tmp_path / "out.bin").read_bytes() == data


def test_real_io_error_is_not_masked_by_fallback(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*_args: object) -> int:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(copying.os, "copy_file_range", broken)
    (tmp_path / "a.bin").write_bytes(b"x" * 100)
    job = job_for(tmp_path / "a.bin", tmp_path / "out.bin", chunk=4096)
    completed, _ = copy_all(job, Kernel())
    assert not completed and job.error is not None and "Input/output error" in job.error
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.bin"]


def test_failed_range_discards_the_shared_temp_file(tmp_path: Path) -> None:
    data = os.urandom(30_000)
    (tmp_path / "a.bin").write_bytes(data)
    job = job_for(tmp_path / "a.bin", tmp_path / "out.bin", chunk=10_000)
    copier = RangeCopier(4096, threading.Event(), lambda _n: None)
    assert not copier.run(job, *job.ranges[0])
    assert (tmp_path / "out.bin.flash-tmp").exists()
    job.fail("simulated failure in another worker")
    assert not copier.run(job, *job.ranges[1]) and not copier.run(job, *job.ranges[2])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.bin"]


def test_cancel_stops_and_discards(tmp_path: Path) -> None:
    (tmp_path / "a.bin").write_bytes(b"x" * 10_000)
    job = job_for(tmp_path / "a.bin", tmp_path / "out.bin", chunk=100_000)
    cancel = threading.Event()
    cancel.set()
    assert not RangeCopier(4096, cancel, lambda _n: None).run(job, 0, 10_000)
    assert job.error == "cancelled" and sorted(p.name for p in tmp_path.iterdir()) == ["a.bin"]
