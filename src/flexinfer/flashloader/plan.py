"""Pure staging decisions over listings: exclusion, the fp16 variant, incremental skips, space, ranges.

Called by ``flexinfer.flashloader.staging`` with the results of ``flexinfer.flashloader.walk`` (stat values,
no I/O here), so every rule is testable with plain values.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from flexinfer.flashloader.report import FileIssue

MIB = 1024 * 1024
HEADROOM_MIN = 10 * MIB
HEADROOM_FRACTION = 0.05
SAFETENSORS = ".safetensors"
FP16_SAFETENSORS = ".fp16.safetensors"
HF_HUB_PATH = ("huggingface", "hub")
"""Below a ``.cache`` directory, the Hugging Face hub cache (``HF_HOME=…/.cache/huggingface``) is staged."""
HF_REPO_PREFIXES = ("models--", "datasets--", "spaces--")


@dataclass(frozen=True, slots=True)
class SourceFile:
    """A regular file found in the source tree (``rel`` uses ``/``; stat values from the walk).

    ``origin``: for a symlink the walk follows (a Hugging Face snapshot entry pointing into ``blobs/``), the
    real file's path relative to the root, whose content is staged under ``rel``; it climbs out of the root
    (``../../blobs/<hash>``) only when the root is a snapshot inside that repository folder
    (``flexinfer.flashloader.link_scope``). The stat values are the real file's. Empty for a plain file.
    """

    rel: str
    size: int
    mtime_ns: int = 0
    dev: int = 0
    ino: int = 0
    mode: int = 0o644
    origin: str = ""

    @property
    def src_rel(self) -> str:
        """Where the content is read from, relative to the source root."""
        return self.origin or self.rel


@dataclass
class DestListing:
    """What the destination already holds: regular-file sizes and directories (relative), stale temps."""

    sizes: dict[str, int] = field(default_factory=dict)
    dirs: set[str] = field(default_factory=set)
    stale: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class CopyPlan:
    """``copies`` must be written; ``unchanged`` match by size (and, after a checksum pass, content)."""

    copies: tuple[SourceFile, ...]
    unchanged: tuple[SourceFile, ...]
    new_dirs: tuple[str, ...]
    rejected: tuple[FileIssue, ...] = ()

    @property
    def bytes_to_copy(self) -> int:
        return sum(item.size for item in self.copies)


def is_excluded(rel: str, name: str, is_dir: bool, patterns: Iterable[str]) -> bool:
    """Prefix match of each pattern on the relative path or on the entry name (directories end in ``/``).

    So ``.cache/`` prunes a ``.cache`` directory at any depth, ``foo`` drops ``foo.bin`` and ``foo/…``,
    and ``.git/`` does not touch ``.gitattributes``.
    """
    rel_key = rel + "/" if is_dir else rel
    name_key = name + "/" if is_dir else name
    return any(rel_key.startswith(pattern) or name_key.startswith(pattern) for pattern in patterns)


def in_hf_hub_cache(rel: str, is_dir: bool) -> bool:
    """True for ``…/.cache``, ``…/.cache/huggingface``, ``…/.cache/huggingface/hub`` (directories on the way)
    and everything below the hub directory: the part of a ``.cache/`` tree the model server reads."""
    parts = rel.split("/")
    for index, part in enumerate(parts):
        if part != ".cache":
            continue
        tail = tuple(parts[index + 1:])
        if len(tail) > len(HF_HUB_PATH) and tail[: len(HF_HUB_PATH)] == HF_HUB_PATH:
            return True
        if is_dir and tail == HF_HUB_PATH[: len(tail)]:
            return True
    return False


def is_hf_blob_store(rel: str, is_dir: bool) -> bool:
    """``models--org--name/blobs`` (also ``datasets--``/``spaces--``): content-addressed files that the
    repository's ``snapshots/<revision>/`` symlinks point to. Staged through those links, under the names the
    server opens, so the store itself (every revision ever downloaded) is not copied."""
    parts = rel.split("/")
    return is_dir and len(parts) >= 2 and parts[-1] == "blobs" and parts[-2].startswith(HF_REPO_PREFIXES)


def apply_variant(files: Sequence[SourceFile], variant: str | None) -> list[SourceFile]:
    """With ``fp16``, drop ``X.safetensors`` whenever ``X.fp16.safetensors`` is also present."""
    if variant != "fp16":
        return list(files)
    present = {item.rel for item in files}

    def shadowed(rel: str) -> bool:
        if not rel.endswith(SAFETENSORS) or rel.endswith(FP16_SAFETENSORS):
            return False
        return rel[: -len(SAFETENSORS)] + FP16_SAFETENSORS in present

    return [item for item in files if not shadowed(item.rel)]


def is_safe_relative(rel: str) -> bool:
    """True for a relative path that stays inside its root (no absolute, empty, ``.``/``..`` parts, NUL)."""
    if not rel or rel.startswith("/") or "\0" in rel or "\\" in rel:
        return False
    return all(part not in ("", ".", "..") for part in rel.split("/"))


def parent_dirs(rel: str) -> list[str]:
    """``a/b/c.bin`` → ``["a", "a/b"]`` (parents first)."""
    parts = rel.split("/")[:-1]
    return ["/".join(parts[: index + 1]) for index in range(len(parts))]


def build_plan(files: Sequence[SourceFile], dest: DestListing) -> CopyPlan:
    """Split files into copies and size-unchanged skips; list directories the destination lacks."""
    copies: list[SourceFile] = []
    unchanged: list[SourceFile] = []
    rejected: list[FileIssue] = []
    needed: set[str] = set()
    for item in files:
        if not is_safe_relative(item.rel):
            rejected.append(FileIssue(item.rel, "path escapes the source directory; not copied"))
            continue
        if dest.sizes.get(item.rel) == item.size:
            unchanged.append(item)
            continue
        copies.append(item)
        needed.update(parent_dirs(item.rel))
    new_dirs = sorted(needed - dest.dirs, key=lambda rel: (rel.count("/"), rel))
    return CopyPlan(tuple(copies), tuple(unchanged), tuple(new_dirs), tuple(rejected))


def demote(plan: CopyPlan, changed: Iterable[SourceFile]) -> CopyPlan:
    """Move size-matching files whose content differs (checksum pass) from ``unchanged`` to ``copies``."""
    moved = set(changed)
    if not moved:
        return plan
    return CopyPlan(
        copies=plan.copies + tuple(item for item in plan.unchanged if item in moved),
        unchanged=tuple(item for item in plan.unchanged if item not in moved),
        new_dirs=plan.new_dirs,
        rejected=plan.rejected,
    )


def required_space(bytes_to_copy: int) -> int:
    """Bytes the destination must have free: the copy plus max(5 %, 10 MiB) headroom."""
    return bytes_to_copy + max(int(bytes_to_copy * HEADROOM_FRACTION), HEADROOM_MIN)


def split_ranges(size: int, chunk: int) -> list[tuple[int, int]]:
    """``(offset, length)`` ranges covering ``size`` bytes, each at most ``chunk``; one range for small files."""
    if size <= chunk:
        return [(0, size)]
    return [(offset, min(chunk, size - offset)) for offset in range(0, size, chunk)]
