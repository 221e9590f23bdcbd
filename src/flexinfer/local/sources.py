"""Where a model's weights are on this machine: ``file://`` sources, and their staged tmpfs copy.

Local mode serves only ``file://`` sources (``file:///abs/model.gguf``, or ``file://rel/model.gguf``
relative to the directory the engine was given). Other schemes get an ``EngineError`` saying what to do.
Used by ``flexinfer.local.engine`` (at activation) and ``flexinfer.local.validation`` (at start-up).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote

from flexinfer.api.model import Model
from flexinfer.core.errors import EngineError

FILE_SCHEME = "file://"


def source_path(model: Model, base_dir: Path) -> Path:
    """The local path named by ``spec.source``; ``EngineError`` for non-``file://`` sources."""
    source = model.spec.source
    if not source.startswith(FILE_SCHEME):
        scheme = source.split("://", 1)[0] + "://" if "://" in source else source
        raise EngineError(
            f"model {model.key}: source {source!r} uses {scheme}, which local mode cannot fetch; download the "
            f"weights to this machine and set spec.source to file:///path/to/the/weights "
            f"(or serve it with the Kubernetes engine)"
        )
    text = unquote(source[len(FILE_SCHEME):])
    if text.startswith("localhost/"):
        text = text[len("localhost"):]
    path = Path(text).expanduser()
    return path if path.is_absolute() else base_dir / path


def existing_source(model: Model, base_dir: Path) -> Path:
    """``source_path``, checked to exist."""
    path = source_path(model, base_dir)
    if not path.exists():
        raise EngineError(f"model {model.key}: weights not found at {path} (spec.source {model.spec.source!r})")
    return path


@dataclass(frozen=True)
class StagingPlan:
    """Stage directory ``src`` into directory ``dst``; the server then loads ``served_path``."""

    src: Path
    dst: Path
    served_path: Path


def staging_plan(model: Model, source: Path, shm_root: Path) -> StagingPlan:
    """Weights go to ``<shm_root>/<namespace>/<model>``. A directory source is staged as is; for a file the
    directory holding it is staged (sidecar files and split parts come along — keep one model per directory)
    and the server loads ``dst/<file name>``."""
    dst = shm_root / model.namespace / model.name
    if source.is_dir():
        return StagingPlan(src=source, dst=dst, served_path=dst)
    return StagingPlan(src=source.parent, dst=dst, served_path=dst / source.name)
