"""Root of FlexInfer's error hierarchy and the resource-validation errors.

The root lives in the innermost layer so every layer can raise and catch it; the full tree is drawn in
``flexinfer.core.errors``. Used by the api loaders and, through ``core.errors``, everywhere else.
"""

from __future__ import annotations

from dataclasses import dataclass


class FlexInferError(Exception):
    """Base class of every error FlexInfer raises on purpose (never a bare traceback to a user)."""


@dataclass(frozen=True)
class FieldProblem:
    """One validation problem: where (file, document index or 1-based line and column, field path) and what.

    Printed ``file:line:column: path: message`` when the position is known (the form editors and CI problem
    matchers jump to), ``file:line: path: message`` with a line only, else ``file[doc i]: path: message``."""

    path: str
    message: str
    source: str = ""
    document: int | None = None
    line: int | None = None
    column: int | None = None

    def __str__(self) -> str:
        where = self.source
        if self.line is not None:
            at = f"{self.line}:{self.column}" if self.column is not None else str(self.line)
            where = f"{where}:{at}" if where else f"line {at}"
        elif self.document is not None:
            where = f"{where}[doc {self.document}]" if where else f"doc {self.document}"
        prefix = f"{where}: " if where else ""
        return f"{prefix}{self.path}: {self.message}" if self.path else f"{prefix}{self.message}"


class InvalidResourceError(FlexInferError):
    """A manifest or resource failed validation; carries one ``FieldProblem`` per problem."""

    def __init__(self, problems: list[FieldProblem]) -> None:
        self.problems = problems
        super().__init__("; ".join(str(p) for p in problems))
