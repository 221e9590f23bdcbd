"""Token buckets, per-model/global rate limits and the per-model concurrency cap."""

from __future__ import annotations

import asyncio

import pytest

from flexinfer.core.errors import ColdStartTimeoutError, UnauthorizedError
from flexinfer.proxy.auth import BearerAuth
from flexinfer.proxy.limits import (
    ConcurrencyLimiter,
    RateLimiter,
    RateLimitExceededError,
    TokenBucket,
    effective_limit,
)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_bucket_allows_burst_then_refills():
    clock = Clock()
    bucket = TokenBucket(rate=2.0, burst=2, clock=clock)
    assert bucket.take() == 0 and bucket.take() == 0
    assert bucket.take() == pytest.approx(0.5)
    clock.now = 0.5
    assert bucket.take() == 0


def test_rate_limiter_scopes_and_retry_after():
    clock = Clock()
    limiter = RateLimiter(per_model=1.0, burst=1, global_rate=1.0, global_burst=2, clock=clock)
    limiter.check("a")
    with pytest.raises(RateLimitExceededError) as model_hit:
        limiter.check("a")
    assert model_hit.value.scope == "model" and model_hit.value.retry_after >= 1
    limiter.check("b")
    with pytest.raises(RateLimitExceededError) as global_hit:
        limiter.check("c")
    assert global_hit.value.scope == "global"
    clock.now = 1.0
    limiter.check("c")  # the model bucket of "c" was given its token back


async def test_concurrency_limit_waits_then_times_out():
    limiter = ConcurrencyLimiter(1)
    entered = asyncio.Event()
    leave = asyncio.Event()

    async def holder() -> None:
        async with limiter.slot("m", 1):
            entered.set()
            await leave.wait()

    task = asyncio.ensure_future(holder())
    await entered.wait()
    with pytest.raises(ColdStartTimeoutError):
        async with limiter.slot("m", 0.01):
            pass
    async with limiter.slot("other", 0.01):
        pass
    leave.set()
    await task
    async with limiter.slot("m", 0.01):
        pass


async def test_unlimited_concurrency_never_waits():
    limiter = ConcurrencyLimiter(0)
    entered = 0
    async with limiter.slot("m", 0), limiter.slot("m", 0):
        entered = 2
    assert entered == 2


@pytest.mark.parametrize(("proxy", "parallel", "limit"), [(0, None, 0), (0, 1, 1), (8, None, 8), (8, 2, 2), (1, 4, 1)])
def test_effective_limit_is_the_smaller_set_one(proxy: int, parallel: int | None, limit: int) -> None:
    assert effective_limit(proxy, parallel) == limit


async def test_a_models_parallel_capacity_queues_the_rest_without_a_proxy_cap():
    """PROXY_MAX_CONCURRENCY_PER_MODEL=0 (the default) no longer lets every waiter through at once: a
    one-slot model (llama.cpp) takes one request at a time, the others wait for it."""
    limiter = ConcurrencyLimiter(0)
    running, peak = 0, 0
    release = asyncio.Event()

    async def request() -> None:
        nonlocal running, peak
        async with limiter.slot("m", 5, parallel=1):
            running += 1
            peak = max(peak, running)
            await release.wait()
            running -= 1

    tasks = [asyncio.ensure_future(request()) for _ in range(4)]
    await asyncio.sleep(0)
    assert running == 1
    release.set()
    await asyncio.gather(*tasks)
    assert peak == 1
    async with limiter.slot("m", 0.01, parallel=None), limiter.slot("m", 0.01, parallel=None):
        pass  # a model without a known capacity is not limited


def test_bearer_auth():
    BearerAuth(None).check(None)
    auth = BearerAuth("tok")
    auth.check("Bearer tok")
    auth.check("bearer tok")
    for header in (None, "", "Basic tok", "Bearer", "Bearer tok2"):
        with pytest.raises(UnauthorizedError):
            auth.check(header)
