"""Where a manifest problem is: a pydantic error's ``loc`` (or a rule's field path) mapped to the YAML node
marks, printed ``file:line:column: field: message`` — nested fields, list items, flow style, and a missing
field at the key of the mapping that lacks it."""

from __future__ import annotations

import pytest
import yaml

from flexinfer.api import InvalidResourceError, parse_documents
from flexinfer.api.errors import FieldProblem
from flexinfer.api.loading import loc_parts, node_positions, position_of

DOC = """\
apiVersion: ai.flexinfer/v1alpha2
kind: Model
metadata:
  name: m
spec:
  backend: vllm
  source: HF://org/m
  gpu:
    shared: g
    priority: 5000
  tolerations:
    - key: a
    -   operator: Sometimes
  litellm: {aliases: [x, {y: 1}]}
"""


def problems(text: str) -> list[str]:
    with pytest.raises(InvalidResourceError) as info:
        parse_documents(text, "m.yaml")
    return [str(p) for p in info.value.problems]


def test_positions_of_keys_items_and_the_document() -> None:
    positions = node_positions(yaml.compose(DOC))
    assert positions[()] == (1, 1)
    assert positions[("spec",)] == (5, 1)
    assert positions[("spec", "gpu", "priority")] == (10, 5)
    assert positions[("spec", "tolerations", "0")] == (12, 7), "a list item: its first character after '- '"
    assert positions[("spec", "tolerations", "1", "operator")] == (13, 9)
    assert positions[("spec", "litellm", "aliases", "1")] == (14, 26), "flow style has columns too"


def test_a_missing_field_is_placed_at_its_nearest_written_parent() -> None:
    positions = node_positions(yaml.compose(DOC))
    assert position_of(positions, "spec.gpu.count") == (8, 3), "the key of the mapping that lacks it"
    assert position_of(positions, ("spec", "tolerations", "0", "effect")) == (12, 7), "the list item"
    assert position_of(positions, "status") == (1, 1), "the document"
    assert position_of({}, "spec") is None
    assert loc_parts(("spec", "tolerations", 1, "operator")) == ("spec", "tolerations", "1", "operator")


def test_validation_errors_name_file_line_column_and_field() -> None:
    assert problems(DOC) == [
        "m.yaml:10:5: spec.gpu.priority: must be ≤ 1000, got 5000",
        "m.yaml:13:9: spec.tolerations[1].operator: must be one of 'Exists' or 'Equal', got 'Sometimes'",
        "m.yaml:14:26: spec.litellm.aliases[1]: Input should be a valid string",
    ]


def test_missing_required_fields_point_at_the_mapping_that_lacks_them() -> None:
    text = ("apiVersion: ai.flexinfer/v1alpha1\nkind: ModelCache\nmetadata: {name: c}\n"
            "spec:\n  source: HF://org/m\n  secretRef:\n    key: TOKEN\n")
    assert problems(text) == ["m.yaml:6:3: spec.secretRef.name: required field is missing"]
    assert problems("apiVersion: ai.flexinfer/v1alpha2\nkind: Model\nspec: {backend: vllm, source: HF://a/b}\n") \
        == ["m.yaml:1:1: metadata: required field is missing"]


def test_cross_field_rules_and_yaml_errors_carry_a_column() -> None:
    text = "apiVersion: ai.flexinfer/v1alpha2\nkind: Model\nmetadata: {name: m}\nspec:\n" \
           "  backend: vllm\n  source: HF://a/b\n  gpu: {vendor: cpu, count: 1}\n"
    assert problems(text) == ["m.yaml:7:22: spec.gpu.count: must not be set when spec.gpu.vendor is cpu"]
    assert problems("kind: Model\nspec: {a: [1}\n") == ["m.yaml:2:13: invalid YAML: expected ',' or ']', but got '}'"]


def test_a_problem_without_a_column_prints_as_before() -> None:
    assert str(FieldProblem("spec", "bad", "m.yaml", line=3)) == "m.yaml:3: spec: bad"
    assert str(FieldProblem("spec", "bad", "m.yaml", line=3, column=7)) == "m.yaml:3:7: spec: bad"
    assert str(FieldProblem("spec", "bad", "m.yaml", document=2)) == "m.yaml[doc 2]: spec: bad"
