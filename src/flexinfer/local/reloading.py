"""Reloading the manifests of a running ``flexinfer serve`` (on a file change, on SIGHUP, or pushed to it).

``ManifestReloader.reload`` reads the manifest paths again, ``ManifestReloader.push`` takes a text sent to the
admin API (``PUT /admin/manifests``); both go through one path, the checks ``flexinfer validate`` runs
(``flexinfer.api.loading.load_manifest_texts``, then ``flexinfer.local.validation``): a schema or cross-field error, a
duplicate, or a problem of the manifests themselves (``manifest_problems``) rejects the whole edit and the
previous configuration stays in force (each problem logged at ERROR, the result kept in ``status`` for the
admin API); a problem of this machine (missing weights, backend not installed) is logged as a warning, as at
start, and only that model fails when activated. An accepted set — the Models and the ModelCaches (their
flash-loader settings) — goes to ``apply`` (the assembly: the flash-loader settings take the ModelCaches, the
dispatcher declares the models, then the catalog and the metrics follow), which adds, changes and removes
models. The status carries the revision of the bytes in force (``flexinfer.core.manifest_revision``: of the
files concatenated in ``manifest_files`` order, or of the pushed text); bytes identical to those in force are
``unchanged`` without being checked again. A pushed configuration stays in force until the next push or file
reload (which reads the files again).

``watch`` polls the paths every ``interval`` seconds (a signature of every manifest file: path, size,
modification time) and reloads once a change has settled (the same signature on two polls in a row, so a
file caught half-written is not reported). Reloads and pushes never overlap. Built by ``flexinfer.assembly.local``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from flexinfer.api.errors import InvalidResourceError
from flexinfer.api.key import ModelKey
from flexinfer.api.loading import (
    Manifest,
    ManifestText,
    load_manifest_texts,
    manifest_files,
    read_manifest_files,
)
from flexinfer.api.model import Model
from flexinfer.api.modelcache import ModelCache
from flexinfer.core.errors import ConfigError, FlexInferError
from flexinfer.core.manifest_revision import manifest_revision
from flexinfer.local.profiles import Availability
from flexinfer.local.validation import machine_problems, manifest_problems

log = logging.getLogger("flexinfer.reload")
PUSHED = "pushed"
"""The source name of a pushed text: its problems are located ``pushed:line:column``."""
DEFAULT_WATCH_INTERVAL = 1.0
"""Seconds between two polls of the manifest files (``flexinfer serve --watch-interval``)."""

Signature = tuple[tuple[str, int, int], ...]
Apply = Callable[[list[Model], list[ModelCache]], Awaitable[None]]
"""Takes the accepted Models and ModelCaches (manifest order)."""


@dataclass
class ConfigStatus:
    """The last reload, as the admin status's ``config`` section shows it."""

    loaded_at: str
    """When the configuration in force was loaded (UTC, ISO 8601)."""
    models: int
    last_reload: str | None = None
    """When the last reload attempt ended (UTC, ISO 8601); ``None`` before the first."""
    trigger: str | None = None
    """``watch``, ``signal`` or ``push`` (or the caller's word) for the last attempt."""
    result: str | None = None
    """``applied``, ``unchanged`` or ``rejected``."""
    errors: list[str] = field(default_factory=list)
    """Why the last attempt was rejected, one ``file:line:column: field: problem`` per entry (as ``flexinfer
    validate``)."""
    reloads: int = 0
    revision: str | None = None
    """``manifest_revision`` of the manifest bytes in force (``None`` when not known)."""

    def as_json(self) -> dict[str, object]:
        return {"loaded_at": self.loaded_at, "models": self.models, "last_reload": self.last_reload,
                "trigger": self.trigger, "result": self.result,
                "error": "; ".join(self.errors) or None, "errors": list(self.errors), "reloads": self.reloads,
                "revision": self.revision}


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def signature(paths: Sequence[str | Path]) -> Signature:
    """Path, size and modification time of every manifest file under ``paths`` (a missing path counts too)."""
    try:
        files = manifest_files(paths)
    except (InvalidResourceError, OSError):
        return (("", -1, -1),)
    marks = []
    for file in files:
        try:
            st = file.stat()
        except OSError:
            marks.append((str(file), -1, -1))
        else:
            marks.append((str(file), st.st_size, st.st_mtime_ns))
    return tuple(marks)


class ManifestReloader:
    """Reloads ``paths`` on demand (``reload``) or when they change (``watch``); see the module docstring."""

    def __init__(self, paths: Sequence[str | Path], models: Sequence[Model], apply: Apply, *,
                 installed: Availability | None, base_dir: Path, interval: float = DEFAULT_WATCH_INTERVAL,
                 caches: Sequence[ModelCache] = (), revision: str | None = None) -> None:
        """``models``, ``caches``: the configuration in force; ``revision``: the revision of its bytes."""
        self._paths, self._apply, self._installed, self._base_dir = list(paths), apply, installed, base_dir
        self.interval = interval
        self._models, self._caches = list(models), list(caches)
        self._lock = asyncio.Lock()
        self._seen = signature(self._paths)
        self.status = ConfigStatus(loaded_at=_now(), models=len(self._models), revision=revision)

    async def reload(self, trigger: str) -> ConfigStatus:
        """Check the manifest files again and apply them when they pass; returns the updated ``status``."""
        async with self._lock:
            self._seen = signature(self._paths)
            return await self._offer(trigger, lambda: read_manifest_files(self._paths),
                                     ", ".join(str(p) for p in self._paths))

    async def push(self, text: bytes, trigger: str = "push") -> ConfigStatus:
        """Check a pushed manifest text (``pushed:line:column`` in its problems) as the files are checked, and
        apply it when it passes; returns the updated ``status``."""
        async with self._lock:
            return await self._offer(trigger, lambda: [ManifestText(PUSHED, text)], "the pushed manifests")

    async def _offer(self, trigger: str, read: Callable[[], list[ManifestText]], where: str) -> ConfigStatus:
        """The one path of a reload and a push (under the lock): read, check, apply, record."""
        started = time.monotonic()
        try:
            texts = read()
            revision = manifest_revision(b"".join(t.data for t in texts))
            if revision == self.status.revision and all(t.unreadable is None for t in texts):
                self._finish(trigger, "unchanged")
                log.info("reload (%s): manifests unchanged (revision %s)", trigger, revision)
                return self.status
            models, caches = self._load(texts, where)
        except FlexInferError as exc:
            self._rejected(trigger, _problems(exc))
            return self.status
        if models == self._models and caches == self._caches:
            self.status.revision = revision
            self._finish(trigger, "unchanged")
            log.info("reload (%s): manifests unchanged (revision %s)", trigger, revision)
            return self.status
        before = {m.key: m for m in self._models}
        caches_changed = caches != self._caches
        await self._apply(models, caches)
        self._models, self._caches = models, caches
        self.status.loaded_at, self.status.models, self.status.revision = _now(), len(models), revision
        self._finish(trigger, "applied")
        log.info("reload (%s) applied in %.2fs (revision %s): %s%s", trigger, time.monotonic() - started, revision,
                 _changes(before, {m.key: m for m in models}),
                 "; ModelCaches changed (they apply at each matching model's next start)" if caches_changed else "")
        return self.status

    def _load(self, texts: list[ManifestText], where: str) -> tuple[list[Model], list[ModelCache]]:
        loaded = load_manifest_texts(texts)
        manifests = [m for m in loaded if isinstance(m.resource, Model)]
        if not manifests:
            raise ConfigError(f"no Model manifests found in {where}")
        problems = manifest_problems(manifests)
        if problems:
            raise InvalidResourceError(problems)
        self._warn(manifests)
        return ([m.resource for m in manifests if isinstance(m.resource, Model)],
                [m.resource for m in loaded if isinstance(m.resource, ModelCache)])

    def _warn(self, manifests: list[Manifest]) -> None:
        if self._installed is None:
            return
        for problem in machine_problems(manifests, self._installed, self._base_dir, every_source=True):
            log.warning("reload: %s (the model fails when activated)", problem)

    def _rejected(self, trigger: str, errors: list[str]) -> None:
        self._finish(trigger, "rejected", errors)
        log.error("reload (%s) rejected, the previous configuration stays in force (%d problem(s)):", trigger,
                  len(errors))
        for error in errors:
            log.error("%s", error)

    def _finish(self, trigger: str, result: str, errors: list[str] | None = None) -> None:
        status = self.status
        status.last_reload, status.trigger, status.result = _now(), trigger, result
        status.errors, status.reloads = errors or [], status.reloads + 1

    async def watch(self) -> None:
        """Poll the paths forever; reload once a change has settled (cancel the task to stop)."""
        previous = self._seen
        while True:
            await asyncio.sleep(self.interval)
            current = signature(self._paths)
            if current != self._seen and current == previous:
                try:
                    await self.reload("watch")
                except Exception:
                    log.exception("reload failed")
            previous = current


def _problems(exc: FlexInferError) -> list[str]:
    if isinstance(exc, InvalidResourceError):
        return [str(p) for p in exc.problems]
    return [str(exc)]


def _changes(before: dict[ModelKey, Model], after: dict[ModelKey, Model]) -> str:
    added = sorted(after.keys() - before.keys())
    removed = sorted(before.keys() - after.keys())
    changed = sorted(k for k in after.keys() & before.keys() if after[k] != before[k])
    parts = [f"{word} {', '.join(keys)}" for word, keys in
             (("added", added), ("changed", changed), ("removed", removed)) if keys]
    return "; ".join(parts) or "no model changed"
