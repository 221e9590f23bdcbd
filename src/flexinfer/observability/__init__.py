"""Metrics (every name defined once, on an injected registry) and opt-in OpenTelemetry tracing."""
