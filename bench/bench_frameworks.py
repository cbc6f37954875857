"""What the Hugging Face ``Trainer`` / Lightning integrations (``frameworks``) cost, as a share of wall time.

``.venv/bin/python bench/bench_frameworks.py [--runs 3] [--steps 60]``. A report, not a test: it exits 0 and prints
PASS/FAIL per target (<= 1 % of the job's wall time).

1. Jobs. The tiny 2-rank jobs of the tests (``tests/support/workers/hf_trainer_worker.py``, ``lightning_worker.py``:
   CPU, gloo; ``--steps`` optimizer steps, a log every 5 steps, a save every 20, an evaluation every 20), bridged
   (``torchelastic_otel.run``, OTLP JSON Lines files in a temporary directory), with ``TORCHELASTIC_OTEL_FRAMEWORKS=1``
   and ``=0`` in alternating runs (so that load from other processes hits both alike); the median wall time of each
   and their ratio. On a shared 2-core machine two identical runs differ by a few per cent, more than the target:
   the ratio is printed, and the verdict is taken from 2.
2. The training thread's part, in this process: one ``Trainer.log``'s callback (``on_log``, a dict of 5 values) and
   one Lightning ``log_metrics``, then the drainer's work for them (gauges set in the SDK), ns per call; that cost
   times the job's log calls, over the job's median wall time (1.), is the share the target applies to. The
   phase spans (train / evaluate / save: a few per job) are timed the same way.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

WORKERS = REPO / "tests" / "support" / "workers"
TARGET = 0.01
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "HF_HUB_DISABLE_TELEMETRY": "1", "TOKENIZERS_PARALLELISM": "false"}  # fmt: skip


def _env(out: Path, steps: int, frameworks: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TORCHELASTIC_", "TRACEPARENT"))}
    env.update(OFFLINE, OMP_NUM_THREADS="1", FRAMEWORK_OUT=str(out / "out"), FRAMEWORK_STEPS=str(steps),
               FRAMEWORK_SAVE_EVERY="20", FRAMEWORK_EVAL="1", HF_HOME=str(out / "hf-home"),
               OTEL_TRACES_EXPORTER="otlp_json_file", OTEL_METRICS_EXPORTER="otlp_json_file",
               OTEL_LOGS_EXPORTER="otlp_json_file", TORCHELASTIC_OTEL_FILE_DIR=str(out / "files"),
               OTEL_METRIC_EXPORT_INTERVAL="1000", TORCHELASTIC_OTEL_FRAMEWORKS=frameworks)  # fmt: skip
    return env


def _job(worker: str, steps: int, frameworks: str) -> float:
    with tempfile.TemporaryDirectory(prefix="bench-frameworks-") as tmp:
        base = Path(tmp)
        (base / "out").mkdir()
        cmd = [sys.executable, "-m", "torchelastic_otel.run", "--standalone", "--nproc-per-node", "2",
               "--max-restarts", "0", "--monitor-interval", "0.1", str(WORKERS / f"{worker}.py")]  # fmt: skip
        start = time.perf_counter()
        done = subprocess.run(cmd, env=_env(base, steps, frameworks), cwd=base, capture_output=True, timeout=600,
                              stdin=subprocess.DEVNULL)  # fmt: skip
        wall = time.perf_counter() - start
        if done.returncode != 0:
            raise SystemExit(f"{worker} failed ({done.returncode}):\n{done.stdout.decode()[-3000:]}")
        return wall


def _ns_per_call(call: Any, n: int, between: Any = None) -> float:
    """Median ns per call over 5 rounds of ``n`` calls; ``between()`` after each round, untimed (a drain: the
    buffer holds 4,096 items, beyond which a call only counts an overflow)."""
    best = []
    for _ in range(5):
        start = time.perf_counter_ns()
        for _ in range(n):
            call()
        best.append((time.perf_counter_ns() - start) / n)
        if between is not None:
            between()
    return statistics.median(best)


def _in_process() -> dict[str, float]:
    """ns per HF log call, per Lightning log call and per phase span: the training thread's part and the drain."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider

    import torchelastic_otel
    from torchelastic_otel._export import drainer
    from torchelastic_otel._torch.worker.frameworks import instruments

    torchelastic_otel.setup(tracer_provider=TracerProvider(), meter_provider=MeterProvider([InMemoryMetricReader()]))
    logs = {"loss": 0.5, "grad_norm": 1.2, "learning_rate": 1e-3, "epoch": 0.25, "eval_loss": 0.7}
    with drainer.paused():
        n = 2000
        instruments.record("hf", logs, 5)
        instruments.drain()  # the gauges made once
        hf = _ns_per_call(lambda: instruments.record("hf", logs, 5), n, instruments.drain)
        lightning = _ns_per_call(
            lambda: instruments.record("lightning", {"train_loss": 0.5}, 5, "train"), n, instruments.drain
        )

        def log_and_drain() -> None:
            instruments.record("hf", logs, 5)
            instruments.drain()

        hf_drained = _ns_per_call(log_and_drain, n)

        def phase() -> None:
            instruments.end(instruments.begin("torchelastic.framework.save", {"framework": "hf"}))
            instruments.drain()

        span = _ns_per_call(phase, 500)
    return {"hf_log": hf, "lightning_log": lightning, "hf_log_drained": hf_drained, "span_drained": span}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=60)
    args = parser.parse_args()
    costs = _in_process()
    print("in process (ns per call; 'drained' includes the drainer's work in the SDK):")
    for name, ns in costs.items():
        print(f"  {name:18s} {ns:10.0f} ns")
    # per job: a log every 5 steps (+ an evaluation log and a summary), a few phases
    logs_per_job = args.steps // 5 + args.steps // 20 + 1
    spans_per_job = 1 + 2 * (args.steps // 20)
    for worker in ("hf_trainer_worker", "lightning_worker"):
        walls: dict[str, list[float]] = {"1": [], "0": []}
        for _ in range(args.runs):
            for frameworks in ("0", "1"):
                walls[frameworks].append(_job(worker, args.steps, frameworks))
        on, off = statistics.median(walls["1"]), statistics.median(walls["0"])
        log_ns = (
            costs["hf_log_drained"] if worker.startswith("hf") else costs["lightning_log"] + costs["hf_log_drained"]
        )
        thread_s = (logs_per_job * log_ns + spans_per_job * costs["span_drained"]) / 1e9
        share = thread_s / off
        print(f"{worker}: wall median FRAMEWORKS=1 {on:.2f} s, =0 {off:.2f} s, ratio {on / off:.3f} "
              f"(runs: {[round(w, 2) for w in walls['1']]} vs {[round(w, 2) for w in walls['0']]})")  # fmt: skip
        print(f"  integration's work per rank: {logs_per_job} log calls + {spans_per_job} spans = "
              f"{thread_s * 1e6:.0f} us = {share * 100:.4f} % of the wall time -> "
              f"{'PASS' if share <= TARGET else 'FAIL'} (target <= {TARGET * 100:.0f} %)")  # fmt: skip


if __name__ == "__main__":
    main()
