"""The OpenAI-compatible HTTP edge: routing, activation queue, streaming passthrough."""
