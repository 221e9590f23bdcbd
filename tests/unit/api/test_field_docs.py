"""Field descriptions from the docstrings under fields, read when a schema is generated
(``flexinfer.api.field_docs``)."""

from __future__ import annotations

import subprocess
import sys

from pydantic import Field

from flexinfer.api.base import ApiModel
from flexinfer.api.field_docs import attribute_docstrings, field_description


class Inner(ApiModel):
    """A nested type."""

    max_items: int = 3
    """How many at most.

    Indented continuation lines are dedented."""


class Outer(ApiModel):
    """The type under test."""

    inner: Inner | None = None
    """Where the nested settings go."""
    named: str = Field(default="x", description="Given explicitly.")
    """Not used: the explicit description wins."""
    plain: int = 0
    undocumented: bool = False

    class Holder(ApiModel):
        """A class nested in a class body."""

        value: int = 1
        """The held value."""


class Child(Outer):
    """Inherits ``inner`` with its docstring, declares ``plain`` again without one and adds ``extra``."""

    plain: int = 5
    extra: str = ""
    """Only the child has it."""


def test_a_docstring_under_a_field_describes_it_cleaned_as_pydantic_does() -> None:
    assert field_description(Inner, "max_items") == "How many at most.\n\nIndented continuation lines are dedented."
    assert field_description(Outer, "inner") == "Where the nested settings go."
    assert field_description(Outer.Holder, "value") == "The held value."


def test_an_explicit_description_wins_and_a_field_without_a_docstring_has_none() -> None:
    assert field_description(Outer, "named") == "Given explicitly."
    assert field_description(Outer, "plain") is None
    assert field_description(Outer, "undocumented") is None


def test_inherited_fields_keep_the_declaring_class_docstring_and_a_redeclaration_starts_afresh() -> None:
    assert field_description(Child, "inner") == "Where the nested settings go."
    assert field_description(Child, "extra") == "Only the child has it."
    assert field_description(Child, "plain") is None
    assert "inner" not in attribute_docstrings(Child)


def test_the_json_schema_carries_them_under_aliases_and_names_beside_references() -> None:
    by_alias = Outer.model_json_schema(by_alias=True)
    assert by_alias["$defs"]["Inner"]["properties"]["maxItems"]["description"].startswith("How many at most.")
    inner = by_alias["properties"]["inner"]
    assert inner["description"] == "Where the nested settings go." and "anyOf" in inner
    assert by_alias["properties"]["named"]["description"] == "Given explicitly."
    assert "description" not in by_alias["properties"]["undocumented"]
    by_name = Inner.model_json_schema(by_alias=False)
    assert by_name["properties"]["max_items"]["description"].startswith("How many at most.")
    assert Child.model_json_schema()["properties"]["extra"]["description"] == "Only the child has it."


def test_validation_does_not_need_them() -> None:
    assert Outer.model_validate({"inner": {"maxItems": 4}}).inner == Inner(max_items=4)


READS_SOURCE = """
import linecache, sys
read = []
original = linecache.getlines
def getlines(filename, module_globals=None):
    read.append(filename)
    return original(filename, module_globals)
linecache.getlines = getlines
from flexinfer.api.model import Model
from flexinfer.api.modelcache import ModelCache
Model.model_validate({"apiVersion": "ai.flexinfer/v1alpha2", "kind": "Model", "metadata": {"name": "m"},
                      "spec": {"backend": "llamacpp", "source": "file:///m.gguf"}})
print(sorted({name for name in read if "flexinfer" in name}))
"""


def test_creating_and_validating_the_api_types_reads_no_source() -> None:
    out = subprocess.run([sys.executable, "-c", READS_SOURCE], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
