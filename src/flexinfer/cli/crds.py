"""``flexinfer crds [--out DIR] [--check]``: write (or check) the generated CustomResourceDefinitions.

Writes ``<group>_<plural>.yaml`` (e.g. ``ai.flexinfer_models.yaml``) from ``flexinfer.api.crds`` into
``charts/flexinfer/crds`` (default). ``--check`` writes nothing and exits 1 naming every file that differs.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from flexinfer.core.errors import ConfigError

DEFAULT_OUT = "charts/flexinfer/crds"


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "crds", help="write the CustomResourceDefinitions generated from the types",
        description="Generate the Model, ModelCache, GPULease and ModelDemand CRDs (apiextensions.k8s.io/v1).",
    )
    parser.add_argument("--out", default=DEFAULT_OUT, metavar="DIR", help=f"output directory (default {DEFAULT_OUT})")
    parser.add_argument("--check", action="store_true", help="only check that the files are up to date")
    return parser


def stale_files(out: Path) -> list[str]:
    """Names of generated files missing from ``out`` or different from the generator's output."""
    from flexinfer.api.crds import crd_files

    stale = []
    for name, text in crd_files().items():
        path = out / name
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            stale.append(name)
    return stale


def run(args: argparse.Namespace) -> int:
    from flexinfer.api.crds import crd_files  # every resource type's schema: built only for this command

    out = Path(args.out)
    if args.check:
        stale = stale_files(out)
        for name in stale:
            print(f"stale: {out / name} (run `flexinfer crds --out {out}`)")
        return 1 if stale else 0
    try:
        out.mkdir(parents=True, exist_ok=True)
        for name, text in crd_files().items():
            (out / name).write_text(text, encoding="utf-8")
            print(f"wrote {out / name}")
    except OSError as exc:
        raise ConfigError(f"--out {out}: cannot write: {exc}") from None
    return 0
