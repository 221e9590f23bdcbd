"""The container image contract: the Dockerfile's entrypoint and the subcommands the chart and the manager
run from it (`manager`, `proxy`, `flash-load`) exist in the `flexinfer` CLI, and the chart's default image
is that image tagged with the package version. No container engine is needed (none exists here).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import yaml

import flexinfer
from flexinfer.cli.main import build_parser
from flexinfer.proxy.listen_config import listen_address
from support.helm_chart import CHART_DIR, Helm, container, find
from support.kube_testbed import REPO_ROOT

DOCKERFILE = REPO_ROOT / "Dockerfile"
IMAGE_SUBCOMMANDS = {"manager", "proxy", "flash-load"}


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    logical = DOCKERFILE.read_text().replace("\\\n", " ")
    pairs = []
    for line in logical.splitlines():
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            keyword, _, rest = stripped.partition(" ")
            pairs.append((keyword.upper(), rest.strip()))
    return pairs


def subcommands() -> set[str]:
    parser = build_parser()
    actions = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return {name for action in actions for name in action.choices}


def test_dockerfile_runs_the_flexinfer_entrypoint_as_non_root() -> None:
    instructions = dockerfile_instructions()
    bases = [args for kw, args in instructions if kw == "FROM"]
    assert bases and all(b.split()[0] == "python:3.11-slim" for b in bases)
    assert ("ENTRYPOINT", '["flexinfer"]') in instructions
    assert any(kw == "RUN" and "pip install" in args and args.rstrip().endswith(" .") for kw, args in instructions)
    users = [args for kw, args in instructions if kw == "USER"]
    assert users[-1] == "65532:65532"


def test_dockerfile_user_matches_the_chart_security_context() -> None:
    values = yaml.safe_load((CHART_DIR / "values.yaml").read_text())
    uid, gid = (int(x) for x in next(a for k, a in dockerfile_instructions() if k == "USER").split(":"))
    assert values["podSecurityContext"]["runAsUser"] == uid
    assert values["podSecurityContext"]["runAsGroup"] == gid


def test_dockerignore_keeps_what_the_build_copies() -> None:
    lines = (REPO_ROOT / ".dockerignore").read_text().splitlines()
    for needed in ("pyproject.toml", "README.md", "src/"):
        assert f"!{needed}" in lines


def test_flexinfer_console_script_shows_help() -> None:
    script = Path(sys.executable).parent / "flexinfer"
    proc = subprocess.run([str(script), "--help"], capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("usage: flexinfer")


def test_image_subcommands_are_registered() -> None:
    missing = IMAGE_SUBCOMMANDS - subcommands()
    assert not missing, f"`flexinfer` lacks subcommands the image/chart run: {sorted(missing)}"


def test_chart_runs_registered_subcommands(default_docs: list[dict[str, Any]]) -> None:
    for deployment, name in (("flexinfer-controller", "manager"), ("flexinfer-proxy", "proxy")):
        args = container(find(default_docs, "Deployment", deployment), name)["args"]
        assert args[0] == name
        assert args[0] in subcommands()


def test_chart_args_parse_with_the_real_cli(helm: Helm, default_docs: list[dict[str, Any]]) -> None:
    parser = build_parser()
    manager = container(find(default_docs, "Deployment", "flexinfer-controller"), "manager")["args"]
    parsed = parser.parse_args(manager)
    assert (parsed.command, parsed.metrics_bind_address, parsed.health_probe_bind_address, parsed.leader_elect,
            parsed.namespace) == ("manager", ":8080", ":8081", True, [])  # no --namespace: kopf cluster-wide
    follower = helm.template("controller.leaderElect=false", "controller.ports.metrics=9090")
    parsed = parser.parse_args(container(find(follower, "Deployment", "flexinfer-controller"), "manager")["args"])
    assert (parsed.metrics_bind_address, parsed.leader_elect) == (":9090", None)
    deployment = container(find(default_docs, "Deployment", "flexinfer-proxy"), "proxy")
    proxy = parser.parse_args(deployment["args"])
    env = {item["name"]: item.get("value", "") for item in deployment["env"]}
    address = listen_address(env, host=proxy.host, port=proxy.port, default_host="0.0.0.0")
    assert (proxy.command, address) == ("proxy", ("0.0.0.0", 8080))  # the container port the chart declares


def test_app_version_and_image_follow_the_package(default_docs: list[dict[str, Any]]) -> None:
    chart = yaml.safe_load((CHART_DIR / "Chart.yaml").read_text())
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    assert chart["apiVersion"] == "v2"
    assert chart["appVersion"] == project["version"] == flexinfer.__version__  # `version` is the chart's own
    values = yaml.safe_load((CHART_DIR / "values.yaml").read_text())
    expected = f"{values['image']['repository']}:{chart['appVersion']}"
    manager = container(find(default_docs, "Deployment", "flexinfer-controller"), "manager")
    proxy = container(find(default_docs, "Deployment", "flexinfer-proxy"), "proxy")
    flash_image = next(e["value"] for e in manager["env"] if e["name"] == "DEFAULT_FLASH_LOADER_IMAGE")
    assert manager["image"] == proxy["image"] == flash_image == expected
