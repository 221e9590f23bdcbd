"""The configuration reference: every environment variable, command-line flag and Helm value with its default.

Built from the settings tables each component keeps (``ENV_VARS``), the command parsers and the chart's
``values.yaml``, plus the flash-loader precedence chain (env defaults → matching ModelCache → Model) with the
defaults of its first layer — so ``docs/CONFIGURATION.md`` is generated (``flexinfer settings --markdown``) and a
test fails when it drifts. Called by ``flexinfer.cli.settings``.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from flexinfer.assembly import cluster_proxy
from flexinfer.assembly.local import SERVE_PROXY_DEFAULTS
from flexinfer.core import controller_defaults, swap_knobs
from flexinfer.core.envvalues import EnvVar
from flexinfer.flashloader import config as flash_config
from flexinfer.local import config as local_settings
from flexinfer.manager import config as manager_settings
from flexinfer.observability import logging_config
from flexinfer.observability.tracing import config as tracing_config
from flexinfer.proxy import config as proxy_settings
from flexinfer.proxy import listen_config


@dataclass(frozen=True)
class EnvGroup:
    """A table of environment variables read by one component."""

    title: str
    table: tuple[EnvVar, ...]


GROUPS: dict[str, EnvGroup] = {
    "local": EnvGroup("Local engine", local_settings.ENV_VARS),
    "swap": EnvGroup("Swap policy (both engines; Helm `swap`)", swap_knobs.ENV_VARS),
    "proxy": EnvGroup("Proxy", proxy_settings.ENV_VARS),
    "tracing": EnvGroup("Tracing (OpenTelemetry)", tracing_config.ENV_VARS),
    "logging": EnvGroup("Logging", logging_config.ENV_VARS),
    "listen": EnvGroup("Listen address", listen_config.ENV_VARS),
    "manager": EnvGroup("Manager", manager_settings.ENV_VARS),
    "defaults": EnvGroup("Controller defaults (Helm `controller.runtime`)", controller_defaults.ENV_VARS),
    "flash-defaults": EnvGroup("Flash-loader defaults (Helm `controller.runtime.flashLoader`)",
                               controller_defaults.FLASH_LOADER_ENV_VARS),
    "cluster": EnvGroup("In-cluster proxy", cluster_proxy.ENV_VARS),
    "flash": EnvGroup("Flash-loader", flash_config.ENV_VARS),
}


@dataclass(frozen=True)
class Component:
    """One command, the environment groups it reads, and the defaults it sets differently."""

    command: str
    summary: str
    groups: tuple[str, ...]
    defaults: Mapping[str, str] = field(default_factory=dict)

    def default(self, var: EnvVar) -> str:
        """The default of ``var`` under this command."""
        return self.defaults.get(var.name, var.default)


COMPONENTS: tuple[Component, ...] = (
    Component("serve", "Single-machine mode: local model servers behind the proxy (the default engine).",
              ("local", "swap", "flash-defaults", "proxy", "tracing", "logging", "listen"), SERVE_PROXY_DEFAULTS),
    Component("manager", "The Kubernetes operator.",
              ("manager", "swap", "defaults", "flash-defaults", "tracing", "logging")),
    Component("proxy", "The in-cluster OpenAI-compatible proxy.",
              ("cluster", "swap", "proxy", "tracing", "logging", "listen"),
              {listen_config.HOST: "0.0.0.0"}),
    Component("flash-load", "The weight-staging program (the `flash-loader` init container).", ("flash",)),
)


_ENV_NAME = re.compile(r"\b([A-Z][A-Z0-9_]{2,})\b")
_DEFAULT_IN_HELP = re.compile(r"\bdefault:?\s+([^;)]+)")
_TRAILING_VALUE = re.compile(r"\((\d+)\)$")


def flag_rows(parser: argparse.ArgumentParser) -> Iterator[tuple[str, str, str]]:
    """(flags, default, help) for every option of ``parser`` except ``--help``. The default is the real
    one: argparse's own, else that of the environment variable the help names (the flag falls back to it),
    else ``required``, else what the help text says."""
    for action in parser._actions:  # argparse has no public accessor for its actions
        if isinstance(action, argparse._HelpAction) or not action.option_strings:
            continue
        text = (action.help or "").replace("\n", " ")
        yield ", ".join(action.option_strings), flag_default(action, text), text


def flag_default(action: argparse.Action, text: str) -> str:
    """The default a user gets when the flag is left out, as shown in the reference (Markdown)."""
    if action.default not in (None, argparse.SUPPRESS, []):
        return _code(str(action.default))
    if action.required or "required" in text:
        return "required"
    variables = [var for group in GROUPS.values() for var in group.table]
    flags = [f"`{flag}`" for flag in action.option_strings if flag.startswith("--")]
    named = [var for var in variables if any(flag in var.description for flag in flags)]
    if not named and (match := _DEFAULT_IN_HELP.search(text)) is not None:
        return match.group(1).strip()
    in_help = set(_ENV_NAME.findall(text))
    named = named or [var for var in variables if var.name in in_help][-1:]
    if named:
        return f"{_code(named[0].default) or 'unset'} (from `{named[0].name}`)"
    if (match := _TRAILING_VALUE.search(text)) is not None:
        return _code(match.group(1))
    return "none"


@dataclass(frozen=True)
class HelmValue:
    """One leaf of ``values.yaml``: dotted key, default and the ``# --`` comment above it."""

    key: str
    default: str
    description: str


def helm_values(values_file: Path) -> list[HelmValue]:
    """Every leaf value of the chart, with the description from its ``# -- …`` comment."""
    text = values_file.read_text(encoding="utf-8")
    notes = _comments_by_key(text)
    rows: list[HelmValue] = []
    for key, value in _leaves(yaml.safe_load(text) or {}, ""):
        rows.append(HelmValue(key, _show(value), notes.get(key) or _section_note(key, notes)))
    return rows


def _section_note(key: str, notes: dict[str, str]) -> str:
    """For an undocumented leaf, the comment of its nearest documented parent, marked as such."""
    parts = key.split(".")
    for end in range(len(parts) - 1, 0, -1):
        note = notes.get(".".join(parts[:end]))
        if note:
            return f"(in `{'.'.join(parts[:end])}`: {note})"
    return ""


def _leaves(node: Any, prefix: str) -> Iterator[tuple[str, Any]]:
    if isinstance(node, dict) and node:
        for key, value in node.items():
            yield from _leaves(value, f"{prefix}.{key}" if prefix else str(key))
    else:
        yield prefix, node


def _show(value: Any) -> str:
    if isinstance(value, str):
        return f'"{value}"'
    return yaml.safe_dump(value, default_flow_style=True, width=1000).strip().removesuffix("...").strip()


_KEY_LINE = re.compile(r"^(\s*)([A-Za-z0-9_]+):")


def _comments_by_key(text: str) -> dict[str, str]:
    """Map dotted keys to the comment block written right above them (``# -- `` markers stripped)."""
    path: list[tuple[int, str]] = []
    pending: list[str] = []
    notes: dict[str, str] = {}
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            pending.append(stripped.lstrip("#").strip().removeprefix("-- ").removeprefix("--").strip())
        elif (match := _KEY_LINE.match(line)) is not None:
            indent = len(match.group(1))
            path = [(i, k) for i, k in path if i < indent] + [(indent, match.group(2))]
            if pending:
                notes[".".join(k for _, k in path)] = " ".join(p for p in pending if p)
            pending = []
        else:
            pending = []
    return notes


def render_markdown(parsers: dict[str, argparse.ArgumentParser], values_file: Path | None) -> str:
    """The whole reference as Markdown (the content of ``docs/CONFIGURATION.md``)."""
    out = [
        "# Configuration reference",
        "",
        "Generated by `flexinfer settings --markdown --chart charts/flexinfer`; do not edit by hand.",
        "Booleans accept `1/true/yes/on` and `0/false/no/off`; durations are Go-style (`90s`, `5m`, `1h30m`);",
        "sizes are Kubernetes quantities (`8Gi`). An empty or unset variable means its default.",
        "",
        "The *if invalid* column says what an unparsable value does. A *start-up error* stops the command",
        "with a one-line message naming the variable (exit code 1); settings that guard access (auth, trust of",
        "incoming trace headers, which namespaces are served, where traffic goes) always fail closed this way.",
        "A *warning* keeps the default (the Go FlexInfer contract) and logs a WARNING naming the variable, the",
        "value and the default; `flexinfer render --env-file` prints the same warning on stderr. That file is",
        "read as a dotenv file (quotes, `export`, `#` comments; no `${VAR}` expansion); a line that is not",
        "`KEY=VALUE` is an error naming the file and line.",
    ]
    for component in COMPONENTS:
        titles = ", ".join(GROUPS[g].title for g in component.groups)
        out += ["", f"## `flexinfer {component.command}`", "", component.summary, "",
                f"Environment: {titles} (below)."]
        parser = parsers.get(component.command)
        if parser is not None:
            out += ["", "| flag | default | meaning |", "|---|---|---|"]
            out += [f"| `{f}` | {d} | {h} |" for f, d, h in flag_rows(parser)]
    out += ["", "## Environment variables"]
    for key, group in GROUPS.items():
        users = ", ".join(f"`{c.command}`" for c in COMPONENTS if key in c.groups)
        out += ["", f"### {group.title}", "", f"Read by {users}.", "",
                "| variable | default | meaning | if invalid |", "|---|---|---|---|"]
        out += [f"| `{v.name}` | {_default_cell(v, key)} | {v.description} | {v.on_invalid} |" for v in group.table]
    out += flash_loader_precedence()
    if values_file is not None:
        out += ["", "## Helm values (`charts/flexinfer/values.yaml`)", "", "| key | default | meaning |",
                "|---|---|---|"]
        out += [f"| `{v.key}` | {_code(v.default)} | {v.description} |" for v in helm_values(values_file)]
    return "\n".join(out) + "\n"


PRECEDENCE_TITLE = "## Flash-loader settings: env defaults → matching ModelCache → Model"


def flash_loader_precedence() -> list[str]:
    """The order in which one Model's flash-loader settings are resolved (``resolve_flash_loader``), with the
    environment defaults of layer 1 taken from the settings tables."""
    image = next(v for v in controller_defaults.ENV_VARS if v.name == "DEFAULT_FLASH_LOADER_IMAGE")
    defaults = [f"   - `{v.name}`: {_code(v.default) or 'unset'}"
                for v in (*controller_defaults.FLASH_LOADER_ENV_VARS, image)]
    return [
        "", PRECEDENCE_TITLE, "",
        "The flash-loader settings of one Model are resolved in this order; each layer overrides the ones above it.",
        "`flexinfer manager`, `flexinfer render` and `flexinfer serve` resolve them alike (worked example and",
        "auto-enable: `docs/user/caching.md`).",
        "",
        "1. **Environment defaults** (Helm `controller.runtime.flashLoader`; `flexinfer serve` reads the same",
        "   variables). An unparsable value keeps its default and is logged as a warning:",
        *defaults,
        "2. **The matching `ModelCache`** (`ai.flexinfer/v1alpha1`) in the Model's namespace with a",
        "   `spec.flashLoader` block: named like the Model or `<model>-cache`, or, for an `HF://` source, whose",
        "   `spec.source` contains the Model's repository; the first in list order. Its `enabled` always applies",
        "   (a block without `enabled: true` turns the flash-loader off); `image` when not blank, `concurrency`",
        "   when above 0, `tmpfsSizeLimit` when a valid quantity.",
        "3. **`Model.spec.cache.flashLoader`** (`ai.flexinfer/v1alpha2`): each field only when set: `enabled`,",
        "   `image`, `concurrency`, `tmpfsSizeLimit`, `bufferSizeKB`, `verifyIntegrity`.",
        "",
        "Then a shared Model with `cache.strategy: Local` and no `spec.cache.flashLoader` block gets it enabled,",
        "a concurrency below 1 becomes 4 and a buffer below 32 KiB becomes 4096 KiB, and a Model without a",
        "persistent volume (a `pvc://` source, or strategy `SharedPVC` or `Local`) never gets it.",
    ]


def _default_cell(var: EnvVar, group: str) -> str:
    """The default, plus the commands that use another one (``5s`` (`serve`: ``0s``))."""
    others = [f"`{c.command}`: {_code(c.default(var))}" for c in COMPONENTS
              if group in c.groups and c.default(var) != var.default]
    return (_code(var.default) or "unset") + (f" ({'; '.join(others)})" if others else "")


def _code(text: str) -> str:
    return f"`{text}`" if text else ""


def reference_text(commands: Sequence[str], values_file: Path | None) -> str:
    """A plain listing: ``NAME=DEFAULT  meaning`` per variable, grouped by command."""
    out: list[str] = []
    for component in COMPONENTS:
        if component.command not in commands:
            continue
        out.append(f"flexinfer {component.command}: {component.summary}")
        seen: set[str] = set()
        for key in component.groups:
            for var in GROUPS[key].table:
                if var.name not in seen:
                    seen.add(var.name)
                    out.append(f"  {var.name}={component.default(var)}  {var.description}")
        out.append("")
    if values_file is not None:
        out.append("Helm values:")
        out += [f"  {v.key}={v.default}  {v.description}".rstrip() for v in helm_values(values_file)]
    return "\n".join(out) + "\n"
