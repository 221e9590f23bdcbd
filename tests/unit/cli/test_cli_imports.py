"""What each short ``flexinfer`` command imports: the real entry point in a child process under
``python -X importtime``, its import lines checked against the stacks it must not load (never a timing).

``--version``, ``--help``, ``ps``, ``load``, ``unload``, ``logs`` and ``completion`` answer from argument
parsing plus a small HTTP client, so none of them may load the servers' stacks (aiohttp, kopf, lightkube,
OpenTelemetry, Prometheus, pydantic) or FlexInfer's engines; ``flash-load`` (an init container on every cold
start) stages a real tree without the manager's or the proxy's imports. The parser itself stays complete:
``--help`` lists every subcommand and shell completion still offers every command and flag.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

SERVER_STACKS = (
    "aiohttp", "kopf", "lightkube", "opentelemetry", "prometheus_client", "pydantic", "uvloop",
    "flexinfer.assembly", "flexinfer.manager", "flexinfer.cluster_proxy", "flexinfer.proxy", "flexinfer.local",
    "flexinfer.runtime", "flexinfer.observability.metrics", "flexinfer.observability.tracing",
    "flexinfer.observability.log_setup",
)
"""Loaded by no short command: the Kubernetes and HTTP-server stacks, every engine, metrics and tracing (the
log flags' choices, ``flexinfer.observability.logging_config``, are part of the parsers)."""
QUICK_ONLY = ("rich", "yaml", "dotenv", "flexinfer.flashloader.staging", "flexinfer.api.model", "flexinfer.api.loading",
              "flexinfer.core.manifests")
"""Also not needed to parse arguments, print help or the version, or fail to reach a server."""
COMMANDS = ("serve", "status", "load", "unload", "logs", "completion", "validate", "render", "manager", "proxy",
            "flash-load", "settings", "crds")


def imports_of(*args: str, env: dict[str, str] | None = None, expect: int = 0) -> tuple[set[str], str]:
    """Run ``python -X importtime -m flexinfer.cli.main ARGS``; the modules it imported and its output."""
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "flexinfer.cli.main", *args],
                          capture_output=True, text=True, env={**os.environ, **(env or {})}, timeout=60,
                          check=False)
    lines = done.stderr.splitlines()
    modules = {line.rsplit("|", 1)[1].strip() for line in lines if line.startswith("import time:")} - {
        "imported package"}
    output = done.stdout + "\n".join(line for line in lines if not line.startswith("import time:"))
    assert done.returncode == expect, output
    assert "Traceback" not in output, output
    return modules, output


def loaded(modules: set[str], stacks: tuple[str, ...]) -> list[str]:
    """The modules that belong to any of ``stacks`` (a package or one of its submodules)."""
    return sorted(name for name in modules if any(name == top or name.startswith(top + ".") for top in stacks))


@pytest.mark.parametrize("args", [
    ("--version",), ("--help",), ("ps", "--help"), ("status", "--help"), ("load", "--help"), ("unload", "--help"),
    ("logs", "--help"), ("completion", "bash"), ("flash-load", "--help"),
])
def test_short_commands_import_no_server_stack(args: tuple[str, ...]) -> None:
    modules, output = imports_of(*args)
    assert "flexinfer.cli" in modules  # the probe sees the imports at all
    assert output.strip()
    assert loaded(modules, SERVER_STACKS + QUICK_ONLY) == []


@pytest.mark.parametrize("command", [("ps",), ("load", "m"), ("unload", "m"), ("logs", "m")])
def test_admin_commands_reach_for_the_server_without_the_server_stacks(command: tuple[str, ...]) -> None:
    modules, output = imports_of(*command, "--url", "127.0.0.1:9", expect=1)
    assert "error: cannot reach flexinfer serve at 127.0.0.1:9" in output
    assert loaded(modules, SERVER_STACKS + QUICK_ONLY) == []


def test_flash_load_stages_without_the_manager_or_proxy_imports(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "sub" / "weights.bin").write_bytes(b"w" * 10_000)
    modules, output = imports_of("flash-load", "--src", str(src), "--dst", str(tmp_path / "dst"))
    assert "copied 1 files" in output or "copied 1 file" in output, output
    assert (tmp_path / "dst" / "sub" / "weights.bin").read_bytes() == b"w" * 10_000
    assert "flexinfer.flashloader.staging" in modules
    assert loaded(modules, (*SERVER_STACKS, "rich", "yaml", "flexinfer.api.model")) == []


def test_help_still_lists_every_subcommand() -> None:
    _, output = imports_of("--help")
    listed = output.split("COMMAND", 1)[1]
    assert [name for name in COMMANDS if f"    {name} " not in listed and f"    {name}\n" not in listed] == []
    _, ps_help = imports_of("ps", "--help")
    assert "--url" in ps_help and "-o {table,wide,json,yaml}" in ps_help


@pytest.mark.parametrize(("line", "offered"), [
    ("flexinfer fl", {"flash-load"}), ("flexinfer ps --", {"--url", "--token", "--output", "--help"}),
    ("flexinfer flash-load --var", {"--variant"}), ("flexinfer completion ", {"bash", "zsh", "fish"}),
])
def test_shell_completion_offers_every_command_and_flag(tmp_path: Path, line: str, offered: set[str]) -> None:
    answer = tmp_path / "completions"
    imports_of(env={"_ARGCOMPLETE": "1", "COMP_LINE": line, "COMP_POINT": str(len(line)),
                    "_ARGCOMPLETE_IFS": "\n", "_ARGCOMPLETE_STDOUT_FILENAME": str(answer)})
    assert offered <= {word.strip() for word in answer.read_text().split("\n")}
