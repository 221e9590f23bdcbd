"""Leader election over a ``coordination.k8s.io/v1`` Lease (``flexinfer-manager`` in ``POD_NAMESPACE``).

``LeaderElector.acquire`` retries until this manager holds the Lease; ``hold`` renews it every
``renew_every`` seconds and returns when leadership is lost (another holder, or no successful renewal
before the lease would expire); ``release`` gives it up on a clean shutdown so a standby takes over at
once. Decisions are the pure ``flexinfer.core.leadership``; writes use the Lease's ``resourceVersion``
so two managers can never both win a round. ``healthy`` is True while the API answers (the readiness of
a standby). Used by ``flexinfer.manager.program``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from lightkube import ApiError

from flexinfer.core.leadership import LeaseRecord, decide, release
from flexinfer.manager.client import KubeApi

log = logging.getLogger("flexinfer.manager")
Body = dict[str, Any]
LEASE_NAME = "flexinfer-manager"


def _parse_time(text: str | None) -> datetime | None:
    return datetime.fromisoformat(text.replace("Z", "+00:00")) if text else None


def _format_time(moment: datetime | None) -> str | None:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ") if moment is not None else None


def record_of(body: Body | None) -> LeaseRecord | None:
    if body is None:
        return None
    spec = body.get("spec") or {}
    return LeaseRecord(spec.get("holderIdentity"), int(spec.get("leaseDurationSeconds") or 15),
                       _parse_time(spec.get("acquireTime")), _parse_time(spec.get("renewTime")),
                       int(spec.get("leaseTransitions") or 0))


def lease_spec(record: LeaseRecord) -> Body:
    return {"holderIdentity": record.holder, "leaseDurationSeconds": record.duration_seconds,
            "acquireTime": _format_time(record.acquire_time), "renewTime": _format_time(record.renew_time),
            "leaseTransitions": record.transitions}


class LeaderElector:
    """See the module docstring."""

    def __init__(self, api: KubeApi, namespace: str, identity: str, *, duration: int = 15,
                 renew_every: float = 5.0, clock: Callable[[], datetime] = lambda: datetime.now(UTC)) -> None:
        self._api, self.namespace, self.identity = api, namespace, identity
        self._duration, self._renew_every, self._clock = duration, renew_every, clock
        self.healthy = False
        self._last_renew: datetime | None = None

    async def try_once(self) -> bool:
        """One round: read, decide, write. True when we lead afterwards."""
        try:
            body = await self._api.get_lease(self.namespace, LEASE_NAME)
            now = self._clock()
            decision = decide(record_of(body), self.identity, now, self._duration)
            if decision.write is not None:
                await self._write(body, decision.write)
            self.healthy = True
        except (ApiError, OSError) as error:
            self.healthy = False
            log.debug("leader election round failed: %s", error)
            return False
        if decision.leader:
            self._last_renew = now
        return decision.leader

    async def _write(self, body: Body | None, record: LeaseRecord) -> None:
        if body is None:
            await self._api.create_lease({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                                          "metadata": {"name": LEASE_NAME, "namespace": self.namespace},
                                          "spec": lease_spec(record)})
            return
        meta = body["metadata"]
        await self._api.replace_lease({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                                       "metadata": {"name": LEASE_NAME, "namespace": self.namespace,
                                                    "resourceVersion": meta["resourceVersion"]},
                                       "spec": lease_spec(record)})

    async def acquire(self) -> None:
        """Return once this manager holds the Lease."""
        retry = asyncio.Event()  # never set: a bounded wait between rounds
        while not await self.try_once():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._renew_every / 2):
                    await retry.wait()
        log.info("became leader (%s/%s as %s)", self.namespace, LEASE_NAME, self.identity)

    async def hold(self) -> None:
        """Renew until leadership is lost; then return."""
        while True:
            await asyncio.sleep(self._renew_every)
            if await self.try_once():
                continue
            now = self._clock()
            deadline = (self._last_renew or now) + timedelta(seconds=self._duration)
            current = record_of(await self._safe_get())
            if (current is not None and current.holder not in (None, self.identity)) or now >= deadline:
                log.error("lost leadership of %s/%s", self.namespace, LEASE_NAME)
                return

    async def _safe_get(self) -> Body | None:
        try:
            return await self._api.get_lease(self.namespace, LEASE_NAME)
        except (ApiError, OSError):
            return None

    async def release(self) -> None:
        """Give the Lease up if we hold it (best effort)."""
        body = await self._safe_get()
        current = record_of(body)
        freed = release(current, self.identity) if current is not None else None
        if body is None or freed is None:
            return
        try:
            await self._write(body, freed)
        except (ApiError, OSError) as error:
            log.warning("could not release the leader lease: %s", error)
