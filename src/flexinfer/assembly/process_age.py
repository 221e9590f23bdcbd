"""How long this process has been running, from the kernel's record of its start.

``flexinfer serve`` prints it on its ``listening on`` line: in a group pod, every cold start of the group runs
``serve`` in a new container, so its own start-up (interpreter, imports, manifests) is a part of the cold start
an operator can read from the pod's log. The start comes from ``/proc/self/stat`` (``starttime``, clock ticks
after boot, the same clock as ``CLOCK_BOOTTIME``), so it includes the interpreter's own start-up, which no
timestamp taken in Python could. Elsewhere than Linux there is no answer.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

_STAT = Path("/proc/self/stat")
_STARTTIME_INDEX = 19
"""``starttime`` is field 22 of ``/proc/[pid]/stat``; counted from field 3, the first after the command name."""


def process_age(stat: Path = _STAT) -> float | None:
    """Seconds since this process started (to the kernel's clock tick, 10 ms on most systems), or ``None`` where
    ``/proc`` does not tell."""
    try:
        # The command name (field 2) is in parentheses and may itself hold spaces or ")": split after the last.
        fields = stat.read_text().rsplit(")", 1)[1].split()
        started = int(fields[_STARTTIME_INDEX]) / os.sysconf("SC_CLK_TCK")
        return max(0.0, time.clock_gettime(time.CLOCK_BOOTTIME) - started)
    except (OSError, IndexError, ValueError, AttributeError):
        return None
