"""Prompt caches that survive a stop: a ``llama-server``'s slots saved before it stops, restored when it starts.

When the local engine stops a llama.cpp model (a swap, the idle timeout, ``flexinfer unload``, a reload that
changed it, a graceful shutdown of ``serve``), it first asks the server to save every idle slot
(``POST /slots/{id}?action=save``, ``flexinfer.local.slot_api``) into the model's cache directory, given to
the server as ``--slot-save-path``: beside the staged weights when the flash-loader staged them
(``<shm root>/<namespace>/<model>.prompt-cache``, the same tmpfs), else under the state directory
(``<state dir>/prompt-cache/<namespace>/<model>``). A manifest (``flexinfer-prompt-cache.json``) records the
identity of the model file (the ``spec.source`` path, its size and modification time) and of the server
binary, and each slot file's tokens and bytes. Saves stop adding files at the model's size cap.

When the model starts again, after its health check passes and before it takes a request (the ``restore``
loading stage), the engine restores each slot the manifest lists. A cache that is missing is nothing to do; one
whose manifest is unreadable, whose model file or server changed, or whose slot file is gone, truncated or
refused by the server is skipped with a log line (the slot is erased, never half-restored): never an error to
a client. A cache is consumed by its restore (the files are removed; the next stop saves again), and
``prune`` removes the caches of models that are no longer declared, as their staged data goes with them.

``spec.config.promptCache`` (default true) turns it off per model, ``spec.config.promptCacheMaxSize``
(default ``2Gi``) caps it; both are parsed here (``ConfigError`` naming the field). Used by
``flexinfer.local.engine``; assembly calls ``prune`` with the declared models.
"""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
import time
from collections.abc import Collection
from dataclasses import asdict, dataclass
from pathlib import Path

import aiohttp

from flexinfer.api.model import Model
from flexinfer.api.units import quantity_bytes
from flexinfer.core.errors import ConfigError
from flexinfer.local.slot_api import SlotApi, SlotError

log = logging.getLogger(__name__)
ENABLED_KEY, SIZE_KEY = "promptCache", "promptCacheMaxSize"
DEFAULT_MAX_SIZE = "2Gi"
MANIFEST = "flexinfer-prompt-cache.json"
SUFFIX = ".prompt-cache"
TIMEOUT = 60.0
"""Seconds a save or a restore may take in all (slow disks, huge KV caches); past it the rest is skipped."""
MIB = 1024 * 1024


@dataclass(frozen=True)
class CacheSettings:
    """A model's prompt-cache switch and size cap."""

    enabled: bool
    max_bytes: int


def cache_settings(model: Model) -> CacheSettings:
    """``spec.config.promptCache`` and ``spec.config.promptCacheMaxSize``; ``ConfigError`` naming the field."""
    return CacheSettings(cache_enabled(model), cache_max_bytes(model))


def cache_enabled(model: Model) -> bool:
    """``spec.config.promptCache`` (a boolean, default true)."""
    enabled = model.spec.config.get(ENABLED_KEY, True)
    if not isinstance(enabled, bool):
        raise ConfigError(f"{model.key}: spec.config.{ENABLED_KEY} must be true or false, got {enabled!r}")
    return enabled


def cache_max_bytes(model: Model) -> int:
    """``spec.config.promptCacheMaxSize`` (a positive quantity, default ``2Gi``) in bytes."""
    raw = model.spec.config.get(SIZE_KEY, DEFAULT_MAX_SIZE)
    try:
        size = quantity_bytes(raw) if isinstance(raw, str | int) and not isinstance(raw, bool) else 0
    except ValueError:
        size = 0
    if size <= 0:
        raise ConfigError(f"{model.key}: spec.config.{SIZE_KEY} must be a positive quantity such as 512Mi, "
                          f"got {raw!r}")
    return size


def cache_dir(model: Model, staged: Path | None, root: Path | None) -> Path | None:
    """Where ``model`` keeps its prompt cache: beside its staged copy ``staged`` (the staging directory), else
    under ``root``; ``None`` when neither is given."""
    if staged is not None:
        return staged.with_name(staged.name + SUFFIX)
    return root / model.namespace / model.name if root is not None else None


def prepare_dir(model: Model, staged: Path | None, root: Path | None) -> Path | None:
    """The model's cache directory, created, when it keeps a cache (``cache_dir``); ``None`` when it keeps none
    or the directory cannot be made (logged). ``ConfigError`` for bad settings."""
    directory = cache_dir(model, staged, root)
    if not cache_enabled(model) or directory is None:
        return None
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        log.warning("model %s: no prompt cache: cannot create %s: %s", model.key, directory, exc.strerror)
        return None
    return directory


@dataclass(frozen=True)
class FileIdentity:
    """A file as a cache was made for it: resolved path, size, modification time (ns)."""

    path: str
    size: int
    mtime_ns: int

    @classmethod
    def of(cls, path: Path) -> FileIdentity:
        info = path.stat()
        return cls(str(path.resolve()), info.st_size, info.st_mtime_ns)


@dataclass(frozen=True)
class Identity:
    """What a saved cache is valid for: this model file, loaded by this server binary."""

    model: FileIdentity
    server: FileIdentity


@dataclass(frozen=True)
class SavedSlot:
    id: int
    file: str
    tokens: int
    size: int


@dataclass(frozen=True)
class ServerCache:
    """Where and for what one server's prompt cache is kept, and its size cap."""

    directory: Path
    identity: Identity
    max_bytes: int


def server_cache(model: Model, slot_dir: str | None, source: Path, binary: Path) -> ServerCache | None:
    """The prompt cache of a server started with ``slot_dir`` (``None``: it keeps none), valid for the model
    file ``source`` loaded by ``binary``; ``None`` (logged) when either cannot be read."""
    if slot_dir is None:
        return None
    try:
        identity = Identity(FileIdentity.of(source), FileIdentity.of(binary))
    except OSError as exc:
        log.warning("model %s: no prompt cache: %s", model.key, exc)
        return None
    return ServerCache(Path(slot_dir), identity, cache_max_bytes(model))


def write_manifest(directory: Path, identity: Identity, saved: list[SavedSlot]) -> None:
    """Record in ``directory`` what its saved slots are valid for (compact JSON: the encoder behind ``indent``
    leaves reference cycles, one set per save, for the cyclic collector that ``serve`` runs rarely)."""
    (directory / MANIFEST).write_text(json.dumps({**asdict(identity), "slots": [asdict(s) for s in saved]}))


def read_manifest(directory: Path) -> dict[str, object] | None:
    """The manifest in ``directory``; ``None`` when there is none; ``ValueError`` when it is unreadable."""
    path = directory / MANIFEST
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ValueError(f"cannot read {path}: {exc.strerror}") from None
    body = json.loads(text)
    if not isinstance(body, dict) or not isinstance(body.get("slots"), list):
        raise ValueError(f"{path} is not a prompt-cache manifest")
    return body


def mismatch(manifest: dict[str, object], identity: Identity) -> str | None:
    """Why a cache made as ``manifest`` says is not valid for ``identity`` (``None``: it is)."""
    if manifest.get("model") != asdict(identity.model):
        return f"it was saved for another model file ({_describe(manifest.get('model'))})"
    if manifest.get("server") != asdict(identity.server):
        return f"it was saved by another server binary ({_describe(manifest.get('server'))})"
    return None


def has_saved(directory: Path) -> bool:
    """Whether ``directory`` holds a saved cache (its manifest) to restore."""
    return (directory / MANIFEST).exists()


def clear(directory: Path) -> None:
    """Remove the slot files and the manifest in ``directory`` (the directory stays: the server writes there)."""
    for path in [*directory.glob("slot-*.bin"), directory / MANIFEST]:
        path.unlink(missing_ok=True)


class PromptCaches:
    """Saves and restores the prompt caches of the engine's ``llama-server`` processes (module docstring)."""

    def __init__(self, root: Path | None = None, staged_root: Path | None = None) -> None:
        self._roots = tuple((path, suffix) for path, suffix in ((root, ""), (staged_root, SUFFIX)) if path)
        """Where caches live: ``<root>/<namespace>/<model>``, ``<staged root>/<namespace>/<model>.prompt-cache``."""

    async def save(self, key: str, base_url: str, directory: Path, identity: Identity, max_bytes: int) -> None:
        """Save the server's idle slots into ``directory`` (at most ``max_bytes``); failures are logged."""
        started = time.monotonic()
        try:
            async with aiohttp.ClientSession() as session, asyncio.timeout(TIMEOUT):
                saved = await self._save(SlotApi(session, base_url), key, directory, max_bytes)
        except (SlotError, OSError, TimeoutError) as exc:
            log.warning("model %s: prompt cache not saved: %s", key, exc or f"not done within {TIMEOUT:g}s")
            clear(directory)
            return
        if saved:
            write_manifest(directory, identity, saved)
            log.info("model %s: saved the prompt cache of %d slot(s), %d tokens, %.1f MiB, in %.3fs", key,
                     len(saved), sum(s.tokens for s in saved), sum(s.size for s in saved) / MIB,
                     time.monotonic() - started, extra={"event": "prompt_cache_saved", "model": key})

    async def _save(self, api: SlotApi, key: str, directory: Path, max_bytes: int) -> list[SavedSlot]:
        clear(directory)
        saved: list[SavedSlot] = []
        for slot in await api.slots():
            if slot.busy:
                log.info("model %s: slot %d is busy, its prompt cache is not saved", key, slot.id)
                continue
            name = f"slot-{slot.id}.bin"
            result = await api.save(slot.id, name)
            if result.tokens and sum(s.size for s in saved) + result.size <= max_bytes:
                saved.append(SavedSlot(slot.id, name, result.tokens, result.size))
                continue
            (directory / name).unlink(missing_ok=True)
            if result.tokens:
                log.info("model %s: slot %d's prompt cache (%.1f MiB) is over the size cap (%.1f MiB), not kept",
                         key, slot.id, result.size / MIB, max_bytes / MIB)
        return saved

    async def restore(self, key: str, base_url: str, directory: Path, identity: Identity) -> None:
        """Restore the slots saved in ``directory`` (skipping what is not valid, module docstring), then remove
        the cache; failures are logged."""
        try:
            manifest = read_manifest(directory)
        except ValueError as exc:
            log.warning("model %s: prompt cache skipped: %s", key, exc)
            clear(directory)
            return
        if manifest is None:
            return
        reason = mismatch(manifest, identity)
        if reason is not None:
            log.warning("model %s: prompt cache skipped: %s", key, reason)
        else:
            await self._restore_all(key, base_url, directory, manifest)
        clear(directory)

    async def _restore_all(self, key: str, base_url: str, directory: Path, manifest: dict[str, object]) -> None:
        started, restored, tokens = time.monotonic(), 0, 0
        try:
            async with aiohttp.ClientSession() as session, asyncio.timeout(TIMEOUT):
                api = SlotApi(session, base_url)
                for entry in manifest["slots"]:  # type: ignore[attr-defined]
                    count = await self._restore_one(api, key, directory, entry)
                    restored, tokens = restored + (count > 0), tokens + count
        except TimeoutError:
            log.warning("model %s: prompt cache restore stopped after %g s", key, TIMEOUT)
        log.info("model %s: restored the prompt cache of %d slot(s), %d tokens, in %.3fs", key, restored, tokens,
                 time.monotonic() - started, extra={"event": "prompt_cache_restored", "model": key})

    async def _restore_one(self, api: SlotApi, key: str, directory: Path, entry: object) -> int:
        """Tokens restored from one manifest entry; 0 (logged, the slot erased) when it cannot be."""
        try:
            slot = SavedSlot(**entry) if isinstance(entry, dict) else None
        except TypeError:
            slot = None
        if slot is None or "/" in slot.file:
            log.warning("model %s: prompt cache entry skipped: %s is not a slot entry", key, str(entry)[:100])
            return 0
        path = directory / slot.file
        if not path.is_file() or path.stat().st_size != slot.size:
            log.warning("model %s: slot %d's prompt cache skipped: %s is missing or not %d bytes", key, slot.id,
                        path, slot.size)
            return 0
        try:
            return await api.restore(slot.id, slot.file)
        except SlotError as exc:
            log.warning("model %s: slot %d's prompt cache skipped: %s", key, slot.id, exc)
            try:
                await api.erase(slot.id)
            except SlotError as erase_failed:
                log.warning("model %s: slot %d could not be erased: %s", key, slot.id, erase_failed)
            return 0

    def prune(self, declared: Collection[str]) -> list[Path]:
        """Remove the cache directories of models not in ``declared`` (keys ``namespace/name``); returns them.
        Only directories holding nothing but cache files are removed."""
        removed = []
        for root, suffix in self._roots:
            for directory in root.glob(f"*/*{suffix}"):
                key = f"{directory.parent.name}/{directory.name.removesuffix(suffix)}"
                if not directory.is_dir() or key in declared:
                    continue
                if all(p.name == MANIFEST or p.name.startswith("slot-") for p in directory.iterdir()):
                    shutil.rmtree(directory, ignore_errors=True)
                    removed.append(directory)
        return removed


def _describe(identity: object) -> str:
    if isinstance(identity, dict):
        return f"{identity.get('path')}, {identity.get('size')} bytes"
    return "unknown"
