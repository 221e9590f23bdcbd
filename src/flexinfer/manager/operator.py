"""The kopf side of the manager: watches, the deletion finalizer, settings, and a thread to run it in.

Handlers are thin: every watch event (Models; Deployments, Services and Pods managed by FlexInfer;
ModelCaches; GPULeases; the proxies' ModelDemands)
is handed to ``Bridge.event`` (the store + reconcile queue live on the manager's
event loop); a Model being deleted runs ``Bridge.deleting`` there and kopf then releases the finalizer
``flexinfer.ai/model-cleanup``. Errors leave the handlers mapped onto kopf's retry semantics
(``kopf_error``, the operator edge of ``flexinfer.core.errors``): a permanent error (an invalid resource or
setting: retrying cannot help) is not retried, so the finalizer is released; anything else is temporary
and retried after ``RETRY_DELAY`` seconds, at most ``RETRIES`` times. kopf runs standalone (leader election
is our own Lease), posts no handler logs as Events, and keeps its bookkeeping (a deletion handler's retries) in
``flexinfer.ai/``-prefixed annotations. It keeps no diff base (``NoDiffBase``): the manager has no create, update or
resume handlers, so kopf writes nothing on a Model but the finalizer.

kopf runs in its own thread and event loop (``OperatorThread``): on exit kopf cancels every task its
loop started after it, so it must not share a loop with the manager's workers and HTTP servers.
Used by ``flexinfer.manager.program``.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any, Protocol

import kopf
from lightkube import ApiError

from flexinfer.api.conventions import FINALIZER, MANAGED_BY, MANAGED_BY_LABEL, MODEL_LABEL
from flexinfer.core.errors import ConfigError, IllegalTransitionError, InvalidResourceError
from flexinfer.manager.connection import bounded_session

log = logging.getLogger("flexinfer.manager")
Body = dict[str, Any]
ANNOTATION_PREFIX = "flexinfer.ai"
MANAGED = {MANAGED_BY_LABEL: MANAGED_BY}
PATCH_CONNECTIONS = 16
"""Connections kopf may use at once for finalizer/annotation patches and events, beyond its watch streams."""
WATCHES: tuple[tuple[str, str, str, str, dict[str, Any] | None], ...] = (
    ("Model", "ai.flexinfer", "v1alpha2", "models", None),
    ("ModelCache", "ai.flexinfer", "v1alpha1", "modelcaches", None),
    ("GPULease", "ai.flexinfer", "v1alpha2", "gpuleases", None),
    ("ModelDemand", "ai.flexinfer", "v1alpha1", "modeldemands", None),
    ("Deployment", "apps", "v1", "deployments", MANAGED),
    ("Service", "", "v1", "services", MANAGED),
    ("Pod", "", "v1", "pods", {**MANAGED, MODEL_LABEL: kopf.PRESENT}),
)


RETRY_DELAY = 10.0
"""Seconds before kopf retries a handler that failed temporarily (kopf's own default is 60 s)."""
RETRIES = 30
"""Attempts before a handler that keeps failing temporarily counts as failed (about five minutes)."""
PERMANENT_ERRORS = (InvalidResourceError, ConfigError, IllegalTransitionError)
"""FlexInfer errors that no retry can fix."""
RETRYABLE_API_STATUS = frozenset({408, 409, 429})


def kopf_error(error: Exception) -> kopf.PermanentError | kopf.TemporaryError:
    """An error raised in a handler, as kopf's ``PermanentError`` (never retried) or ``TemporaryError``
    (retried after ``RETRY_DELAY``). API answers 4xx other than timeout/conflict/throttling are permanent."""
    message = str(error) or repr(error)
    if isinstance(error, PERMANENT_ERRORS):
        return kopf.PermanentError(message)
    if isinstance(error, ApiError) and 400 <= (error.status.code or 0) < 500 \
            and error.status.code not in RETRYABLE_API_STATUS:
        return kopf.PermanentError(message)
    return kopf.TemporaryError(message, delay=RETRY_DELAY)


class NoDiffBase(kopf.DiffBaseStorage):
    """kopf's diff base for a registry without create, update or resume handlers: every object counts as handled
    and unchanged. kopf's default stores each object's last handled spec in an annotation (one more patch per
    Model, and one more watch event) and deep-copies every watched body to compare it; the manager reconciles
    from its own store and needs neither. Deletion handlers do not depend on it (a deletion is the
    ``deletionTimestamp``)."""

    def build(self, *, body: kopf.Body, extra_fields: Iterable[Any] | None = None) -> kopf.BodyEssence:
        return kopf.BodyEssence()

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
        return kopf.BodyEssence()

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: kopf.BodyEssence) -> None:
        return None


class Bridge(Protocol):
    """The manager side of the handlers; ``event`` must be thread-safe."""

    def event(self, kind: str, type_: str | None, body: Body) -> None: ...

    async def deleting(self, body: Body) -> None: ...


def operator_settings(settings: kopf.OperatorSettings | None = None) -> kopf.OperatorSettings:
    """Standalone, quiet, FlexInfer's finalizer and annotation prefix, no diff base (``NoDiffBase``)."""
    settings = settings or kopf.OperatorSettings()
    settings.peering.standalone = True
    settings.posting.enabled = False
    settings.persistence.finalizer = FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=ANNOTATION_PREFIX)
    settings.persistence.diffbase_storage = NoDiffBase()
    settings.watching.server_timeout = 300
    settings.networking.request_timeout = 60
    return settings


def connection_limit(namespaces: int) -> int:
    """kopf's connections: one long-lived stream per watch (each resource in each namespace, or cluster-wide)
    plus room for concurrent patches and events."""
    return len(WATCHES) * max(1, namespaces) + PATCH_CONNECTIONS


def build_registry(bridge: Bridge, login: Callable[[], kopf.ConnectionInfo],
                   main_loop: asyncio.AbstractEventLoop, *, namespaces: int = 0) -> kopf.OperatorRegistry:
    """A registry with the login (a connection-bounded session), the watch handlers and the Model deletion
    handler."""
    registry = kopf.OperatorRegistry()

    @kopf.on.login(registry=registry)
    async def _login(**_: Any) -> kopf.AiohttpSession:
        return bounded_session(login(), connection_limit(namespaces))

    for kind, group, version, plural, labels in WATCHES:
        handler = _forwarder(bridge, kind)
        kopf.on.event(group, version, plural, registry=registry, labels=labels, id=f"watch-{plural}")(handler)

    @kopf.on.delete("ai.flexinfer", "v1alpha2", "models", registry=registry, id="model-cleanup",
                    retries=RETRIES)
    async def _cleanup(body: kopf.Body, **_: Any) -> None:
        future = asyncio.run_coroutine_threadsafe(bridge.deleting(dict(body)), main_loop)
        try:
            await asyncio.wrap_future(future)
        except Exception as error:
            raise kopf_error(error) from error

    return registry


def _forwarder(bridge: Bridge, kind: str) -> Callable[..., Awaitable[None]]:
    async def forward(event: kopf.RawEvent, **_: Any) -> None:
        bridge.event(kind, event.get("type"), event["object"])  # type: ignore[arg-type]
    return forward


class OperatorThread:
    """kopf in a thread of its own: ``start``, ``wait_ready``, ``stop``; ``error`` if kopf crashed."""

    def __init__(self, registry: kopf.OperatorRegistry, settings: kopf.OperatorSettings,
                 namespaces: Sequence[str] = ()) -> None:
        self._registry, self._settings, self._namespaces = registry, settings, tuple(namespaces)
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._main, name="kopf", daemon=True)
        self.error: BaseException | None = None
        self.on_exit: Callable[[], None] | None = None

    def start(self) -> None:
        self._thread.start()

    def _main(self) -> None:
        try:
            asyncio.run(kopf.operator(
                registry=self._registry, settings=self._settings, standalone=True,
                clusterwide=not self._namespaces, namespaces=self._namespaces,
                stop_flag=self._stop, ready_flag=self._ready))
        except BaseException as error:  # reported to the manager, which exits 1
            self.error = error
            log.error("the kopf operator failed: %s", error)
        finally:
            self._done.set()
            if self.on_exit is not None:
                self.on_exit()

    async def wait_ready(self, timeout: float) -> bool:
        """True once kopf is running (False if it exited or ``timeout`` passed)."""
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, self._ready_or_done, timeout)
        return self.running

    def _ready_or_done(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not self._ready.wait(0.05) and not self._done.is_set() and time.monotonic() < deadline:
            continue

    @property
    def running(self) -> bool:
        return self._ready.is_set() and not self._done.is_set()

    async def stop(self, timeout: float = 30.0) -> None:
        """Ask kopf to stop and wait for its thread."""
        self._stop.set()
        if self._thread.is_alive():
            await asyncio.get_running_loop().run_in_executor(None, self._thread.join, timeout)
