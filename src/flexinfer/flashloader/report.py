"""The result of one staging run: counts, bytes, timing and per-file problems.

Built by ``flexinfer.flashloader.staging``; read by the CLI (``flexinfer flash-load`` prints ``summary()``)
and by the local engine, which calls ``raise_for_failures()`` when it needs all-or-nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

from flexinfer.core.errors import StagingError


@dataclass(frozen=True, slots=True)
class FileIssue:
    """A file (path relative to the source or destination root) and what happened to it."""

    path: str
    reason: str

    def __str__(self) -> str:
        return f"{self.path}: {self.reason}"


@dataclass(frozen=True)
class StageReport:
    """Outcome of ``stage()``. ``failures`` non-empty means the destination is incomplete."""

    files_copied: int = 0
    files_skipped: int = 0
    bytes_copied: int = 0
    bytes_skipped: int = 0
    seconds: float = 0.0
    stale_removed: int = 0
    verified: int = 0
    failures: tuple[FileIssue, ...] = ()
    ignored: tuple[FileIssue, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.failures

    @property
    def gbps(self) -> float:
        """Copy throughput in GB/s (10^9 bytes) over the whole run; 0 when nothing was copied."""
        return self.bytes_copied / self.seconds / 1e9 if self.seconds > 0 else 0.0

    def summary(self) -> str:
        """One line for people and logs."""
        line = (
            f"copied {self.files_copied} files ({self.bytes_copied / 2**20:.1f} MiB), "
            f"skipped {self.files_skipped} unchanged ({self.bytes_skipped / 2**20:.1f} MiB) "
            f"in {self.seconds:.3f} s ({self.gbps:.2f} GB/s)"
        )
        extras = [
            f"{self.verified} verified" if self.verified else "",
            f"{self.stale_removed} stale temp files removed" if self.stale_removed else "",
            f"{len(self.ignored)} ignored" if self.ignored else "",
            f"{len(self.failures)} FAILED" if self.failures else "",
        ]
        extra = ", ".join(part for part in extras if part)
        return f"{line}; {extra}" if extra else line

    def raise_for_failures(self) -> StageReport:
        """Return ``self`` when complete, else raise ``StagingError`` listing the failed files."""
        if self.failures:
            shown = "; ".join(str(issue) for issue in self.failures[:5])
            more = f" (+{len(self.failures) - 5} more)" if len(self.failures) > 5 else ""
            raise StagingError(f"staging failed for {len(self.failures)} file(s): {shown}{more}")
        return self
