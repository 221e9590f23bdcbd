"""``flexinfer status``: the table shows a name several namespaces use as ``namespace/name``."""

from __future__ import annotations

from rich.console import Console

from flexinfer.cli.status import status_table


def row(namespace: str, name: str) -> dict[str, object]:
    return {"key": f"{namespace}/{name}", "name": name, "namespace": namespace, "group": None, "phase": "Idle",
            "queue_depth": 0, "in_flight": 0, "endpoint": None, "last_swap_age": None, "draining": False}


def test_a_shared_name_is_shown_with_its_namespace_and_a_unique_one_bare() -> None:
    console = Console(width=200, record=True)
    console.print(status_table([row("default", "chat"), row("team-b", "chat"), row("default", "solo")]))
    text = console.export_text()
    assert "default/chat" in text and "team-b/chat" in text
    assert "solo" in text and "default/solo" not in text
