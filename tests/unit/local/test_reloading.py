"""``ManifestReloader``: an accepted edit reaches ``apply`` once, an invalid one is rejected whole with the
errors ``flexinfer validate`` prints (and ``apply`` never sees it), an unchanged set is not applied, and the
watcher reloads a change once it has settled."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from flexinfer.api.model import Model
from flexinfer.api.modelcache import ModelCache
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
