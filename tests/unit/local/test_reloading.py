"""``ManifestReloader``: an accepted edit reaches ``apply`` once, an invalid one is rejected whole with the
errors ``flexinfer validate`` prints (and ``apply`` never sees it), an unchanged set is not applied, and the
watcher reloads a change once it has settled. A pushed text goes through the same checks (its problems located
``pushed:line:column``), never at the same time as a file reload; the status carries the revision in force."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import yaml

from flexinfer.api.loading import manifest_files
from flexinfer.api.model import Model
from flexinfer.api.modelcache import ModelCache
from flexinfer.core.manifest_revision import manifest_revision
from flexinfer.local.reloading import ManifestReloader, signature
from support.local_serve import model_manifest, write_manifests
from support.polling import eventually


def reloader(models_dir: Path, applied: list[list[Model]], interval: float = 0.01,
             caches_applied: list[list[ModelCache]] | None = None) -> ManifestReloader:
    async def apply(models: list[Model], caches: list[ModelCache]) -> None:
        applied.append(models)
        if caches_applied is not None:
            caches_applied.append(caches)

    return ManifestReloader([models_dir], [], apply, installed=None, base_dir=models_dir, interval=interval)


def write(models_dir: Path, tmp_path: Path, *names: str, **config: object) -> None:
    documents = [model_manifest(n, tmp_path / "w.bin", config=dict(config) or None) for n in names]
    write_manifests(models_dir / "models.yaml", documents)


async def test_accepted_rejected_and_unchanged_reloads(tmp_path: Path) -> None:
    models_dir, applied = tmp_path / "models", []
    write(models_dir, tmp_path, "a")
    r = reloader(models_dir, applied)
    status = await r.reload("signal")
    assert (status.result, status.trigger, [m.name for m in applied[0]]) == ("applied", "signal", ["a"])

    write(models_dir, tmp_path, "a", "b", startupTimeout="soon")
    status = await r.reload("signal")
    assert status.result == "rejected" and len(applied) == 1
    assert len(status.errors) == 2 and all("spec.config.startupTimeout" in e for e in status.errors)
    assert status.errors[1].startswith(str(models_dir / "models.yaml") + ":19:5: "), "file, line, column as validate"
    assert status.as_json()["error"] == "; ".join(status.errors)

    write(models_dir, tmp_path, "a")
    status = await r.reload("signal")
    assert status.result == "unchanged" and status.errors == [] and len(applied) == 1
    assert status.reloads == 3


async def test_a_model_cache_edit_is_applied_with_the_models(tmp_path: Path) -> None:
    """A ModelCache carries flash-loader settings: editing only it is a change the assembly must get."""
    models_dir, applied, caches = tmp_path / "models", [], []
    write(models_dir, tmp_path, "a")
    r = reloader(models_dir, applied, caches_applied=caches)
    cache = {"apiVersion": "ai.flexinfer/v1alpha1", "kind": "ModelCache", "metadata": {"name": "a-cache"},
             "spec": {"source": "file:///w", "flashLoader": {"enabled": True, "concurrency": 2}}}
    write_manifests(models_dir / "caches.yaml", [cache])
    assert (await r.reload("signal")).result == "applied"
    assert [[(c.name, c.spec.flash_loader.concurrency if c.spec.flash_loader else None) for c in cs]
            for cs in caches] == [[("a-cache", 2)]]
    assert [m.name for m in applied[0]] == ["a"]
    assert (await r.reload("signal")).result == "unchanged"
    (models_dir / "caches.yaml").unlink()
    assert (await r.reload("signal")).result == "applied" and caches[-1] == []


async def test_a_missing_directory_and_an_empty_one_are_rejected(tmp_path: Path) -> None:
    models_dir, applied = tmp_path / "models", []
    write(models_dir, tmp_path, "a")
    r = reloader(models_dir, applied)
    (models_dir / "models.yaml").unlink()
    assert (await r.reload("watch")).errors == [f"no Model manifests found in {models_dir}"]
    models_dir.rmdir()
    assert "no such file or directory" in (await r.reload("watch")).errors[0]
    assert applied == []


async def test_watch_reloads_a_settled_change_once(tmp_path: Path) -> None:
    models_dir, applied = tmp_path / "models", []
    write(models_dir, tmp_path, "a")
    r = reloader(models_dir, applied)
    watcher = asyncio.create_task(r.watch())
    try:
        write(models_dir, tmp_path, "a", "b")
        await eventually(lambda: len(applied) == 1)
        assert [m.name for m in applied[0]] == ["a", "b"]
        assert r.status.trigger == "watch"
        file = models_dir / "models.yaml"
        stat = file.stat()
        os.utime(file, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
        await eventually(lambda: r.status.reloads == 2)
        assert r.status.result == "unchanged" and len(applied) == 1, "a touched file is read again, not applied"
    finally:
        watcher.cancel()


def test_signature_sees_size_and_time_of_every_manifest(tmp_path: Path) -> None:
    write(tmp_path / "m", tmp_path, "a")
    before = signature([tmp_path / "m"])
    (tmp_path / "m" / "notes.txt").write_text("not a manifest")
    assert signature([tmp_path / "m"]) == before
    write(tmp_path / "m" / "sub", tmp_path, "b")
    assert len(signature([tmp_path / "m"])) == 2


def manifest_text(tmp_path: Path, *names: str, **config: object) -> bytes:
    documents = [model_manifest(n, tmp_path / "w.bin", config=dict(config) or None) for n in names]
    return yaml.safe_dump_all(documents, sort_keys=False).encode()


async def test_the_revision_is_that_of_the_files_in_force(tmp_path: Path) -> None:
    """Start-up's revision is kept until a reload applies other bytes; several files count concatenated in the
    order ``manifest_files`` lists them; a rejected edit leaves the revision in force."""
    models_dir, applied = tmp_path / "models", []
    write(models_dir, tmp_path, "a")
    start = manifest_revision((models_dir / "models.yaml").read_bytes())
    r = ManifestReloader([models_dir], [], lambda m, c: _record(applied, m), installed=None, base_dir=models_dir,
                         revision=start)
    assert r.status.as_json()["revision"] == start
    assert (await r.reload("signal")).result == "unchanged" and applied == [], "the same bytes: nothing to check"
    write_manifests(models_dir / "b.yaml", [model_manifest("b", tmp_path / "w.bin")])
    status = await r.reload("signal")
    files = [models_dir / "b.yaml", models_dir / "models.yaml"]
    assert [str(f) for f in manifest_files([models_dir])] == [str(f) for f in files]
    assert status.result == "applied" and status.revision == manifest_revision(b"".join(f.read_bytes() for f in files))
    (models_dir / "b.yaml").write_text("kind: Model\n")
    assert (await r.reload("signal")).result == "rejected" and r.status.revision == status.revision
    write_manifests(models_dir / "b.yaml", [model_manifest("b", tmp_path / "w.bin")])
    assert (await r.reload("signal")).result == "unchanged" and r.status.errors == []


async def _record(applied: list[list[Model]], models: list[Model]) -> None:
    applied.append(models)


async def test_a_push_is_checked_like_the_files_and_applied_or_rejected_whole(tmp_path: Path) -> None:
    models_dir, applied = tmp_path / "models", []
    write(models_dir, tmp_path, "a")
    r = reloader(models_dir, applied)
    pushed = manifest_text(tmp_path, "a", "b")
    status = await r.push(pushed)
    assert (status.result, status.trigger, status.models) == ("applied", "push", 2)
    assert status.revision == manifest_revision(pushed) and [m.name for m in applied[0]] == ["a", "b"]

    bad = manifest_text(tmp_path, "a", "b", "c", startupTimeout="soon")
    status = await r.push(bad)
    assert status.result == "rejected" and len(applied) == 1 and status.revision == manifest_revision(pushed)
    pushed_errors = list(status.errors)
    (models_dir / "models.yaml").write_bytes(bad)
    expected = [e.replace(str(models_dir / "models.yaml"), "pushed") for e in (await r.reload("watch")).errors]
    assert expected and pushed_errors == expected, "the same problems as a file reload, located pushed:line:column"
    assert pushed_errors[0].startswith("pushed:9:5: spec.config.startupTimeout: ")
    assert await r.push(b"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n") is r.status
    assert "ConfigMap (v1) is not a FlexInfer kind" in r.status.errors[0], "the files' rule for other kinds"
    cache = {"apiVersion": "ai.flexinfer/v1alpha1", "kind": "ModelCache", "metadata": {"name": "c"},
             "spec": {"source": "file:///w"}}
    assert (await r.push(yaml.safe_dump(cache).encode())).errors == [
        "no Model manifests found in the pushed manifests"]
    assert (await r.push(b"")).result == "rejected" and len(applied) == 1

    status = await r.push(pushed)
    assert status.result == "unchanged" and status.errors == [] and len(applied) == 1
    commented = pushed + b"# the same models\n"
    status = await r.push(commented)
    assert status.result == "unchanged" and status.revision == manifest_revision(commented), \
        "other bytes, the same models: nothing restarts, the revision follows the bytes"


async def test_pushes_and_file_reloads_never_overlap(tmp_path: Path) -> None:
    models_dir, gate, order = tmp_path / "models", asyncio.Event(), []
    write(models_dir, tmp_path, "a")

    async def apply(models: list[Model], caches: list[ModelCache]) -> None:
        order.append(f"start {len(models)}")
        if len(models) == 1:
            await gate.wait()
        order.append(f"end {len(models)}")

    r = ManifestReloader([models_dir], [], apply, installed=None, base_dir=models_dir)
    reload = asyncio.create_task(r.reload("watch"))
    await eventually(lambda: order == ["start 1"])
    push = asyncio.create_task(r.push(manifest_text(tmp_path, "a", "b")))
    for _ in range(20):  # yield: the push runs up to the lock the reload holds (a yield, not a wait for state)
        await asyncio.sleep(0)
    assert order == ["start 1"] and not push.done()
    gate.set()
    await asyncio.gather(reload, push)
    assert order == ["start 1", "end 1", "start 2", "end 2"]
    assert r.status.trigger == "push" and r.status.reloads == 2
