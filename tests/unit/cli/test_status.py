"""``flexinfer status``: the table shows a name several namespaces use as ``namespace/name``."""

from __future__ import annotations

from rich.console import Console

from flexinfer.cli.status import config_summary, status_table


def row(namespace: str, name: str) -> dict[str, object]:
    return {"key": f"{namespace}/{name}", "name": name, "namespace": namespace, "group": None, "phase": "Idle",
            "queue_depth": 0, "in_flight": 0, "endpoint": None, "last_swap_age": None, "draining": False}


def test_a_shared_name_is_shown_with_its_namespace_and_a_unique_one_bare() -> None:
    console = Console(width=200, record=True)
    console.print(status_table([row("default", "chat"), row("team-b", "chat"), row("default", "solo")]))
    text = console.export_text()
    assert "default/chat" in text and "team-b/chat" in text
    assert "solo" in text and "default/solo" not in text


def test_a_rejected_reload_is_shown_under_the_table_with_its_errors() -> None:
    console = Console(width=200, record=True)
    config = {"models": 2, "loaded_at": "2026-01-01T10:00:00+00:00", "last_reload": "2026-01-01T10:05:00+00:00",
              "trigger": "watch", "result": "rejected", "errors": ["m.yaml:4: spec.backend: [bad] value"]}
    console.print(config_summary(config), highlight=False)
    text = console.export_text()
    assert "2 model(s) loaded at 2026-01-01T10:00:00+00:00" in text
    assert "last reload 2026-01-01T10:05:00+00:00 (watch): rejected" in text
    assert "error: m.yaml:4: spec.backend: [bad] value" in text, "markup in an error is shown as written"
