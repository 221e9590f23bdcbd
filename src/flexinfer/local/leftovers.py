"""Records of the model-server process groups a ``serve`` started, and reaping of those a dead ``serve`` left.

Children get a parent-death signal, but a server that ignores it, or processes it forked (they are not
signalled by the kernel), can outlive a ``serve`` killed with SIGKILL. So every spawned group is recorded
as one JSON file in the state directory (``processes/<pid>.json``: the group id, a random token the
children carry in their environment as ``FLEXINFER_SERVE_CHILD``, the command, and the recording
``serve``'s pid and start time); the file is removed when the group is stopped. On start, ``reap`` kills
every process that carries the token of a record whose ``serve`` is gone (a recording ``serve`` counts as
alive only if its pid has the recorded start time) and deletes the record; a process that does not carry
the token, such as an unrelated process that reused a recorded pid, is never touched. Linux ``/proc``;
elsewhere it does nothing. Used by ``flexinfer.local.engine`` (recording, and reaping when
``flexinfer.assembly.local`` starts).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import signal
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)
TOKEN_VARIABLE = "FLEXINFER_SERVE_CHILD"
PROC = Path("/proc")


def start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (``/proc/<pid>/stat`` field 22), ``None`` if gone."""
    try:
        fields = (PROC / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()
        return int(fields[19])
    except (OSError, IndexError, ValueError):
        return None


@dataclass(frozen=True)
class Record:
    """One recorded process group."""

    pgid: int
    token: str
    argv: tuple[str, ...]
    owner_pid: int
    owner_start: int | None

    def owner_alive(self) -> bool:
        """The ``serve`` that recorded the group still runs (same pid and start time)."""
        return self.owner_start is not None and start_ticks(self.owner_pid) == self.owner_start


class ProcessRecords:
    """The record files under one directory (see the module docstring)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    @staticmethod
    def new_token() -> str:
        """A token to put in a child's environment (``TOKEN_VARIABLE``) before spawning it."""
        return secrets.token_hex(16)

    def add(self, pgid: int, token: str, argv: Sequence[str]) -> None:
        """Record a spawned group (best effort: a failure to write is logged, the server still runs)."""
        me = os.getpid()
        body = {"pgid": pgid, "token": token, "argv": list(argv), "owner_pid": me, "owner_start": start_ticks(me)}
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            path = self.directory / f"{pgid}.json"
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(body))
            tmp.replace(path)
        except OSError as exc:
            log.warning("cannot record model server %d in %s: %s", pgid, self.directory, exc)

    def remove(self, pgid: int) -> None:
        """Forget a group that was stopped."""
        with contextlib.suppress(OSError):
            (self.directory / f"{pgid}.json").unlink()

    def records(self) -> list[tuple[Path, Record | None]]:
        """Every record file with its parsed record (``None`` when unreadable)."""
        if not self.directory.is_dir():
            return []
        out: list[tuple[Path, Record | None]] = []
        for path in sorted(self.directory.glob("*.json")):
            try:
                raw = json.loads(path.read_text())
                record = Record(int(raw["pgid"]), str(raw["token"]), tuple(raw["argv"]), int(raw["owner_pid"]),
                                raw.get("owner_start"))
            except (OSError, ValueError, KeyError, TypeError):
                record = None
            out.append((path, record))
        return out

    def reap(self) -> list[Record]:
        """Kill what dead ``serve`` processes left behind; returns the records of groups that had members."""
        if not PROC.is_dir():
            return []
        orphaned: dict[str, Record] = {}
        for path, record in self.records():
            if record is not None and record.owner_alive():
                continue
            if record is not None:
                orphaned[record.token] = record
            with contextlib.suppress(OSError):
                path.unlink()
        if not orphaned:
            return []
        found = {}
        for pid, token in token_carriers():
            record = orphaned.get(token)
            if record is not None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
                    found[token] = record
        return list(found.values())


def token_carriers() -> list[tuple[int, str]]:
    """Every readable process with a ``FLEXINFER_SERVE_CHILD`` token in its environment, with the token."""
    prefix = f"{TOKEN_VARIABLE}=".encode()
    out = []
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        for item in environ.split(b"\0"):
            if item.startswith(prefix):
                out.append((int(entry.name), item[len(prefix):].decode(errors="replace")))
                break
    return out
