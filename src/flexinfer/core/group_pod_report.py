"""What a group pod's ``flexinfer serve`` says about itself: its admin status, read tolerantly (pure).

The manager's link to a group pod (``flexinfer.manager.group_pod_link``) GETs ``/admin/status`` (routes in
docs/reference/admin-api.md) and hands the body to ``PodReport.from_status``; the group-pod plan
(``flexinfer.core.group_pod_plan``) mirrors each member's phase from it. Fields the pod leaves out, or that
have an unexpected type, read as unknown rather than failing the pass.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from flexinfer.core.phases import PHASES


@dataclass(frozen=True)
class MemberReport:
    """One member as the pod's local engine sees it."""

    phase: str
    last_error: str | None = None
    in_flight: int = 0
    queue_depth: int = 0
    need_mib: float | None = None
    need_source: str | None = None

    @property
    def busy(self) -> bool:
        """Requests run or wait for it inside the pod."""
        return self.in_flight > 0 or self.queue_depth > 0


@dataclass(frozen=True)
class PodReport:
    """The answer of one group pod run (``run``: the pod's uid) at ``url`` (its own base URL)."""

    run: str
    url: str
    revision: str | None = None
    """The revision of the manifests in force in the pod (``flexinfer.core.manifest_revision``)."""
    members: Mapping[str, MemberReport] = field(default_factory=dict)
    """By model key (``namespace/name``)."""

    @classmethod
    def from_status(cls, run: str, url: str, body: Mapping[str, Any]) -> PodReport:
        """Read ``GET /admin/status``'s body."""
        members = {}
        for entry in body.get("models") or ():
            if not isinstance(entry, Mapping) or not isinstance(entry.get("key"), str):
                continue
            phase = entry.get("phase")
            need: Mapping[str, Any] = entry["need"] if isinstance(entry.get("need"), Mapping) else {}
            members[str(entry["key"])] = MemberReport(
                phase=phase if phase in PHASES else "Pending",
                last_error=_text(entry.get("last_error")),
                in_flight=_count(entry.get("in_flight")), queue_depth=_count(entry.get("queue_depth")),
                need_mib=_number(need.get("mib")), need_source=_text(need.get("source")))
        config: Mapping[str, Any] = body["config"] if isinstance(body.get("config"), Mapping) else {}
        return cls(run, url, _text(config.get("revision")), members)


def _text(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


def _count(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None
