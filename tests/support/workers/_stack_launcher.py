"""``torchelastic-otel run ...`` that keeps the agent's process alive after the run, for a Prometheus scrape.

Usage: ``python tests/support/workers/_stack_launcher.py FLAG_DIR WAIT_SECONDS <torchrun arguments>``.

It calls the bridge's launcher (``torchelastic_otel.run.main``: torchrun with the bridge) with the torchrun
arguments. The agent records a run's final metrics (``run_total``, the run outcomes, ``flakiness``) at the very end
of the run and torchrun exits right after: a Prometheus server pulling from the agent never sees them. So, after the
run, this launcher writes ``agent-done`` (with the exit code) in ``FLAG_DIR`` and waits, at most ``WAIT_SECONDS``,
for the file ``agent-exit`` there while the agent's Prometheus endpoint keeps serving. Then it exits with torchrun's
exit code (1 when the worker group failed).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path


def main(argv: list[str]) -> int:
    flag_dir, wait, torchrun_args = Path(argv[0]), float(argv[1]), argv[2:]
    from torchelastic_otel.run import main as run_main

    code = 0
    try:
        run_main(torchrun_args)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except Exception as exc:  # torch's ChildFailedError when the worker group failed
        print(f"stack launcher: run failed: {type(exc).__name__}", flush=True)
        code = 1
    tmp = flag_dir / ".agent-done.tmp"
    tmp.write_text(str(code))
    tmp.replace(flag_dir / "agent-done")
    deadline = time.monotonic() + wait
    exit_flag = flag_dir / "agent-exit"
    while time.monotonic() < deadline and not exit_flag.exists():
        time.sleep(0.05)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
