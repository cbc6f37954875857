"""What the tests share (one definition each), and the scripts their jobs run.

- ``env``: the environments of the processes the tests start (clean, exporting over OTLP or to files, Prometheus,
  plain torchrun), and this process exporting as they do (``use_otlp``);
- ``procs``: process trees (``stop_tree``, ``Job``, ``run_job``) and the child scripts run from the repository;
  ``ports``: ``free_port``, ``free_port_block``, ``listening``; ``waiting``: ``wait_for``; ``otel``: in-memory SDK
  pipelines and reading their metrics (the fixtures are in ``tests/conftest.py`` and ``tests/unit/conftest.py``);
  ``installed``: a part of the bridge installed on its own patches; ``logging_capture``: the workers' logging
  capture in this process; ``final_words``: a worker's final words delivered by an agent built here;
  ``tiny_models``: models the in-process framework tests train;
- ``jobs``: launchers, arguments of real torchrun jobs (the demo's too), and reading what they sent and printed;
- ``otlp_receiver`` (a real OTLP receiver, in-process) and ``silent_collector`` (accepts, never answers);
- ``stack`` (Prometheus, promtool, rotel), ``training_jobs``, ``output_jobs``, ``rel_common``: the helpers of the
  stack, training, worker-output and reliability tests; ``report_files`` and ``report_browser``: the report's;
- ``workers/``: the scripts the tests start (torchrun workers, child programs), each run by its path; what they
  share is in ``workers/_shared.py`` and ``workers/_framework.py``.
"""

from __future__ import annotations

from pathlib import Path

#: The repository (the cwd of every job, and what children put on ``PYTHONPATH`` to import ``tests.support``).
ROOT = Path(__file__).resolve().parents[2]
#: The scripts the tests run by path (``python WORKERS / "x.py"``, ``torchrun ... WORKERS / "x.py"``).
WORKERS = Path(__file__).resolve().parent / "workers"
