"""Turning YAML/JSON documents into typed resources, with every problem named by file, document and field.

``parse_resource`` is the single entry point for a dict; ``load_paths`` reads files and directories of
multi-document YAML (the CLI and the local engine use it). ``parse_stored`` is for objects the API server
already holds (the manager's and the proxy's watches): a quantity or duration FlexInfer cannot parse —
written before the CRD carried its ``pattern`` — is dropped, so the next layer or the default applies, and
returned as a problem to report; every other problem still raises.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from flexinfer.api.base import FORMAT_ERRORS
from flexinfer.api.errors import FieldProblem, InvalidResourceError
from flexinfer.api.gpulease import GPULease
from flexinfer.api.model import Model
from flexinfer.api.modelcache import ModelCache
from flexinfer.api.rules import model_problems

Resource = Model | ModelCache | GPULease
T = TypeVar("T", bound=BaseModel)
KINDS: dict[tuple[str, str], type[Resource]] = {
    ("ai.flexinfer/v1alpha2", "Model"): Model,
    ("ai.flexinfer/v1alpha1", "ModelCache"): ModelCache,
    ("ai.flexinfer/v1alpha2", "GPULease"): GPULease,
}
MANIFEST_SUFFIXES = (".yaml", ".yml", ".json")


def parse_resource(doc: Any, source: str = "", index: int | None = None) -> Resource:
    """Validate one document into its resource type; raise ``InvalidResourceError`` naming each field."""
    if not isinstance(doc, dict):
        raise InvalidResourceError([FieldProblem("", "document is not a mapping", source=source, document=index)])
    key = (str(doc.get("apiVersion", "")), str(doc.get("kind", "")))
    cls = KINDS.get(key)
    if cls is None:
        known = ", ".join(f"{k} {v}" for v, k in KINDS)
        raise InvalidResourceError([FieldProblem(
            "kind", f"unknown kind {key[1]!r} in apiVersion {key[0]!r} (known: {known})", source=source, document=index,
        )])
    try:
        resource = cls.model_validate(doc)
    except ValidationError as exc:
        raise InvalidResourceError([
            FieldProblem(_path(err["loc"]), _message(err), source=source, document=index) for err in exc.errors()
        ]) from None
    if isinstance(resource, Model):
        problems = model_problems(resource)
        if problems:
            raise InvalidResourceError([FieldProblem(p.path, p.message, source, index) for p in problems])
    return resource


@dataclass(frozen=True)
class Stored:
    """A stored object as FlexInfer uses it, and the fields it had to ignore (``parse_stored``)."""

    resource: Resource
    ignored: tuple[FieldProblem, ...] = ()


def parse_stored(doc: Any) -> Stored:
    """Like ``parse_resource``, but unparsable quantities and durations are dropped and listed in ``ignored``."""
    try:
        return Stored(parse_resource(doc))
    except InvalidResourceError as error:
        original = error
    cls = KINDS.get((str(doc.get("apiVersion", "")), str(doc.get("kind", "")))) if isinstance(doc, dict) else None
    if cls is None:
        raise original
    try:
        _, pruned, ignored = validate_stored(cls, doc)
    except ValidationError:
        raise original from None
    if not ignored:  # the schema holds; a cross-field rule failed
        raise original
    return Stored(parse_resource(pruned), ignored)


def validate_stored(cls: type[T], doc: dict[str, Any]) -> tuple[T, dict[str, Any], tuple[FieldProblem, ...]]:
    """``cls.model_validate(doc)`` after dropping the quantities and durations that do not parse: (object, the
    pruned document, the ignored fields). Any other problem raises the ``ValidationError``."""
    try:
        return cls.model_validate(doc), doc, ()
    except ValidationError as exc:
        if any(err["type"] not in FORMAT_ERRORS for err in exc.errors()):
            raise
        errors = exc.errors()
    pruned = copy.deepcopy(doc)
    for err in errors:
        _drop(pruned, err["loc"])
    ignored = tuple(FieldProblem(_path(err["loc"]), _message(err)) for err in errors)
    return cls.model_validate(pruned), pruned, ignored


def _drop(doc: dict[str, Any], loc: tuple[int | str, ...]) -> None:
    """Remove the value at ``loc`` (a pydantic error location) from ``doc``."""
    node: Any = doc
    for part in loc[:-1]:
        node = node[part]
    del node[loc[-1]]


def parse_documents(text: str, source: str = "") -> list[Resource]:
    """Parse a multi-document YAML text; collect the problems of every document before raising."""
    docs: list[Any] = []
    try:
        for doc in yaml.safe_load_all(text):
            docs.append(doc)
    except yaml.YAMLError as exc:
        raise InvalidResourceError([
            FieldProblem("", _yaml_message(exc), source=source, document=len(docs)),
        ]) from None
    resources: list[Resource] = []
    problems: list[FieldProblem] = []
    for index, doc in enumerate(docs):
        if doc is None:
            continue
        try:
            resources.append(parse_resource(doc, source, index))
        except InvalidResourceError as exc:
            problems.extend(exc.problems)
    if problems:
        raise InvalidResourceError(problems)
    return resources


def manifest_files(paths: Iterable[str | Path]) -> list[Path]:
    """Expand files and directories (recursively, sorted) into manifest files."""
    files: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            files.extend(sorted(p for p in path.rglob("*") if p.suffix in MANIFEST_SUFFIXES and p.is_file()))
        elif path.exists():
            files.append(path)
        else:
            raise InvalidResourceError([FieldProblem("", "no such file or directory", source=str(path))])
    return files


def load_paths(paths: Sequence[str | Path]) -> list[Resource]:
    """Load every resource under ``paths``; raise one error listing every problem in every file."""
    resources: list[Resource] = []
    problems: list[FieldProblem] = []
    for file in manifest_files(paths):
        try:
            text = file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            problems.append(FieldProblem("", f"cannot read: {exc}", source=str(file)))
            continue
        try:
            resources.extend(parse_documents(text, str(file)))
        except InvalidResourceError as exc:
            problems.extend(exc.problems)
    problems.extend(_duplicate_problems(resources))
    if problems:
        raise InvalidResourceError(problems)
    return resources


def _duplicate_problems(resources: list[Resource]) -> list[FieldProblem]:
    seen: set[tuple[str, str, str]] = set()
    problems = []
    for res in resources:
        ident = (res.kind, res.metadata.namespace, res.metadata.name)
        if ident in seen:
            problems.append(FieldProblem("metadata.name", f"duplicate {res.kind} {ident[1]}/{ident[2]}"))
        seen.add(ident)
    return problems


def _yaml_message(exc: yaml.YAMLError) -> str:
    """One line: what the YAML parser objected to and where (1-based line and column)."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    return f"invalid YAML{where}: {problem}"


def _path(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int) or "." in part or "/" in part:
            out += f"[{part}]"
        else:
            out += f".{part}" if out else part
    return out


_TEMPLATES = {
    "less_than_equal": "must be ≤ {le}, got {input}",
    "greater_than_equal": "must be ≥ {ge}, got {input}",
    "less_than": "must be < {lt}, got {input}",
    "greater_than": "must be > {gt}, got {input}",
    "extra_forbidden": "unknown field",
    "missing": "required field is missing",
    "literal_error": "must be one of {expected}, got {input!r}",
    "string_pattern_mismatch": "must match {pattern}, got {input!r}",
    "too_long": "must have at most {max_length} items",
    "string_too_long": "must be at most {max_length} characters",
    "string_too_short": "must be at least {min_length} characters",
}


def _message(err: Any) -> str:
    template = _TEMPLATES.get(err["type"])
    ctx = dict(err.get("ctx") or {})
    if template:
        try:
            return template.format(input=err.get("input"), **ctx)
        except (KeyError, IndexError):
            pass
    msg = str(err["msg"])
    return msg[len("Value error, "):] if msg.startswith("Value error, ") else msg
