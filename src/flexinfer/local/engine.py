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

A ``llama-server`` keeps its slots' prompt caches across a stop (``flexinfer.local.prompt_cache``): ``stop``
saves them before the SIGTERM, ``start`` restores them after the health check (the ``restore`` stage) and
before returning, so no request reaches the server before they are back. ``memory`` is a server's measured
memory from its start-up log (``flexinfer.core.server_memory``), kept after it stops; once Ready, the server's
need (what it put on its GPU, else all of it; without such a log, for a model with a GPU, the device memory its
process group holds as the vendor's binding reports it, ``flexinfer.local.gpu_bindings``; for a model without one,
the group's resident memory) is reported through ``ServerReporter.measured`` (a group that packs by memory counts
it from then on). A model with a GPU, no such log and no binding installed (or one that does not see the group)
reports nothing: resident memory does not show what is on the device, so its declared or estimated need stands.

Built by ``flexinfer.assembly.run_local``; the admin API reads ``logs``/``endpoint``/``memory`` from it.
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
from flexinfer.core.errors import ConfigError, EngineError, StagingError
from flexinfer.core.flashloader_settings import FlashLoaderConfig
from flexinfer.core.memory_need import measured_mib, reported_need
from flexinfer.core.server_memory import ServerMemory, parse_memory
from flexinfer.local.flash_settings import FlashSettings
from flexinfer.local.gpu_bindings import process_vram_mib
from flexinfer.local.gpu_discovery import GpuInventory
from flexinfer.local.leftovers import TOKEN_VARIABLE, ProcessRecords
from flexinfer.local.logs import LogStore
from flexinfer.local.ports import PortAllocator
from flexinfer.local.process import ServerProcess, describe_exit, last_server_line
from flexinfer.local.process_memory import group_pids, group_rss_mib
from flexinfer.local.profiles import Availability, LaunchPlan, SystemAvailability, plan_launch
from flexinfer.local.prompt_cache import PromptCaches, ServerCache, has_saved, prepare_dir, server_cache
from flexinfer.local.readiness import NotReady, ServerExited, wait_ready
from flexinfer.local.sources import existing_source, staging_plan
from flexinfer.runtime.ports import Endpoint, ServerReporter

log = logging.getLogger(__name__)
ERROR_TAIL_LINES = 8
"""Output lines quoted in a start error (it reaches API clients); ``flexinfer logs`` shows the rest."""
NEED_POLL = 0.05
"""How often a Ready server's log is read for its buffer lines (``LocalEngineSettings.need_wait``)."""


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
    prompt_cache_root: Path | None = None
    """Where models that are not staged keep their prompt caches (``<state dir>/prompt-cache``); ``None``:
    only staged models keep them (beside their staged copy)."""
    base_dir: Path = Path(".")
    """Relative ``file://`` sources resolve against this directory."""
    env: Mapping[str, str] = field(default_factory=dict)
    """The environment children inherit (``flexinfer.settings.environment()``)."""
    need_wait: float = 5.0
    """How long a Ready server's buffer lines may take to reach its log before its process group's memory (device
    memory on a GPU, else resident) is reported as its need instead (servers that log no buffers wait this long)."""


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


@dataclass(frozen=True)
class _Weights:
    """What a server loads (``path``), the ``spec.source`` file it comes from, and the staging directory."""

    path: Path
    source: Path
    staged: Path | None


@dataclass
class _Server:
    model: Model
    process: ServerProcess
    port: int
    endpoint: Endpoint
    report: ServerReporter
    log_from: int = 0
    """The sequence number of the first output line of this run (``ModelLog.window``)."""
    cache: ServerCache | None = None
    memory: ServerMemory | None = None
    """This run's figures (once its log showed them)."""
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
        self._caches = PromptCaches(self.settings.prompt_cache_root, self.settings.shm_root)
        self._declared: set[str] | None = None
        self._memory: dict[str, ServerMemory] = {}

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
        try:
            slot_dir = prepare_dir(model, weights.staged, self.settings.prompt_cache_root)
        except ConfigError as exc:
            raise EngineError(f"model {exc}") from None
        port = self._ports.allocate()
        try:
            plan = plan_launch(model, str(weights.path), port, self.settings.host, self._installed,
                               slot_dir=str(slot_dir) if slot_dir else None)
            env = {**self.settings.env, **devices.env, **plan.env}
            binary = self._installed.which(plan.argv[0]) or plan.argv[0]
            cache = server_cache(model, plan.slot_dir, weights.source, Path(binary))
            return await self._launch(model, plan, env, port, report, cache=cache)
        except BaseException:
            self._ports.release(port)
            raise

    async def stop(self, model: Model) -> None:
        """Stop ``model``'s server: save its prompt cache (``llama-server``, unless the model is no longer
        declared), SIGTERM its group, wait ``stop_grace``, SIGKILL (no-op if not running)."""
        server = self._servers.pop(model.key, None)
        if server is None:
            return
        server.stopping = True
        self._measure(server)
        if server.cache is not None and not self._closed and self._is_declared(model.key):
            cache = server.cache
            await self._caches.save(model.key, server.endpoint.base_url, cache.directory, cache.identity,
                                    cache.max_bytes)
        await self._terminate(server.process, self.settings.stop_grace)
        self._ports.release(server.port)

    def prune(self, declared: set[str]) -> None:
        """The models now declared (keys): the prompt caches of all others are removed, and a model that is no
        longer declared saves none when it stops."""
        self._declared = set(declared)
        for directory in self._caches.prune(self._declared):
            log.info("removed the prompt cache %s of a model no longer declared", directory)

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

    def memory(self, key: str) -> ServerMemory | None:
        """The model's memory as its server reported it (the last run's once it stopped); ``None`` when it
        reported none (another server, or none started yet)."""
        server = self._servers.get(key)
        if server is not None:
            self._measure(server)
        return self._memory.get(key)

    @property
    def child_pids(self) -> list[int]:
        """Every live child group (Ready or still starting)."""
        return [p.pid for p in self._children]

    # ------------------------------------------------------------ internals

    def _is_declared(self, key: str) -> bool:
        return self._declared is None or key in self._declared

    def _measure(self, server: _Server) -> None:
        """Parse the run's output for its memory figures until they are complete (they replace the last run's
        once there are some)."""
        if server.memory is not None and server.memory.complete:
            return
        measured = parse_memory(server.process.output.window(after=server.log_from).lines)
        if measured is not None:
            server.memory = self._memory[server.model.key] = measured

    async def _report_need(self, server: _Server) -> None:
        """Report what the Ready server takes: the buffers its log shows (the lines may still be on their way:
        up to ``need_wait``), else its process group's device memory through the GPU binding (a model with a GPU) or
        resident memory (one without); both read in a thread. Stops early when the server exits."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.settings.need_wait
        while server.memory is None or not server.memory.complete:
            if server.stopping or server.process.returncode is not None or loop.time() >= deadline:
                break
            await asyncio.sleep(NEED_POLL)
            self._measure(server)
        if server.stopping or server.process.returncode is not None:
            return
        on_gpu = server.model.gpu_count > 0
        logged = measured_mib(server.memory, on_gpu) if server.memory is not None else None
        group = server.process.pid  # the server leads its own process group
        need = await asyncio.to_thread(reported_need, logged, on_gpu, lambda: group_rss_mib(group),
                                       lambda: process_vram_mib(group_pids(group) or ()))
        if need is not None:
            server.report.measured(need)

    async def _weights(self, model: Model, report: ServerReporter) -> _Weights:
        """What the server loads: the ``file://`` source, or its staged tmpfs copy."""
        src = existing_source(model, self.settings.base_dir)
        config = self.flash(model)
        if not config.enabled:
            return _Weights(src, src, None)
        if self._stager is None:
            raise EngineError(f"model {model.key}: the flash-loader is enabled but this engine has no stager")
        plan = staging_plan(model, src, self.settings.shm_root)
        report.stage("staging")
        try:
            await self._stager(model, plan.src, plan.dst, config)
        except StagingError as exc:
            raise EngineError(f"model {model.key}: refusing to start, weights not staged into {plan.dst}: {exc}") \
                from exc
        return _Weights(plan.served_path, src, plan.dst)

    async def _launch(self, model: Model, plan: LaunchPlan, env: Mapping[str, str], port: int,
                      report: ServerReporter, *, cache: ServerCache | None) -> Endpoint:
        report.stage("server_start")
        token = ProcessRecords.new_token()
        output = self.logs.get(model.key)
        log_from = output.written
        process = await ServerProcess.spawn(plan.argv, {**env, TOKEN_VARIABLE: token}, output)
        self._children.add(process)
        log.info("model %s: server started (pid %s, port %d)", model.key, process.pid, port,
                 extra={"event": "server_started", "model": model.key, "pid": process.pid, "port": port})
        if self._records is not None:
            self._records.add(process.pid, token, plan.argv)
        timeout = start_timeout(model, self.settings.start_timeout)
        host = f"[{self.settings.host}]" if ":" in self.settings.host else self.settings.host
        server = _Server(model, process, port, Endpoint(f"http://{host}:{port}"), report, log_from, cache)
        try:
            await wait_ready(self.settings.host, port, plan.health_path, timeout=timeout, exited=process.exited,
                             on_connected=lambda: report.stage("health"))
            if cache is not None and has_saved(cache.directory):
                report.stage("restore")
                await self._caches.restore(model.key, server.endpoint.base_url, cache.directory, cache.identity)
        except BaseException as exc:
            process.kill()
            await self._forget(process)
            raise self._start_error(model, plan, port, timeout, process, exc=exc, log_from=log_from) from None
        server.watcher = asyncio.create_task(self._watch(server), name=f"watch-{model.key}")
        self._servers[model.key] = server
        self._measure(server)
        return server.endpoint

    def _start_error(self, model: Model, plan: LaunchPlan, port: int, timeout: float,
                     process: ServerProcess, *, exc: BaseException, log_from: int) -> BaseException:
        """The error ``start`` raises for ``exc`` (cancellation passes through unchanged). Its first line, what
        one-line views show (``flexinfer ps``, ``load``, the log), ends with the server's own last line of
        this start, for a server that exits usually why (``error: invalid argument: --bogus-flag``)."""
        if isinstance(exc, ServerExited):
            code = process.returncode
            how = describe_exit(code) if code is not None else "an unknown status"
            said = last_server_line(process.output.window(after=log_from).lines)
            what = f"server ({plan.origin}) exited with {how} before it was ready" + (f": {said}" if said else "")
        elif isinstance(exc, NotReady):
            what = f"server ({plan.origin}) not ready within {timeout:g}s (GET {plan.health_path} on port {port})"
        else:
            return exc
        tail = "\n".join(process.output.tail(ERROR_TAIL_LINES))
        return EngineError(f"model {model.key}: {what}; last output (more: flexinfer logs {model.key}):\n{tail}")

    async def _watch(self, server: _Server) -> None:
        """Report what a Ready server takes, then its exit when it exits on its own, and clean up after it."""
        await self._report_need(server)
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
