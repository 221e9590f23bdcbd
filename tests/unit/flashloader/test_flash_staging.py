"""stage()/stage_blocking() on a real filesystem: copy, incremental, verify, filters, symlinks, faults."""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path

import pytest

from flexinfer.core.errors import InsufficientSpaceError, StagingError
from flexinfer.flashloader.config import StageSettings
from flexinfer.flashloader.staging import stage, stage_blocking, within_limit
from support.file_trees import read_tree, write_tree

MODEL = {
    "config.json": b"{}",
    "model-00001.safetensors": os.urandom(300_000),
    "model-00002.safetensors": os.urandom(123_457),
    "tokenizer/vocab.txt": b"a\nb\n",
    "empty.bin": b"",
}


def test_copies_tree_and_reports(src: Path, dst: Path) -> None:
    write_tree(src, MODEL)
    report = stage_blocking(src, dst)
    assert read_tree(dst) == MODEL
    assert report.ok and report.files_copied == len(MODEL) and report.files_skipped == 0
    assert report.bytes_copied == sum(len(v) for v in MODEL.values())
    assert report.seconds > 0 and report.gbps > 0
    assert "copied 5 files" in report.summary()


def test_second_run_skips_everything(src: Path, dst: Path) -> None:
    write_tree(src, MODEL)
    stage_blocking(src, dst)
    again = stage_blocking(src, dst)
    assert (again.files_copied, again.files_skipped, again.bytes_copied) == (0, len(MODEL), 0)


def test_size_change_is_recopied_but_same_size_edit_needs_verify(src: Path, dst: Path) -> None:
    write_tree(src, {"a.bin": b"1234", "b.bin": b"abcd"})
    stage_blocking(src, dst)
    write_tree(src, {"a.bin": b"12345", "b.bin": b"ABCD"})
    plain = stage_blocking(src, dst)
    assert plain.files_copied == 1 and read_tree(dst) == {"a.bin": b"12345", "b.bin": b"abcd"}
    verified = stage_blocking(src, dst, StageSettings(verify=True))
    assert verified.files_copied == 1 and verified.verified == 2
    assert read_tree(dst) == {"a.bin": b"12345", "b.bin": b"ABCD"}


def test_big_files_split_into_ranges_across_workers(src: Path, dst: Path) -> None:
    big = os.urandom(5 * 65536 + 17)
    write_tree(src, {"shard.safetensors": big, "small.txt": b"x"})
    settings = StageSettings(concurrency=4, buffer_kb=16, chunk_bytes=65536, verify=True)
    report = stage_blocking(src, dst, settings)
    assert report.ok and read_tree(dst) == {"shard.safetensors": big, "small.txt": b"x"}


def test_stale_temp_files_are_removed(src: Path, dst: Path) -> None:
    write_tree(src, {"a.bin": b"data"})
    write_tree(dst, {"a.bin.flash-tmp": b"da", "deep/old.flash-tmp": b"zz"})
    report = stage_blocking(src, dst)
    assert report.stale_removed == 2
    assert read_tree(dst) == {"a.bin": b"data"}


def test_excludes_and_variant(src: Path, dst: Path) -> None:
    write_tree(src, {
        "model.safetensors": b"full", "model.fp16.safetensors": b"half", ".cache/hf/blob": b"c",
        "sub/.git/HEAD": b"g", "originals/raw.bin": b"r", ".gitattributes": b"*",
    })
    settings = StageSettings(exclude=("originals/",), variant="fp16")
    stage_blocking(src, dst, settings)
    assert read_tree(dst) == {"model.fp16.safetensors": b"half", ".gitattributes": b"*"}


def test_symlinks_loops_and_escapes_are_not_followed(src: Path, dst: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    write_tree(outside, {"secret.bin": b"s"})
    write_tree(src, {"real.bin": b"r", "sub/x.bin": b"x"})
    (src / "loop").symlink_to(".")
    (src / "sub" / "up").symlink_to("..")
    (src / "a").symlink_to("b")
    (src / "b").symlink_to("a")
    (src / "escape").symlink_to(outside)
    (src / "file-link.bin").symlink_to(outside / "secret.bin")
    report = stage_blocking(src, dst)
    assert read_tree(dst) == {"real.bin": b"r", "sub/x.bin": b"x"}
    assert not any(p.is_symlink() for p in dst.rglob("*"))
    assert {i.path for i in report.ignored} == {"loop", "sub/up", "a", "b", "escape", "file-link.bin"}


def test_fifo_is_ignored_without_blocking(src: Path, dst: Path) -> None:
    write_tree(src, {"a.bin": b"a"})
    os.mkfifo(src / "pipe")
    report = stage_blocking(src, dst)
    assert report.ok and [i.path for i in report.ignored] == ["pipe"]


@pytest.mark.parametrize("kind", ["missing", "file", "fifo"])
def test_bad_source_is_a_clear_error(tmp_path: Path, dst: Path, kind: str) -> None:
    path = tmp_path / "model"
    if kind == "file":
        path.write_bytes(b"not a dir")
    elif kind == "fifo":
        os.mkfifo(path)
    message = "does not exist" if kind == "missing" else "is not a directory"
    with pytest.raises(StagingError, match=message):
        stage_blocking(path, dst)


def test_overlapping_trees_are_refused(src: Path) -> None:
    write_tree(src, {"a.bin": b"a"})
    with pytest.raises(StagingError, match="overlap"):
        stage_blocking(src, src / "staged")


def test_destination_file_in_the_way_of_a_directory(src: Path, dst: Path) -> None:
    write_tree(src, {"sub/a.bin": b"a"})
    write_tree(dst, {"sub": b"I am a file"})
    with pytest.raises(StagingError, match="exists and is not a directory"):
        stage_blocking(src, dst)


def test_destination_symlinked_directory_is_not_written_through(src: Path, dst: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    write_tree(src, {"sub/a.bin": b"a"})
    dst.mkdir()
    (dst / "sub").symlink_to(elsewhere)
    with pytest.raises(StagingError, match="not a directory"):
        stage_blocking(src, dst)
    assert list(elsewhere.iterdir()) == []


def test_insufficient_space_names_both_sizes(src: Path, dst: Path) -> None:
    write_tree(src, {"a.bin": b"x" * 1000})
    with pytest.raises(InsufficientSpaceError) as caught:
        stage_blocking(src, dst, free_space=lambda _path: 5000)
    assert caught.value.needed == 1000 + 10 * 2**20 and caught.value.available == 5000
    assert f"need {1000 + 10 * 2**20} bytes" in str(caught.value) and "5000 bytes free" in str(caught.value)
    assert read_tree(dst) == {}


def test_nothing_to_copy_skips_space_check(src: Path, dst: Path) -> None:
    write_tree(src, {"a.bin": b"x"})
    stage_blocking(src, dst)
    assert stage_blocking(src, dst, free_space=lambda _path: 0).ok


def test_a_size_limit_counts_what_the_destination_already_holds(src: Path, dst: Path) -> None:
    write_tree(src, {"a.bin": b"x" * 1000})
    write_tree(dst, {"old/b.bin": b"y" * 3000})
    (dst / "link").symlink_to(src / "a.bin")
    limited = within_limit(20 * 2**20, lambda _path: 10**12)
    assert limited(str(dst)) == 20 * 2**20 - 3000, "regular files under the destination count, links do not"
    assert within_limit(20 * 2**20, lambda _path: 7)(str(dst)) == 7, "the filesystem's free space still caps it"
    with pytest.raises(InsufficientSpaceError) as caught:
        stage_blocking(src, dst, free_space=within_limit(2**20, lambda _path: 10**12))
    assert caught.value.available == 2**20 - 3000
    assert read_tree(dst) == {"old/b.bin": b"y" * 3000}, "nothing copied"


class GrowOnFirstChunk:
    """A progress sink that appends to (or truncates) the source file after the first copied chunk."""

    def __init__(self, path: Path, shrink: bool = False) -> None:
        self.path, self.shrink, self.fired = path, shrink, threading.Event()

    def begin(self, files: int, total_bytes: int) -> None:
        pass

    def advance(self, nbytes: int) -> None:
        if not self.fired.is_set():
            self.fired.set()
            with self.path.open("r+b" if self.shrink else "ab") as handle:
                handle.truncate(1000) if self.shrink else handle.write(b"more")

    def file_done(self, rel: str, size: int) -> None:
        pass

    def end(self) -> None:
        pass


@pytest.mark.parametrize("shrink", [False, True])
def test_source_changing_during_copy_fails_without_final_file(src: Path, dst: Path, shrink: bool) -> None:
    write_tree(src, {"w.bin": os.urandom(256 * 1024), "ok.bin": b"fine"})
    sink = GrowOnFirstChunk(src / "w.bin", shrink=shrink)
    report = stage_blocking(src, dst, StageSettings(concurrency=1, buffer_kb=4), sink)
    assert sink.fired.is_set()
    failed = {issue.path: issue.reason for issue in report.failures}
    assert list(failed) == ["w.bin"]
    assert "changed during copy" in failed["w.bin"] or "shrank during copy" in failed["w.bin"]
    assert sorted(p.name for p in dst.iterdir()) == ["ok.bin"]


def test_file_replaced_after_scan_is_detected(src: Path, dst: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import flexinfer.flashloader.staging as staging

    write_tree(src, {"a.bin": b"original"})
    real_plan = staging.build_plan

    def plan_then_replace(*args, **kwargs):  # type: ignore[no-untyped-def]
        plan = real_plan(*args, **kwargs)
        (src / "imposter").write_bytes(b"imposter")
        (src / "imposter").replace(src / "a.bin")
        return plan

    monkeypatch.setattr(staging, "build_plan", plan_then_replace)
    report = stage_blocking(src, dst)
    assert [i.reason for i in report.failures] == ["source file was replaced after the scan"]
    assert list(dst.iterdir()) == []


async def test_async_stage_runs_off_the_event_loop(src: Path, dst: Path) -> None:
    write_tree(src, MODEL)
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)  # one tick per loop turn: the measurement, not a wait

    task = asyncio.create_task(ticker())
    report = await stage(src, dst, StageSettings(concurrency=2, buffer_kb=1))
    task.cancel()
    assert report.ok and read_tree(dst) == MODEL and ticks > 1


class BlockFirstChunk:
    """Signals when copying has started and holds the worker until released."""

    def __init__(self) -> None:
        self.started, self.release = threading.Event(), threading.Event()

    def begin(self, files: int, total_bytes: int) -> None:
        pass

    def advance(self, nbytes: int) -> None:
        self.started.set()
        self.release.wait(5)

    def file_done(self, rel: str, size: int) -> None:
        pass

    def end(self) -> None:
        pass


async def test_cancelling_stage_leaves_no_partial_files(src: Path, dst: Path) -> None:
    data = os.urandom(64 * 1024)
    write_tree(src, {"big.bin": data})
    sink = BlockFirstChunk()
    task = asyncio.create_task(stage(src, dst, StageSettings(concurrency=1, buffer_kb=4), sink))
    assert await asyncio.to_thread(sink.started.wait, 5)
    task.cancel()
    sink.release.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    left = os.listdir(dst)  # the copy may win the race with cancellation, but never leaves a partial file
    assert left == [] or (left == ["big.bin"] and (dst / "big.bin").read_bytes() == data)


def test_raise_for_failures(src: Path, dst: Path) -> None:
    write_tree(src, {"w.bin": os.urandom(64 * 1024)})
    report = stage_blocking(src, dst, StageSettings(concurrency=1, buffer_kb=4), GrowOnFirstChunk(src / "w.bin"))
    with pytest.raises(StagingError, match=r"staging failed for 1 file\(s\): w.bin"):
        report.raise_for_failures()


def test_worker_count_never_exceeds_the_cpus_available() -> None:
    import os

    from flexinfer.flashloader.staging import worker_count

    cpus = len(os.sched_getaffinity(0))
    assert worker_count(1) == 1
    assert worker_count(cpus + 7) == cpus
    assert worker_count(0) == 1


class Tasks:
    """A progress sink recording, per task, the bytes advanced."""

    def __init__(self) -> None:
        self.tasks: list[tuple[str, int, int]] = []
        self._lock = threading.Lock()

    def begin(self, files: int, total_bytes: int, task: str = "copying") -> None:
        self.tasks.append((task, total_bytes, 0))

    def advance(self, nbytes: int) -> None:
        with self._lock:
            task, total, done = self.tasks[-1]
            self.tasks[-1] = (task, total, done + nbytes)

    def file_done(self, rel: str, size: int) -> None:
        pass

    def end(self) -> None:
        pass


def test_verify_passes_report_the_bytes_they_hash(src: Path, dst: Path) -> None:
    write_tree(src, MODEL)
    size = sum(map(len, MODEL.values()))
    sink = Tasks()
    stage_blocking(src, dst, StageSettings(verify=True), sink)
    assert sink.tasks == [("checksumming", 0, 0), ("copying", size, size), ("checksumming", 2 * size, 2 * size)]
    again = Tasks()
    stage_blocking(src, dst, StageSettings(verify=True), again)
    assert again.tasks[0] == ("checksumming", 2 * size, 2 * size)
