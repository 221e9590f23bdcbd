"""Both engines give one manifest set the same flash-loader settings.

Every row of the precedence table (``support.flashloader_cases``: controller environment, ModelCaches, Model)
goes through the manager's path — ``manager_config(env)`` → ``render_model`` → the ``flash-loader`` init
container, whose ``FLASH_*`` environment ``flexinfer flash-load`` parses, and the ``flash-tmpfs`` volume's
sizeLimit — and through ``flexinfer serve``'s — ``local_config(env)`` → ``FlashSettings`` → ``local_staging``
(what the local stager hands the flash-loader library). Whether the model is staged, the staging settings and
the tmpfs limit must agree.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from flexinfer.api.model import Model
from flexinfer.api.modelcache import ModelCache
from flexinfer.assembly.local import local_staging
from flexinfer.core.manifests.render import render_model
from flexinfer.flashloader.config import StageSettings, settings_from_env
from flexinfer.local.config import local_config
from flexinfer.local.flash_settings import FlashSettings
from flexinfer.manager.config import manager_config
from support.flashloader_cases import CASES, Case, build_cache, case_model

Outcome = tuple[bool, StageSettings | None, str | None]
"""(staged, staging settings, tmpfs size limit)."""


def cluster_outcome(env: dict[str, str], caches: list[ModelCache], model: Model) -> Outcome:
    deployment = render_model(model, caches, manager_config(env).defaults, 1)[0]
    pod: dict[str, Any] = deployment["spec"]["template"]["spec"]
    loader = next((c for c in pod.get("initContainers", []) if c["name"] == "flash-loader"), None)
    if loader is None:
        return False, None, None
    settings = settings_from_env({e["name"]: e["value"] for e in loader["env"]}, warn=None)
    tmpfs = next(v for v in pod["volumes"] if v["name"] == "flash-tmpfs")
    return True, settings, tmpfs.get("emptyDir", {}).get("sizeLimit")


def local_outcome(env: dict[str, str], caches: list[ModelCache], model: Model, base_dir: Path) -> Outcome:
    warnings: list[str] = []
    flash = FlashSettings(local_config(env, base_dir, warn=warnings.append).flash_loader, tuple(caches))
    config = flash(model)
    if not config.enabled:
        return False, None, None
    how = local_staging(model, config)
    return True, how.settings, how.tmpfs_size_limit


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_both_engines_resolve_alike(case: Case, tmp_path: Path) -> None:
    model, caches = case_model(case), [build_cache(c) for c in case.caches]
    local = local_outcome(case.env, caches, model, tmp_path)
    assert local == cluster_outcome(case.env, caches, model)
    if "enabled" in case.expected:
        assert local[0] is case.expected["enabled"]


def test_the_settings_reach_the_stager_unchanged(tmp_path: Path) -> None:
    """A sample row in full: the local stager gets every field the init container gets."""
    env = {"DEFAULT_FLASH_LOADER_ENABLED": "1", "DEFAULT_FLASH_LOADER_BUFFER_KB": "512",
           "DEFAULT_FLASH_LOADER_VERIFY": "true", "DEFAULT_FLASH_LOADER_EXCLUDE": "onnx/,tf/"}
    caches = [build_cache({"name": "m-cache", "flash_loader": {"enabled": True, "concurrency": 3,
                                                               "tmpfsSizeLimit": "3Gi"}})]
    model = case_model(Case("sample", {}, model={"config": {"useFp16": "1"}}))
    staged, settings, limit = local_outcome(env, caches, model, tmp_path)
    assert staged and settings is not None
    assert (settings.concurrency, settings.buffer_kb, settings.verify, settings.variant, limit) == \
        (3, 512, True, "fp16", "3Gi")
    assert settings.exclude[:2] == ("onnx/", "tf/")
    assert cluster_outcome(env, caches, model) == (staged, settings, limit)
