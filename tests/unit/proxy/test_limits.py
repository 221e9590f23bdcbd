"""Token buckets and per-model/global rate limits."""

from __future__ import annotations

import pytest

from flexinfer.proxy.limits import RateLimiter, RateLimitExceededError, TokenBucket


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
