"""The only place that touches torch's internals. Imported lazily: the APIs work without torch."""
