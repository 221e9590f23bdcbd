"""Model lifecycle phases: the transition table, condition types/reasons, loading substages, and the
condition upsert with Kubernetes ``lastTransitionTime`` semantics.

Used by the arbiter (``flexinfer.core.arbiter.machine``) for the local engine's model states and by the
Kubernetes engine's status derivation (``flexinfer.core.model_status.build``) for ``Model.status``.
"""

from __future__ import annotations

from datetime import datetime
from typing import Final, Literal

from flexinfer.api.base import Condition
from flexinfer.api.model import Phase
from flexinfer.core.errors import IllegalTransitionError

IDLE: Final = "Idle"
PENDING: Final = "Pending"
LOADING: Final = "Loading"
READY: Final = "Ready"
PREEMPTED: Final = "Preempted"
FAILED: Final = "Failed"
PHASES: Final[tuple[Phase, ...]] = (IDLE, PENDING, LOADING, READY, PREEMPTED, FAILED)

_ALLOWED: Final[dict[str, frozenset[str]]] = {
    IDLE: frozenset({PENDING, LOADING, READY, FAILED}),
    PENDING: frozenset({IDLE, LOADING, READY, FAILED}),
    LOADING: frozenset({IDLE, PENDING, READY, PREEMPTED, FAILED}),
    READY: frozenset({IDLE, PENDING, LOADING, PREEMPTED, FAILED}),
    PREEMPTED: frozenset({IDLE, PENDING, LOADING, READY, FAILED}),
    FAILED: frozenset({IDLE, PENDING, LOADING, READY}),
}
"""``old -> allowed new`` phases. Only a model that holds (or is loading onto) the GPU can be preempted;
a Failed model cannot be preempted. Ready may be reached from any other phase because the Kubernetes
engine derives phases from Deployment status, which can jump several steps between reconciles."""

# Condition types and reasons (spec §1.1.2).
COND_CACHED: Final = "Cached"
COND_READY: Final = "Ready"
COND_CONFIG_VALID: Final = "ConfigValid"
REASON_WAITING_FOR_ACTIVATION: Final = "WaitingForActivation"
REASON_STARTING_BACKEND: Final = "StartingBackend"
REASON_BACKEND_READY: Final = "BackendReady"
REASON_PREEMPTED: Final = "Preempted"
REASON_START_FAILED: Final = "StartFailed"
REASON_CONFIG_VALID: Final = "ConfigValid"

ConditionStatus = Literal["True", "False", "Unknown"]


def check_transition(old: str | None, new: str) -> None:
    """Raise ``IllegalTransitionError`` unless ``old -> new`` is in the table (``None`` = first phase)."""
    if new not in _ALLOWED:
        raise IllegalTransitionError(f"unknown phase {new!r}")
    if old is None or old == new:
        return
    if new not in _ALLOWED.get(old, frozenset()):
        raise IllegalTransitionError(f"illegal phase transition {old} -> {new}")


def ready_condition(phase: str) -> tuple[ConditionStatus, str]:
    """The ``Ready`` condition (status, reason) a phase implies (spec §3.6)."""
    if phase == READY:
        return "True", REASON_BACKEND_READY
    if phase == PREEMPTED:
        return "False", REASON_PREEMPTED
    if phase in (LOADING, PENDING):
        return "False", REASON_STARTING_BACKEND
    if phase == FAILED:
        return "False", REASON_START_FAILED
    return "False", REASON_WAITING_FOR_ACTIVATION


def find_condition(conditions: list[Condition], type_: str) -> Condition | None:
    return next((c for c in conditions if c.type == type_), None)


def set_condition(
    conditions: list[Condition], type_: str, status: ConditionStatus, reason: str, *, message: str = "",
    now: datetime, observed_generation: int | None = None,
) -> list[Condition]:
    """Upsert a condition by type and return the new list (input untouched).

    Unchanged status/reason/message/generation → the same list back. ``lastTransitionTime`` is bumped
    only when the status flips (or the condition is new); a reason/message change keeps it.
    """
    old = find_condition(conditions, type_)
    if old is None:
        new = Condition(type=type_, status=status, reason=reason, message=message,
                        last_transition_time=now, observed_generation=observed_generation)
        return [*conditions, new]
    if (old.status, old.reason, old.message, old.observed_generation) == (
            status, reason, message, observed_generation):
        return conditions
    since = now if old.status != status else old.last_transition_time
    new = old.model_copy(update={"status": status, "reason": reason, "message": message,
                                 "last_transition_time": since, "observed_generation": observed_generation})
    return [new if c.type == type_ else c for c in conditions]
