"""``make demo``: a real elastic job exported to OTLP JSON Lines files, then rendered as a report.

1. ``torchelastic-otel run --standalone --nproc-per-node 2 --max-restarts 1 examples/demo_worker.py
   --fail-once-rank 1``: torch's agent and 2 gloo workers on CPU; rank 1 fails in the first attempt, the agent
   restarts the group, the second attempt succeeds. The workers record their own metrics, events and spans.
2. Every process (the agent and each worker of each attempt) exports through the OpenTelemetry exporter package
   ``opentelemetry-exporter-otlp-json-file`` (``OTEL_*_EXPORTER=otlp_json_file``) into its own files under
   ``TORCHELASTIC_OTEL_FILE_DIR`` -- no collector, no backend.
3. ``torchelastic-otel report`` renders those files: in the terminal, and as one self-contained HTML file.

The last line printed is ``report: <path of the HTML file>``. Everything goes to a fresh directory (``--out`` to
choose it). The job is bounded (``--timeout``); if it outlives that it is stopped and the files rendered anyway.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
WORKER = HERE / "demo_worker.py"


def job_command() -> list[str]:
    launcher = Path(sys.executable).with_name("torchelastic-otel")
    prefix = [str(launcher)] if launcher.exists() else [sys.executable, "-m", "torchelastic_otel.run"]
    return [
        *prefix, "run", "--standalone", "--nproc-per-node", "2", "--max-restarts", "1", "--monitor-interval", "0.1",
        str(WORKER), "--fail-once-rank", "1",
    ]  # fmt: skip


def job_env(telemetry: Path) -> dict[str, str]:
    """This environment without OTEL_* settings of its own, exporting every signal to files in ``telemetry``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TORCHELASTIC_", "TRACEPARENT"))}
    env.update(
        OTEL_TRACES_EXPORTER="otlp_json_file",
        OTEL_METRICS_EXPORTER="otlp_json_file",
        OTEL_LOGS_EXPORTER="otlp_json_file",
        TORCHELASTIC_OTEL_FILE_DIR=str(telemetry),
        OTEL_SERVICE_NAME="torchelastic-demo",
        OTEL_METRIC_EXPORT_INTERVAL="250",  # points often enough to chart a few seconds of training
        OTEL_BSP_SCHEDULE_DELAY="200",
        OTEL_BLRP_SCHEDULE_DELAY="200",
        TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1",  # pytorch#135712: stale store keys on restart in torch 2.x
        OMP_NUM_THREADS="1",  # 2 workers on a small machine: no thread oversubscription
        PYTHONUNBUFFERED="1",
    )
    return env


def run_job(out: Path, timeout: float) -> int:
    telemetry, log = out / "telemetry", out / "job.log"
    cmd = job_command()
    print(f"$ OTEL_{{TRACES,METRICS,LOGS}}_EXPORTER=otlp_json_file TORCHELASTIC_OTEL_FILE_DIR={telemetry} \\\n"
          f"    {shlex.join(cmd[cmd.index('run'):])}", flush=True)  # fmt: skip
    started = time.monotonic()
    with open(log, "wb") as fh:
        proc = subprocess.Popen(cmd, env=job_env(telemetry), cwd=HERE.parent, stdout=fh, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)  # fmt: skip
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGTERM)  # the agent stops its workers on SIGTERM
            try:
                code = proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                code = proc.wait()
            print(f"the job outlived {timeout:.0f} s and was stopped", flush=True)
    print(f"job exited with status {code} after {time.monotonic() - started:.1f} s (its output: {log})", flush=True)
    return code


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="directory for the telemetry and the report (default: a new one)")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds the job may run")
    args = parser.parse_args(argv)
    # Absolute: the job runs in the repository's root, so a relative --out would name a directory there.
    out = (args.out or Path(tempfile.mkdtemp(prefix="torchelastic-demo-"))).resolve()
    if (out / "telemetry").exists():
        shutil.rmtree(out / "telemetry")  # the exporter appends: a second run must not mix with the first
    out.mkdir(parents=True, exist_ok=True)
    run_job(out, args.timeout)
    print(flush=True)
    from torchelastic_otel.report import main as report

    return report([str(out / "telemetry"), "--html", str(out / "report.html")])


if __name__ == "__main__":
    sys.exit(main())
