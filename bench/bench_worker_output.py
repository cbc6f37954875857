"""Worker output benchmark: what capturing a worker's stdout costs the worker, and what it loses.

``.venv/bin/python bench/bench_worker_output.py [--rounds 3] [--seconds 3] [--flood-lines 200000]``. A report, not
a test: it exits 0 and prints PASS / MISS per target (~2 minutes on a 2-core machine).

The job is ``tests/support/workers/_output_worker.py --mode flood`` (bridge-unaware) with one worker, torchrun's output
to a file as a batch system collects it, run alternately with plain ``torchrun`` and with
``python -m torchelastic_otel.run`` exporting OTLP/gRPC to an ``OtlpReceiver`` on 127.0.0.1 (plain, bridged, plain,
...; medians):

1. A worker printing 10,000 lines a second: each line after 100 us of computation (a training loop that prints),
   for ``--seconds``, with the rate limit raised to 20,000 lines a second so that all of it is below the limit.
   Measured: the worker's wall time, bridged over plain -- target <= 1.05x; the time its ``write`` calls take, in
   microseconds a line (reported: a write to a pipe wakes the pass-through process, a write to a file wakes
   nobody); lines missing from the console -- target 0; lines lost below the limit (printed, neither exported
   nor counted) -- target 0; lines dropped (counted) -- reported. The receiver runs in this process, on the
   same 2 cores: the 10,000 records a second it decodes compete with the bridged worker only.
2. As fast as it can: ``--flood-lines`` lines in one go with the default limits (1,000 lines/s, burst 10,000).
   Measured: the worker's wall time bridged over plain (reported; it prints at memory speed and the pass-through
   process is one more copy); lines missing from the console -- target 0; records + lines counted as dropped =
   lines printed -- target: exactly.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.support import output_jobs as jobs  # noqa: E402
from tests.support.otlp_receiver import OtlpReceiver  # noqa: E402

WAIT = 60.0  # seconds to wait for a job's records at the receiver
DONE = "output_worker flood done"


def _records(rx: OtlpReceiver, pid: int) -> int:
    """Records of the worker ``pid``'s own lines (its flood lines and the last one)."""
    return sum(
        1 for r in rx.logs()
        if r["scope"] == "torchelastic_otel.worker.output" and r["resource"].get("process.parent_pid") == pid
        and str(r["body"]).startswith("output_worker")
    )  # fmt: skip


def _dropped(rx: OtlpReceiver, pid: int) -> int:
    """Lines counted as dropped by the worker's output processes (latest value of each reason)."""
    latest: dict[str, tuple[int, int]] = {}
    for p in rx.metric_points("torchelastic_otel.dropped"):
        if p["resource"].get("process.parent_pid") == pid and p["attributes"].get("signal") == "logs":
            reason = p["attributes"]["reason"]
            if reason not in latest or p["time_unix_nano"] > latest[reason][0]:
                latest[reason] = (p["time_unix_nano"], int(p["value"]))
    return sum(value for _t, value in latest.values())


def _run(kind: str, tmp: Path, mode: list[str], env: dict[str, str]) -> dict[str, float]:
    """One job; the worker's times, its lines on the console, and (bridged) its records and counted drops."""
    rx = OtlpReceiver().start() if kind == "bridged" else None
    try:
        job = jobs.run(kind, tmp, mode, rx=rx, nproc=1, env_extra=env)
        probe = job.probes[0]
        printed = sum(1 for line in job.console.splitlines() if line.startswith("output_worker"))
        result = {"seconds": probe["seconds"], "write_seconds": probe["write_seconds"], "console": printed,
                  "returncode": job.returncode}  # fmt: skip
        if rx is not None:
            pid = probe["pid"]
            rx.wait_for(lambda r: _records(r, pid) + _dropped(r, pid) >= printed, timeout=WAIT, interval=1.0)
            result.update(records=_records(rx, pid), dropped=_dropped(rx, pid))
        return result
    finally:
        if rx is not None:
            rx.stop()


def _scenario(title: str, rounds: int, mode: list[str], env: dict[str, str], tmp: Path) -> dict[str, list]:
    print(f"\n{title}")
    runs: dict[str, list] = {"plain": [], "bridged": []}
    for index in range(rounds):
        for kind in ("plain", "bridged"):
            result = _run(kind, tmp, mode, env)
            runs[kind].append(result)
            extra = f", records {result['records']}, dropped {result['dropped']}" if kind == "bridged" else ""
            print(f"  round {index + 1} {kind:7}: wall {result['seconds']:.3f} s, "
                  f"writing {result['write_seconds']:.3f} s, console lines {result['console']}{extra}")  # fmt: skip
    return runs


def _median(runs: list[dict[str, float]], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def _verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS  <<<<<"


def paced(rounds: int, seconds: float, tmp: Path) -> None:
    lines = int(10_000 * seconds)
    mode = ["--mode", "flood", "--lines", str(lines), "--work-us", "100"]
    env = {"TORCHELASTIC_OTEL_WORKER_OUTPUT_RATE": "20000", "TORCHELASTIC_OTEL_WORKER_OUTPUT_BURST": "20000"}
    title = f"1. 10,000 lines/s (100 us of work a line) for {seconds:g} s ({lines:,} lines), limit 20,000 lines/s"
    runs = _scenario(title, rounds, mode, env, tmp)
    ratio = _median(runs["bridged"], "seconds") / _median(runs["plain"], "seconds")
    missing = max(lines + 1 - r["console"] for r in runs["bridged"])
    lost = max(lines + 1 - r["records"] - r["dropped"] for r in runs["bridged"])
    dropped = max(r["dropped"] for r in runs["bridged"])
    per_line = {k: _median(v, "write_seconds") / lines * 1e6 for k, v in runs.items()}
    print(f"  worker wall time, bridged / plain = {ratio:.3f}x (target <= 1.05x)  {_verdict(ratio <= 1.05)}")
    print(f"  a write call: plain {per_line['plain']:.2f} us, bridged {per_line['bridged']:.2f} us (reported)")
    print(f"  lines missing from the console = {missing} (target 0)  {_verdict(missing == 0)}")
    print(f"  lines lost below the limit = {lost} (target 0)  {_verdict(lost == 0)}; counted as dropped: {dropped}")


def flood(rounds: int, lines: int, tmp: Path) -> None:
    mode = ["--mode", "flood", "--lines", str(lines)]
    runs = _scenario(f"2. {lines:,} lines as fast as the worker can print, default limits", rounds, mode, {}, tmp)
    ratio = _median(runs["bridged"], "seconds") / _median(runs["plain"], "seconds")
    rate = lines / _median(runs["plain"], "seconds")
    missing = max(lines + 1 - r["console"] for r in runs["bridged"])
    unaccounted = max(abs(lines + 1 - r["records"] - r["dropped"]) for r in runs["bridged"])
    print(f"  worker wall time, bridged / plain = {ratio:.2f}x (plain prints {rate:,.0f} lines/s; reported)")
    print(f"  lines missing from the console = {missing} (target 0)  {_verdict(missing == 0)}")
    print(f"  records + counted drops - lines printed = {unaccounted} (target 0)  {_verdict(unaccounted == 0)}; "
          f"records {_median(runs['bridged'], 'records'):.0f}")  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--flood-lines", type=int, default=200_000)
    args = parser.parse_args()
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="bench-worker-output-") as tmp:
        paced(args.rounds, args.seconds, Path(tmp))
        flood(args.rounds, args.flood_lines, Path(tmp))
    print(f"\n({time.monotonic() - started:.0f} s)")
    return 0  # a report: a missed target is printed as MISS, not an error


if __name__ == "__main__":
    sys.exit(main())
