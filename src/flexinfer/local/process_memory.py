"""How much memory a model server's processes hold: the resident set of every process in its process group.

The local engine measures a server this way once it is Ready when the server does not report its own buffers
(llama.cpp's ``llama-server`` does: ``flexinfer.core.server_memory``), e.g. llama-cpp-python's server or vLLM.
Pages shared between the group's processes count once per process (an over-estimate, the safe side for a
memory budget). Linux only (``/proc``); ``None`` elsewhere or when the group is gone. ``group_pids`` lists the
group's members (the engine asks the GPU bindings for their device memory, ``flexinfer.local.gpu_bindings``).
Used by ``flexinfer.local.engine``.
"""

from __future__ import annotations

import os
from pathlib import Path

from flexinfer.core.memory_need import MIB

PROC = Path("/proc")


def group_pids(pgid: int, proc: Path = PROC) -> set[int] | None:
    """The pids of the processes in process group ``pgid`` now (``None``: no ``/proc``; empty: no such group)."""
    try:
        entries = [p for p in proc.iterdir() if p.name.isdigit()]
    except OSError:
        return None
    pids: set[int] = set()
    for entry in entries:
        try:
            stat = (entry / "stat").read_text()
            if int(stat.rsplit(")", 1)[1].split()[2]) == pgid:
                pids.add(int(entry.name))
        except (OSError, IndexError, ValueError):
            continue  # exited while we looked
    return pids


def group_rss_mib(pgid: int, proc: Path = PROC) -> float | None:
    """The summed resident memory of process group ``pgid`` in MiB (``None``: no such group, or no ``/proc``)."""
    page = os.sysconf("SC_PAGE_SIZE")
    pages, found = 0, False
    for pid in group_pids(pgid, proc) or ():
        try:
            pages += int((proc / str(pid) / "statm").read_text().split()[1])
            found = True
        except (OSError, IndexError, ValueError):
            continue  # exited since it was listed
    return pages * page / MIB if found else None
