"""When the manager's watch showed a model server's pod (or Deployment) turn Ready, live.

The Ready instant of a cold start or swap is the pod's ``Ready`` condition turning True (else the Deployment's
``Available``). The condition's ``lastTransitionTime`` has whole seconds; the watch event that showed the
transition reaches the manager milliseconds after it. ``ReadySightings.update`` is called by the store
(``flexinfer.manager.store``) for every Pod and Deployment body it keeps, with the moment the watch delivered it
(``seen``; ``None`` for a body from a listing — the start-up snapshot or a re-list — or from the manager's own
write). A transition counts as seen live only when the body before it, also kept, did not show the condition
True, and the body that shows it came from the watch; the reconcile plan reads the sighting
(``flexinfer.core.unit_plan``), the lifecycle clock decides whether to trust it
(``flexinfer.core.lifecycle_clock.observed_ready``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

Body = Mapping[str, Any]
READY_CONDITION: Final = {"Pod": "Ready", "Deployment": "Available"}
"""The condition whose turning True makes a model Ready, per kind."""


@dataclass(frozen=True)
class Sighting:
    """The current True condition of one object: its ``lastTransitionTime`` as stored, and when the watch
    delivered the event that showed it turn True (``None``: not seen live)."""

    since: str
    seen: datetime | None


def true_since(kind: str, body: Body | None) -> str | None:
    """``lastTransitionTime`` (as stored) of ``body``'s Ready (Pod) or Available (Deployment) condition when it
    is True; ``None`` otherwise."""
    wanted = READY_CONDITION.get(kind)
    for condition in ((body or {}).get("status") or {}).get("conditions") or []:
        if condition.get("type") == wanted and condition.get("status") == "True":
            return str(condition.get("lastTransitionTime") or "")
    return None


class ReadySightings:
    """One ``Sighting`` per Pod and Deployment whose condition is True (keyed by kind, namespace, name)."""

    def __init__(self) -> None:
        self._sightings: dict[tuple[str, str, str], Sighting] = {}

    def update(self, kind: str, key: tuple[str, str], previous: Body | None, body: Body,
               seen: datetime | None) -> None:
        """``body`` replaced ``previous`` (``None``: first kept) in the store; ``seen`` is when the watch
        delivered it (``None``: not from the watch). The first body that shows a transition decides."""
        since = true_since(kind, body)
        slot = (kind, *key)
        if since is None:
            self._sightings.pop(slot, None)
            return
        known = self._sightings.get(slot)
        if known is not None and known.since == since:
            return
        live = seen is not None and previous is not None and true_since(kind, previous) is None
        self._sightings[slot] = Sighting(since, seen if live else None)

    def forget(self, kind: str, key: tuple[str, str]) -> None:
        self._sightings.pop((kind, *key), None)

    def seen(self, kind: str, namespace: str, name: str) -> datetime | None:
        """When the watch showed the object's current True condition turn True, if it did so live."""
        sighting = self._sightings.get((kind, namespace, name))
        return sighting.seen if sighting is not None else None
