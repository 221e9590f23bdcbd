"""Fixtures for the chart tests: the pinned helm and renders of charts/flexinfer shared per session."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from support.helm_chart import SEED_SET_ARGS, Helm, pinned_helm


@pytest.fixture(scope="session")
def helm(tmp_path_factory: pytest.TempPathFactory) -> Helm:
    return pinned_helm(Path(tmp_path_factory.mktemp("helm-home")))


@pytest.fixture(scope="session")
def default_docs(helm: Helm) -> list[dict[str, Any]]:
    return helm.template()


@pytest.fixture(scope="session")
def seed_docs(helm: Helm) -> list[dict[str, Any]]:
    """The render from the seed design note's verification command."""
    return helm.template(*SEED_SET_ARGS)
