"""``ProcessRecords``: leftovers of a dead ``serve`` are killed only if they carry the record's token; the
records of a live ``serve`` are left alone."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

from flexinfer.local.leftovers import TOKEN_VARIABLE, ProcessRecords, start_ticks
from support.local_processes import alive

SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)"]


async def sleeper(token: str | None) -> asyncio.subprocess.Process:
    env = dict(os.environ)
    env.pop(TOKEN_VARIABLE, None)
    if token:
        env[TOKEN_VARIABLE] = token
    return await asyncio.create_subprocess_exec(*SLEEPER, env=env)


def orphan(records: ProcessRecords, pgid: int, token: str) -> None:
    """Rewrite the record as if its ``serve`` had died (an owner pid with another start time)."""
    path = records.directory / f"{pgid}.json"
    body = json.loads(path.read_text())
    path.write_text(json.dumps({**body, "owner_start": (start_ticks(os.getpid()) or 0) + 1}))


async def test_leftovers_carrying_the_token_are_killed_others_never(tmp_path: Path) -> None:
    records = ProcessRecords(tmp_path / "processes")
    token = records.new_token()
    owned, unrelated = await sleeper(token), await sleeper(None)
    try:
        records.add(owned.pid, token, SLEEPER)
        records.add(unrelated.pid, token, SLEEPER)  # as if the recorded pid had been reused
        assert records.reap() == []  # this process (the recording "serve") is alive
        assert alive(owned.pid)
        orphan(records, owned.pid, token)
        orphan(records, unrelated.pid, token)
        reaped = records.reap()
        assert [r.token for r in reaped] == [token]
        await asyncio.wait_for(owned.wait(), 5)
        assert alive(unrelated.pid)
        assert list(records.directory.iterdir()) == []
    finally:
        for proc in (owned, unrelated):
            if proc.returncode is None:
                proc.kill()
                await proc.wait()


def test_removed_and_unreadable_records(tmp_path: Path) -> None:
    records = ProcessRecords(tmp_path / "processes")
    records.add(12345, "t", ["x"])
    records.remove(12345)
    (records.directory / "999.json").write_text("{not json")
    assert records.reap() == []
    assert list(records.directory.iterdir()) == []
