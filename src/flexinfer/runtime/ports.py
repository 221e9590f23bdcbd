"""The ports between the runtime and its neighbours.

- ``Engine``: what an engine (local processes, Kubernetes) implements so the dispatcher can start and stop
  model servers. Implemented by ``flexinfer.local`` and ``flexinfer.cluster_proxy``; faked by tests.
- ``Activator``: what the proxy needs from the runtime: wait until a model may serve a request, get its
  upstream, and say when the request is over (in-flight accounting). Implemented by the dispatcher.
- ``Catalog``: what the proxy needs to resolve a request's model name and list models.

A request's model name is resolved once, by the ``Catalog``, into a ``ModelKey`` (``namespace/name``); the
``Activator``, its ``Grant`` and the engines only ever see that key.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Protocol

from flexinfer.api.key import ModelKey
from flexinfer.api.model import Model

Stage = str
"""A bounded startup-stage name: ``queue``, ``drain``, ``staging``, ``server_start``, ``health``, ``restore``."""

STAGES: tuple[Stage, ...] = ("queue", "drain", "staging", "server_start", "health", "restore")


@dataclass(frozen=True)
class Endpoint:
    """Where a Ready model server answers (an OpenAI-compatible base URL without ``/v1``)."""

    base_url: str


class ServerReporter(Protocol):
    """How an engine reports on one server it was asked to start: its startup stages (for metrics and traces),
    the memory it measured the server takes once up (MiB: the model's need in a group that packs by memory),
    and, later, an exit nobody asked for (the model becomes Failed and restarts after its backoff)."""

    def stage(self, stage: Stage) -> None: ...

    def measured(self, mib: float) -> None: ...

    def exited(self, reason: str) -> None: ...


class Engine(Protocol):
    """Starts and stops model servers. ``start`` returns once the server is Ready (or raises
    ``EngineError``); it may be cancelled, and must then leave nothing running. ``report`` stays valid for the
    life of the server it started: an engine that watches its servers reports an unasked-for exit through it."""

    async def start(self, model: Model, report: ServerReporter) -> Endpoint: ...

    async def stop(self, model: Model) -> None: ...


@dataclass
class Grant:
    """Permission to send one request to a model; ``release`` must be called exactly once when the
    response is finished (or the client went away)."""

    model: ModelKey
    endpoint: Endpoint
    release: Callable[[], None]
    waited_seconds: float = 0.0
    activation: str | None = None
    """The activation this request triggered or joined (``cold_start``/``swap``), if any."""


class Activator(Protocol):
    """Admission for requests. ``acquire`` waits (bounded by ``timeout``) until the model with key ``model``
    is Ready and returns a ``Grant``; raises ``RequestError`` subclasses (ModelNotFound, QueueFull, ColdStartTimeout,
    ModelFailed, ShuttingDown). Cancelling the awaiting task withdraws the request: it never counts as in
    flight. ``on_wait`` is called once if the request has to wait for an activation."""

    async def acquire(
        self, model: ModelKey, timeout: float | None = None, on_wait: Callable[[str], None] | None = None,
    ) -> Grant: ...


@dataclass(frozen=True)
class ModelView:
    """What the proxy knows about a model: identity, routing names and current state."""

    name: str
    namespace: str
    backend: str
    served_model_name: str
    phase: str
    group: str | None = None
    priority: int = 100
    aliases: tuple[str, ...] = ()
    parked: bool = False
    created: float = 0.0
    metadata: dict[str, object] = field(default_factory=dict)

    @cached_property
    def key(self) -> ModelKey:
        """The model's identity, carried from here on instead of its name (made once per view)."""
        return ModelKey(self.namespace, self.name)


class Catalog(Protocol):
    """Model lookup for the proxy (backed by manifests locally, by a watch cache in Kubernetes).

    ``resolve`` turns a client's model name into the model (``None``: unknown) by the rule of
    ``flexinfer.core.model_index``; it raises ``AmbiguousModelError`` for a bare name several namespaces use."""

    def resolve(self, name: str) -> ModelView | None: ...

    def models(self) -> Sequence[ModelView]: ...
