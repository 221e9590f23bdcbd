"""The proxy's watch cache: list + watch into the store, 410 Gone relists, errors re-watch from the last
resourceVersion, invalid documents are skipped, and ``wait_until`` is woken by events."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest

from flexinfer.api.model import Model
from flexinfer.cluster_proxy.model_api import KubeApiError
from flexinfer.cluster_proxy.model_watch import ModelStore, ModelWatcher
from support.fake_model_api import FakeModelApi, model_body
from support.polling import eventually


@contextlib.asynccontextmanager
async def watching(api: FakeModelApi,
                   namespace: str | None = "default") -> AsyncIterator[tuple[ModelStore, ModelWatcher]]:
    store = ModelStore()
    watcher = ModelWatcher(api, store, namespace, backoff_initial=0.01, backoff_max=0.05)
    task = asyncio.create_task(watcher.run())
    try:
        await asyncio.wait_for(store.synced.wait(), 5)
        yield store, watcher
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def phase(store: ModelStore, key: str) -> str | None:
    model = store.get(key)
    return model.status.phase if model is not None else None


async def test_initial_list_fills_the_store_for_the_namespace_only() -> None:
    api = FakeModelApi()
    await api.put(model_body("a", phase="Idle"))
    await api.put(model_body("b", namespace="other"))
    async with watching(api) as (store, watcher):
        assert [m.key for m in store.all()] == ["default/a"]
        assert phase(store, "default/a") == "Idle"
        assert watcher.relists == 1


async def test_all_namespaces_mode_sees_every_namespace() -> None:
    api = FakeModelApi()
    await api.put(model_body("a"))
    await api.put(model_body("b", namespace="other"))
    async with watching(api, namespace=None) as (store, _):
        assert sorted(m.key for m in store.all()) == ["default/a", "other/b"]


async def test_watch_events_update_the_store_and_notify_listeners() -> None:
    api = FakeModelApi()
    await api.put(model_body("a", phase="Idle"))
    async with watching(api) as (store, _):
        seen: list[tuple[str | None, str | None]] = []
        store.subscribe(lambda old, new: seen.append((old.status.phase if old else None,
                                                      new.status.phase if new else None)))
        await api.set_status("a", {"phase": "Loading"})
        await api.put(model_body("b"))
        await api.remove("a")
        await eventually(lambda: len(seen) == 3)
        assert seen == [("Idle", "Loading"), (None, None), ("Loading", None)]
        assert [m.key for m in store.all()] == ["default/b"]


async def test_410_gone_relists_and_drops_models_deleted_meanwhile() -> None:
    api = FakeModelApi()
    await api.put(model_body("a"))
    await api.put(model_body("b"))
    async with watching(api) as (store, watcher):
        deleted: list[str] = []
        store.subscribe(lambda old, new: deleted.append(old.key) if old is not None and new is None else None)
        api.objects.pop("default/a")  # deleted while the watch is down: no event ever arrives for it
        await api.expire()
        await eventually(lambda: watcher.relists == 2)
        assert [m.key for m in store.all()] == ["default/b"]
        assert deleted == ["default/a"]
        await api.set_status("b", {"phase": "Ready"})
        await eventually(lambda: phase(store, "default/b") == "Ready")


async def test_other_errors_rewatch_from_the_last_resource_version_without_relisting() -> None:
    api = FakeModelApi()
    await api.put(model_body("a"))
    async with watching(api) as (store, watcher):
        await api.set_status("a", {"phase": "Pending"})
        await eventually(lambda: phase(store, "default/a") == "Pending")
        last = watcher.resource_version
        await api.break_watches(KubeApiError("connection reset"))
        await eventually(lambda: len(api.watch_calls) == 2)
        assert api.watch_calls[-1] == last
        assert watcher.relists == 1
        await api.set_status("a", {"phase": "Loading"})
        await eventually(lambda: phase(store, "default/a") == "Loading")
        assert watcher.last_error is not None and "connection reset" in watcher.last_error


async def test_a_failing_list_backs_off_and_retries() -> None:
    api = FakeModelApi()
    await api.put(model_body("a"))
    real_list = api.list_models
    failures = [KubeApiError("apiserver down"), KubeApiError("apiserver down")]

    async def flaky(namespace: str | None):  # type: ignore[no-untyped-def]
        if failures:
            raise failures.pop(0)
        return await real_list(namespace)

    api.list_models = flaky  # type: ignore[method-assign]
    async with watching(api) as (store, watcher):
        assert [m.key for m in store.all()] == ["default/a"]
        assert watcher.last_error is None


async def test_invalid_documents_are_skipped_and_an_invalid_update_removes_the_model() -> None:
    api = FakeModelApi()
    await api.put(model_body("good"))
    await api.put(model_body("bad", backend="no-such-backend"))
    async with watching(api) as (store, _):
        assert [m.key for m in store.all()] == ["default/good"]
        await api.put(model_body("good", backend="no-such-backend"))
        await eventually(lambda: store.get("default/good") is None)


async def test_wait_until_is_resolved_by_a_change_and_cleans_up() -> None:
    store = ModelStore()
    store.upsert(Model.model_validate(model_body("a", phase="Loading")))

    def ready(model: Model | None) -> str | None:
        return "yes" if model is not None and model.status.phase == "Ready" else None

    waiter = asyncio.create_task(store.wait_until("default/a", ready))
    await eventually(lambda: "default/a" in store._waiters)
    assert not waiter.done()
    doc = model_body("a", phase="Ready")
    doc["metadata"]["resourceVersion"] = "2"
    store.upsert(Model.model_validate(doc))
    assert await asyncio.wait_for(waiter, 1) == "yes"
    assert store._waiters == {}


async def test_wait_until_raises_what_the_check_raises_and_cancellation_unregisters() -> None:
    store = ModelStore()

    def gone(model: Model | None) -> str | None:
        if model is None:
            raise LookupError("deleted")
        return None

    store.upsert(Model.model_validate(model_body("a")))
    failing = asyncio.create_task(store.wait_until("default/a", gone))
    cancelled = asyncio.create_task(store.wait_until("default/a", lambda m: None))
    await eventually(lambda: len(store._waiters.get("default/a", ())) == 2)
    cancelled.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await cancelled
    store.delete("default/a")
    with pytest.raises(LookupError):
        await asyncio.wait_for(failing, 1)
    assert store._waiters == {}


async def test_same_resource_version_is_not_a_change() -> None:
    store = ModelStore()
    calls: list[object] = []
    store.subscribe(lambda old, new: calls.append(new))
    doc = model_body("a")
    doc["metadata"]["resourceVersion"] = "7"
    store.upsert(Model.model_validate(doc))
    store.upsert(Model.model_validate(doc))
    assert len(calls) == 1 and store.version == 1
