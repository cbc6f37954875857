"""Several runs from one process: ``torchelastic_otel.run.main`` called once per mode given, one after another, as a
notebook or a test suite calls the launcher (``test_many_runs.py``).

Usage: ``python many_runs_launcher.py RUN_ID_PREFIX MODE...`` with MODE ``ok`` or ``fail`` (rank 1 of that launch
exits with code 3). Launch ``i`` (from 1) is run ``<prefix>-<i>``: 2 workers, a c10d rendezvous on a free
127.0.0.1 port, no restarts. A failing launch raises ``ChildFailedError``, caught here; each launch prints
``launch <i> <outcome>``.
"""

from __future__ import annotations

import socket
import sys
from pathlib import Path

WORKER = Path(__file__).resolve().parent / "many_runs_worker.py"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def main() -> None:
    from torchelastic_otel.run import main as launcher_main

    prefix, modes = sys.argv[1], sys.argv[2:]
    for i, mode in enumerate(modes, start=1):
        args = ["--nnodes=1", "--nproc-per-node=2", f"--rdzv-id={prefix}-{i}", "--rdzv-backend=c10d",
                f"--rdzv-endpoint=127.0.0.1:{free_port()}", "--max-restarts=0", "--monitor-interval=0.05",
                str(WORKER), mode]  # fmt: skip
        try:
            launcher_main(args)
            outcome = "ok"
        except Exception as exc:  # ChildFailedError, as with torch.distributed.run.main
            outcome = type(exc).__name__
        print(f"launch {i} {outcome}", flush=True)


if __name__ == "__main__":
    main()
