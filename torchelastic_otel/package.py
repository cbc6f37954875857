"""What the instrumentor instruments (read by ``opentelemetry-instrument`` / ``BaseInstrumentor``)."""

_instruments = ("torch >= 2.4",)
_supports_metrics = True
