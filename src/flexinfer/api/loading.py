"""Turning YAML/JSON documents into typed resources, with every problem named by file, line, column and field.

``parse_resource`` is the single entry point for a dict (the operator uses it for watched objects);
``load_manifests`` reads files and directories of multi-document YAML into ``Manifest`` records that remember where
each field was written (``node_positions``: the YAML composer's node marks, as 1-based line and column), so every
problem — a pydantic error's ``loc``, a cross-field rule, a later check (``flexinfer.local.validation``) — is
printed ``file:line:column: field: message`` (``position_of``: the field's key, a list item's first character, or
for a missing field the key of the mapping that lacks it; a document's schema problems in file order). ``flexinfer
validate``, ``render`` and ``serve`` all load through here. ``load_paths`` is the same without the records.
``read_manifest_files`` and ``load_manifest_texts`` split ``load_manifests`` into reading the bytes and checking
them (``serve`` keeps the revision of the bytes it loaded); ``load_manifest_text`` checks a text that is not a
file (a pushed one) the same way.
``parse_stored`` is for objects the API server already holds (the manager's and the proxy's watches): a quantity or
duration FlexInfer cannot parse — written before the CRD carried its ``pattern`` — is dropped, so the next layer or
the default applies, and returned as a problem to report; every other problem still raises.

A path ``-`` reads standard input. A ``kind: List`` document (``kubectl get -o yaml``) contributes its
``items``. An object of a kind outside ``ai.flexinfer`` (a ConfigMap kept beside the manifests) is an error
naming its file, line and kind, unless the caller passes a ``skipped`` list: then it is recorded there and
left out. Unknown kinds inside ``ai.flexinfer`` are always errors (a typo must not be skipped silently).
"""

from __future__ import annotations

import copy
import dataclasses
import re
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from flexinfer.api.base import FORMAT_ERRORS
from flexinfer.api.error_wording import error_message, field_path
from flexinfer.api.errors import FieldProblem, InvalidResourceError
from flexinfer.api.gpulease import GPULease
from flexinfer.api.model import Model
from flexinfer.api.modelcache import ModelCache
from flexinfer.api.modeldemand import ModelDemand
from flexinfer.api.rules import model_problems

Resource = Model | ModelCache | GPULease | ModelDemand
T = TypeVar("T", bound=BaseModel)
KINDS: dict[tuple[str, str], type[Resource]] = {
    ("ai.flexinfer/v1alpha2", "Model"): Model,
    ("ai.flexinfer/v1alpha1", "ModelCache"): ModelCache,
    ("ai.flexinfer/v1alpha2", "GPULease"): GPULease,
    ("ai.flexinfer/v1alpha1", "ModelDemand"): ModelDemand,
}
MANIFEST_SUFFIXES = (".yaml", ".yml", ".json")
API_GROUP = "ai.flexinfer"
STDIN = "-"
SKIP_HINT = "--skip-unknown-kinds leaves out objects of other kinds"


Position = tuple[int, int]
"""1-based (line, column) in a manifest file."""
Positions = Mapping[tuple[str, ...], Position]
"""Where each field was written, by path parts (``("spec", "gpu", "priority")``; list items by index)."""


@dataclass(frozen=True)
class Manifest:
    """A loaded resource and where it was written."""

    resource: Resource
    source: str = ""
    document: int | None = None
    positions: Positions = field(default_factory=dict)

    def where(self, path: str = "") -> str:
        """``file:line:column`` (or ``file[doc i]``) of the field at ``path``, for messages naming another
        manifest."""
        return str(self.problem(path, "", shown_path="")).rstrip(": ")

    def problem(self, path: str, message: str, *, shown_path: str | None = None) -> FieldProblem:
        """A problem located at ``path`` (printed with ``shown_path`` instead when given, e.g. ``""``)."""
        return located(FieldProblem(path if shown_path is None else shown_path, message, self.source, self.document),
                       self.positions, path)


def path_parts(path: str) -> tuple[str, ...]:
    """``spec.resources.limits[example.com/x]`` → ``("spec", "resources", "limits", "example.com/x")``."""
    return tuple(bracketed or plain for bracketed, plain in re.findall(r"\[([^\]]*)\]|([^.\[\]]+)", path))


def loc_parts(loc: tuple[int | str, ...]) -> tuple[str, ...]:
    """A pydantic error location as path parts (``("spec", "tolerations", 0)`` → ``("spec", "tolerations", "0")``)."""
    return tuple(str(part) for part in loc)


def position_of(positions: Positions, path: str | tuple[str, ...]) -> Position | None:
    """Where the field at ``path`` (a printed path, or path parts) was written or, for a missing field, where
    the nearest written parent was: the key of the mapping that lacks it, or the list item."""
    parts = path_parts(path) if isinstance(path, str) else path
    while parts not in positions:
        if not parts:
            return None
        parts = parts[:-1]
    return positions[parts]


def located(problem: FieldProblem, positions: Positions | None,
            path: str | tuple[str, ...] | None = None) -> FieldProblem:
    """``problem`` with the line and column of ``path`` (default: the problem's own path), when known."""
    position = position_of(positions, problem.path if path is None else path) if positions else None
    if position is None:
        return problem
    return dataclasses.replace(problem, line=position[0], column=position[1])


def _position(mark: yaml.Mark) -> Position:
    return mark.line + 1, mark.column + 1


def node_positions(node: yaml.Node) -> dict[tuple[str, ...], Position]:
    """Where every mapping key and sequence item under ``node`` starts (``()``: the node itself)."""
    positions: dict[tuple[str, ...], Position] = {(): _position(node.start_mark)}
    stack: list[tuple[tuple[str, ...], yaml.Node]] = [((), node)]
    while stack:
        prefix, current = stack.pop()
        if isinstance(current, yaml.MappingNode):
            children = [((*prefix, str(k.value)), k, v) for k, v in current.value if isinstance(k, yaml.ScalarNode)]
        elif isinstance(current, yaml.SequenceNode):
            children = [((*prefix, str(i)), item, item) for i, item in enumerate(current.value)]
        else:
            continue
        for path, marked, child in children:
            positions.setdefault(path, _position(marked.start_mark))
            stack.append((path, child))
    return positions


def _located(problems: list[FieldProblem], positions: Positions | None) -> InvalidResourceError:
    return InvalidResourceError([located(p, positions) for p in problems])


def parse_resource(doc: Any, source: str = "", index: int | None = None,
                   positions: Positions | None = None) -> Resource:
    """Validate one document into its resource type; raise ``InvalidResourceError`` naming each field (and its
    line and column, given ``positions``)."""
    if not isinstance(doc, dict):
        raise _located([FieldProblem("", "document is not a mapping", source=source, document=index)], positions)
    key = (str(doc.get("apiVersion", "")), str(doc.get("kind", "")))
    cls = KINDS.get(key)
    if cls is None:
        known = ", ".join(f"{k} {v}" for v, k in KINDS)
        raise _located([FieldProblem(
            "kind", f"unknown kind {key[1]!r} in apiVersion {key[0]!r} (known: {known})", source=source, document=index,
        )], positions)
    try:
        resource = cls.model_validate(doc)
    except ValidationError as exc:
        problems = [located(FieldProblem(field_path(err["loc"]), error_message(err), source=source, document=index),
                            positions, loc_parts(err["loc"])) for err in exc.errors()]
        raise InvalidResourceError(sorted(problems, key=lambda p: (p.line or 0, p.column or 0))) from None
    if isinstance(resource, Model):
        problems = model_problems(resource)
        if problems:
            raise _located([FieldProblem(p.path, p.message, source, index) for p in problems], positions)
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
    ignored = tuple(FieldProblem(field_path(err["loc"]), error_message(err)) for err in errors)
    return cls.model_validate(pruned), pruned, ignored


def _drop(doc: dict[str, Any], loc: tuple[int | str, ...]) -> None:
    """Remove the value at ``loc`` (a pydantic error location) from ``doc``."""
    node: Any = doc
    for part in loc[:-1]:
        node = node[part]
    del node[loc[-1]]


def parse_manifests(text: str, source: str = "", skipped: list[FieldProblem] | None = None) -> list[Manifest]:
    """Parse a multi-document YAML text; collect the problems of every document before raising. Objects of
    other API groups are recorded in ``skipped`` and left out when it is given (errors otherwise)."""
    docs: list[tuple[Any, yaml.Node]] = []
    loader = yaml.SafeLoader(text)
    try:
        while loader.check_node():
            node = loader.get_node()
            if node is not None:
                docs.append((loader.construct_document(node), node))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line, column = _position(mark) if mark is not None else (None, None)
        raise InvalidResourceError([FieldProblem(
            "", _yaml_message(exc), source=source, document=len(docs), line=line, column=column,
        )]) from None
    finally:
        loader.dispose()
    manifests: list[Manifest] = []
    problems: list[FieldProblem] = []
    for index, doc, node in _objects(docs):
        if doc is None:
            continue
        positions = node_positions(node)
        foreign = _foreign_kind(doc)
        if foreign is not None:
            found = located(FieldProblem("kind", f"{foreign} is not a FlexInfer kind", source, index), positions)
            if skipped is not None:
                skipped.append(found)
            else:
                problems.append(dataclasses.replace(found, message=f"{found.message} ({SKIP_HINT})"))
            continue
        try:
            manifests.append(Manifest(parse_resource(doc, source, index, positions), source, index, positions))
        except InvalidResourceError as exc:
            problems.extend(exc.problems)
    if problems:
        raise InvalidResourceError(problems)
    return manifests


def _objects(docs: list[tuple[Any, yaml.Node]]) -> Iterable[tuple[int, Any, yaml.Node]]:
    """(document index, object, node) of every object; a ``kind: List`` yields its items."""
    for index, (doc, node) in enumerate(docs):
        items = doc.get("items") if isinstance(doc, dict) and doc.get("kind") == "List" else None
        if not isinstance(items, list) or not isinstance(node, yaml.MappingNode):
            yield index, doc, node
            continue
        items_node = next((v for k, v in node.value if isinstance(k, yaml.ScalarNode) and k.value == "items"), None)
        nodes = items_node.value if isinstance(items_node, yaml.SequenceNode) else []
        for item, item_node in zip(items, nodes, strict=False):
            yield index, item, item_node


def _foreign_kind(doc: Any) -> str | None:
    """``"ConfigMap (v1)"`` for an object outside the ``ai.flexinfer`` API group, else ``None``."""
    if not isinstance(doc, dict) or not doc.get("kind"):
        return None
    api_version = str(doc.get("apiVersion", ""))
    if api_version.split("/", maxsplit=1)[0] == API_GROUP:
        return None
    return f"{doc['kind']} ({api_version or 'no apiVersion'})"


def parse_documents(text: str, source: str = "") -> list[Resource]:
    """``parse_manifests`` without the records: the resources only."""
    return [manifest.resource for manifest in parse_manifests(text, source)]


def manifest_files(paths: Iterable[str | Path]) -> list[Path]:
    """Expand files and directories (recursively, sorted) into manifest files."""
    files: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if str(raw) == STDIN:
            files.append(path)
        elif path.is_dir():
            files.extend(sorted(p for p in path.rglob("*") if p.suffix in MANIFEST_SUFFIXES and p.is_file()))
        elif path.exists():
            files.append(path)
        else:
            raise InvalidResourceError([FieldProblem("", "no such file or directory", source=str(path))])
    return files


@dataclass(frozen=True)
class ManifestText:
    """One manifest text as read: the name problems print (a file's path, ``<stdin>``, ``pushed``), its bytes, and
    why it could not be read (then ``data`` is empty)."""

    source: str
    data: bytes = b""
    unreadable: str | None = None


def read_manifest_files(paths: Sequence[str | Path]) -> list[ManifestText]:
    """The bytes of every manifest file under ``paths``, in ``manifest_files`` order (``-``: standard input); a file
    that cannot be read carries why. A missing path raises ``InvalidResourceError``."""
    texts: list[ManifestText] = []
    for file in manifest_files(paths):
        source = "<stdin>" if str(file) == STDIN else str(file)
        try:
            data = sys.stdin.read().encode("utf-8") if str(file) == STDIN else file.read_bytes()
        except (OSError, UnicodeError) as exc:
            texts.append(ManifestText(source, unreadable=f"cannot read: {exc}"))
        else:
            texts.append(ManifestText(source, data))
    return texts


def load_manifest_texts(texts: Sequence[ManifestText], skipped: list[FieldProblem] | None = None) -> list[Manifest]:
    """Parse every text (UTF-8) into its resources with where each was written; raise one error listing every
    problem of every text (a resource defined twice names both places). ``skipped``: see the module docstring."""
    manifests: list[Manifest] = []
    problems: list[FieldProblem] = []
    for text in texts:
        try:
            if text.unreadable is not None:
                raise InvalidResourceError([FieldProblem("", text.unreadable, source=text.source)])
            try:
                decoded = text.data.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise InvalidResourceError([FieldProblem("", f"cannot read: {exc}", source=text.source)]) from None
            manifests.extend(parse_manifests(decoded, text.source, skipped))
        except InvalidResourceError as exc:
            problems.extend(exc.problems)
    problems.extend(_duplicate_problems(manifests))
    if problems:
        raise InvalidResourceError(problems)
    return manifests


def load_manifest_text(text: bytes, source_name: str, skipped: list[FieldProblem] | None = None) -> list[Manifest]:
    """One manifest text that is not a file (a YAML stream or JSON pushed to ``serve``) through the same checks as
    the files: problems are located ``source_name:line:column``."""
    return load_manifest_texts([ManifestText(source_name, text)], skipped)


def load_manifests(paths: Sequence[str | Path], skipped: list[FieldProblem] | None = None) -> list[Manifest]:
    """Load every resource under ``paths`` (``-``: standard input) with where it was written; raise one error
    listing every problem in every file (a resource defined twice names both places). ``skipped``: see the
    module docstring."""
    return load_manifest_texts(read_manifest_files(paths), skipped)


def load_paths(paths: Sequence[str | Path]) -> list[Resource]:
    """``load_manifests`` without the records: the resources only."""
    return [manifest.resource for manifest in load_manifests(paths)]


def _duplicate_problems(manifests: list[Manifest]) -> list[FieldProblem]:
    first: dict[tuple[str, str, str], Manifest] = {}
    problems = []
    for manifest in manifests:
        res = manifest.resource
        ident = (res.kind, res.metadata.namespace, res.metadata.name)
        if ident in first:
            problems.append(manifest.problem("metadata.name", f"duplicate {res.kind} {ident[1]}/{ident[2]} "
                                             f"(first defined at {first[ident].where('metadata.name')})"))
        first.setdefault(ident, manifest)
    return problems


def _yaml_message(exc: yaml.YAMLError) -> str:
    """One line: what the YAML parser objected to (where is the problem's line and column)."""
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    return f"invalid YAML: {problem}"
