"""What the instrumentor instruments (read by ``opentelemetry-instrument`` / ``BaseInstrumentor``).

The same range as the ``torch`` extra in pyproject.toml: the releases ``make test-compat`` runs real torchrun jobs
with, at each end. ``opentelemetry-instrument`` skips the bridge (logged) for a torch outside it. Not before 2.8:
there the ``ProcessGroup`` destructor holds the GIL while it joins gloo's threads (pytorch#154976), and a bridged
worker deadlocked in ``destroy_process_group`` in every failure-and-restart job tried with torch 2.4.1.
"""

_instruments = ("torch >= 2.8, < 2.16",)
_supports_metrics = True
