"""Every documented environment variable (the ``ENV_VARS`` tables behind docs/CONFIGURATION.md) with a garbage
value: it is rejected (``ConfigError`` naming it) or warned about by name (a WARNING on ``flexinfer.settings``
naming the variable, the value and the default) — never silently replaced. The table's declared policy says
which, and is checked here against what the component actually does."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

import pytest

from flexinfer import settings
from flexinfer.assembly.cluster_proxy import cluster_proxy_settings
from flexinfer.assembly.reference import GROUPS
from flexinfer.core.envvalues import EnvVar, Kind, Policy
from flexinfer.core.errors import ConfigError
from flexinfer.flashloader.config import from_env
from flexinfer.local.config import local_config
from flexinfer.manager.config import manager_config
from flexinfer.observability.logging_config import log_settings
from flexinfer.observability.tracing.config import tracing_settings
from flexinfer.observability.tracing.provider import init_tracing
from flexinfer.proxy.config import proxy_config
from flexinfer.proxy.listen_config import listen_address

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
GARBAGE: dict[Kind, str] = {
    Kind.BOOL: "maybe", Kind.INT: "abc", Kind.NUMBER: "abc", Kind.DURATION: "5 mins", Kind.QUANTITY: "16 gigs",
    Kind.MILLIS: "abc", Kind.PAIRS: "novalue", Kind.CHOICE: "bogus", Kind.URL: "::not a url::",
    Kind.ADDRESS: "nohost", Kind.JSON: "{not json",
}
FREE_TEXT = {
    "FLEXINFER_STATE_DIR", "FLEXINFER_SHM_ROOT", "PROXY_AUTH_TOKEN", "FLEXINFER_OTEL_SERVICE_NAMESPACE",
    "OTEL_SERVICE_NAME", "POD_NAMESPACE", "POD_NAME", "POD_UID", "KUBECONFIG", "FLEXINFER_FLASH_LOADER_IMAGE",
    "DEFAULT_FLASH_LOADER_IMAGE", "DEFAULT_FLASH_LOADER_EXCLUDE", "DEFAULT_<BACKEND>_IMAGE", "FLASH_SRC", "FLASH_DST",
    "FLASH_EXCLUDE", "FLEXINFER_HOST", "FLEXINFER_ADMIN_TOKEN",
}
"""Variables whose every value is valid text (paths, images, names): nothing to reject."""


def _tracing(env: Mapping[str, str]) -> None:
    tracing_settings(env)


def _tracing_enabled(env: Mapping[str, str]) -> None:
    init_tracing("t", tracing_settings({"FLEXINFER_OTEL_ENABLED": "true", **env})).shutdown()


def _flash_defaults(env: Mapping[str, str]) -> None:
    """Both readers of the flash-loader defaults: the manager, and ``serve`` (warnings as ``run_local`` sends)."""
    manager_config(env)
    local_config(env, Path("/tmp"), warn=settings.warn)


def _swap(env: Mapping[str, str]) -> None:
    """Every reader of the swap knobs: ``serve``, the manager and the in-cluster proxy."""
    local_config(env, Path("/tmp"))
    manager_config(env)
    cluster_proxy_settings(env)


PARSERS: dict[str, Callable[[Mapping[str, str]], object]] = {
    "local": lambda env: local_config(env, Path("/tmp")),
    "swap": _swap,
    "proxy": lambda env: proxy_config(env).validate(),
    "tracing": _tracing,
    "manager": manager_config,
    "defaults": manager_config,
    "flash-defaults": _flash_defaults,
    "cluster": cluster_proxy_settings,
    "flash": lambda env: from_env({"FLASH_SRC": "/s", "FLASH_DST": "/d", **env}),
    "logging": log_settings,
    "listen": lambda env: listen_address(env, host=None, port=None, default_host="127.0.0.1"),
}
"""How each documented group is parsed in production (the manager parses the controller defaults)."""


def cases() -> list[tuple[str, EnvVar]]:
    return [(key, var) for key, group in GROUPS.items() for var in group.table if var.kind is not Kind.TEXT]


def test_every_group_has_a_parser_and_free_text_is_listed() -> None:
    assert set(PARSERS) == set(GROUPS)
    text = {var.name for group in GROUPS.values() for var in group.table if var.kind is Kind.TEXT}
    assert text == FREE_TEXT, "a variable without a Kind is free text; give it a Kind if values can be invalid"


@pytest.mark.parametrize(("group", "var"), cases(), ids=lambda v: v.name if isinstance(v, EnvVar) else v)
def test_garbage_value_is_rejected_or_warned_by_name(
    group: str, var: EnvVar, caplog: pytest.LogCaptureFixture,
) -> None:
    garbage = GARBAGE[var.kind]
    env = {var.name: garbage}
    parse = _tracing_enabled if var.policy is Policy.WHEN_ENABLED else PARSERS[group]
    caplog.set_level(logging.WARNING, logger="flexinfer.settings")
    if var.policy is Policy.FALLBACK:
        parse(env)
        warnings = [r.getMessage() for r in caplog.records if r.name == "flexinfer.settings"]
        kept = ("; using the default", "; entry skipped")
        assert any(m.startswith(f"{var.name}={garbage!r} is ") and any(k in m for k in kept) for m in warnings), (
            f"{var.name}={garbage!r}: no warning naming it (got {warnings})")
    else:
        with pytest.raises(ConfigError, match=var.name.replace("OTEL_EXPORTER_OTLP_", "OTEL_EXPORTER_OTLP_.*")):
            parse(env)


@pytest.mark.parametrize("name", ["PROXY_AUTH_ENABLED", "FLEXINFER_OTEL_TRUST_INCOMING",
                                  "FLEXINFER_PROXY_ALL_NAMESPACES", "FLEXINFER_PROXY_ENDPOINT_OVERRIDE"])
def test_settings_that_guard_access_fail_closed(name: str) -> None:
    var = next(v for g in GROUPS.values() for v in g.table if v.name == name)
    assert var.policy is Policy.GUARD


def run_cli(args: list[str], env: dict[str, str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """``flexinfer ARGS`` as a child process with only ``env`` (plus PATH/PYTHONPATH) set."""
    base = {key: os.environ[key] for key in ("PATH", "PYTHONPATH") if key in os.environ}
    return subprocess.run([sys.executable, "-m", "flexinfer.cli.main", *args], env={**base, "HOME": str(tmp_path),
                          **env}, capture_output=True, text=True, timeout=60, check=False, cwd=tmp_path)


@pytest.mark.parametrize(("args", "env", "name"), [
    (["proxy", "--port", "0"], {"PROXY_AUTH_ENABLED": "maybe"}, "PROXY_AUTH_ENABLED"),
    (["proxy", "--port", "0"], {"FLEXINFER_OTEL_TRUST_INCOMING": "maybe"}, "FLEXINFER_OTEL_TRUST_INCOMING"),
    (["proxy", "--port", "0"], {"FLEXINFER_PROXY_ALL_NAMESPACES": "yes please"}, "FLEXINFER_PROXY_ALL_NAMESPACES"),
    (["serve", "--port", "0", "-f", str(EXAMPLES / "local")], {"PROXY_AUTH_ENABLED": "maybe"}, "PROXY_AUTH_ENABLED"),
    (["manager"], {"FLEXINFER_OTEL_TRUST_INCOMING": "maybe"}, "FLEXINFER_OTEL_TRUST_INCOMING"),
    (["manager"], {"LEADER_ELECT": "maybe"}, "LEADER_ELECT"),
])
def test_start_up_stops_with_one_line_naming_the_variable(
    args: list[str], env: dict[str, str], name: str, tmp_path: Path,
) -> None:
    done = run_cli(args, env, tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert errors == [f"error: {name}={env[name]!r} is not a boolean (use 1/true/yes/on or 0/false/no/off)"], (
        done.stderr)


def test_render_env_file_warns_about_an_unparsable_value_it_replaces(tmp_path: Path) -> None:
    env_file = tmp_path / "controller.env"
    env_file.write_text("DEFAULT_SHM_SIZE_LIMIT=8Gigs\nDEFAULT_FLASH_LOADER_CONCURRENCY=-5\n", encoding="utf-8")
    done = run_cli(["render", "-f", str(EXAMPLES / "local"), "--env-file", str(env_file)], {}, tmp_path)
    assert done.returncode == 0, done.stderr
    assert "sizeLimit: 8Gi" in done.stdout
    assert "DEFAULT_SHM_SIZE_LIMIT='8Gigs' is not a Kubernetes quantity" in done.stderr
    assert "using the default '8Gi'" in done.stderr
    assert "DEFAULT_FLASH_LOADER_CONCURRENCY='-5' is below the minimum 1; using the default 4" in done.stderr


@pytest.mark.parametrize("content", [None, "\n"], ids=["missing", "empty"])
def test_an_unusable_admin_token_file_stops_serve_with_one_line(content: str | None, tmp_path: Path) -> None:
    """Fails closed: no admin API without the token it was told to require."""
    token_file = tmp_path / "admin-token"
    if content is not None:
        token_file.write_text(content)
    done = run_cli(["serve", "--port", "0", "-f", str(EXAMPLES / "local"), "--admin-token-file", str(token_file)], {},
                   tmp_path)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    why = f"{token_file} is empty" if content else f"cannot read {token_file}: No such file or directory"
    assert errors == [f"error: --admin-token-file: {why}"], done.stderr
