"""The manager's in-memory view of the cluster: the latest body of every watched object.

Includes the proxies' ``ModelDemand`` reports: a changed report affects the units of the Models it names.

Fed by the kopf event handlers (``flexinfer.manager.operator``) and by the reconciler's own write responses
(so a reconcile right after a write never acts on the older body); bodies carrying an older
``resourceVersion`` than the stored one, or the same one again, are ignored. Each update returns the reconcile
``Unit``s it affects: none for a Model changed only in fields no pass reads (``BOOKKEEPING``: kopf adding its
finalizer), whose new body is kept without a new parse. Reconciles read only from here: no API read per
reconcile. Models and ModelCaches are parsed with ``parse_stored``: a quantity or duration stored before the CRD's
pattern existed is ignored (and listed in ``ignored`` for the reconciler to report) instead of discarding the whole
object. It also remembers when the last pod of each model was deleted (``pods_gone_at``): a device released a
moment ago may not be rebound yet, and when its watch showed a pod or Deployment turn Ready live (``ready_seen``,
``flexinfer.manager.ready_watch``). A group pod's Deployment, Service and pods (label ``flexinfer.ai/group-pod``)
affect their group's unit. A pod the manager deleted itself with grace period 0 (``forget_pod``: gone at once) is
dropped without waiting for the watch's DELETED event, and the events still on their way for it are ignored
(``REAPED_KEPT`` names remembered). ``put`` takes the moment the watch delivered a body (``seen``; ``None`` for
listings and the manager's own writes).

A pass reads only its unit's objects: ModelCaches and ModelDemands are kept per namespace, GPULeases per
(namespace, group), each parsed once when stored, so what the store holds elsewhere costs a pass nothing
(tests/unit/manager/test_pass_cost.py).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any, TypeVar

from flexinfer.api.conventions import GROUP_POD_LABEL, MODEL_LABEL
from flexinfer.api.errors import FieldProblem, InvalidResourceError
from flexinfer.api.gpulease import GPULease
from flexinfer.api.loading import parse_stored
from flexinfer.api.model import Model
from flexinfer.api.modelcache import ModelCache
from flexinfer.api.modeldemand import ModelDemand
from flexinfer.core.flashloader_settings import cache_matches_model
from flexinfer.manager.ready_watch import READY_CONDITION, ReadySightings

Body = dict[str, Any]
Key = tuple[str, str]
T = TypeVar("T")


@dataclass(frozen=True, order=True)
class Unit:
    """What one reconcile covers: a whole shared group (``group`` set) or one exclusive model."""

    namespace: str
    name: str
    group: bool = False

    def __str__(self) -> str:
        return f"{self.namespace}/{'group:' if self.group else ''}{self.name}"


@dataclass(frozen=True)
class StoredCache:
    """A ModelCache body parsed once: the typed cache (``None`` when invalid) and the fields ignored in it."""

    body: Body
    cache: ModelCache | None
    ignored: tuple[FieldProblem, ...] = ()


@dataclass(frozen=True)
class Parsed:
    """A Model body validated once per resourceVersion: the typed Model or the validation error, and the
    fields ignored because their stored value cannot be parsed."""

    body: Body
    model: Model | None
    error: InvalidResourceError | None
    ignored: tuple[FieldProblem, ...] = ()


def key_of(body: Body) -> Key:
    meta = body.get("metadata") or {}
    return str(meta.get("namespace") or "default"), str(meta.get("name") or "")


def _rv(body: Body | None) -> int | None:
    text = str(((body or {}).get("metadata") or {}).get("resourceVersion") or "")
    return int(text) if text.isdigit() else None


def _stale(body: Body, stored: Body | None) -> bool:
    """Whether ``body`` is older than the stored version, or that same version again (a watch event echoing the
    response of the manager's own write, a listing of what the snapshot holds)."""
    new, old = _rv(body) or 0, _rv(stored) or 0
    return new < old or 0 < new == old


def _group_of(body: Body) -> str | None:
    gpu = (body.get("spec") or {}).get("gpu") or {}
    shared = gpu.get("shared")
    return str(shared) if shared else None


def unit_of(body: Body) -> Unit:
    namespace, name = key_of(body)
    group = _group_of(body)
    return Unit(namespace, group, True) if group else Unit(namespace, name)


def _parse(body: Body) -> Parsed:
    try:
        stored = parse_stored(body)
    except InvalidResourceError as error:
        return Parsed(body, None, error)
    model = stored.resource if isinstance(stored.resource, Model) else None
    return Parsed(body, model, None, stored.ignored)


REAPED_KEPT = 256
"""How many pods deleted by the manager itself are remembered, so a late watch event cannot bring one back."""


class Store:
    """Latest bodies of Models, Deployments, Pods, ModelCaches, GPULeases and ModelDemands (see the module
    docstring)."""

    def __init__(self, clock: Callable[[], datetime] = lambda: datetime.now(UTC)) -> None:
        self._clock = clock
        self._pods_gone: dict[Key, datetime] = {}
        """When the last pod of a model was deleted (a device it held may still be settling)."""
        self._models: dict[Key, Parsed] = {}
        self._groups: dict[Key, set[str]] = defaultdict(set)
        self._deployments: dict[Key, Body] = {}
        self._services: dict[Key, Body] = {}
        self._pods: dict[Key, dict[str, Body]] = defaultdict(dict)
        self._reaped: dict[Key, None] = {}
        """(namespace, name) of pods ``forget_pod`` dropped, oldest first (at most ``REAPED_KEPT``)."""
        self._caches: dict[str, dict[str, StoredCache]] = defaultdict(dict)
        """Namespace → name → the ModelCache."""
        self._leases: dict[Key, dict[str, GPULease]] = defaultdict(dict)
        """(namespace, group) → name → the valid GPULeases of that group."""
        self._lease_groups: dict[Key, str] = {}
        """(namespace, name) of a stored GPULease → its group."""
        self._demands: dict[str, dict[str, ModelDemand]] = defaultdict(dict)
        """Namespace → name → the proxy's report."""
        self._ready = ReadySightings()

    # ---------------------------------------------------------------- updates

    def put(self, kind: str, body: Body, seen: datetime | None = None) -> list[Unit]:
        """Store a newer body (without ``managedFields``); returns the units to reconcile. ``seen``: when the
        watch delivered it (``None``: a listing or the manager's own write)."""
        body = _slim(body)
        if kind not in READY_CONDITION:
            return getattr(self, f"_put_{kind.lower()}")(body)  # type: ignore[no-any-return]
        previous = self._kept(kind, body)
        units: list[Unit] = getattr(self, f"_put_{kind.lower()}")(body)
        if self._kept(kind, body) is body:
            self._ready.update(kind, key_of(body), previous, body, seen)
        return units

    def remove(self, kind: str, body: Body) -> list[Unit]:
        """Forget a deleted object; returns the units to reconcile."""
        if kind in READY_CONDITION:
            self._ready.forget(kind, key_of(body))
        return getattr(self, f"_remove_{kind.lower()}")(body)  # type: ignore[no-any-return]

    def _kept(self, kind: str, body: Body) -> Body | None:
        """The stored Pod or Deployment of ``body``'s name."""
        namespace, name = key_of(body)
        if kind == "Deployment":
            return self._deployments.get((namespace, name))
        model = ((body.get("metadata") or {}).get("labels") or {}).get(MODEL_LABEL)
        return self._pods.get((namespace, model or ""), {}).get(name)

    def _put_model(self, body: Body) -> list[Unit]:
        key = key_of(body)
        old = self._models.get(key)
        if old is not None and _stale(body, old.body):
            return []
        if old is not None and _rv(body) is not None and _same_but_bookkeeping(old.body, body):
            self._models[key] = replace(old, body=body)
            return []
        units = self._unindex(key)
        self._models[key] = _parse(body)
        group = _group_of(body)
        if group:
            self._groups[(key[0], group)].add(key[1])
        return sorted({*units, unit_of(body)})

    def _unindex(self, key: Key) -> list[Unit]:
        old = self._models.get(key)
        if old is None:
            return []
        group = _group_of(old.body)
        if group:
            self._groups[(key[0], group)].discard(key[1])
        return [unit_of(old.body)]

    def _remove_model(self, body: Body) -> list[Unit]:
        key = key_of(body)
        units = self._unindex(key)
        self._models.pop(key, None)
        return units if units and units[0].group else []

    def _model_units(self, namespace: str, name: str | None) -> list[Unit]:
        parsed = self._models.get((namespace, name or ""))
        return [unit_of(parsed.body)] if parsed is not None else []

    def _owner_units(self, body: Body, name: str | None) -> list[Unit]:
        """The unit of a Model's own object, or of a group pod's (``flexinfer.ai/group-pod``: its group)."""
        group = ((body.get("metadata") or {}).get("labels") or {}).get(GROUP_POD_LABEL)
        if group:
            return [Unit(key_of(body)[0], str(group), True)]
        return self._model_units(key_of(body)[0], name)

    def _put_deployment(self, body: Body) -> list[Unit]:
        key = key_of(body)
        if _stale(body, self._deployments.get(key)):
            return []
        self._deployments[key] = body
        return self._owner_units(body, key[1])

    def _remove_deployment(self, body: Body) -> list[Unit]:
        key = key_of(body)
        self._deployments.pop(key, None)
        return self._owner_units(body, key[1])

    def _put_service(self, body: Body) -> list[Unit]:
        key = key_of(body)
        if _stale(body, self._services.get(key)):
            return []
        self._services[key] = body
        return self._owner_units(body, key[1])

    def _remove_service(self, body: Body) -> list[Unit]:
        key = key_of(body)
        self._services.pop(key, None)
        return self._owner_units(body, key[1])

    def _put_pod(self, body: Body) -> list[Unit]:
        namespace, name = key_of(body)
        model = ((body.get("metadata") or {}).get("labels") or {}).get(MODEL_LABEL)
        if not model or (namespace, name) in self._reaped:
            return []
        self._pods[(namespace, model)][name] = body
        return self._owner_units(body, model)

    def forget_pod(self, namespace: str, name: str) -> None:
        """The manager deleted this pod with grace period 0: it is gone now (its DELETED event may come later),
        unless finalizers keep the object until their controllers remove them."""
        for (ns, _model), pods in self._pods.items():
            if ns == namespace and name in pods:
                if (pods[name].get("metadata") or {}).get("finalizers"):
                    return
                self.remove("Pod", pods[name])
                break
        self._reaped[(namespace, name)] = None
        while len(self._reaped) > REAPED_KEPT:
            del self._reaped[next(iter(self._reaped))]

    def _remove_pod(self, body: Body) -> list[Unit]:
        namespace, name = key_of(body)
        model = ((body.get("metadata") or {}).get("labels") or {}).get(MODEL_LABEL)
        pods = self._pods.get((namespace, model or ""), {})
        if pods.pop(name, None) is not None:
            self._pods_gone[(namespace, model or "")] = self._clock()
        return self._owner_units(body, model)

    def _put_modelcache(self, body: Body) -> list[Unit]:
        namespace, name = key_of(body)
        try:
            stored = parse_stored(body)
        except InvalidResourceError:
            self._caches[namespace][name] = StoredCache(body, None)
        else:
            cache = stored.resource if isinstance(stored.resource, ModelCache) else None
            self._caches[namespace][name] = StoredCache(body, cache, stored.ignored if cache else ())
        return self._cache_units(body)

    def _remove_modelcache(self, body: Body) -> list[Unit]:
        namespace, name = key_of(body)
        self._caches.get(namespace, {}).pop(name, None)
        return self._cache_units(body)

    def _cache_units(self, body: Body) -> list[Unit]:
        cache = _typed(body, ModelCache)
        if cache is None:
            return []
        return sorted({unit_of(p.body) for p in self._models.values()
                       if p.model is not None and p.model.namespace == cache.namespace
                       and cache_matches_model(cache, p.model)})

    def _put_gpulease(self, body: Body) -> list[Unit]:
        units = self._remove_gpulease(body)
        lease = _typed(body, GPULease)
        if lease is not None:
            key = key_of(body)
            self._leases[(key[0], lease.spec.group)][key[1]] = lease
            self._lease_groups[key] = lease.spec.group
        group = str((body.get("spec") or {}).get("group") or "")
        return sorted({*units, Unit(key_of(body)[0], group, True)}) if group else units

    def _remove_gpulease(self, body: Body) -> list[Unit]:
        """Forget the stored lease of ``body``'s name; the unit of the group it was stored under."""
        key = key_of(body)
        group = self._lease_groups.pop(key, None)
        if group is None:
            group = str((body.get("spec") or {}).get("group") or "")
            return [Unit(key[0], group, True)] if group else []
        leases = self._leases.get((key[0], group), {})
        leases.pop(key[1], None)
        if not leases:
            self._leases.pop((key[0], group), None)
        return [Unit(key[0], group, True)]

    def _put_modeldemand(self, body: Body) -> list[Unit]:
        namespace, name = key_of(body)
        old = self._demands[namespace].pop(name, None)
        new = _typed(body, ModelDemand)
        if new is not None:
            self._demands[namespace][name] = new
        return self._demand_units(namespace, old, new)

    def _remove_modeldemand(self, body: Body) -> list[Unit]:
        namespace, name = key_of(body)
        return self._demand_units(namespace, self._demands.get(namespace, {}).pop(name, None), None)

    def _demand_units(self, namespace: str, old: ModelDemand | None, new: ModelDemand | None) -> list[Unit]:
        """Units of the Models whose report changed between ``old`` and ``new``."""
        before = old.spec.models if old is not None else {}
        after = new.spec.models if new is not None else {}
        renewed = old is None or new is None or old.spec.renew_time != new.spec.renew_time
        live = {n for n, r in (*before.items(), *after.items()) if r.waiting_since or r.in_flight_at}
        names = {n for n in {*before, *after} if before.get(n) != after.get(n) or (renewed and n in live)}
        return sorted({u for n in names for u in self._model_units(namespace, n)})

    # ---------------------------------------------------------------- reads

    def demands(self, namespace: str) -> list[ModelDemand]:
        """The proxies' ``ModelDemand`` reports in ``namespace``."""
        return list(self._demands.get(namespace, {}).values())

    def unit_models(self, unit: Unit) -> list[Parsed]:
        """The Models of a unit (a group's members by name), deleted-but-finalizing ones included."""
        names = sorted(self._groups.get((unit.namespace, unit.name), ())) if unit.group else [unit.name]
        found = (self._models.get((unit.namespace, n)) for n in names)
        return [p for p in found if p is not None and (unit.group or _group_of(p.body) is None)]

    def model(self, namespace: str, name: str) -> Parsed | None:
        return self._models.get((namespace, name))

    def deployment(self, namespace: str, name: str) -> Body | None:
        return self._deployments.get((namespace, name))

    def service(self, namespace: str, name: str) -> Body | None:
        return self._services.get((namespace, name))

    def live(self, kind: str, namespace: str, name: str) -> Body | None:
        """The stored Deployment or Service of that name."""
        table = self._deployments if kind == "Deployment" else self._services
        return table.get((namespace, name))

    def pods(self, namespace: str, model: str) -> Iterable[Body]:
        return list(self._pods.get((namespace, model), {}).values())

    def ready_seen(self, kind: str, namespace: str, name: str) -> datetime | None:
        """When the watch delivered the event that showed the stored Pod (``Ready``) or Deployment
        (``Available``) of that name turn True, if the manager saw that transition live."""
        return self._ready.seen(kind, namespace, name)

    def pods_gone_at(self, namespace: str, model: str) -> datetime | None:
        """When a pod of ``model`` was last seen deleted (``None``: never, since this process started): with none
        left, its device was released then; with another left, its replica was replaced then."""
        return self._pods_gone.get((namespace, model))

    def caches(self, namespace: str) -> list[ModelCache]:
        """The valid ModelCaches of ``namespace``."""
        return [c.cache for c in self._caches.get(namespace, {}).values() if c.cache is not None]

    def cache_problems(self, namespace: str) -> list[tuple[Body, ModelCache, tuple[FieldProblem, ...]]]:
        """The ModelCaches of ``namespace`` that had fields ignored: (body, typed cache, ignored fields)."""
        return [(c.body, c.cache, c.ignored) for c in self._caches.get(namespace, {}).values()
                if c.cache is not None and c.ignored]

    def leases(self, namespace: str, group: str) -> list[GPULease]:
        """The valid GPULeases of ``group`` in ``namespace``."""
        return list(self._leases.get((namespace, group), {}).values())

    def units(self) -> list[Unit]:
        """Every unit with at least one Model."""
        return sorted({unit_of(p.body) for p in self._models.values()})

    def model_count(self) -> int:
        return len(self._models)


BOOKKEEPING = frozenset({"resourceVersion", "finalizers", "managedFields"})
"""Fields of a Model's ``metadata`` that no pass reads: a change of these alone (kopf adding its finalizer) needs
neither a new parse nor a reconcile."""


def _same_but_bookkeeping(old: Body, new: Body) -> bool:
    """Whether the two bodies of a Model differ at most in ``BOOKKEEPING`` fields."""
    if old.keys() != new.keys() or any(old[k] != new[k] for k in old if k != "metadata"):
        return False
    before, after = old.get("metadata") or {}, new.get("metadata") or {}
    keys = (before.keys() | after.keys()) - BOOKKEEPING
    return all(before.get(k) == after.get(k) for k in keys)


def _slim(body: Body) -> Body:
    """The body without ``metadata.managedFields`` (large, never read)."""
    meta = body.get("metadata")
    if not isinstance(meta, dict) or "managedFields" not in meta:
        return body
    return {**body, "metadata": {k: v for k, v in meta.items() if k != "managedFields"}}


def _typed(body: Body, cls: type[T]) -> T | None:
    """The object as ``cls`` (unparsable quantities/durations ignored), or ``None`` when it is invalid."""
    try:
        resource = parse_stored(body).resource
    except InvalidResourceError:
        return None
    return resource if isinstance(resource, cls) else None
