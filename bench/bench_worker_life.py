"""What the bridge adds to a worker's life: start-up and exit of a worker that prints one line, and two jobs.

``.venv/bin/python bench/bench_worker_life.py [--rounds 5] [--only worker,launch,job,failonce]``. A report, not a
test: it exits 0 and prints, per scenario, the medians of alternating runs (plain, bridged with a live collector,
bridged with the collector down, plain, ...), their differences and ratios, and PASS/MISS against the target of
issue 18 (a worker's life costs <= 0.3 s more with the bridge, live collector and collector down alike).

1. ``worker``: the worker process alone, started as a torchrun agent starts a script worker: plain torchrun's
   environment, or the one a bridged agent hands down (the bootstrap on ``PYTHONPATH``,
   ``TORCHELASTIC_OTEL_AUTO_INSTALL=1``, a ``TRACEPARENT``, ``OTEL_*`` to a live ``OtlpReceiver`` on 127.0.0.1 or
   to a closed port). The worker (``print`` one line, then leave) stamps ``time.time_ns()`` at its first line, at
   its last line and in the first ``atexit`` handler to run; the bench stamps the spawn and the reaping. So its
   life splits into: start-up (spawn -> first line: interpreter, ``sitecustomize``, the bridge's set-up), the
   script, threading shutdown (last line -> first atexit handler: ``threading._shutdown``, which joins non-daemon
   threads and runs the hooks registered with ``threading._register_atexit``) and the rest of the exit (the other
   atexit handlers -- the bridge's flush and shutdown -- interpreter finalization, reaping).
2. ``launch``: ``elastic_launch`` of that worker (1 process, c10d on 127.0.0.1:0) in a launching process of its own,
   plain or after ``torchelastic_otel.install()``: the first launch of the process and a second one, timed in the
   launching process (the interpreter's and torch's import not included).
3. ``job``: the same worker as a whole ``torchrun --standalone --nproc-per-node 2`` job (``torchelastic-otel run``
   for the bridged kinds): the agent's own start-up included.
4. ``failonce``: ``bench/_failonce_worker.py`` (see ``bench_job.py``): 2 workers, the first attempt fails while a
   worker is blocked in gloo's ``init_process_group`` and is SIGTERMed, the second succeeds: two worker lives and
   a stop each. Then the same job with ``--silent`` workers, which record nothing (issue 15's script). Its time is
   bimodal in every kind: when rank 1 reaches ``init_process_group`` before rank 0 has opened its TCPStore, rank
   1's connection is retried after a back-off, and the attempt takes ~0.5 s longer; take medians of >= 7 rounds.

``python -X importtime`` of one bridged worker start-up is summarised too (the largest imports under
``sitecustomize``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(HERE))

import bench_job  # noqa: E402

from tests.support.otlp_receiver import OtlpReceiver  # noqa: E402
from tests.support.procs import stop_tree  # noqa: E402

KINDS = ("plain", "live", "down")
TARGET_SECONDS = 0.3
#: Issue 15's target for the whole fail-once job (two worker lives a rank, the agent's own start-up and stop).
FAILONCE_TARGET_SECONDS = 0.5
RUN_TIMEOUT = 120.0

#: The worker: one printed line. argv[1]: where to write its stamps (first line, last line, first atexit handler).
HELLO = """\
import time
first = time.time_ns()
import atexit, os, sys
stamps = sys.argv[1] if len(sys.argv) > 1 else None
print(f"hello from rank {os.environ.get('RANK', '?')}", flush=True)
def _at_exit():
    if stamps:
        with open(stamps, "a") as fh:
            fh.write(f"atexit {time.time_ns()}\\n")
atexit.register(_at_exit)
if stamps:
    import threading
    waited = ",".join(t.name for t in threading.enumerate() if not t.daemon and t is not threading.main_thread())
    with open(stamps, "w") as fh:
        fh.write(f"first {first}\\nlast {time.time_ns()}\\nthreads {waited or '-'}\\n")
"""

#: The launching process of scenario 2: ``elastic_launch`` twice, the seconds of each on its last line.
LAUNCHER = """\
import sys, time, uuid
mode, worker = sys.argv[1], sys.argv[2]
if mode != "plain":
    import torchelastic_otel
    assert torchelastic_otel.install()
from torch.distributed.launcher.api import LaunchConfig, elastic_launch
seconds = []
for _ in range(2):
    config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=1, run_id=uuid.uuid4().hex[:8],
                          rdzv_backend="c10d", rdzv_endpoint="127.0.0.1:0", max_restarts=0,
                          monitor_interval=0.05, start_method="spawn")
    started = time.monotonic()
    elastic_launch(config, sys.executable)(worker)
    seconds.append(time.monotonic() - started)
print("SECONDS", *seconds, flush=True)
"""


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def envs(rx: OtlpReceiver, tmp: str) -> dict[str, dict[str, str]]:
    """The launching environments: plain torchrun's, and the bridge's exporting to a live or a closed port."""
    bridged = {**bench_job.base_env(), **bench_job.otel_env(rx)}
    down = {**bridged, "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{bench_job.free_port()}"}
    return {"plain": bench_job.base_env(), "live": bridged, "down": down}


def worker_envs(rx: OtlpReceiver, tmp: str) -> dict[str, dict[str, str]]:
    """What a plain and a bridged agent give a script worker (``bench_job.worker_env``); a bridged agent's workers
    also get the directory where they leave what they could not send (``TORCHELASTIC_OTEL_FAILURE_DIR``)."""
    failures = Path(tmp) / "failures"
    failures.mkdir(exist_ok=True)
    live = {**bench_job.worker_env(rx, bridged=True), "TORCHELASTIC_OTEL_FAILURE_DIR": str(failures)}
    return {
        "plain": bench_job.worker_env(rx, bridged=False),
        "live": live,
        "down": {**live, "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{bench_job.free_port()}"},
    }


#: The non-daemon threads a worker's interpreter waited for at exit (name -> how many workers had it).
WAITED_FOR: dict[str, dict[str, int]] = {}


def read_stamps(path: Path, kind: str) -> dict[str, int]:
    stamps: dict[str, int] = {}
    for line in path.read_text().splitlines():
        key, _, value = line.partition(" ")
        if key == "threads":
            for name in value.split(","):
                WAITED_FOR.setdefault(kind, {}).setdefault(name, 0)
                WAITED_FOR[kind][name] += 1
            continue
        stamps[key] = int(value)
    return stamps


def worker_life(script: Path, env: dict[str, str], tmp: str, n: int, kind: str) -> dict[str, float]:
    """One worker's life and its parts, in seconds."""
    stamps = Path(tmp) / f"stamps-{n}"
    with open(Path(tmp) / f"worker-{n}.out", "wb") as out:
        spawned = time.time_ns()
        proc = subprocess.Popen([sys.executable, str(script), str(stamps)], env=env, stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)  # fmt: skip
        try:
            proc.wait(timeout=RUN_TIMEOUT)
        finally:
            reaped = time.time_ns()
            stop_tree(proc)
    got = read_stamps(stamps, kind)
    return {
        "life": (reaped - spawned) / 1e9,
        "start-up": (got["first"] - spawned) / 1e9,
        "script": (got["last"] - got["first"]) / 1e9,
        "threading shutdown": (got["atexit"] - got["last"]) / 1e9,
        "atexit + finalize": (reaped - got["atexit"]) / 1e9,
    }


def run(cmd: list[str], env: dict[str, str], log: Path) -> tuple[float, str]:
    with open(log, "wb") as out:
        started = time.monotonic()
        proc = subprocess.Popen(cmd, env=env, cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)  # fmt: skip
        try:
            code = proc.wait(timeout=RUN_TIMEOUT)
        except subprocess.TimeoutExpired:
            code = None
        finally:
            seconds = time.monotonic() - started
            stop_tree(proc)
    output = log.read_text(errors="replace")
    if code != 0:
        raise RuntimeError(f"{' '.join(cmd[:4])}... ended with {code}: {output[-2000:]}")
    return seconds, output


def alternate(rounds: int, one: Callable[[str, int], dict[str, float]]) -> dict[str, dict[str, list[float]]]:
    """``rounds`` rounds of plain, live, down; per kind, per measure, the values."""
    out: dict[str, dict[str, list[float]]] = {kind: {} for kind in KINDS}
    for round_ in range(rounds):
        for kind in KINDS:
            measures = one(kind, round_)
            for name, value in measures.items():
                out[kind].setdefault(name, []).append(value)
            shown = "  ".join(f"{name} {value:.3f}" for name, value in measures.items())
            print(f"    round {round_ + 1}/{rounds}  {kind:<5}  {shown}", flush=True)
    return out


def report(
    title: str, results: dict[str, dict[str, list[float]]], checked: str, target: float = TARGET_SECONDS
) -> list[str]:
    """A table of medians, bridged - plain and bridged / plain per measure; the verdicts for ``checked``."""
    print(f"\n  {title}: medians (s); live/down: bridged with a live collector / with the collector down")
    print(f"    {'measure':<22}{'plain':>9}{'live':>9}{'down':>9}{'live-plain':>12}{'down-plain':>12}"
          f"{'live/plain':>12}{'down/plain':>12}")  # fmt: skip

    def ratio(x: float, p: float) -> str:
        return f"{x / p:11.2f}x" if p > 0 else f"{'-':>12}"

    for name in results["plain"]:
        p, live, down = (median(results[k][name]) for k in KINDS)
        print(f"    {name:<22}{p:9.3f}{live:9.3f}{down:9.3f}{live - p:+12.3f}{down - p:+12.3f}"
              f"{ratio(live, p)}{ratio(down, p)}")  # fmt: skip
    verdicts = []
    for kind in ("live", "down"):
        extra = median(results[kind][checked]) - median(results["plain"][checked])
        verdict = "PASS" if extra <= target else "MISS"
        verdicts.append(f"{verdict}  {title}, {kind}: {checked} +{extra:.3f} s (target <= +{target} s)")
    return verdicts


def importtime(script: Path, env: dict[str, str], tmp: str) -> None:
    """The largest imports of one bridged worker's start-up (``-X importtime``, cumulative microseconds)."""
    out = subprocess.run([sys.executable, "-X", "importtime", str(script), str(Path(tmp) / "importtime-stamps")],
                         env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT)  # fmt: skip
    rows = []
    for line in out.stderr.splitlines():
        if not line.startswith("import time:") or "cumulative" in line:
            continue
        self_us, cumulative, name = line.split(":", 1)[1].split("|", 2)
        try:
            rows.append((int(cumulative.strip()), int(self_us.strip()), name.rstrip()))
        except ValueError:
            continue
    total = sum(own for _, own, _ in rows)
    print(f"\n  one bridged worker, -X importtime: {total / 1e6:.3f} s importing (all threads; the bridge builds its "
          f"pipeline in a thread of its own); largest, cumulative:")  # fmt: skip
    for cumulative, _, name in sorted(rows, reverse=True)[:14]:
        print(f"    {cumulative / 1e6:7.3f} s  {name}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--only", default="worker,launch,job,failonce")
    args = parser.parse_args()
    only = set(args.only.split(","))
    print(f"bench_worker_life: {args.rounds} rounds of {', '.join(KINDS)} alternating; {os.cpu_count()} cores; "
          f"load average {os.getloadavg()[0]:.1f}")  # fmt: skip
    verdicts: list[str] = []
    with tempfile.TemporaryDirectory(prefix="bench_worker_life_") as tmp, OtlpReceiver() as rx:
        script = Path(tmp) / "hello.py"
        script.write_text(HELLO)
        launching = envs(rx, tmp)
        if "worker" in only:
            print("\n  1. worker alone (the environment each kind of agent gives it)", flush=True)
            wenvs = worker_envs(rx, tmp)
            counter = iter(range(10**6))
            results = alternate(args.rounds, lambda kind, _: worker_life(script, wenvs[kind], tmp, next(counter), kind))
            verdicts += report("worker alone", results, "life")
            for kind, names in WAITED_FOR.items():
                print(f"    non-daemon threads at the script's end ({kind}): "
                      + ", ".join(f"{name} x{count}" for name, count in sorted(names.items())))  # fmt: skip
            importtime(script, wenvs["live"], tmp)
        if "launch" in only:
            print("\n  2. elastic_launch in a launching process (first and second launch)", flush=True)
            launcher = Path(tmp) / "launcher.py"
            launcher.write_text(LAUNCHER)

            def one_launch(kind: str, round_: int) -> dict[str, float]:
                mode = "plain" if kind == "plain" else "bridged"
                _, output = run([sys.executable, str(launcher), mode, str(script)], launching[kind],
                                Path(tmp) / f"launch-{kind}-{round_}.log")  # fmt: skip
                first, second = (float(x) for x in output.split("SECONDS", 1)[1].split()[:2])
                return {"first launch": first, "second launch": second}

            verdicts += report("elastic_launch", alternate(args.rounds, one_launch), "second launch")
        if "job" in only:
            print("\n  3. the worker as a torchrun job (--standalone, 2 workers; agent start-up included)", flush=True)

            def one_job(kind: str, round_: int) -> dict[str, float]:
                launcher = ["torch.distributed.run"] if kind == "plain" else ["torchelastic_otel.run"]
                cmd = [sys.executable, "-m", *launcher, "--standalone", "--nproc-per-node", "2",
                       "--monitor-interval", "0.1", str(script)]  # fmt: skip
                seconds, _ = run(cmd, launching[kind], Path(tmp) / f"job-{kind}-{round_}.log")
                return {"job": seconds}

            verdicts += report("hello job", alternate(args.rounds, one_job), "job")
        if "failonce" in only:
            print("\n  4. the fail-once job (two worker lives and a stop each)", flush=True)

            # The fail-once worker records to the "otel" destination: plain torch gets a silent one (bench_job).
            failonce_envs = {**launching, "plain": bench_job.plain_torch_env(tmp)}

            def one_failonce(kind: str, round_: int, *extra: str) -> dict[str, float]:
                launcher = "torch.distributed.run" if kind == "plain" else "torchelastic_otel.run"
                cmd = [sys.executable, "-m", launcher, *bench_job.FAILONCE_ARGS, str(bench_job.FAILONCE_WORKER), *extra]
                log = Path(tmp) / f"failonce-{kind}-{round_}.log"
                seconds, code, output = bench_job.run_failonce_job(cmd, failonce_envs[kind], log)
                if code != 0:
                    raise RuntimeError(f"fail-once job ({kind}) ended with {code}: {output[-2000:]}")
                return {"job": seconds}

            job_target = FAILONCE_TARGET_SECONDS
            verdicts += report("fail-once job", alternate(args.rounds, one_failonce), "job", job_target)
            print("\n  5. the fail-once job, its workers silent (they record nothing: the common script)", flush=True)
            silent = alternate(args.rounds, lambda kind, round_: one_failonce(kind, round_, "--silent"))
            verdicts += report("fail-once job, silent workers", silent, "job", job_target)
    print()
    for line in verdicts:
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
