"""What the tests share (one definition each), and the scripts their jobs run.

- ``procs``: process trees (``stop_tree``, ``Job``); ``ports``: ``free_port``, ``free_port_block``; ``waiting``:
  ``wait_for``; ``otel``: in-memory SDK pipelines and reading their metrics (the fixtures are in ``tests/conftest.py``);
- ``jobs``: environments and arguments of real torchrun jobs, and reading what they sent and printed;
- ``otlp_receiver`` (a real OTLP receiver, in-process) and ``silent_collector`` (accepts, never answers);
- ``stack`` (Prometheus, promtool, rotel), ``training_jobs``, ``output_jobs``, ``rel_common``: the helpers of the
  stack, training, worker-output and reliability tests; ``report_files`` and ``report_browser``: the report's;
- ``workers/``: the scripts the tests start (torchrun workers, child programs), each run by its path.
"""

from __future__ import annotations

from pathlib import Path

#: The repository (the cwd of every job, and what children put on ``PYTHONPATH`` to import ``tests.support``).
ROOT = Path(__file__).resolve().parents[2]
#: The scripts the tests run by path (``python WORKERS / "x.py"``, ``torchrun ... WORKERS / "x.py"``).
WORKERS = Path(__file__).resolve().parent / "workers"
