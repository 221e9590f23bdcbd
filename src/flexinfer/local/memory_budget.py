"""Which shared groups of ``flexinfer serve`` pack by memory, and their budgets.

A group opts in with an entry ``GROUP=SIZE`` (``FLEXINFER_GROUP_MEMORY=gpu0=24Gi,cpu=auto``, or the repeatable
``serve --group-memory gpu0=24Gi``, which wins for the groups it names). ``GROUP`` is a ``spec.gpu.shared``
value (that group in every namespace) or ``namespace/group``; ``SIZE`` is a Kubernetes quantity (``24Gi``,
``512Mi``; ``GiB``/``MiB`` are read the same), a number of MiB, or ``auto``:

- ``auto`` for a group whose members use a GPU: the total memory of the GPU(s) they are pinned to, from the
  vendor's binding (AMD SMI, NVML) or ``nvidia-smi``; for a group of CPU-only models: the memory the host has
  available when ``serve`` starts (``MemAvailable``). Without such a figure (no GPU found, a tool that does not
  report memory) ``auto`` is a ``ConfigError`` naming the group: give a size.
- a group that does not opt in runs one model at a time.

``parse_entries`` is pure (``flexinfer.local.config`` parses the variable with it); ``resolve_budgets`` asks
the machine (GPU discovery, ``/proc/meminfo``) and is called by ``flexinfer.assembly.run_local``.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from flexinfer.api.model import Model
from flexinfer.api.units import parse_quantity
from flexinfer.core.errors import ConfigError
from flexinfer.core.memory_need import MIB
from flexinfer.local.gpu_discovery import GpuInventory

log = logging.getLogger(__name__)
AUTO = "auto"
MEMINFO = Path("/proc/meminfo")
_GROUP = re.compile(r"^(?:[a-z0-9]([-a-z0-9]*[a-z0-9])?/)?[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def parse_entries(entries: Iterable[str], source: str) -> dict[str, float | None]:
    """``GROUP=SIZE`` entries (each may hold several, comma-separated) → MiB by group, ``None`` for ``auto``;
    ``ConfigError`` naming ``source`` (the variable or flag) and the entry for anything else."""
    out: dict[str, float | None] = {}
    for entry in (part.strip() for text in entries for part in text.split(",")):
        if not entry:
            continue
        group, eq, size = (piece.strip() for piece in entry.partition("="))
        if not eq or not _GROUP.match(group):
            raise ConfigError(f"{source}: expected GROUP=SIZE (e.g. gpu0=24Gi or gpu0=auto), got {entry!r}")
        out[group] = _mib(size, f"{source}: {group}")
    return out


def _mib(size: str, where: str) -> float | None:
    if size.lower() == AUTO:
        return None
    text = size[:-1] if size.endswith(("iB", "IB")) else size
    try:
        mib = float(text) if re.fullmatch(r"\d+(\.\d+)?", text) else float(parse_quantity(text)) / MIB
    except ValueError:
        mib = 0.0
    if mib <= 0:
        raise ConfigError(f"{where}: expected a size such as 24Gi, 512Mi, a number of MiB, or auto; got {size!r}")
    return mib


async def resolve_budgets(entries: Mapping[str, float | None], models: Sequence[Model], gpus: GpuInventory,
                          meminfo: Path = MEMINFO) -> dict[str, float]:
    """MiB by group, ``auto`` entries resolved from the machine (see the module docstring)."""
    budgets: dict[str, float] = {}
    for group, mib in entries.items():
        members = [m for m in models if m.group and group in (m.group, f"{m.namespace}/{m.group}")]
        if not members:
            log.warning("group memory for %s: no declared model uses that group (spec.gpu.shared)", group)
        budgets[group] = mib if mib is not None else await _auto(group, members, gpus, meminfo)
        log.info("GPU group %s packs by memory: budget %.0f MiB", group, budgets[group])
    return budgets


async def _auto(group: str, members: Sequence[Model], gpus: GpuInventory, meminfo: Path) -> float:
    on_gpu = [m for m in members if m.gpu_count > 0]
    if not on_gpu:
        available = host_available_mib(meminfo)
        if available is None:
            raise ConfigError(f"group memory for {group}: auto needs the host's available memory ({meminfo}), "
                              f"which cannot be read here; give a size (e.g. {group}=16Gi)")
        return available
    found = await gpus.gpus()
    vendor = on_gpu[0].gpu_vendor
    devices = [g for g in found if vendor in ("auto", g.vendor)][:max(m.gpu_count for m in on_gpu)]
    sizes = [g.memory_mb for g in devices]
    if not devices or any(size is None for size in sizes):
        what = "no GPU was found" if not devices else "the GPU's memory size is not reported (install the " \
                                                      "vendor binding: flexinfer[rocm] or flexinfer[nvidia])"
        raise ConfigError(f"group memory for {group}: auto needs the memory of its GPU, but {what}; "
                          f"give a size (e.g. {group}=24Gi)")
    return float(sum(size for size in sizes if size is not None))


def host_available_mib(meminfo: Path = MEMINFO) -> float | None:
    """``MemAvailable`` of ``/proc/meminfo`` in MiB (``None`` where it cannot be read)."""
    try:
        for line in meminfo.read_text().splitlines():
            name, _, value = line.partition(":")
            if name == "MemAvailable":
                return int(value.split()[0]) / 1024  # kB
    except (OSError, ValueError, IndexError):
        return None
    return None
