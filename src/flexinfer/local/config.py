"""Settings of ``flexinfer serve`` (the local engine and its swap policy) from an environment snapshot.

``local_config(env, base_dir)`` parses the ``FLEXINFER_*`` variables below (``ENV_VARS`` is the
documentation table) through ``flexinfer.core.envvalues.EnvReader``, and the swap knobs both engines
share (``flexinfer.core.swap_knobs``: ``FLEXINFER_SWAP_MIN_HOLD``, ``FLEXINFER_SWAP_MAX_WAIT``, the
bound checked against the cold-start budget), and the groups that pack by memory
(``FLEXINFER_GROUP_MEMORY``, ``flexinfer.local.memory_budget``); a malformed value raises ``ConfigError``
naming the variable. The flash-loader defaults (``DEFAULT_FLASH_LOADER_*``) are the manager's, parsed by
``flexinfer.core.controller_defaults.flash_loader_defaults`` with the manager's rule (an unparsable value keeps
its default and goes to ``warn``). The admin API's own token is ``FLEXINFER_ADMIN_TOKEN`` or the file ``serve
--admin-token-file`` names (``resolve_admin_token``, which reads that file once). Pure apart from computing
default paths and reading that file. Called by ``flexinfer.assembly.run_local``; tests pass plain dicts.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from flexinfer.api.units import parse_duration
from flexinfer.core.arbiter.policy import ArbiterPolicy
from flexinfer.core.controller_defaults import FlashLoaderDefaults, flash_loader_defaults
from flexinfer.core.envvalues import EnvReader, EnvVar, Kind, Warn
from flexinfer.core.errors import ConfigError
from flexinfer.core.swap_knobs import check_bound_fits, swap_knobs
from flexinfer.local.engine import LocalEngineSettings
from flexinfer.local.memory_budget import parse_entries

ENV_VARS: tuple[EnvVar, ...] = (
    EnvVar("FLEXINFER_STATE_DIR", "$XDG_STATE_HOME/flexinfer or ~/.local/state/flexinfer",
           "Where model-server logs are kept (`logs/<namespace>_<model>.log`), records of running model "
           "servers (`processes/`: a `serve` started after one was killed stops what it left), and the prompt "
           "caches of llama.cpp models that are not staged (`prompt-cache/<namespace>/<model>`)."),
    EnvVar("FLEXINFER_SHM_ROOT", "/dev/shm/flexinfer", "Flash-loader destination root (tmpfs); a staged "
           "llama.cpp model keeps its prompt cache beside its copy (`<namespace>/<model>.prompt-cache`)."),
    EnvVar("FLEXINFER_STOP_GRACE", "10s", "Time between SIGTERM and SIGKILL when a model server is stopped "
           "(a SIGINT follows the SIGTERM after 1s, so servers such as uvicorn do not wait for generations "
           "whose client is gone).", Kind.DURATION),
    EnvVar("FLEXINFER_START_TIMEOUT", "5m", "Readiness budget of a model server (`spec.config.startupTimeout` "
           "overrides it per model).", Kind.DURATION),
    EnvVar("FLEXINFER_DRAIN_TIMEOUT", "30s", "How long an outgoing model may finish in-flight requests.",
           Kind.DURATION),
    EnvVar("FLEXINFER_RESTART_BACKOFF", "5s", "Backoff after a failed start (doubles per failure, max 5m).",
           Kind.DURATION),
    EnvVar("FLEXINFER_GROUP_MEMORY", "", "Shared GPU groups that pack by memory, `GROUP=SIZE,...` (`GROUP`: a "
           "`spec.gpu.shared` value, or `namespace/group`; `SIZE`: e.g. `24Gi`, a number of MiB, or `auto`: the "
           "GPU's total memory from the vendor binding, for CPU-only models the host's available memory). Such a "
           "group keeps as many members running as fit and evicts by cost; others run one model at a time. The "
           "`--group-memory` entries of `serve` win for the groups they name.", Kind.PAIRS),
    EnvVar("FLEXINFER_ADMIN_TOKEN", "", "The admin API's own bearer token: when set, every `/admin/*` route needs "
           "`Authorization: Bearer <it>` whatever `PROXY_AUTH_*` says (unset: the admin routes follow the proxy's "
           "auth); `--admin-token-file` wins. Never logged."),
)
_DEFAULTS = {var.name: var.default for var in ENV_VARS}


@dataclass(frozen=True)
class LocalConfig:
    """Everything ``serve`` needs besides the proxy's own ``PROXY_*`` settings."""

    engine: LocalEngineSettings
    policy: ArbiterPolicy
    flash_loader: FlashLoaderDefaults
    """Layer 1 of the flash-loader settings (``flexinfer.local.flash_settings`` adds the ModelCaches)."""
    group_memory: Mapping[str, float | None] = field(default_factory=dict)
    """``FLEXINFER_GROUP_MEMORY``: MiB by group, ``None`` for ``auto`` (resolved at start-up)."""
    admin_token: str = ""
    """``FLEXINFER_ADMIN_TOKEN`` (empty: the admin routes follow the proxy's auth)."""


def state_dir(env: Mapping[str, str]) -> Path:
    """``FLEXINFER_STATE_DIR``, else ``$XDG_STATE_HOME/flexinfer``, else ``~/.local/state/flexinfer``."""
    if env.get("FLEXINFER_STATE_DIR", "").strip():
        return Path(env["FLEXINFER_STATE_DIR"].strip()).expanduser()
    if env.get("XDG_STATE_HOME", "").strip():
        return Path(env["XDG_STATE_HOME"].strip()) / "flexinfer"
    home = env.get("HOME", "").strip()
    return (Path(home) if home else Path.home()) / ".local" / "state" / "flexinfer"


def duration(env: Mapping[str, str], name: str) -> float:
    """A duration variable in seconds (missing → documented default); ``ConfigError`` naming it when malformed."""
    return EnvReader(env).duration(name, parse_duration(_DEFAULTS[name]))


def local_config(env: Mapping[str, str], base_dir: Path, *, cold_start_timeout: float = 60.0,
                 queue_limit: int = 100, max_concurrency: int = 0, warn: Warn | None = None) -> LocalConfig:
    """Parse the local-mode variables; the proxy's cold-start timeout and queue size feed the policy (a
    starvation bound not shorter than that timeout is a ``ConfigError``). An unparsable flash-loader default goes
    to ``warn`` (without it: ``ConfigError``)."""
    shm = env.get("FLEXINFER_SHM_ROOT", "").strip() or _DEFAULTS["FLEXINFER_SHM_ROOT"]
    engine = LocalEngineSettings(
        stop_grace=duration(env, "FLEXINFER_STOP_GRACE"),
        start_timeout=duration(env, "FLEXINFER_START_TIMEOUT") or 300.0,
        log_dir=state_dir(env) / "logs", shm_root=Path(shm), base_dir=base_dir, env=dict(env),
        prompt_cache_root=state_dir(env) / "prompt-cache",
    )
    knobs = swap_knobs(env)
    check_bound_fits(knobs.max_wait, cold_start_timeout)
    policy = ArbiterPolicy(
        min_hold=knobs.min_hold, max_wait=knobs.max_wait,
        drain_timeout=duration(env, "FLEXINFER_DRAIN_TIMEOUT"),
        restart_backoff=duration(env, "FLEXINFER_RESTART_BACKOFF"),
        cold_start_timeout=cold_start_timeout, queue_limit=queue_limit, max_concurrency=max_concurrency,
        restart_changed=True,
    )
    return LocalConfig(engine=engine, policy=policy, flash_loader=flash_loader_defaults(env, warn=warn),
                       group_memory=parse_entries([env.get("FLEXINFER_GROUP_MEMORY", "")], "FLEXINFER_GROUP_MEMORY"),
                       admin_token=EnvReader(env).text("FLEXINFER_ADMIN_TOKEN"))


def resolve_admin_token(config: LocalConfig, token_file: Path | None) -> str:
    """The admin API's token: the content of ``token_file`` (``--admin-token-file``, read once; trailing newlines
    stripped) when given, else ``FLEXINFER_ADMIN_TOKEN``. An unreadable or empty file is a ``ConfigError`` naming
    the flag (an empty token would open the admin routes: fail closed)."""
    if token_file is None:
        return config.admin_token
    try:
        token = token_file.read_text(encoding="utf-8").rstrip("\r\n")
    except (OSError, UnicodeError) as exc:
        raise ConfigError(f"--admin-token-file: cannot read {token_file}: {getattr(exc, 'strerror', None) or exc}"
                          ) from None
    if not token.strip():
        raise ConfigError(f"--admin-token-file: {token_file} is empty")
    return token
