"""The operator edge of the error hierarchy: which errors kopf must not retry, and the retry delay of the rest."""

from __future__ import annotations

import kopf
import pytest
from lightkube import ApiError
from lightkube.models.meta_v1 import Status

from flexinfer.api.errors import FieldProblem
from flexinfer.core.errors import ConfigError, EngineError, IllegalTransitionError, InvalidResourceError
from flexinfer.manager.operator import RETRY_DELAY, kopf_error


def api_error(code: int) -> ApiError:
    return ApiError(status=Status(code=code, message=f"status {code}"))


@pytest.mark.parametrize("error", [
    InvalidResourceError([FieldProblem("spec.source", "bad scheme")]), ConfigError("X is not a boolean"),
    IllegalTransitionError("Ready → Idle"), api_error(422), api_error(403), api_error(404),
])
def test_errors_no_retry_can_fix_are_permanent(error: Exception) -> None:
    mapped = kopf_error(error)
    assert isinstance(mapped, kopf.PermanentError) and str(mapped) == str(error)


@pytest.mark.parametrize("error", [
    EngineError("server did not start"), OSError("connection reset"), TimeoutError(), RuntimeError("bug"),
    api_error(409), api_error(429), api_error(500), api_error(503),
])
def test_everything_else_is_temporary_with_a_delay(error: Exception) -> None:
    mapped = kopf_error(error)
    assert isinstance(mapped, kopf.TemporaryError) and mapped.delay == RETRY_DELAY
    assert str(mapped)
