"""Start-up check of the models ``flexinfer serve`` was given: what will fail when each is activated.

Nothing here stops ``serve``: a model that cannot run here (non-``file://`` source, missing weights, no
backend installed, malformed ``spec.config``) fails with the same message when it is activated, and the
other models keep working. ``serve`` prints these notes at start-up so the operator sees them early.
Called by ``flexinfer.assembly.run_local``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from flexinfer.api.model import Model
from flexinfer.core.errors import EngineError
from flexinfer.local.profiles import Availability, plan_launch
from flexinfer.local.sources import existing_source


@dataclass(frozen=True)
class ModelNote:
    """A problem found with one model at start-up."""

    model: str
    message: str


def check_model(model: Model, installed: Availability, base_dir: Path) -> ModelNote | None:
    """The first reason ``model`` would fail to start here, if any."""
    try:
        path = existing_source(model, base_dir)
        plan_launch(model, str(path), 0, "127.0.0.1", installed)
    except EngineError as exc:
        return ModelNote(model.key, str(exc))
    return None


def check_models(models: Sequence[Model], installed: Availability, base_dir: Path) -> list[ModelNote]:
    """``check_model`` for every model; duplicates of a key are reported too."""
    notes, seen = [], set()
    for model in models:
        if model.key in seen:
            notes.append(ModelNote(model.key, f"model {model.key} is defined more than once; the last one wins"))
        seen.add(model.key)
        note = check_model(model, installed, base_dir)
        if note is not None:
            notes.append(note)
    return notes
