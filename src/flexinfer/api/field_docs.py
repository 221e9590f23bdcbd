"""A field's description: the docstring written under it in the class body, read from the source on demand.

The API types document their fields with a string literal under each annotated field. Those strings are the
descriptions of the CRD schema (``flexinfer.api.crds``) and of ``docs/reference/models.md``
(``flexinfer.assembly.model_reference``), and nothing else reads them. They are therefore not collected when a
class is created: pydantic's ``use_attribute_docstrings`` re-reads and re-parses the source for every class, a
quarter of the time it takes to import the API types, paid by every process that only validates manifests
(``flexinfer serve`` in a group pod starts on every cold start of its group). Here each module's source is parsed
once, when a schema or the reference is generated.

The rules match pydantic's: a string statement right under an annotated name in the class's own body documents
that name (cleaned with ``inspect.cleandoc``); a ``Field(description=...)`` wins; an inherited field keeps the
docstring of the class that declared it, a field declared again keeps the new declaration's (or none).
"""

from __future__ import annotations

import ast
import functools
import inspect
import sys
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel


@functools.cache
def _class_bodies(module_name: str) -> Mapping[str, ast.ClassDef]:
    """Every class statement of a module by qualified name (nested classes as ``Outer.Inner``)."""
    module = sys.modules.get(module_name)
    try:
        tree = ast.parse(inspect.getsource(module)) if module is not None else None
    except (OSError, TypeError, SyntaxError):
        tree = None
    found: dict[str, ast.ClassDef] = {}

    def visit(body: list[ast.stmt], prefix: str) -> None:
        for node in body:
            if isinstance(node, ast.ClassDef):
                found[prefix + node.name] = node
                visit(node.body, f"{prefix}{node.name}.")

    visit(tree.body if tree is not None else [], "")
    return found


@functools.cache
def attribute_docstrings(cls: type) -> Mapping[str, str]:
    """The docstrings under the annotated names of ``cls``'s own body (not its bases')."""
    node = _class_bodies(cls.__module__).get(cls.__qualname__)
    if node is None:
        return {}
    docs: dict[str, str] = {}
    for statement, following in zip(node.body, node.body[1:], strict=False):
        if (isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name)
                and isinstance(following, ast.Expr) and isinstance(following.value, ast.Constant)
                and isinstance(following.value.value, str)):
            docs[statement.target.id] = inspect.cleandoc(following.value.value)
    return docs


def field_description(model: type[BaseModel], name: str) -> str | None:
    """The description of ``model``'s field ``name``: its ``Field(description=...)``, else the docstring under
    its declaration in the nearest class that declares it."""
    explicit = model.model_fields[name].description
    if explicit is not None:
        return explicit
    for cls in model.__mro__:
        if name in inspect.get_annotations(cls):
            return attribute_docstrings(cls).get(name)
    return None


def describe_fields(schema: dict[str, Any], cls: type[BaseModel]) -> None:
    """A ``json_schema_extra`` hook: give each property of ``cls``'s JSON schema (keyed by alias or name) its
    field's description, unless the property has one already."""
    properties = schema.get("properties")
    if not isinstance(properties, dict):
        return
    for name, info in cls.model_fields.items():
        key = info.alias if info.alias in properties else name
        prop = properties.get(key)
        if isinstance(prop, dict) and "description" not in prop:
            text = field_description(cls, name)
            if text:
                prop["description"] = text
