"""Progress sinks: periodic log lines with an injected clock, big-file lines, terminal selection."""

from __future__ import annotations

import io

from flexinfer.flashloader.progress import CHECKSUMMING, LogProgress, NullProgress, RichProgress, make_progress


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_log_lines_at_most_once_per_interval() -> None:
    lines: list[str] = []
    clock = Clock()
    sink = LogProgress(lines.append, interval=5.0, clock=clock)
    sink.begin(2, 200 * 2**20)
    sink.advance(50 * 2**20)
    clock.now = 6.0
    sink.advance(50 * 2**20)
    sink.advance(1)
    assert lines[0] == "flash-load: copying 2 files, 200.0 MiB"
    assert len(lines) == 2 and "100.0/200.0 MiB (50%)" in lines[1] and "0/2 files" in lines[1]
    sink.file_done("model.safetensors", 150 * 2**20)
    sink.file_done("small.json", 10)
    assert lines[-1] == "flash-load: copied model.safetensors (150.0 MiB)" and len(lines) == 3


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_make_progress_picks_by_terminal() -> None:
    assert isinstance(make_progress(io.StringIO()), LogProgress)
    assert isinstance(make_progress(Tty()), RichProgress)
    assert isinstance(make_progress(Tty(), enabled=False), NullProgress)


def test_rich_bar_renders_to_a_terminal() -> None:
    stream = Tty()
    bar = RichProgress(stream)
    bar.begin(1, 1000)
    bar.advance(1000)
    bar.end()
    assert "flash-load" in stream.getvalue()


def test_a_checksum_pass_reports_its_own_progress_lines() -> None:
    lines: list[str] = []
    clock = Clock()
    sink = LogProgress(lines.append, interval=5.0, clock=clock)
    sink.begin(2, 400 * 2**20, CHECKSUMMING)
    clock.now = 6.0
    sink.advance(100 * 2**20)
    sink.file_done("model.safetensors", 150 * 2**20)  # no "copied" line for a hashed file
    sink.end()
    assert lines == ["flash-load: checksumming 2 files, 400.0 MiB",
                     "flash-load: checksummed 100.0/400.0 MiB (25%), 0/2 files, 0.02 GB/s"]
