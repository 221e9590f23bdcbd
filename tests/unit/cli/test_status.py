"""``flexinfer status``/``ps`` table: namespace and name columns, the reason of a failure with its backoff, how
long a model has been Ready, ``wide`` columns, and whole rows when the output is not a terminal."""

from __future__ import annotations

from typing import Any

import pytest
from rich.console import Console

from flexinfer.cli.output import print_table
from flexinfer.cli.status import config_summary, group_lines, status_table


def row(namespace: str, name: str, **fields: Any) -> dict[str, Any]:
    return {"key": f"{namespace}/{name}", "name": name, "namespace": namespace, "group": None, "phase": "Idle",
            "queue_depth": 0, "in_flight": 0, "endpoint": None, "last_swap_age": None, "draining": False,
            **fields}


def rendered(rows: list[dict[str, Any]], wide: bool = False) -> list[list[str]]:
    console = Console(width=400, record=True)
    console.print(status_table(rows, wide))
    return [line.split() for line in console.export_text().splitlines()]


def test_namespace_reason_and_active_for() -> None:
    lines = rendered([
        row("team-b", "chat", phase="Ready", ready_for=125.0, queue_depth=3, group="pair"),
        row("default", "broken", phase="Failed", last_error="exited with code 3\nTraceback...", retry_in=4.0),
    ])
    assert lines[0] == ["NAMESPACE", "NAME", "GROUP", "PHASE", "ACTIVE", "FOR", "QUEUE", "REASON"]
    assert lines[1] == ["team-b", "chat", "pair", "Ready", "2m5s", "3", "-"]
    assert lines[2][:6] == ["default", "broken", "-", "Failed", "-", "0"]
    assert " ".join(lines[2][6:]) == "exited with code 3 (retry in 4s)"


def test_wide_adds_endpoint_pid_priority_memory_and_need() -> None:
    memory = {"model_mib": 129.2, "kv_mib": 64.0, "compute_mib": 18.01, "other_mib": 0.0, "total_mib": 211.21}
    lines = rendered([row("default", "m", phase="Ready", priority=7, pid=42, endpoint="http://127.0.0.1:9",
                          in_flight=1, last_swap_age=3.0, memory=memory, need={"mib": 211.21, "source": "measured"}),
                      row("default", "n", need={"mib": 300, "source": "declared"}), row("default", "o")], wide=True)
    assert lines[0][-2:] == ["MEMORY", "NEED"]
    assert lines[1][-12:] == ["7", "1", "3s", "ago", "42", "http://127.0.0.1:9", "211.2", "MiB",
                              "(129.2+64.0+18.0)", "211.2", "MiB", "(measured)"]
    assert lines[2][-4:] == ["-", "300.0", "MiB", "(declared)"]  # not started: no figures of its own yet
    assert lines[3][-2:] == ["-", "-"]  # no figure at all (not started, outside a group that packs by memory)


def test_groups_that_pack_by_memory_are_listed_under_the_table() -> None:
    group = {"group": "default/gpu0", "budget_mib": 24576.0, "used_mib": 9000.5, "reserved_mib": 4000.0,
             "models": ["default/a", "default/b"], "evictions": {"make_room": 3, "out_of_memory": 1}}
    assert group_lines([group]) == [
        "memory: group default/gpu0: 9000.5 MiB used + 4000.0 MiB loading of 24576.0 MiB, 2 running; evictions: "
        "3 make room, 1 out of memory"]


def test_piped_output_keeps_long_names_whole(capsys: pytest.CaptureFixture[str]) -> None:
    name = "a-model-name-that-is-much-longer-than-any-terminal-would-show-in-one-column-" * 3
    print_table(status_table([row("a-namespace-with-a-long-name", name.rstrip("-"))]))
    out = capsys.readouterr().out
    assert name.rstrip("-") in out and "…" not in out
    assert all(line == line.rstrip() for line in out.splitlines())


def test_a_rejected_reload_is_shown_under_the_table_with_its_errors() -> None:
    console = Console(width=200, record=True)
    config = {"models": 2, "loaded_at": "2026-01-01T10:00:00+00:00", "last_reload": "2026-01-01T10:05:00+00:00",
              "trigger": "watch", "result": "rejected", "errors": ["m.yaml:4: spec.backend: [bad] value"]}
    console.print(config_summary(config), highlight=False)
    text = console.export_text()
    assert "2 model(s) loaded at 2026-01-01T10:00:00+00:00" in text
    assert "last reload 2026-01-01T10:05:00+00:00 (watch): rejected" in text
    assert "error: m.yaml:4: spec.backend: [bad] value" in text, "markup in an error is shown as written"
