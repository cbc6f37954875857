"""The export pipeline: the state machine that builds it, its providers, bounded buffers and self-telemetry."""
