"""``torchelastic-otel report PATH...``: a job's telemetry from OTLP JSON Lines files, without a backend.

Post-mortem: a job exports to files (``OTEL_*_EXPORTER=otlp_json_file`` with ``TORCHELASTIC_OTEL_FILE_DIR``, or a
Collector's ``file`` exporter), and this renders them later, anywhere: in the terminal and as one self-contained
HTML file (a zoomable timeline of agents, attempts, rendezvous and workers per rank; the root cause of each failed
attempt with its traceback; restarts; per-rank metric charts and a metric table; the trace tree).

- ``otlpjson``: reads the files in one streaming pass (with the OpenTelemetry OTLP JSON library's checks),
  counting what it must skip (its value rules: ``otlpvalues``; its fast path: ``typedlines``; where both put the
  records: ``sink``);
- ``model``: the job: agents, attempts, workers, failures, root causes, restarts;
- ``timeline``, ``metrics``, ``tree``: what both renderers show; ``terminal`` and ``html`` render it;
- ``cli``: the command; ``follow``: its live view of a running job (``--follow``), the files read as they grow.
"""

from torchelastic_otel.report.cli import main
from torchelastic_otel.report.model import build
from torchelastic_otel.report.otlpjson import ReportError, read

__all__ = ["main", "read", "build", "ReportError"]
