"""Where a symlink found in the source may lead and still be staged: the rule ``walk`` applies to each link.

Called by ``flexinfer.flashloader.walk``. A link is followed only when its fully resolved target lies inside
its scope:

- the source root, always;
- and, when the source root is (or lies inside) a Hugging Face hub repository folder (``models--org--name/``,
  also ``datasets--``/``spaces--``), that whole repository folder. The directory a model server is pointed at
  is a snapshot, ``models--org--name/snapshots/<revision>/``, whose entries are links to
  ``../../blobs/<hash>``: with the snapshot as the source they are staged as their blobs' contents under the
  snapshot's names. A link that leaves the repository folder (another repository's blobs, ``/etc``) is still
  refused, and the refusal names the folder it had to stay in.

Targets are compared as real paths (every link on the way resolved), so ``..`` tricks and links to links
cannot widen the scope.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from flexinfer.flashloader.plan import HF_REPO_PREFIXES


@dataclass(frozen=True, slots=True)
class LinkScope:
    """The real source root and, when it is inside one, the real Hugging Face repository folder around it."""

    root: str
    repo: str | None = None

    @classmethod
    def of(cls, root: str) -> LinkScope:
        """The scope of links under ``root`` (a real path, as ``staging.prepare_roots`` returns it)."""
        return cls(root, hf_repo_folder(root))

    def allows(self, target: str) -> bool:
        """True when ``target`` (a real path) is inside the root or the repository folder."""
        return inside(target, self.root) or (self.repo is not None and inside(target, self.repo))

    def refusal(self, shown: str) -> str:
        """The reason listed for a link to ``shown`` (its text as written) that leaves the scope."""
        if self.repo is None:
            return f"symlink to {shown} outside the source root (not followed)"
        return (f"symlink to {shown} outside the source root and its Hugging Face repository folder "
                f"{self.repo} (not followed)")


def hf_repo_folder(root: str) -> str | None:
    """The nearest directory named ``models--…`` (``datasets--…``, ``spaces--…``) among ``root`` and its
    parents, or None: ``/hub/models--org--m/snapshots/abc`` → ``/hub/models--org--m``."""
    path = root.rstrip("/") or "/"
    while path != "/":
        if os.path.basename(path).startswith(HF_REPO_PREFIXES):
            return path
        path = os.path.dirname(path)
    return None


def inside(path: str, root: str) -> bool:
    """True for ``root`` itself and everything below it (plain path prefix on ``/`` boundaries)."""
    return path == root or path.startswith(root.rstrip("/") + "/")
