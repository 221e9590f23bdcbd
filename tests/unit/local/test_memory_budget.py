"""The budgets of ``serve``'s groups that pack by memory (flexinfer.local.memory_budget): the entries'
grammar and errors naming the setting and the entry, ``auto`` from the GPU's memory or the host's available
memory, a clear error naming the group when neither is known; and a process group's resident memory
(flexinfer.local.process_memory)."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import pytest

from flexinfer.api.model import Model
from flexinfer.core.errors import ConfigError
from flexinfer.local.gpu_bindings import Gpu
from flexinfer.local.gpu_discovery import GpuInventory
from flexinfer.local.memory_budget import parse_entries, resolve_budgets
from flexinfer.local.process_memory import group_rss_mib


def member(name: str, group: str = "gpu0", **gpu: Any) -> Model:
    return Model.model_validate({"metadata": {"name": name, "namespace": "team"}, "spec": {
        "backend": "llamacpp", "source": "file:///m.gguf", "gpu": {"shared": group, **gpu}}})


def test_entries_take_quantities_mib_and_auto_and_name_the_setting_when_wrong() -> None:
    assert parse_entries(["gpu0=24Gi, team/cpu=auto", "small=512", "half=1.5GiB,,"], "--group-memory") == {
        "gpu0": 24576.0, "team/cpu": None, "small": 512.0, "half": 1536.0}
    for bad, problem in (("gpu0", "expected GROUP=SIZE"), ("Gpu0=1Gi", "expected GROUP=SIZE"),
                         ("gpu0=lots", "gpu0: expected a size"), ("gpu0=0", "gpu0: expected a size")):
        with pytest.raises(ConfigError, match=f"^--group-memory: {problem}"):
            parse_entries([bad], "--group-memory")


async def test_auto_is_the_memory_of_the_gpus_the_members_use(tmp_path: Path) -> None:
    gpus = GpuInventory(known=[Gpu("amd", 0, "RX 7900 XTX", 24560), Gpu("amd", 1, "RX 7900 XTX", 24560)])
    budgets = await resolve_budgets({"gpu0": None, "pair": None, "fixed": 1000.0},
                                    [member("a"), member("b", "pair", count=2), member("c", "fixed")], gpus)
    assert budgets == {"gpu0": 24560.0, "pair": 49120.0, "fixed": 1000.0}


async def test_auto_for_cpu_only_members_is_the_hosts_available_memory(tmp_path: Path) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       32000000 kB\nMemFree:  1000 kB\nMemAvailable:   20480000 kB\n")
    budgets = await resolve_budgets({"team/cpu": None}, [member("a", "cpu", vendor="cpu")], GpuInventory(known=[]),
                                    meminfo)
    assert budgets == {"team/cpu": 20000.0}
    with pytest.raises(ConfigError, match="group memory for team/cpu: auto needs the host's available memory"):
        await resolve_budgets({"team/cpu": None}, [member("a", "cpu", vendor="cpu")], GpuInventory(known=[]),
                              tmp_path / "missing")


async def test_auto_without_a_known_gpu_size_is_an_error_naming_the_group(caplog: pytest.LogCaptureFixture) -> None:
    with pytest.raises(ConfigError, match="group memory for gpu0: auto needs the memory of its GPU, but no GPU "
                                          r"was found; give a size \(e.g. gpu0=24Gi\)"):
        await resolve_budgets({"gpu0": None}, [member("a")], GpuInventory(known=[]))
    with pytest.raises(ConfigError, match="the GPU's memory size is not reported"):
        await resolve_budgets({"gpu0": None}, [member("a")], GpuInventory(known=[Gpu("amd", 0, "card0")]))
    caplog.set_level(logging.WARNING, logger="flexinfer.local.memory_budget")
    assert await resolve_budgets({"nobody": 512.0}, [member("a")], GpuInventory(known=[])) == {"nobody": 512.0}
    assert "group memory for nobody: no declared model uses that group" in caplog.text


def test_a_process_groups_resident_memory() -> None:
    mine = group_rss_mib(os.getpgid(0))
    assert mine is not None and mine > 10  # this Python process, at least
    assert group_rss_mib(2**22 + 12345) is None
