"""Flash-loader settings in local mode: the cluster's resolution over what ``flexinfer serve`` was given.

``FlashSettings`` holds the inputs of the layers the manager uses (spec §2.2): the controller defaults
(``DEFAULT_FLASH_LOADER_*`` in serve's environment, parsed by ``flexinfer.core.controller_defaults`` with
the manager's rules) and the ModelCache manifests loaded with the Models (in file order, the candidates of
layer 2). Calling it with a Model returns ``flexinfer.core.flashloader_settings.resolve_flash_loader`` — the
function the manifest renderer calls — so one manifest set gets the same effective settings in both engines.
``replace_caches`` swaps the ModelCaches on a reload (a changed ModelCache applies at the next start of the
models it matches).

Built by ``flexinfer.local.config.local_config``; the local engine asks it whether (and how) to stage.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from flexinfer.api.model import Model
from flexinfer.api.modelcache import ModelCache
from flexinfer.core.controller_defaults import ControllerDefaults, FlashLoaderDefaults
from flexinfer.core.flashloader_settings import FlashLoaderConfig, resolve_flash_loader


@dataclass
class FlashSettings:
    """Resolves the flash-loader settings of a Model (see the module docstring)."""

    defaults: FlashLoaderDefaults = field(default_factory=FlashLoaderDefaults)
    caches: tuple[ModelCache, ...] = ()

    def __call__(self, model: Model) -> FlashLoaderConfig:
        return resolve_flash_loader(ControllerDefaults(flash_loader=self.defaults), model, self.caches)

    def replace_caches(self, caches: Iterable[ModelCache]) -> None:
        """Use a new ModelCache list (list order decides between two caches matching one Model)."""
        self.caches = tuple(caches)
