"""Request limits at the proxy edge: token-bucket rate limits and a per-model concurrency cap.

``RateLimiter.check(model)`` takes one token from the model's bucket and the global bucket or raises
``RateLimitedError`` with a ``Retry-After`` equal to the time until a token is back. ``ConcurrencyLimiter``
bounds the requests forwarded to one model at once — to what its server runs in parallel (the catalog's
``ModelView.parallel``: 1 for llama.cpp unless ``spec.config.parallel`` says more), and to
``PROXY_MAX_CONCURRENCY_PER_MODEL`` when that is set — and queues the rest (bounded) for a slot, so no
request reaches a server that would interrupt or truncate another one.
Called by ``handler.py``; the clock is injectable for tests.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager

from flexinfer.core.errors import ColdStartTimeoutError, RateLimitedError

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


def effective_limit(proxy_limit: int, parallel: int | None) -> int:
    """The smaller of the proxy-wide cap and the model's parallel capacity, ignoring unset ones (0 or
    ``None``); 0 = unlimited."""
    if not parallel or parallel <= 0:
        return max(proxy_limit, 0)
    return min(proxy_limit, parallel) if proxy_limit > 0 else parallel


class ConcurrencyLimiter:
    """At most ``limit`` requests per model at once (0 = unlimited), and at most the model's own
    ``parallel`` capacity."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._slots: dict[str, tuple[int, asyncio.Semaphore]] = {}

    def slot(self, model: str, timeout: float, parallel: int | None = None,
             on_wait: Callable[[], None] | None = None) -> AbstractAsyncContextManager[None]:
        """Hold one of the model's slots (its own parallel capacity or the configured cap, see
        ``effective_limit``); ``on_wait()`` when none is free at once (the request queues); waiting longer than
        ``timeout`` → 504 timeout. Without a limit: a shared no-op (nothing allocated per request)."""
        limit = effective_limit(self._limit, parallel)
        if limit <= 0:
            return _UNLIMITED
        held = self._slots.get(model)
        if held is None or held[0] != limit:  # first use, or the model's capacity changed
            held = self._slots[model] = (limit, asyncio.Semaphore(limit))
        return _Held(model, limit, held[1], timeout, on_wait)


class _Held:
    """One slot of a model's semaphore for an ``async with`` block. A free slot is taken at once (no timer);
    only a request that has to queue waits under the timeout."""

    __slots__ = ("_limit", "_model", "_on_wait", "_semaphore", "_timeout")

    def __init__(self, model: str, limit: int, semaphore: asyncio.Semaphore, timeout: float,
                 on_wait: Callable[[], None] | None) -> None:
        self._model, self._limit, self._semaphore, self._timeout = model, limit, semaphore, timeout
        self._on_wait = on_wait

    async def __aenter__(self) -> None:
        semaphore = self._semaphore
        if not semaphore.locked():
            await semaphore.acquire()  # a slot is free: taken without suspending
            return
        if self._on_wait is not None:
            self._on_wait()
        try:
            async with asyncio.timeout(self._timeout):
                await semaphore.acquire()
        except TimeoutError:
            raise ColdStartTimeoutError(
                f"Timeout waiting for a free slot on model '{self._model}' (limit {self._limit} concurrent requests)"
            ) from None

    async def __aexit__(self, *exc: object) -> None:
        self._semaphore.release()


class _Unlimited:
    """The slot of a model without a concurrency limit: enters and exits at once."""

    async def __aenter__(self) -> None:
        return None

    async def __aexit__(self, *exc: object) -> None:
        return None


_UNLIMITED = _Unlimited()
