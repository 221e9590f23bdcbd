"""Request rate limits at the proxy edge: token buckets per model and for the whole proxy.

``RateLimiter.check(model)`` takes one token from the model's bucket and the global bucket or raises
``RateLimitedError`` with a ``Retry-After`` equal to the time until a token is back. (The per-model
concurrency cap is the arbiter's: a request beyond a model's parallel capacity waits in the model's one queue,
``flexinfer.core.arbiter``.) Called by ``handler.py``; the clock is injectable for tests.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from flexinfer.core.errors import RateLimitedError

Clock = Callable[[], float]


class TokenBucket:
    """``burst`` tokens, refilled at ``rate`` per second."""

    __slots__ = ("_burst", "_clock", "_rate", "_stamp", "_tokens")

    def __init__(self, rate: float, burst: int, clock: Clock) -> None:
        self._rate, self._burst, self._clock = rate, float(burst), clock
        self._tokens, self._stamp = float(burst), clock()

    def take(self) -> float:
        """Take one token; return 0 on success, else the seconds until a token is available."""
        now = self._clock()
        self._tokens = min(self._burst, self._tokens + (now - self._stamp) * self._rate)
        self._stamp = now
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return 0.0
        return (1.0 - self._tokens) / self._rate

    def give_back(self) -> None:
        """Return a token taken for a request that another limit then rejected."""
        self._tokens = min(self._burst, self._tokens + 1.0)


class RateLimiter:
    """Per-model and global token buckets (per-model buckets exist only for catalog names)."""

    def __init__(self, per_model: float, burst: int, global_rate: float, global_burst: int,
                 clock: Clock = time.monotonic) -> None:
        self._per_model, self._burst, self._clock = per_model, burst, clock
        self._global = TokenBucket(global_rate, global_burst, clock)
        self._models: dict[str, TokenBucket] = {}

    def check(self, model: str) -> None:
        """Admit one request for ``model`` or raise ``RateLimitExceededError``."""
        bucket = self._models.get(model)
        if bucket is None:
            bucket = self._models[model] = TokenBucket(self._per_model, self._burst, self._clock)
        wait = bucket.take()
        if wait:
            raise _limited(model, "model", wait)
        wait = self._global.take()
        if wait:
            bucket.give_back()
            raise _limited(model, "global", wait)


class RateLimitExceededError(RateLimitedError):
    """A ``RateLimitedError`` that says which bucket was empty (``scope``: model or global)."""

    def __init__(self, message: str, scope: str, retry_after: float) -> None:
        super().__init__(message)
        self.scope, self.retry_after = scope, retry_after


def _limited(model: str, scope: str, wait: float) -> RateLimitExceededError:
    target = f"model '{model}'" if scope == "model" else "the proxy"
    return RateLimitExceededError(f"Rate limit exceeded for {target}, retry later", scope, max(wait, 1.0))
