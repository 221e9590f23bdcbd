"""The one check of loaded manifests shared by ``flexinfer validate``, ``render`` and ``serve``.

``manifest_problems`` finds what is wrong in the manifests themselves, on any machine: a ``spec.config`` that
the launch or the rendering rejects (``command``/``args``/``env``/``healthPath`` shapes, a ``startupTimeout``
that is not a duration, an unknown ``runtimeProfile`` or ``llamacppServer``, a ``promptCache`` that is no
boolean or a ``promptCacheMaxSize`` that is no quantity) and client-facing names
(``spec.litellm`` served name and aliases) claimed by two models or shadowing another model's name.
``machine_problems`` finds what would fail when a ``file://`` model is started here: missing weights, no
installed backend, a server program that is not on ``PATH`` (other sources are for the Kubernetes engine and
are not checked against this machine). Every problem names the file, line and column of the field
(``Manifest.problem``); one naming another model names that model's file and line too.

``validate`` runs both (``--offline`` skips the machine checks) and fails on any problem; ``render`` runs
``manifest_problems`` and fails; ``serve`` runs both (reporting non-``file://`` sources too) and logs each
problem as a warning (that model fails when activated, the others keep working). Schema, cross-field rules
(``flexinfer.api.rules``) and duplicate names are checked earlier, by ``flexinfer.api.load_manifests``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from flexinfer.api.errors import FieldProblem
from flexinfer.api.loading import Manifest
from flexinfer.api.model import Model
from flexinfer.core.errors import ConfigError, EngineError
from flexinfer.core.model_index import aliases
from flexinfer.core.profiles import runtime_profile
from flexinfer.local.engine import start_timeout
from flexinfer.local.profiles import (
    PROFILES,
    Availability,
    chosen_variant,
    command_argv,
    command_health_path,
    config_env,
    extra_args,
    plan_launch,
)
from flexinfer.local.prompt_cache import cache_enabled, cache_max_bytes
from flexinfer.local.sources import FILE_SCHEME, existing_source

_CONFIG_CHECKS: tuple[tuple[str, Callable[[Model], object]], ...] = (
    ("spec.config.command", lambda m: command_argv(m) if "command" in m.spec.config else None),
    ("spec.config.healthPath", command_health_path),
    ("spec.config.env", config_env),
    ("spec.config.args", extra_args),
    ("spec.config.startupTimeout", lambda m: start_timeout(m, 1.0)),
    ("spec.config.runtimeProfile", runtime_profile),
    ("spec.config.llamacppServer", lambda m: chosen_variant(m, PROFILES[m.backend]) if m.backend in PROFILES
     else None),
    ("spec.config.promptCache", cache_enabled),
    ("spec.config.promptCacheMaxSize", cache_max_bytes),
)


def manifest_problems(manifests: Sequence[Manifest]) -> list[FieldProblem]:
    """Problems of the manifests themselves (see the module docstring), in input order."""
    models = [m for m in manifests if isinstance(m.resource, Model)]
    problems = [problem for manifest in models for problem in _config_problems(manifest)]
    return problems + _name_problems(models)


def machine_problems(manifests: Sequence[Manifest], installed: Availability, base_dir: Path, *,
                     every_source: bool = False) -> list[FieldProblem]:
    """What would fail when each ``file://`` model (with ``every_source``, each model: ``serve`` says that other
    sources cannot be fetched) is started on this machine."""
    problems = []
    for manifest in manifests:
        model = manifest.resource
        if not isinstance(model, Model) or not (every_source or model.spec.source.startswith(FILE_SCHEME)):
            continue
        try:
            path = existing_source(model, base_dir)
        except EngineError as exc:
            problems.append(manifest.problem("spec.source", _without_model(exc, model), shown_path=""))
            continue
        try:
            plan = plan_launch(model, str(path), 0, "127.0.0.1", installed)
        except EngineError as exc:
            problems.append(manifest.problem("spec.backend", _without_model(exc, model), shown_path=""))
            continue
        program = plan.argv[0]
        if not (installed.which(program) if "/" not in program else Path(program).is_file()):
            problems.append(manifest.problem("spec.config.command", f"cannot start {program!r} ({plan.origin}): "
                                             "no such program on PATH", shown_path=""))
    return problems


def check_manifests(manifests: Sequence[Manifest], installed: Availability | None, base_dir: Path, *,
                    every_source: bool = False) -> list[FieldProblem]:
    """``manifest_problems``, then ``machine_problems`` (skipped when ``installed`` is ``None``) for the models
    whose manifests are sound."""
    problems = manifest_problems(manifests)
    if installed is not None:
        flawed = {(p.source, p.document) for p in problems}
        sound = [m for m in manifests if (m.source, m.document) not in flawed]
        problems += machine_problems(sound, installed, base_dir, every_source=every_source)
    return problems


def _config_problems(manifest: Manifest) -> list[FieldProblem]:
    model = manifest.resource
    assert isinstance(model, Model)
    problems = []
    for path, check in _CONFIG_CHECKS:
        try:
            check(model)
        except (EngineError, ConfigError) as exc:
            message = _without_model(exc, model)
            if not message.startswith(path):
                message = f"{path}: {message}"
            problems.append(manifest.problem(path, message, shown_path=""))
    return problems


def _name_problems(models: Sequence[Manifest]) -> list[FieldProblem]:
    """Client-facing names claimed twice: an alias of two models, or an alias that is another model's name."""
    owners: dict[str, tuple[Manifest, str]] = {}
    for manifest in models:
        model = manifest.resource
        assert isinstance(model, Model)
        owners.setdefault(model.name, (manifest, "metadata.name"))
    problems = []
    for manifest in models:
        model = manifest.resource
        assert isinstance(model, Model)
        for name in aliases(model):
            path = _alias_path(model, name)
            owner = owners.setdefault(name, (manifest, path))
            if owner[0] is manifest:
                continue
            other = owner[0].resource
            assert isinstance(other, Model)
            what = "is the name of" if owner[1] == "metadata.name" else "is also claimed by"
            problems.append(manifest.problem(path, f"{path}: {name!r} {what} model {other.key} "
                                                   f"({owner[0].where(owner[1])}); a name routes to one model",
                                             shown_path=""))
    return problems


def _alias_path(model: Model, name: str) -> str:
    litellm = model.spec.litellm
    if litellm is not None and name in litellm.aliases:
        return f"spec.litellm.aliases[{litellm.aliases.index(name)}]"
    return "spec.litellm.servedModelName"


def _without_model(exc: Exception, model: Model) -> str:
    """The message without its leading ``model <key>:`` (the file and line already say which model)."""
    message = str(exc)
    for prefix in (f"model {model.key}: ", f"{model.key}: "):
        if message.startswith(prefix):
            return message[len(prefix):]
    return message
