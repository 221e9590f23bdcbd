"""What one reconcile pass over a unit does: the plan's parts, which the manager's reconciler executes as I/O.

``UnitPlan`` (built by ``flexinfer.core.unit_plan.plan_unit``) holds the ``Rejection``s, ``Preemption``s and one
``MemberAction`` per member (manifests to apply, the status patch, the log to read, what the lifecycle tracker
needs); ``member_status`` is the status a member's facts give, with the fields ignored in stored objects named.
Pure data and pure functions.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, Final

from flexinfer.api.model import Model, ModelStatus
from flexinfer.core.election import Election
from flexinfer.core.loading_logs import LOG_TAIL_LINES, refine_from_log
from flexinfer.core.measured_memory import measurement
from flexinfer.core.model_status.build import (
    REASON_FIELD_IGNORED,
    REASON_VALIDATION_FAILED,
    StatusInputs,
    build_status,
    status_patch,
    with_ignored_fields,
)
from flexinfer.core.model_status.pod_failure import PodFailure, crash_cause, shown_failure

Json = dict[str, Any]


@dataclass(frozen=True)
class Rejection:
    """An invalid Model: the status patch to write (``{}``: already written) and the message naming the field."""

    body: Json
    patch: Json
    message: str
    reason: str = REASON_VALIDATION_FAILED

    @property
    def announce(self) -> bool:
        """The conditions change: post a Warning event ``ValidationFailed``."""
        return "conditions" in self.patch


@dataclass(frozen=True)
class Preemption:
    """A Ready member that loses the GPU in this pass: write ``patch`` first, then post ``message``."""

    model: Model
    patch: Json
    by: str
    message: str


@dataclass(frozen=True)
class IgnoredFields:
    """Fields ignored for a Model: ``message`` ('' when none) for it, ``own`` when some are in the Model itself
    (an API server without validation ratcheting then refuses its status writes), and one
    ``(key, body, message)`` per matching ModelCache that holds some."""

    message: str = ""
    own: bool = False
    caches: tuple[tuple[str, Json, str], ...] = ()
    reason: str = REASON_FIELD_IGNORED


CRASH_LOG_LINES: Final = 40
"""Lines of a crashed container's previous log read to name the cause."""


@dataclass(frozen=True)
class LogRead:
    """The log tail to read: pod, container, how many lines, and whether of the container's previous run."""

    pod: str
    container: str
    lines: int = LOG_TAIL_LINES
    previous: bool = False
    run: str = ""
    """Set for a Ready server's measurement read (``flexinfer.core.measured_memory``): the server run read."""


@dataclass(frozen=True)
class MemberAction:
    """One member's I/O for this pass. ``model`` is the Model as decided on (reports folded in)."""

    model: Model
    manifests: tuple[Json, Json]
    """The Deployment and the Service, applied in this order."""
    inputs: StatusInputs
    """What ``status`` was built from (``with_log`` refines the loading detail in it)."""
    status: ModelStatus
    patch: Json
    """Merge patch from ``stored`` to ``status``; ``{}``: nothing to write."""
    ignored: IgnoredFields
    stops: bool = False
    """Its Deployment had replicas and is scaled to zero by this apply (a swap's drain ends)."""
    ready_at: datetime | None = None
    """While Ready: the Ready instant the cluster recorded (``build.ready_source``)."""
    ready_seen: datetime | None = None
    """While Ready: when the manager's watch showed that condition turn True (``None``: not seen live)."""
    busy: tuple[str, ...] = ()
    """Proxies reporting requests in flight for it."""
    log: LogRead | None = None
    """The log whose tail can refine the loading detail (a container runs but is not ready yet), name a crash's
    cause, or measure a Ready server's memory (``LogRead.run``)."""
    stored: ModelStatus = field(default_factory=ModelStatus)
    """The member's status as stored."""
    failure: PodFailure | None = None
    """While the member is Failed because its pod cannot start (``pod_failure``): the reason and cause."""

    @property
    def announce(self) -> bool:
        """A failure appeared or its cause changed: post a Warning event (reason = ``failure.reason``)."""
        return self.failure is not None and ("phase" in self.patch or "message" in self.patch)

    def with_log(self, lines: Sequence[str]) -> MemberAction:
        """This action with the loading detail (or a crash's cause, or a Ready server's measured memory) refined
        by the log's newest ``lines``."""
        if self.log is not None and self.log.run:
            return self._with_measurement(self.log, lines)
        if self.failure is not None:
            return self._with_cause(crash_cause(lines))
        loading = self.inputs.loading
        refined = refine_from_log(lines)
        if refined is None or loading is None:
            return self
        inputs = replace(self.inputs, loading=replace(refined, log_container=loading.log_container))
        status = member_status(self.model, inputs, self.ignored)
        return replace(self, inputs=inputs, status=status, patch=status_patch(self.stored, status), log=None)

    def _with_measurement(self, read: LogRead, lines: Sequence[str]) -> MemberAction:
        """The measured record in ``status.sharedGroup`` (the rest of the status as built: the pod endpoint, the
        node); the next pass's election counts it."""
        shared = self.status.shared_group
        if shared is None:
            return replace(self, log=None)
        record = measurement(lines, read.lines, run=read.run, generation=self.model.metadata.generation,
                             on_gpu=self.model.gpu_count > 0)
        shared = shared.model_copy(update={"memory_measured": record})
        status = self.status.model_copy(update={"shared_group": shared})
        inputs = replace(self.inputs, shared=shared)
        return replace(self, inputs=inputs, status=status, patch=status_patch(self.stored, status), log=None)

    def _with_cause(self, cause: str | None) -> MemberAction:
        """The crash's cause from its previous log; an unreadable log keeps the cause already written."""
        assert self.failure is not None
        failure = self.failure.with_cause(cause, shown=shown_failure(self.stored))
        inputs = replace(self.inputs, failure=(failure.reason, failure.message))
        status = member_status(self.model, inputs, self.ignored)
        return replace(self, inputs=inputs, status=status, patch=status_patch(self.stored, status), log=None,
                       failure=failure)


@dataclass(frozen=True)
class UnitPlan:
    """One pass over one unit (see the module docstring)."""

    now: datetime
    rejections: tuple[Rejection, ...] = ()
    declared: tuple[Model, ...] = ()
    preemptions: tuple[Preemption, ...] = ()
    members: tuple[MemberAction, ...] = ()
    wake: datetime | None = None
    election: Election | None = None
    """The shared group's election of this pass (``None`` for an exclusive Model)."""
    unreadable_markers: tuple[tuple[str, str], ...] = ()
    """(Model key, annotation text) of wait markers that are not RFC 3339 times (ignored)."""
    reap: tuple[tuple[str, str], ...] = ()
    """Pods of members a winner waits for whose containers have all exited: deleted at once (``device_handover``)."""


def member_status(model: Model, inputs: StatusInputs, ignored: IgnoredFields) -> ModelStatus:
    """``build_status``, with ``ConfigValid=False`` naming the fields ignored for this model (if any)."""
    status = build_status(model, inputs)
    if not ignored.message:
        return status
    return with_ignored_fields(status, ignored.message, model.metadata.generation, inputs.now)
