"""Backend launch profiles as data, and their resolution into one concrete command for one model.

A profile lists launch variants; the first installed one that needs no explicit choice wins (``llamacpp``:
llama.cpp's ``llama-server`` binary on ``PATH``). A variant marked ``explicit`` runs only when the model asks
for it by the profile's choice key (``spec.config.llamacppServer: python`` → ``python -m
llama_cpp.server``, llama-cpp-python's server: for a machine where only pip-installed wheels are available,
or for its own options such as ``--chat_format``); an explicit ``spec.config.command`` (list form) overrides
the profile for any backend. Placeholders ``{model_path}``, ``{port}``, ``{host}``, ``{served_name}`` and
``{python}`` are substituted textually (other braces are left alone); ``{served_name}`` is
``flexinfer.core.profiles.served_name``, the name the Kubernetes engine gives the same server. Servers that
take a parallel capacity get it (``--parallel N`` for ``llama-server``, ``--max-num-seqs N`` for vLLM; N from
``flexinfer.core.profiles.parallel_requests``, 1 for llama.cpp unless configured); ``python -m
llama_cpp.server`` runs one request at a time and is started with ``--interrupt_requests False``, so a new
request waits for the running one instead of cutting it short. ``llama-server`` is started at
``--verbosity 4`` (the level at which llama.cpp logs its model, KV cache and compute buffer sizes:
``flexinfer.core.server_memory``; a ``--verbosity``/``-lv`` in ``spec.config.args`` comes later and wins)
and, when the engine keeps prompt caches across stops, with ``--slot-save-path DIR`` (unless the args set
one: then the user manages the slot files). Used by ``flexinfer.local.engine`` at activation time and by
``flexinfer.local.validation`` at ``serve`` start.
"""

from __future__ import annotations

import importlib.util
import shutil
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from flexinfer.api.model import Model
from flexinfer.core.errors import ConfigError, EngineError
from flexinfer.core.profiles import config_args, parallel_args, served_name

PLACEHOLDERS = ("model_path", "port", "host", "served_name", "python")
DEFAULT_COMMAND_HEALTH_PATH = "/v1/models"


@dataclass(frozen=True)
class LaunchVariant:
    """One way to start a backend: an argv template, its health path, and what must be installed."""

    label: str
    """How messages name it (``python -m llama_cpp.server``)."""
    argv: tuple[str, ...]
    health_path: str
    binary: str | None = None
    """An executable that must be on ``PATH`` (also ``argv[0]``)."""
    module: str | None = None
    """A Python package that must be importable by ``{python}``."""
    env: tuple[tuple[str, str], ...] = ()
    """Environment templates: servers that read settings from variables (``PORT``…) get the same values."""
    takes_parallel: bool = True
    """It accepts the backend's parallel-capacity flag (``core.profiles.BackendDefaults.parallel_flags``)."""
    choice: str = ""
    """The value of the profile's choice key (``BackendProfile.choice_key``) that selects this variant."""
    explicit: bool = False
    """Used only when chosen by the choice key, never picked on its own."""
    slot_save: bool = False
    """It saves and restores slot prompt caches (``--slot-save-path DIR``, ``POST /slots/{id}``)."""


@dataclass(frozen=True)
class BackendProfile:
    """A backend's launch variants (first installed non-explicit one wins) and what to tell a user who has
    none."""

    name: str
    variants: tuple[LaunchVariant, ...]
    install_hint: str
    choice_key: str | None = None
    """The ``spec.config`` key that names a variant by its ``choice``."""


_LISTEN = ("--host", "{host}", "--port", "{port}")
LLAMACPP_CHOICE = "llamacppServer"
LLAMA_SERVER_VERBOSITY = ("--verbosity", "4")
"""llama.cpp logs its buffer sizes (model, KV cache, compute) at trace level (4) only."""
SLOT_SAVE_FLAG = "--slot-save-path"
PROFILES: dict[str, BackendProfile] = {
    "llamacpp": BackendProfile(
        name="llamacpp",
        variants=(
            LaunchVariant(
                label="llama-server",
                argv=("llama-server", "--model", "{model_path}", *_LISTEN, "--alias", "{served_name}",
                      *LLAMA_SERVER_VERBOSITY),
                # GET /health: 503 while the model loads (the server listens at once), 200 once it serves
                health_path="/health", binary="llama-server", choice="llama-server", slot_save=True,
            ),
            LaunchVariant(
                label="python -m llama_cpp.server",
                argv=("{python}", "-m", "llama_cpp.server", "--model", "{model_path}", *_LISTEN,
                      "--model_alias", "{served_name}", "--interrupt_requests", "False"),
                health_path="/v1/models", module="llama_cpp",
                # its pydantic settings read HOST/PORT/MODEL from the environment, over the arguments;
                # its default interrupt_requests=True lets a new request cut the running stream short
                env=(("HOST", "{host}"), ("PORT", "{port}"), ("MODEL", "{model_path}"),
                     ("INTERRUPT_REQUESTS", "false")),
                takes_parallel=False,  # one request at a time (a lock around its one Llama instance)
                choice="python", explicit=True,
            ),
        ),
        install_hint="put llama.cpp's `llama-server` on PATH (`hack/build-llama-server` builds it; "
                     "`scripts/bootstrap` links it into ~/.cache/flexinfer/bin), or choose llama-cpp-python's "
                     "server with spec.config.llamacppServer: python (`pip install 'flexinfer[llamacpp]'`)",
        choice_key=LLAMACPP_CHOICE,
    ),
    "vllm": BackendProfile(
        name="vllm",
        variants=(
            LaunchVariant(
                label="vllm serve",
                argv=("vllm", "serve", "{model_path}", *_LISTEN, "--served-model-name", "{served_name}"),
                health_path="/health", binary="vllm",
            ),
        ),
        install_hint="install vLLM so that `vllm` is on PATH",
    ),
}


class Availability(Protocol):
    """What is installed on this machine (injected so tests can pretend)."""

    @property
    def python(self) -> str:
        """The interpreter that runs ``{python}`` commands."""

    def which(self, name: str) -> str | None: ...

    def has_module(self, name: str) -> bool: ...


@dataclass(frozen=True)
class SystemAvailability:
    """The real machine: executables on ``path`` (the ``PATH`` given to children) and this interpreter."""

    path: str | None = None
    python: str = field(default=sys.executable)

    def which(self, name: str) -> str | None:
        return shutil.which(name, path=self.path)

    def has_module(self, name: str) -> bool:
        return importlib.util.find_spec(name) is not None


@dataclass(frozen=True)
class LaunchPlan:
    """A resolved command: argv, extra environment, and the path that answers 200 once Ready."""

    argv: tuple[str, ...]
    health_path: str
    env: Mapping[str, str]
    origin: str
    """``spec.config.command`` or ``<backend> via <variant label>`` (for messages)."""
    slot_dir: str | None = None
    """The directory the server saves slot prompt caches in (``--slot-save-path``), when FlexInfer gave it one."""


def substitute(template: Sequence[str], values: Mapping[str, str]) -> tuple[str, ...]:
    """Replace ``{placeholder}`` occurrences of the known names; other text (and braces) stays as is."""
    out = []
    for arg in template:
        text = arg
        for key in PLACEHOLDERS:
            if key in values:
                text = text.replace("{" + key + "}", values[key])
        out.append(text)
    return tuple(out)


def plan_launch(model: Model, model_path: str, port: int, host: str, installed: Availability, *,
                slot_dir: str | None = None) -> LaunchPlan:
    """Resolve the command for ``model``; ``EngineError`` saying what to do when none can run. ``slot_dir``:
    where a server that saves slot prompt caches keeps them (``LaunchPlan.slot_dir`` says if it got it)."""
    values = {"model_path": model_path, "port": str(port), "host": host,
              "served_name": served_name(model), "python": installed.python}
    env = config_env(model)
    command = model.spec.config.get("command")
    if command is not None:
        return LaunchPlan(substitute(command_argv(model), values), command_health_path(model), env,
                          "spec.config.command")
    variant = choose_variant(model, installed)
    try:
        parallel = parallel_args(model) if variant.takes_parallel else ()
    except ConfigError as exc:
        raise EngineError(str(exc)) from None
    extra = extra_args(model)
    slots = slot_dir if variant.slot_save and slot_dir and SLOT_SAVE_FLAG not in extra else None
    argv = substitute(variant.argv, values) + parallel + ((SLOT_SAVE_FLAG, slots) if slots else ()) + extra
    names = [name for name, _ in variant.env]
    profile_env = dict(zip(names, substitute([value for _, value in variant.env], values), strict=True))
    return LaunchPlan(argv, variant.health_path, {**profile_env, **env}, f"{model.backend} via {variant.label}",
                      slots)


def choose_variant(model: Model, installed: Availability) -> LaunchVariant:
    """The variant the model chose by the profile's choice key, else the first installed one that needs no
    choice; ``EngineError`` saying what to install (or choose) otherwise."""
    profile = PROFILES.get(model.backend)
    if profile is None:
        raise EngineError(
            f"model {model.key}: backend {model.backend!r} has no local launch profile "
            f"(known: {', '.join(sorted(PROFILES))}); set spec.config.command to the server command, "
            f"e.g. [\"my-server\", \"--port\", \"{{port}}\", \"--model\", \"{{model_path}}\"]"
        )
    chosen = chosen_variant(model, profile)
    if chosen is not None:
        if not _installed(chosen, installed):
            raise EngineError(f"model {model.key}: spec.config.{profile.choice_key} is {chosen.choice!r} but "
                              f"{chosen.label} is not installed on this machine; {profile.install_hint}")
        return chosen
    for variant in profile.variants:
        if not variant.explicit and _installed(variant, installed):
            return variant
    raise EngineError(
        f"model {model.key}: no {profile.name} backend is installed on this machine; "
        f"{profile.install_hint}, or set spec.config.command"
    )


def chosen_variant(model: Model, profile: BackendProfile) -> LaunchVariant | None:
    """The variant named by ``spec.config.<choice key>`` (``None`` when unset); ``EngineError`` naming the
    field and the choices for any other value."""
    if profile.choice_key is None or model.spec.config.get(profile.choice_key) is None:
        return None
    value = model.spec.config[profile.choice_key]
    for variant in profile.variants:
        if value == variant.choice:
            return variant
    choices = ", ".join(repr(v.choice) for v in profile.variants)
    raise EngineError(f"model {model.key}: spec.config.{profile.choice_key} must be one of {choices}, "
                      f"got {value!r}")


def _installed(variant: LaunchVariant, installed: Availability) -> bool:
    if variant.binary and installed.which(variant.binary) is None:
        return False
    return not (variant.module and not installed.has_module(variant.module))


def command_argv(model: Model) -> list[str]:
    """``spec.config.command`` validated as a non-empty list of strings."""
    command = model.spec.config.get("command")
    if not isinstance(command, list) or not command or not all(isinstance(a, str) for a in command):
        raise EngineError(
            f"model {model.key}: spec.config.command must be a non-empty list of strings "
            f"(e.g. [\"server\", \"--port\", \"{{port}}\"]), got {command!r}"
        )
    return command


def command_health_path(model: Model) -> str:
    """``spec.config.healthPath`` (must start with ``/``), default ``/v1/models``."""
    path = model.spec.config.get("healthPath", DEFAULT_COMMAND_HEALTH_PATH)
    if not isinstance(path, str) or not path.startswith("/"):
        raise EngineError(f"model {model.key}: spec.config.healthPath must be a path such as /health, got {path!r}")
    return path


def config_env(model: Model) -> dict[str, str]:
    """``spec.config.env``: a mapping of names to scalar values, rendered as strings."""
    env = model.spec.config.get("env", {})
    if not isinstance(env, dict) or not all(isinstance(v, str | int | float | bool) for v in env.values()):
        raise EngineError(f"model {model.key}: spec.config.env must map names to strings, got {env!r}")
    return {str(k): str(v) for k, v in env.items()}


def extra_args(model: Model) -> tuple[str, ...]:
    """``spec.config.args``: extra arguments appended to a profile's command (e.g. ``["--ctx-size", "512"]``)."""
    try:
        return config_args(model)
    except ConfigError as exc:
        raise EngineError(f"model {exc}") from None
