"""What a failure costs a job with the bridge: the fail-once job of a bridge-unaware script, bridged vs plain.

``.venv/bin/python bench/bench_failures.py [--rounds 5]``. A report, not a test: it exits 0 and prints PASS/MISS
per target.

The job: ``tests/support/workers/_silent_worker.py --mode failonce`` (never imports the bridge, records nothing), 2
workers, ``--standalone --max-restarts 1 --monitor-interval 0.1``. In the first attempt rank 1 exits 1 at its first
line, so the agent SIGTERMs rank 0 while it starts (importing torch, its pipeline being built) or waits in gloo's
``init_process_group`` (native code); the second attempt does one ``all_reduce`` and ends well (exit 0).

Four kinds, alternating in every round (plain, live, down, silent, plain, ...) so that load from other processes hits
them alike: ``plain`` is ``python -m torch.distributed.run``; ``live`` is ``python -m torchelastic_otel.run`` exporting
OTLP/gRPC to an ``OtlpReceiver`` on 127.0.0.1; ``down`` the same towards a 127.0.0.1 port nothing listens on; ``silent``
towards a server that accepts connections and never answers (``tests.support.silent_collector``).

Printed, as medians and as differences to plain (and the differences within each round: median and quartiles):

- the job's wall time (targets: live - plain <= 0.5 s, down - plain <= 0.5 s);
- SIGTERM -> failure report: from torch's agent logging "Sending process ... closing signal SIGTERM" to its next
  line, "failed (exitcode ...)", which it logs once the stopped workers are gone (the time a worker takes to
  die of the SIGTERM, final words included; target: <= 0.3 s with a live collector);
- "forcefully exiting via 9" lines (a worker that outlived torch's 30 s grace): must be 0.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.support.env import otlp_env  # noqa: E402
from tests.support.jobs import FAILURE_REPORTED, SIGTERM_SENT, agent_log_seconds  # noqa: E402
from tests.support.otlp_receiver import OtlpReceiver  # noqa: E402
from tests.support.procs import stop_tree  # noqa: E402
from tests.support.silent_collector import SilentCollector  # noqa: E402

WORKER = REPO / "tests" / "support" / "workers" / "_silent_worker.py"
ARGS = ["--standalone", "--nproc-per-node", "2", "--max-restarts", "1", "--monitor-interval", "0.1",
        str(WORKER), "--mode", "failonce"]  # fmt: skip
KINDS = ("plain", "live", "down", "silent")
JOB_TIMEOUT = 120.0


def sigterm_to_report(output: str) -> float | None:
    """Seconds from the first "closing signal SIGTERM" to the "failed (exitcode" line after it."""
    return agent_log_seconds(output, SIGTERM_SENT, FAILURE_REPORTED)


def paired_differences(kind: list[float], plain: list[float]) -> tuple[float, float, float]:
    """Lower quartile, median and upper quartile of ``kind - plain`` within each round: the jobs of a round run one
    after the other, so a machine that is slower for a while slows them alike; the spread says how far apart runs
    of the same code land (on a 2-core machine, some 0.3 s)."""
    differences = [k - p for k, p in zip(kind, plain, strict=True)]
    if len(differences) < 2:
        return differences[0], differences[0], differences[0]
    low, mid, high = statistics.quantiles(differences, n=4)
    return low, mid, high


def run_job(kind: str, rx: OtlpReceiver, silent: SilentCollector, log: Path) -> tuple[float, int | None, str]:
    env = otlp_env(rx)
    if kind == "plain":
        env = {k: v for k, v in env.items() if not k.startswith("OTEL_")}
    elif kind == "down":
        env["OTEL_EXPORTER_OTLP_ENDPOINT"] = "http://127.0.0.1:1"
    elif kind == "silent":
        env["OTEL_EXPORTER_OTLP_ENDPOINT"] = silent.endpoint
    launcher = "torch.distributed.run" if kind == "plain" else "torchelastic_otel.run"
    with open(log, "wb") as out:
        started = time.monotonic()
        proc = subprocess.Popen([sys.executable, "-m", launcher, *ARGS], env=env, cwd=REPO, stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)  # fmt: skip
        try:
            code: int | None = proc.wait(timeout=JOB_TIMEOUT)
        except subprocess.TimeoutExpired:
            code = None
        finally:
            stop_tree(proc)
        seconds = time.monotonic() - started
    return seconds, code, log.read_text(errors="replace")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    rounds = max(1, parser.parse_args().rounds)
    times: dict[str, list[float]] = {kind: [] for kind in KINDS}
    latency: dict[str, list[float]] = {kind: [] for kind in KINDS}
    killed: dict[str, int] = {kind: 0 for kind in KINDS}
    bad: list[str] = []
    print(f"fail-once job, bridge-unaware script: {' '.join(ARGS)}; {rounds} rounds of {', '.join(KINDS)}")
    with tempfile.TemporaryDirectory() as tmp, OtlpReceiver() as rx, SilentCollector() as silent:
        for round_ in range(rounds):
            for kind in KINDS:
                seconds, code, output = run_job(kind, rx, silent, Path(tmp) / f"{kind}-{round_}.log")
                if code != 0:
                    bad.append(f"{kind} round {round_ + 1}: exit {code}")
                times[kind].append(seconds)
                delay = sigterm_to_report(output)
                if delay is not None:
                    latency[kind].append(delay)
                killed[kind] += output.count("forcefully exiting via 9")
                print(f"  round {round_ + 1}/{rounds} {kind:<7} {seconds:6.2f} s  exit {code}  "
                      f"SIGTERM->report {delay if delay is None else round(delay, 3)} s", flush=True)  # fmt: skip
    med = {kind: statistics.median(values) for kind, values in times.items()}
    lat = {kind: statistics.median(values) if values else float("nan") for kind, values in latency.items()}
    print()
    for kind in KINDS:
        print(
            f"  {kind:<7} job median {med[kind]:6.2f} s ({med[kind] - med['plain']:+.2f} s vs plain)  "
            f"SIGTERM->report median {lat[kind]:.3f} s ({lat[kind] - lat['plain']:+.3f} s)  "
            f"SIGKILLed workers {killed[kind]}"
        )
    print()
    for kind in KINDS[1:]:
        low, mid, high = paired_differences(times[kind], times["plain"])
        print(f"  {kind:<7} - plain, round by round: median {mid:+.2f} s, quartiles {low:+.2f} / {high:+.2f} s")
    checks = [
        ("bridged (live) - plain <= 0.5 s", med["live"] - med["plain"] <= 0.5),
        ("collector down - plain <= 0.5 s", med["down"] - med["plain"] <= 0.5),
        ("SIGTERM -> failure report <= 0.3 s (live)", lat["live"] <= 0.3),
        ("no worker SIGKILLed after the grace", not any(killed.values())),
        ("every job ended well after its restart", not bad),
    ]
    print()
    for name, ok in checks:
        print(f"  {'PASS' if ok else 'MISS'}  {name}")
    for line in bad:
        print(f"  (job) {line}")
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
