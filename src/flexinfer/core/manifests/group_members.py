"""Who can join a group pod, where each member's weights are inside it, and the manifests its ``serve`` reads.

A group pod (``flexinfer.core.manifests.group_pod``) runs ``flexinfer serve`` over a shared group's members in
one container, so every member must run in one image, with weights the local engine can read, on a backend it
can start. ``member_problems`` says which members break that (the image: the oldest member's, by
``creationTimestamp`` then name, among those without another problem); ``member_volumes`` lays out the
members' weight volumes in the pod and ``served_source`` the path each member loads from there:

- ``pvc://claim/sub/path`` → the claim at ``/pvc/<claim>`` → ``file:///pvc/<claim>/sub/path`` (and the stored
  ``spec.cache.strategy`` ``None``/unset becomes ``SharedPVC``, so the flash-loader decision stays the one the
  Kubernetes engine takes for a claim: weights on a persistent volume);
- ``file:///models/…`` of a ``SharedPVC`` member: its claim (``spec.cache.pvcName``, default ``<model>-cache``),
  mounted once per claim at ``/pvc/<claim>`` as above → ``file:///pvc/<claim>/…``;
- ``file:///models/…`` of a ``Local`` member: its node directory (``<hostPath>/<namespace>/<model>``) at
  ``/models/<model>`` → ``file:///models/<model>/…`` (one directory per member, as in default mode, so two
  members that both load ``/models/model.gguf`` keep their own files);
- ``file:///models/…`` with strategy ``Memory``/``None`` is a problem (the pod's volume would be empty, as it is
  in default mode); any other ``file://`` path is left as is (weights inside the image).

Every volume is mounted read-only: the local engine only reads weights (it stages copies elsewhere). Pure;
used by ``flexinfer.core.manifests.group_pod``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from flexinfer.api.model import Model
from flexinfer.core.cache_strategy import cache_pvc_name, effective_cache_strategy, is_pvc_source, pvc_source_parts
from flexinfer.core.controller_defaults import ControllerDefaults
from flexinfer.core.errors import ConfigError
from flexinfer.core.manifests.deployment import model_image
from flexinfer.core.manifests.volumes import MODEL_MOUNT, model_volume
from flexinfer.core.profiles import runtime_profile

Json = dict[str, Any]
PVC_MOUNT = "/pvc"
GROUP_POD_BACKENDS = ("llamacpp", "vllm")
"""The backends the local engine has a launch profile for (``flexinfer.local.profiles.PROFILES``); a member on
another backend joins only with its own ``spec.config.command``."""
EMPTY_STRATEGIES = ("Memory", "None")
"""Cache strategies whose ``model`` volume starts empty in a pod (nothing fills it for a ``file://`` source)."""


@dataclass(frozen=True)
class MemberVolume:
    """One weight volume of the group pod: the pod volume, where it is mounted, and the ``/models`` path it
    replaces for the members that read it."""

    volume: Json
    mount_path: str


def seniority(model: Model) -> tuple[bool, float, str]:
    """Oldest first: ``creationTimestamp`` (members without one last), then name."""
    created = model.metadata.creation_timestamp
    return created is None, created.timestamp() if created is not None else 0.0, model.name


def member_problems(members: Sequence[Model], defaults: ControllerDefaults) -> tuple[str | None, dict[str, str]]:
    """The image of the group pod (``None`` when no member can join) and ``{member: why it cannot join}``."""
    problems: dict[str, str] = {}
    images: dict[str, str] = {}
    for model in sorted(members, key=seniority):
        try:
            images[model.name] = model_image(model, defaults, runtime_profile(model))
        except ConfigError as exc:
            problems[model.name] = str(exc)
            continue
        why = [text for text in (source_problem(model), backend_problem(model)) if text is not None]
        if why:
            problems[model.name] = "; ".join(why)
    owner = next((m for m in sorted(members, key=seniority) if m.name not in problems), None)
    if owner is None:
        return None, problems
    image = images[owner.name]
    for model in members:
        if model.name not in problems and images[model.name] != image:
            problems[model.name] = (
                f"model {model.name} runs image {images[model.name]} but group {model.group}'s pod runs {image} (the "
                f"image of its oldest member {owner.name}): group-pod mode runs every member in one image")
    return image, problems


def source_problem(model: Model) -> str | None:
    """Why the local engine cannot read the member's weights inside the pod (``None``: it can)."""
    source = model.spec.source
    if is_pvc_source(model):
        return None
    if not source.lower().startswith("file://"):
        return (f"model {model.name}: source {source!r} is fetched by the model server itself, but a group pod's "
                f"local engine reads only file:// and pvc:// sources: put the weights on a PersistentVolumeClaim "
                f"(source pvc://<claim>/<path>) or on the node (spec.cache.strategy Local, source "
                f"file://{MODEL_MOUNT}/<file>)")
    strategy = effective_cache_strategy(model)
    if _under_models(_file_path(model)) and strategy in EMPTY_STRATEGIES:
        return (f"model {model.name}: source {source!r} is read from {MODEL_MOUNT}, which cache strategy {strategy} "
                f"leaves empty in a pod: set spec.cache.strategy to Local or SharedPVC, or use a pvc:// source")
    return None


def backend_problem(model: Model) -> str | None:
    """Why the local engine cannot start the member's server (``None``: it can)."""
    if model.backend in GROUP_POD_BACKENDS or isinstance(model.spec.config.get("command"), list):
        return None
    return (f"model {model.name}: backend {model.backend!r} has no launch profile in a group pod's local engine "
            f"(it runs {', '.join(GROUP_POD_BACKENDS)}): set spec.config.command to the server's command, or run "
            f"the group with the Exclusive strategy")


def member_volume(model: Model) -> MemberVolume | None:
    """The volume holding the member's weights and where the pod mounts it (``None``: weights in the image).
    The volume's ``name`` is ``model``; ``member_volumes`` names them."""
    if is_pvc_source(model):
        claim = pvc_source_parts(model)[0]
    elif not _under_models(_file_path(model)):
        return None
    elif effective_cache_strategy(model) == "SharedPVC":
        claim = cache_pvc_name(model)
    else:
        return MemberVolume(model_volume(model), f"{MODEL_MOUNT}/{model.name}")
    return MemberVolume({"name": "model", "persistentVolumeClaim": {"claimName": claim, "readOnly": True}},
                        f"{PVC_MOUNT}/{claim}")


def member_volumes(members: Sequence[Model]) -> tuple[list[Json], list[Json]]:
    """Each distinct weight volume once (members by name), named ``model-<n>``, and its read-only mount."""
    volumes: list[Json] = []
    mounts: list[Json] = []
    seen: set[str] = set()
    for model in sorted(members, key=lambda m: m.name):
        found = member_volume(model)
        if found is None or found.mount_path in seen:
            continue
        seen.add(found.mount_path)
        name = f"model-{len(volumes)}"
        volumes.append({**found.volume, "name": name})
        mounts.append({"name": name, "mountPath": found.mount_path, "readOnly": True})
    return volumes, mounts


def served_source(model: Model) -> str:
    """``spec.source`` as the member reads it inside the pod (see the module docstring)."""
    found = member_volume(model)
    if found is None:
        return model.spec.source
    below_models = _file_path(model)[len(MODEL_MOUNT):]
    sub_path = (pvc_source_parts(model)[1] if is_pvc_source(model) else below_models).strip("/")
    return "file://" + found.mount_path + (f"/{sub_path}" if sub_path else "")


def served_spec(model: Model) -> Json:
    """The stored spec (fields as given) with ``source`` served from the pod, and a claim's strategy kept
    persistent (``SharedPVC`` for a ``pvc://`` source without one, or with ``None``)."""
    spec = model.spec.model_dump(by_alias=True, exclude_unset=True, exclude_none=True, mode="json")
    spec["source"] = served_source(model)
    if is_pvc_source(model):
        cache = dict(spec.get("cache") or {})
        if cache.get("strategy") in (None, "None"):
            cache["strategy"] = "SharedPVC"
        spec["cache"] = cache
    return spec


def model_document(model: Model) -> Json:
    """The member as its group pod's ``serve`` reads it: identity, labels and the served spec. No annotations:
    the local engine reads none, and the manager's and proxies' (waiting, in flight) change with every request."""
    metadata: Json = {"name": model.name, "namespace": model.namespace}
    if model.metadata.labels:
        metadata["labels"] = dict(model.metadata.labels)
    return {"apiVersion": model.api_version, "kind": model.kind, "metadata": metadata, "spec": served_spec(model)}


def _file_path(model: Model) -> str:
    """A ``file://`` source's path, absolute as the Kubernetes engine reads it."""
    return "/" + model.spec.source.partition("://")[2].lstrip("/")


def _under_models(path: str) -> bool:
    return path == MODEL_MOUNT or path.startswith(MODEL_MOUNT + "/")
