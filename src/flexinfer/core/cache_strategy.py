"""The effective cache strategy of a Model and whether its weights live on a persistent volume.

Go rules (``cacheStrategy()``, ``modelUsesPersistentVolume``): an explicit ``spec.cache.strategy`` wins;
otherwise shared-GPU models default to ``Memory`` and all others to ``SharedPVC``. A model uses a
persistent volume when its source is ``pvc://`` or its strategy is ``SharedPVC`` or ``Local``.

Pure; used by ``flexinfer.core.flashloader_settings``, the manifest renderer, the status planner
(``flexinfer.core.model_status.build``), the local engine and the metrics labels.
"""

from __future__ import annotations

from flexinfer.api.model import CacheStrategy, Model

PERSISTENT_STRATEGIES: frozenset[str] = frozenset({"SharedPVC", "Local"})
DEFAULT_LOCAL_HOST_PATH = "/var/lib/flexinfer/models"


def effective_cache_strategy(model: Model) -> CacheStrategy:
    """Explicit strategy, else ``Memory`` for shared-GPU models, else ``SharedPVC``."""
    if model.spec.cache is not None and model.spec.cache.strategy is not None:
        return model.spec.cache.strategy
    return "Memory" if model.group else "SharedPVC"


def is_pvc_source(model: Model) -> bool:
    """True for ``pvc://claim/sub/path`` sources."""
    return model.spec.source.lower().startswith("pvc://")


def uses_persistent_volume(model: Model) -> bool:
    """True when weights come from a volume that outlives the pod (the flash-loader gate)."""
    return is_pvc_source(model) or effective_cache_strategy(model) in PERSISTENT_STRATEGIES


def pvc_source_parts(model: Model) -> tuple[str, str]:
    """``pvc://claim/sub/path`` → ``("claim", "sub/path")`` (sub path empty when absent)."""
    rest = model.spec.source.split("://", 1)[1].strip("/")
    claim, _, sub_path = rest.partition("/")
    return claim, sub_path.strip("/")


def cache_pvc_name(model: Model) -> str:
    """The SharedPVC claim: ``spec.cache.pvcName`` or the auto-created ``<model>-cache``."""
    if model.spec.cache is not None and model.spec.cache.pvc_name:
        return model.spec.cache.pvc_name
    return f"{model.name}-cache"


def local_cache_dir(model: Model) -> str:
    """The node directory of a ``Local`` cache: ``<cache.hostPath>/<namespace>/<name>``."""
    base = DEFAULT_LOCAL_HOST_PATH
    if model.spec.cache is not None and model.spec.cache.host_path:
        base = model.spec.cache.host_path
    return f"{base.rstrip('/')}/{model.namespace}/{model.name}"
