"""A recorder of the reconcile metric calls (``reconcile_duration``/``reconcile_error``) for tracing tests."""

from __future__ import annotations


class RecordingMetrics:
    """Records the reconcile metric calls."""

    def __init__(self) -> None:
        self.durations: list[tuple[str, float]] = []
        self.errors: list[str] = []

    def reconcile_duration(self, controller: str, seconds: float) -> None:
        self.durations.append((controller, seconds))

    def reconcile_error(self, controller: str) -> None:
        self.errors.append(controller)
