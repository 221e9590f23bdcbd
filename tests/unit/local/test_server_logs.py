"""Captured model-server output: ring buffer, partial lines, file mirror, pipe pump."""

from __future__ import annotations

import asyncio
from pathlib import Path

from flexinfer.local.logs import LogStore, ModelLog, pump


def test_ring_buffer_keeps_the_last_lines() -> None:
    log = ModelLog(max_lines=3)
    log.write("a\nb\nc\nd\n")
    assert log.tail() == ["b", "c", "d"]
    assert log.tail(2) == ["c", "d"]
    assert log.tail(0) == []


def test_partial_lines_join_across_writes() -> None:
    log = ModelLog()
    log.write("hel")
    log.write("lo\r\nwor")
    assert log.tail() == ["hello", "wor"]
    log.write("ld\n")
    assert log.tail() == ["hello", "world"]


def test_file_mirror_and_rotation(tmp_path: Path) -> None:
    path = tmp_path / "d" / "m.log"
    log = ModelLog(file=path, max_file_bytes=10)
    log.open_file()
    log.write("first line\n")
    log.close()
    assert path.read_text() == "first line\n"
    again = ModelLog(file=path, max_file_bytes=10)
    again.open_file()
    again.write("second\n")
    again.close()
    assert path.read_text() == "second\n"
    assert (tmp_path / "d" / "m.log.1").read_text() == "first line\n"


def test_store_keeps_one_log_per_model(tmp_path: Path) -> None:
    store = LogStore(tmp_path, max_lines=5)
    assert store.tail("ns/a") is None
    store.get("ns/a").write("x\n")
    assert store.get("ns/a") is store.get("ns/a")
    assert store.tail("ns/a") == ["x"]
    assert store.get("ns/a").path == tmp_path / "ns_a.log"


async def test_pump_copies_until_eof() -> None:
    reader = asyncio.StreamReader()
    log = ModelLog()
    task = asyncio.create_task(pump(reader, log))
    reader.feed_data("één\ntwo".encode())
    reader.feed_data(b"\xff\n")
    reader.feed_eof()
    await task
    assert log.tail() == ["één", "two\ufffd"]
