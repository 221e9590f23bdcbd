"""The arbiter's vocabulary: events in, effects out (the knobs are in ``policy``).

``flexinfer.core.arbiter.machine.Arbiter.handle(event, now)`` consumes the events below and returns effects.
The dispatcher (``flexinfer.runtime.dispatcher``) is the only production caller: it turns requests and
engine completions into events and executes the effects. Tests script both sides directly.

Times are plain floats (seconds on the caller's monotonic clock); model identity is the model key
(``flexinfer.api.key.ModelKey``, ``namespace/name``), resolved by the proxy's catalog before a request gets
here: the arbiter never looks a bare name up; tickets are ints chosen by the caller.
"""

from __future__ import annotations

from dataclasses import dataclass

from flexinfer.api.key import ModelKey
from flexinfer.api.model import Model
from flexinfer.core.errors import RequestError

# ---------------------------------------------------------------- events


@dataclass(frozen=True)
class RequestArrived:
    """A caller wants to send one request to ``model``; ``deadline`` is the caller's own budget."""

    ticket: int
    model: ModelKey
    deadline: float | None = None


@dataclass(frozen=True)
class RequestCancelled:
    """The caller went away (before or after its grant); the ticket ends without counting as in flight."""

    ticket: int


@dataclass(frozen=True)
class RequestFinished:
    """A granted request is over (``Grant.release``)."""

    ticket: int


@dataclass(frozen=True)
class ModelReady:
    """The engine reports the model Ready at ``endpoint`` (an ``Endpoint`` or any opaque value)."""

    model: ModelKey
    endpoint: object


@dataclass(frozen=True)
class ModelStartFailed:
    model: ModelKey
    error: str


@dataclass(frozen=True)
class ModelStopped:
    """The model server is gone (a requested stop finished, or it exited on its own)."""

    model: ModelKey


@dataclass(frozen=True)
class ModelCrashed:
    """A Ready (or loading) model server exited without being asked to: the model becomes Failed, its
    waiting tickets are rejected, and the next start waits out the restart backoff."""

    model: ModelKey
    error: str


@dataclass(frozen=True)
class MemoryNeedReported:
    """What ``model`` needs of its group's memory budget, in MiB: the engine's ``estimated`` figure for its
    current manifest (before it starts), or the ``measured`` one of its running server."""

    model: ModelKey
    mib: float
    source: str


@dataclass(frozen=True)
class StageReached:
    """An engine-reported startup stage began (``staging``/``server_start``/``health``)."""

    model: ModelKey
    stage: str


@dataclass(frozen=True)
class Tick:
    """Time passed; deadlines up to ``now`` fire (``handle`` is given the same ``now``)."""

    now: float


@dataclass(frozen=True)
class Preload:
    model: ModelKey


@dataclass(frozen=True)
class Unload:
    model: ModelKey


@dataclass(frozen=True)
class Shutdown:
    """Stop admitting; reject waiting tickets; drain (``drain_timeout``, else the policy's) and stop all."""

    drain_timeout: float | None = None


@dataclass(frozen=True)
class ModelsReplaced:
    """The declared set of models changed (add/update/remove)."""

    models: tuple[Model, ...]


Event = (
    RequestArrived | RequestCancelled | RequestFinished | ModelReady | ModelStartFailed | ModelStopped | ModelCrashed
    | StageReached | Tick | Preload | Unload | Shutdown | ModelsReplaced | MemoryNeedReported
)

# ---------------------------------------------------------------- effects


@dataclass(frozen=True)
class GrantTicket:
    ticket: int
    model: ModelKey
    endpoint: object
    waited: float
    activation: str | None = None
    """``cold_start``/``swap`` when the ticket waited for (or joined) an activation."""


@dataclass(frozen=True)
class RejectTicket:
    ticket: int
    model: ModelKey
    error: RequestError


@dataclass(frozen=True)
class StartModel:
    model: ModelKey


@dataclass(frozen=True)
class StopModel:
    """Stop the model (cancelling a start in progress). ``forced`` = the drain timeout expired."""

    model: ModelKey
    forced: bool = False


@dataclass(frozen=True)
class ScheduleWake:
    """Post ``Tick`` at ``at`` (replaces any earlier wake); ``None`` = nothing pending."""

    at: float | None


@dataclass(frozen=True)
class ObserveColdStart:
    model: ModelKey
    seconds: float


@dataclass(frozen=True)
class ObserveSwap:
    model: ModelKey
    group: str
    seconds: float


@dataclass(frozen=True)
class ObserveStage:
    model: ModelKey
    stage: str
    seconds: float


@dataclass(frozen=True)
class PhaseChanged:
    """``reason``: the condition reason (CamelCase); ``detail``: why, for people: the stop's cause ("idle timeout",
    "unloaded", "preempted by ns/name", …) or the failure's error; ``retry_in``: a failure's backoff (seconds)."""

    model: ModelKey
    old: str | None
    new: str
    reason: str = ""
    detail: str = ""
    retry_in: float | None = None


@dataclass(frozen=True)
class Preempted:
    """``loser`` lost the GPU of ``group`` to ``winner`` (a swap decision)."""

    group: str
    loser: ModelKey
    winner: ModelKey


@dataclass(frozen=True)
class ActivationDone:
    """One activation ended: its kind, stage start times, the tickets that waited for it, the outcome."""

    model: ModelKey
    kind: str
    started_at: float
    ended_at: float
    stages: tuple[tuple[str, float, float], ...]
    tickets: tuple[int, ...]
    result: str = "success"
    preempted: ModelKey | None = None


@dataclass(frozen=True)
class ModelDeclared:
    """The model joined the declared set (or its spec changed): create its series at zero."""

    model: Model


@dataclass(frozen=True)
class ModelForgotten:
    """The model was removed from the declared set; drop its series/state."""

    model: Model


@dataclass(frozen=True)
class ShutdownComplete:
    """Every model is stopped after ``Shutdown``."""


Effect = (
    GrantTicket | RejectTicket | StartModel | StopModel | ScheduleWake | ObserveColdStart | ObserveSwap
    | ObserveStage | PhaseChanged | Preempted | ActivationDone | ModelDeclared | ModelForgotten | ShutdownComplete
)
