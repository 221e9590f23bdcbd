"""``LocalEngine``: the ``flexinfer.runtime.ports.Engine`` for one machine — model servers as child processes.

``start`` resolves the weights (``file://`` only; staged into tmpfs through the injected ``Stager`` when
the model's flash-loader settings — ``flash``, the cluster's resolution, see ``flexinfer.local.flash_settings``
— enable it), picks a launch profile, spawns the server on a free loopback port in its own
process group and returns once its health endpoint answers. A server that exits before Ready raises
``EngineError`` with its last output lines; cancelling ``start`` kills what it spawned. A server that
exits after Ready is reported through the ``ServerReporter`` its ``start`` was given (the dispatcher turns it into
``ModelCrashed``).
``stop`` is SIGTERM → grace → SIGKILL for the group; ``aclose`` does that for every child; ``hurry``
SIGTERMs every child now and SIGKILLs it after ``close_grace`` (a second shutdown signal). With
``records_dir`` every child group is recorded there while it runs (``flexinfer.local.leftovers``), so a
``serve`` started after this one was killed can reap what it left (``reap_leftovers``).

Built by ``flexinfer.assembly.run_local``; the admin API reads ``logs``/``endpoint`` from it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from flexinfer.api.model import Model
from flexinfer.api.units import parse_duration
from flexinfer.core.errors import EngineError, StagingError
from flexinfer.core.flashloader_settings import FlashLoaderConfig
from flexinfer.local.flash_settings import FlashSettings
from flexinfer.local.gpu_discovery import GpuInventory
from flexinfer.local.leftovers import TOKEN_VARIABLE, ProcessRecords
from flexinfer.local.logs import LogStore
from flexinfer.local.ports import PortAllocator
from flexinfer.local.process import ServerProcess, describe_exit
from flexinfer.local.profiles import Availability, LaunchPlan, SystemAvailability, plan_launch
from flexinfer.local.readiness import NotReady, ServerExited, wait_ready
from flexinfer.local.sources import existing_source, staging_plan
from flexinfer.runtime.ports import Endpoint, ServerReporter

log = logging.getLogger(__name__)
ERROR_TAIL_LINES = 8
"""Output lines quoted in a start error (it reaches API clients); ``flexinfer logs`` shows the rest."""


@dataclass(frozen=True)
class LocalEngineSettings:
    """How the local engine runs servers (assembly builds it from flags and ``flexinfer.settings``)."""

    host: str = "127.0.0.1"
    stop_grace: float = 10.0
    """Seconds between SIGTERM and SIGKILL on ``stop``."""
    close_grace: float = 2.0
    """The same on ``aclose`` (``serve`` shutting down)."""
    start_timeout: float = 300.0
    """Default readiness budget; ``spec.config.startupTimeout`` overrides it per model."""
    log_lines: int = 1000
    log_dir: Path | None = None
    records_dir: Path | None = None
    """Where running child groups are recorded (``<state dir>/processes``); ``None``: not recorded."""
    shm_root: Path = Path("/dev/shm/flexinfer")
    base_dir: Path = Path(".")
    """Relative ``file://`` sources resolve against this directory."""
    env: Mapping[str, str] = field(default_factory=dict)
    """The environment children inherit (``flexinfer.settings.environment()``)."""


class Stager(Protocol):
    """Copies (incrementally) the weights directory ``src`` into directory ``dst`` with the model's resolved
    flash-loader settings; raises ``StagingError`` (``InsufficientSpaceError`` when tmpfs, or the settings'
    tmpfs size limit, is too small). Assembly adapts ``flexinfer.flashloader.stage``."""

    async def __call__(self, model: Model, src: Path, dst: Path, config: FlashLoaderConfig) -> None: ...


"""Called with the model and its exit status when a Ready server exits without being asked to."""


def start_timeout(model: Model, default: float) -> float:
    """``spec.config.startupTimeout`` (a duration such as ``90s``, or seconds) or ``default``."""
    value = model.spec.config.get("startupTimeout")
    if value is None:
        return default
    try:
        seconds = float(value) if isinstance(value, int | float) else parse_duration(str(value))
    except ValueError as exc:
        raise EngineError(f"model {model.key}: spec.config.startupTimeout: {exc}") from None
    return seconds if seconds > 0 else default


@dataclass
class _Server:
    model: Model
    process: ServerProcess
    port: int
    endpoint: Endpoint
    report: ServerReporter
    stopping: bool = False
    watcher: asyncio.Task[None] | None = None


class LocalEngine:
    """Starts and stops model servers as child processes (see the module docstring)."""

    def __init__(self, settings: LocalEngineSettings | None = None, *, stager: Stager | None = None,
                 flash: Callable[[Model], FlashLoaderConfig] | None = None,
                 installed: Availability | None = None, gpus: GpuInventory | None = None) -> None:
        self.settings = settings or LocalEngineSettings()
        self._stager = stager
        self.flash = flash or FlashSettings()
        """The flash-loader settings of a model (``FlashSettings``: environment defaults, ModelCaches)."""
        path = self.settings.env.get("PATH")
        self._installed = installed or SystemAvailability(path=path)
        self._gpus = gpus or GpuInventory(path=path)
        self._ports = PortAllocator(self.settings.host)
        self.logs = LogStore(self.settings.log_dir, self.settings.log_lines)
        self._servers: dict[str, _Server] = {}
        self._children: set[ServerProcess] = set()
        self._warned: set[str] = set()
        self._closed = False
        self._records = ProcessRecords(self.settings.records_dir) if self.settings.records_dir else None

    # ------------------------------------------------------------ Engine port

    async def start(self, model: Model, report: ServerReporter) -> Endpoint:
        """Start ``model``'s server and return its endpoint once Ready (see the module docstring)."""
        if self._closed:
            raise EngineError(f"model {model.key}: the local engine is shutting down")
        running = self._servers.get(model.key)
        if running is not None:
            return running.endpoint
        weights = await self._weights(model, report)
        devices = await self._gpus.device_env(model)
        if devices.warning and model.key not in self._warned:
            self._warned.add(model.key)
            log.warning("%s", devices.warning)
        port = self._ports.allocate()
        try:
            plan = plan_launch(model, str(weights), port, self.settings.host, self._installed)
            env = {**self.settings.env, **devices.env, **plan.env}
            return await self._launch(model, plan, env, port, report)
        except BaseException:
            self._ports.release(port)
            raise

    async def stop(self, model: Model) -> None:
        """Stop ``model``'s server: SIGTERM its group, wait ``stop_grace``, SIGKILL (no-op if not running)."""
        server = self._servers.pop(model.key, None)
        if server is None:
            return
        server.stopping = True
        await self._terminate(server.process, self.settings.stop_grace)
        self._ports.release(server.port)

    # ------------------------------------------------------------ lifecycle of the engine itself

    async def aclose(self) -> None:
        """Stop every child group (grace ``close_grace``) and refuse further starts. Idempotent."""
        self._closed = True
        for server in self._servers.values():
            server.stopping = True
        self._servers.clear()
        await asyncio.gather(*(self._terminate(p, self.settings.close_grace) for p in list(self._children)))
        self.logs.close()

    def hurry(self) -> None:
        """Refuse further starts, SIGTERM every child group now and SIGKILL it after ``close_grace``
        (returns at once; pending ``stop``/``aclose`` calls end as the children exit)."""
        self._closed = True
        for process in list(self._children):
            process.hurry(self.settings.close_grace)

    def reap_leftovers(self) -> int:
        """Kill the model servers a previous, killed ``serve`` recorded in ``records_dir``; returns how many
        groups had live members."""
        if self._records is None:
            return 0
        reaped = self._records.reap()
        for record in reaped:
            log.warning("killed model server group %d left by a previous serve (pid %d): %s", record.pgid,
                        record.owner_pid, " ".join(record.argv))
        return len(reaped)

    def kill_all(self) -> None:
        """SIGKILL every child group now (synchronous: for a last-resort exit path)."""
        for process in list(self._children):
            process.kill()

    # ------------------------------------------------------------ queries (admin API, status)

    def endpoint(self, key: str) -> Endpoint | None:
        """The endpoint of a Ready server, by model key (``namespace/name``)."""
        server = self._servers.get(key)
        return server.endpoint if server else None

    def pid(self, key: str) -> int | None:
        """The process id (= process group id) of a Ready server."""
        server = self._servers.get(key)
        return server.process.pid if server else None

    @property
    def child_pids(self) -> list[int]:
        """Every live child group (Ready or still starting)."""
        return [p.pid for p in self._children]

    # ------------------------------------------------------------ internals

    async def _weights(self, model: Model, report: ServerReporter) -> Path:
        """The path the server loads: the ``file://`` source, or its staged tmpfs copy."""
        src = existing_source(model, self.settings.base_dir)
        config = self.flash(model)
        if not config.enabled:
            return src
        if self._stager is None:
            raise EngineError(f"model {model.key}: the flash-loader is enabled but this engine has no stager")
        plan = staging_plan(model, src, self.settings.shm_root)
        report.stage("staging")
        try:
            await self._stager(model, plan.src, plan.dst, config)
        except StagingError as exc:
            raise EngineError(f"model {model.key}: refusing to start, weights not staged into {plan.dst}: {exc}") \
                from exc
        return plan.served_path

    async def _launch(self, model: Model, plan: LaunchPlan, env: Mapping[str, str], port: int,
                      report: ServerReporter) -> Endpoint:
        report.stage("server_start")
        token = ProcessRecords.new_token()
        process = await ServerProcess.spawn(plan.argv, {**env, TOKEN_VARIABLE: token}, self.logs.get(model.key))
        self._children.add(process)
        log.info("model %s: server started (pid %s, port %d)", model.key, process.pid, port,
                 extra={"event": "server_started", "model": model.key, "pid": process.pid, "port": port})
        if self._records is not None:
            self._records.add(process.pid, token, plan.argv)
        timeout = start_timeout(model, self.settings.start_timeout)
        try:
            await wait_ready(self.settings.host, port, plan.health_path, timeout=timeout, exited=process.exited,
                             on_connected=lambda: report.stage("health"))
        except BaseException as exc:
            process.kill()
            await self._forget(process)
            raise self._start_error(model, plan, port, timeout, process, exc=exc) from None
        host = f"[{self.settings.host}]" if ":" in self.settings.host else self.settings.host
        server = _Server(model, process, port, Endpoint(f"http://{host}:{port}"), report)
        server.watcher = asyncio.create_task(self._watch(server), name=f"watch-{model.key}")
        self._servers[model.key] = server
        return server.endpoint

    def _start_error(self, model: Model, plan: LaunchPlan, port: int, timeout: float,
                     process: ServerProcess, *, exc: BaseException) -> BaseException:
        """The error ``start`` raises for ``exc`` (cancellation passes through unchanged)."""
        if isinstance(exc, ServerExited):
            code = process.returncode
            how = describe_exit(code) if code is not None else "an unknown status"
            what = f"server ({plan.origin}) exited with {how} before it was ready"
        elif isinstance(exc, NotReady):
            what = f"server ({plan.origin}) not ready within {timeout:g}s (GET {plan.health_path} on port {port})"
        else:
            return exc
        tail = "\n".join(process.output.tail(ERROR_TAIL_LINES))
        return EngineError(f"model {model.key}: {what}; last output (more: flexinfer logs {model.key}):\n{tail}")

    async def _watch(self, server: _Server) -> None:
        """Report a Ready server that exits on its own, and clean up after it."""
        code = await server.process.wait()
        if server.stopping:
            return
        if self._servers.get(server.model.key) is server:
            del self._servers[server.model.key]
        log.warning("model %s: server exited with %s after it was ready", server.model.key, describe_exit(code))
        server.process.kill()
        await self._forget(server.process)
        self._ports.release(server.port)
        server.report.exited(f"model server exited with {describe_exit(code)}")

    async def _terminate(self, process: ServerProcess, grace: float) -> None:
        await process.terminate(grace)
        self._discard(process)

    async def _forget(self, process: ServerProcess) -> None:
        await process.close()
        self._discard(process)

    def _discard(self, process: ServerProcess) -> None:
        self._children.discard(process)
        if self._records is not None:
            self._records.remove(process.pid)
