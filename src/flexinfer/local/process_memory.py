"""How much memory a model server's processes hold: the resident set of every process in its process group.

The local engine measures a server this way once it is Ready when the server does not report its own buffers
(llama.cpp's ``llama-server`` does: ``flexinfer.core.server_memory``), e.g. llama-cpp-python's server or vLLM.
Pages shared between the group's processes count once per process (an over-estimate, the safe side for a
memory budget). Linux only (``/proc``); ``None`` elsewhere or when the group is gone. Used by
``flexinfer.local.engine``.
"""

from __future__ import annotations

import os
from pathlib import Path

from flexinfer.core.memory_need import MIB

PROC = Path("/proc")


def group_rss_mib(pgid: int, proc: Path = PROC) -> float | None:
    """The summed resident memory of process group ``pgid`` in MiB (``None``: no such group, or no ``/proc``)."""
    try:
        entries = [p for p in proc.iterdir() if p.name.isdigit()]
    except OSError:
        return None
    page = os.sysconf("SC_PAGE_SIZE")
    pages, found = 0, False
    for entry in entries:
        try:
            stat = (entry / "stat").read_text()
            group = int(stat.rsplit(")", 1)[1].split()[2])
            if group != pgid:
                continue
            pages += int((entry / "statm").read_text().split()[1])
            found = True
        except (OSError, IndexError, ValueError):
            continue  # exited while we looked
    return pages * page / MIB if found else None
