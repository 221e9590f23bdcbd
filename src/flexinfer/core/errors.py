"""FlexInfer's one error hierarchy. Every error raised on purpose is a ``FlexInferError``::

    FlexInferError                      (flexinfer.api.errors)
    ├── InvalidResourceError            a manifest/resource failed validation (field problems)
    ├── ConfigError                     a setting (env var, flag, Helm value) is invalid
    ├── IllegalTransitionError          a lifecycle phase change that the table forbids
    ├── RequestError                    a request cannot be served; each maps to an OpenAI error
    │   ├── BadRequestError             400 invalid_request_error / missing_required_field
    │   ├── UnauthorizedError           401 invalid_api_key
    │   ├── ModelNotFoundError          404 model_not_found
    │   ├── AmbiguousModelError         409 model_ambiguous (a bare name used in several namespaces)
    │   ├── PayloadTooLargeError        413 request body over the limit
    │   ├── RateLimitedError            429 rate_limit_exceeded (+ Retry-After)
    │   ├── QueueFullError              503 queue_full (+ Retry-After)
    │   ├── ModelFailedError            503 activation_failed (the model cannot start)
    │   ├── ShuttingDownError           503 service_unavailable (draining)
    │   ├── UpstreamError               502 bad_gateway (the model server failed)
    │   └── ColdStartTimeoutError       504 timeout (not Ready within the cold-start budget)
    ├── StagingError                    the flash-loader could not stage weights
    │   └── InsufficientSpaceError      destination tmpfs too small
    └── EngineError                     an engine could not start/stop a model server

Edges map them: the proxy to the OpenAI error envelope (``flexinfer.proxy.errors``); the operator to kopf
errors (``flexinfer.manager.operator.kopf_error``): ``InvalidResourceError``, ``ConfigError`` and
``IllegalTransitionError`` become ``PermanentError`` (not retried), everything else ``TemporaryError``
(retried after a delay, a bounded number of times); the CLI to one line on stderr and exit code 1
(``flexinfer.cli.main``). ``echo_safe`` bounds and
escapes any error text an HTTP edge sends back.
"""

from __future__ import annotations

from flexinfer.api.errors import FieldProblem, FlexInferError, InvalidResourceError

__all__ = [
    "AmbiguousModelError", "BadRequestError", "ColdStartTimeoutError", "ConfigError", "EngineError", "FieldProblem",
    "FlexInferError", "IllegalTransitionError", "InsufficientSpaceError", "InvalidResourceError",
    "ModelFailedError", "ModelNotFoundError", "PayloadTooLargeError", "QueueFullError", "RateLimitedError",
    "RequestError", "ShuttingDownError", "StagingError", "UnauthorizedError", "UpstreamError",
]


MAX_ECHO = 1024
"""Characters of any error text sent back to a client (messages echo client input: model names, paths)."""


def echo_safe(text: str, limit: int = MAX_ECHO) -> str:
    """``text`` bounded to ``limit`` characters and encodable as UTF-8 (lone surrogates, from a JSON
    ``\\ud800`` escape or undecodable header bytes, become backslash-escaped text): safe to send back."""
    if len(text) > limit:
        text = f"{text[:limit]}… ({len(text) - limit} more characters)"
    return text.encode("utf-8", errors="backslashreplace").decode("utf-8")


class ConfigError(FlexInferError):
    """An invalid setting; the message names the variable/flag and the accepted values."""


class IllegalTransitionError(FlexInferError):
    """A phase transition not in the lifecycle table."""


class RequestError(FlexInferError):
    """A request that cannot be served. ``status``/``type``/``code`` follow the OpenAI error envelope."""

    status = 500
    type = "server_error"
    code = "server_error"
    retry_after: float | None = None
    param: str | None = None


class BadRequestError(RequestError):
    status, type, code = 400, "invalid_request_error", "invalid_request_error"

    def __init__(self, message: str, code: str = "invalid_request_error", param: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.param = param


class UnauthorizedError(RequestError):
    status, type, code = 401, "invalid_request_error", "invalid_api_key"


class ModelNotFoundError(RequestError):
    status, type, code, param = 404, "not_found_error", "model_not_found", "model"

    def __init__(self, model: str) -> None:
        super().__init__(f"Model '{model}' not found")
        self.model = model


class AmbiguousModelError(RequestError):
    """A bare model name that several namespaces use: the client must name one as ``namespace/name``."""

    status, type, code, param = 409, "invalid_request_error", "model_ambiguous", "model"

    def __init__(self, model: str, candidates: tuple[str, ...]) -> None:
        listed = ", ".join(f"'{c}'" for c in candidates)
        super().__init__(f"Model '{model}' is ambiguous: it exists in several namespaces ({listed}); "
                         "name one as namespace/name")
        self.model, self.candidates = model, candidates


class PayloadTooLargeError(RequestError):
    status, type, code = 413, "invalid_request_error", "request_too_large"


class RateLimitedError(RequestError):
    status, type, code, retry_after = 429, "rate_limit_error", "rate_limit_exceeded", 1.0


class QueueFullError(RequestError):
    status, type, code, retry_after = 503, "service_unavailable_error", "queue_full", 1.0


class ModelFailedError(RequestError):
    status, type, code, retry_after = 503, "service_unavailable_error", "activation_failed", 30.0


class ShuttingDownError(RequestError):
    status, type, code, retry_after = 503, "service_unavailable_error", "service_unavailable", 5.0


class UpstreamError(RequestError):
    status, type, code = 502, "upstream_error", "bad_gateway"


class ColdStartTimeoutError(RequestError):
    status, type, code = 504, "timeout_error", "timeout"


class StagingError(FlexInferError):
    """The flash-loader failed; the message says which file and why."""


class InsufficientSpaceError(StagingError):
    """The destination has less free space than the weights plus headroom."""

    def __init__(self, needed: int, available: int, path: str) -> None:
        super().__init__(
            f"insufficient tmpfs space at {path}: need {needed} bytes (weights + headroom), "
            f"{available} bytes free"
        )
        self.needed, self.available, self.path = needed, available, path


class EngineError(FlexInferError):
    """An engine failed to start, stop or reach a model server."""
