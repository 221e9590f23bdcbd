"""``flexinfer render -f FILE|DIR [--env-file F] [--replicas N]``: print what the manager would apply.

For every Model in the inputs: its Deployment and Service (multi-document YAML), rendered with the
controller defaults from ``--env-file`` (built-in defaults otherwise; the process environment is not
read, so output is reproducible; an unparsable value is rendered as the manager would, with the default, and
a warning naming it goes to stderr) and the ModelCaches found in the same inputs. The manifests are checked
first, with the checks ``validate`` runs (``flexinfer.local.validation.manifest_problems``) except those
against this machine. ``--cleanup-jobs`` adds the
tmpfs cleanup Job a shared model gets on deletion, pinned to ``--node`` (the manager pins it to the node the
model's pod ran on; by default the model's ``kubernetes.io/hostname`` node selector stands in for it).
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from flexinfer.api.errors import InvalidResourceError
from flexinfer.cli.arguments import int_at_least
from flexinfer.cli.output import add_output_argument, print_data
from flexinfer.cli.validate import add_manifest_arguments, load
from flexinfer.core.errors import ConfigError
from flexinfer.settings import read_env_file, warn

if TYPE_CHECKING:
    from flexinfer.api.loading import Manifest
    from flexinfer.core.controller_defaults import ControllerDefaults


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "render", help="print the Kubernetes objects the manager would apply",
        description="Render Deployments and Services for every Model in the given manifests.",
    )
    add_manifest_arguments(parser)
    add_output_argument(parser, ("yaml", "json"), "yaml", "json prints one `kind: List`")
    parser.add_argument("--env-file", metavar="FILE", help="controller environment (KEY=VALUE lines)")
    parser.add_argument("--replicas", type=int_at_least(0), default=1, metavar="N",
                        help="Deployment replicas to render (default 1; the manager decides at run time)")
    parser.add_argument("--cleanup-jobs", action="store_true", help="also print tmpfs cleanup Jobs")
    parser.add_argument("--node", metavar="NAME", default="",
                        help="node of the cleanup Jobs (default: the model's kubernetes.io/hostname node selector)")
    return parser




def load_defaults(env_file: str | None) -> ControllerDefaults:
    """Controller defaults from an env file (``ConfigError`` if unreadable or malformed). Values the manager
    would replace by their default (Go fallback) are rendered the same way, with a warning on stderr naming
    the variable, the value and the default."""
    from flexinfer.core.controller_defaults import controller_defaults

    env: dict[str, str] = {}
    if env_file:
        try:
            env = read_env_file(env_file)
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            raise ConfigError(f"--env-file {env_file}: {exc}") from None
    return controller_defaults(env, warn=warn)


def rendered_documents(paths: list[str], defaults: ControllerDefaults, replicas: int,
                       cleanup_jobs: bool = False, manifests: list[Manifest] | None = None, *,
                       node: str = "") -> list[dict[str, Any]]:
    """Every object for every Model under ``paths`` (or in ``manifests``, already loaded), in input order."""
    from flexinfer.api.loading import load_manifests  # the renderer's stack: for a run, not for ``--help``
    from flexinfer.api.model import Model
    from flexinfer.api.modelcache import ModelCache
    from flexinfer.core.manifests.render import render_model, render_tmpfs_cleanup_job
    from flexinfer.local.validation import manifest_problems

    manifests = load_manifests(paths) if manifests is None else manifests
    problems = manifest_problems(manifests)
    if problems:
        raise InvalidResourceError(problems)
    resources = [manifest.resource for manifest in manifests]
    caches = [r for r in resources if isinstance(r, ModelCache)]
    docs: list[dict[str, Any]] = []
    for model in (r for r in resources if isinstance(r, Model)):
        docs.extend(render_model(model, caches, defaults, replicas))
        where = node or model.spec.node_selector.get("kubernetes.io/hostname", "")
        job = render_tmpfs_cleanup_job(model, where, defaults) if cleanup_jobs else None
        if job is not None:
            docs.append(job)
    return docs


def run(args: argparse.Namespace) -> int:
    defaults = load_defaults(args.env_file)
    manifests, _ = load(args)
    docs = rendered_documents(args.filename, defaults, args.replicas, args.cleanup_jobs, manifests,
                              node=args.node)
    if args.output == "json":
        print_data({"apiVersion": "v1", "kind": "List", "items": docs}, "json")
    else:
        import yaml

        sys.stdout.write(yaml.safe_dump_all(docs, sort_keys=False, explicit_start=True, width=120))
    return 0
