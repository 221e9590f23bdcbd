"""Shared building blocks of the resource types: the camelCase base model, object metadata, conditions.

Used by every resource module in ``flexinfer.api``.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field
from pydantic.alias_generators import to_camel
from pydantic_core import PydanticCustomError

from flexinfer.api.field_docs import describe_fields
from flexinfer.api.key import ModelKey
from flexinfer.api.units import parse_duration, parse_quantity

GROUP = "ai.flexinfer"


FORMAT_ERRORS = frozenset({"invalid_duration", "invalid_quantity"})
"""Error types of a value that has the right JSON type but a text FlexInfer cannot parse. The CRDs reject
these by ``pattern``; an object stored before that pattern existed has only that field ignored
(``flexinfer.api.loading.parse_stored``)."""


def _check_duration(value: str) -> str:
    try:
        parse_duration(value)
    except ValueError as error:
        raise PydanticCustomError("invalid_duration", str(error)) from None
    return value


def _check_quantity(value: str) -> str:
    try:
        parse_quantity(value)
    except ValueError as error:
        raise PydanticCustomError("invalid_quantity", str(error)) from None
    return value


Duration = Annotated[str, AfterValidator(_check_duration), Field(json_schema_extra={"format": "duration"})]
"""A Go/Kubernetes duration string such as ``90s`` or ``5m`` (validated, kept as text)."""

def _number_to_text(value: object) -> object:
    return str(value) if isinstance(value, int | float) and not isinstance(value, bool) else value


Quantity = Annotated[
    str, BeforeValidator(_number_to_text), AfterValidator(_check_quantity),
    Field(json_schema_extra={"format": "quantity"}),
]
"""A Kubernetes quantity string such as ``8Gi`` (validated, kept as text)."""


class ApiModel(BaseModel):
    """Base of every spec type: camelCase keys, unknown keys rejected, names usable in Python. A docstring
    under a field is its description (CRD schema, ``docs/reference/models.md``), read when a schema is generated
    (``flexinfer.api.field_docs``)."""

    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True,
        validate_default=False, json_schema_extra=describe_fields,
    )

    def to_dict(self) -> dict[str, Any]:
        """The resource as Kubernetes JSON: camelCase keys, unset fields left out."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")


class StatusModel(ApiModel):
    """Base of status types: tolerant of fields written by other controllers or versions."""

    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="ignore", frozen=True,
    )


class OwnerReference(ApiModel):
    """``metadata.ownerReferences[]`` entry."""

    api_version: str
    kind: str
    name: str
    uid: str
    controller: bool | None = None
    block_owner_deletion: bool | None = None


class ObjectMeta(ApiModel):
    """The subset of ``metadata`` FlexInfer reads; server-managed fields are accepted and ignored."""

    name: str = Field(min_length=1, max_length=63, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    namespace: str = Field(default="default", pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    uid: str | None = None
    resource_version: str | None = None
    generation: int | None = None
    creation_timestamp: datetime | None = None
    deletion_timestamp: datetime | None = None
    deletion_grace_period_seconds: int | None = None
    finalizers: list[str] = Field(default_factory=list)
    owner_references: list[OwnerReference] = Field(default_factory=list)
    managed_fields: list[dict[str, Any]] | None = None
    self_link: str | None = None
    generate_name: str | None = None


class Condition(StatusModel):
    """A ``metav1.Condition``."""

    type: str
    status: Literal["True", "False", "Unknown"]
    reason: str = ""
    message: str = ""
    last_transition_time: datetime | None = None
    observed_generation: int | None = None


class Toleration(ApiModel):
    """A pod toleration (``core/v1 Toleration``)."""

    key: str | None = None
    operator: Literal["Exists", "Equal"] | None = None
    value: str | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    toleration_seconds: int | None = None


class ResourceRequirements(ApiModel):
    """Container compute resources; GPU keys are rejected by the Model validator (use ``spec.gpu``)."""

    limits: dict[str, Quantity] = Field(default_factory=dict)
    requests: dict[str, Quantity] = Field(default_factory=dict)


class NamedResource:
    """Mixin for resource types: ``name``, ``namespace`` and ``key`` read from ``metadata``."""

    metadata: ObjectMeta

    @property
    def name(self) -> str:
        return self.metadata.name

    @property
    def namespace(self) -> str:
        return self.metadata.namespace

    @property
    def key(self) -> ModelKey:
        """``namespace/name``: the resource's identity across engines."""
        return ModelKey(self.metadata.namespace, self.metadata.name)
