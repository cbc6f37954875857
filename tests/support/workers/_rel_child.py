"""Child programs of the reliability tests (``tests/*/test_reliability_*.py``), one scenario per run.

Usage: ``PYTHONPATH=. python tests/support/workers/_rel_child.py SCENARIO [ARGS...]`` (from the repository: it
imports ``tests.support``). Exporters are configured by the ``OTEL_*`` variables the parent sets, as in a real job; a
scenario uses the public API (plus the bridge's self-telemetry counters, which it reports). Lines the parent reads:

- ``REL_RESULT {json}``: what the child did (pid, counters, timings...); the last one is the result;
- ``REL_STAGE name ...``: the child reached a point where the parent acts (it then waits, bounded, for a stdin line).

Scenarios:

- ``export_faults``: events, a span and metrics while every export is rejected; waits for the parent to heal the
  receiver, then flushes: the drop counters (export_failed, queue_full, flush_timeout, exporter_unavailable)
  travel with the metrics;
- ``flood N``: N events and N metric values as fast as possible towards a dead endpoint: peak memory and drops;
- ``backlog N``: N events still in the bridge's buffer when the process exits;
- ``sequence N INTERVAL_MS``: N numbered events and counter increments at a steady pace (receiver restart test);
- ``fork MODE``: the bridge used before ``multiprocessing`` starts children (MODE ``fork`` or ``spawn``), while
  values sit in the buffers; ``fork_stress N``: N forks while a thread records;
- ``secrets``: DEBUG logging of everything, exporter headers carrying a token, events whose metadata try to pose
  as resource attributes or another run's ids;
- ``tls``: a few events and metrics, then a flush, over OTLP as configured (TLS certificate from the parent);
- ``prometheus``: the Prometheus exporter with the default host; waits for the parent to scrape.
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import select
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import torchelastic_otel
from tests.support.waiting import wait_for  # the repository is on PYTHONPATH (rel_common.clean_env)
from torchelastic_otel import _selftelemetry as selftelemetry
from torchelastic_otel import events, metrics
from torchelastic_otel._export import drainer as _drainer
from torchelastic_otel.events import Event, EventSource


def result(**data: Any) -> None:
    print("REL_RESULT " + json.dumps(data, sort_keys=True, default=str), flush=True)


def stage(name: str, **data: Any) -> None:
    print(f"REL_STAGE {name} " + json.dumps(data, default=str), flush=True)


def wait_stdin(timeout: float = 60.0) -> None:
    """Block until the parent writes a line (or closes stdin), at most ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while (remaining := deadline - time.monotonic()) > 0:
        ready, _, _ = select.select([sys.stdin], [], [], remaining)
        if ready:
            sys.stdin.readline()
            return


def wait_until(condition: Callable[[], Any], timeout: float, interval: float = 0.02) -> bool:
    """``wait_for``, as a yes or no: the child reports a timeout rather than failing."""
    try:
        wait_for(condition, timeout, interval=interval)
    except AssertionError:
        return False
    return True


def counts() -> dict[str, int]:
    """The self-telemetry counters as ``{"dropped/logs/export_failed": n, ...}``."""
    return {"/".join(key): value for key, value in sorted(selftelemetry.snapshot().items())}


def dropped(signal: str, reason: str) -> int:
    return selftelemetry.total(selftelemetry.DROPPED, signal, reason)


def vm_hwm_kib() -> int:
    """Peak resident set size of this process so far (``VmHWM``), in KiB."""
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return 0


def configure() -> None:
    metrics.configure(metrics.OtelMetricHandler())
    events.configure(events.OtelEventHandler())


# ---- scenarios ----------------------------------------------------------------------------------------------------


def export_faults() -> None:
    configure()
    from opentelemetry import trace

    n = 100
    with trace.get_tracer("rel").start_as_current_span("rel.span"):
        for i in range(n):
            events.record("rel.fault", "rel", {"seq": i})
    for _ in range(20):
        metrics.put_metric("rel.fault.count", 1, "rel")
    started = time.monotonic()
    flushed = torchelastic_otel.flush(5000)
    flush_seconds = time.monotonic() - started
    # Wait for the exporters to give up on what they hold (OTEL_EXPORTER_OTLP_TIMEOUT), bounded.
    settled = wait_until(
        lambda: (
            dropped("logs", "export_failed")
            and dropped("metrics", "export_failed")
            and dropped("traces", "export_failed")
        ),
        timeout=30,
    )
    stage("failed", counts=counts(), flushed=flushed, flush_seconds=flush_seconds, settled=settled)
    wait_stdin()
    healed = wait_until(lambda: torchelastic_otel.flush(5000), timeout=20, interval=0.2)
    result(pid=os.getpid(), events=n, healed=healed, counts=counts(), flushed=flushed, flush_seconds=flush_seconds)


def flood(n: int) -> None:
    configure()
    baseline = None
    started = time.monotonic()
    for i in range(n):
        events.record("rel.flood", "rel", {"seq": i, "rank": 0, "payload": "x" * 64})
        metrics.put_metric("rel.flood.count", 1, "rel")
        metrics.put_metric("rel.flood.loss", i * 0.001, "rel")
        if i == 10_000:
            baseline = vm_hwm_kib()
    recorded = time.monotonic() - started
    _drainer.drain_all()  # what a flush does first: everything buffered reaches the SDK (or is counted)
    peak = vm_hwm_kib()
    flush_started = time.monotonic()
    flushed = torchelastic_otel.flush(5000)
    result(
        pid=os.getpid(), n=n, baseline_kib=baseline, peak_kib=vm_hwm_kib(), peak_after_drain_kib=peak,
        record_seconds=recorded, flushed=flushed, flush_seconds=time.monotonic() - flush_started, counts=counts(),
        exit_started=time.monotonic(),
    )  # fmt: skip


def backlog(n: int) -> None:
    """``n`` events left in the bridge's buffer at exit (the drainer paused): the exit handler must stay within
    its time bound, and count what it could not deliver."""
    configure()
    pause = _drainer.paused()
    pause.__enter__()  # never resumed: the exit handler finds everything still buffered
    for i in range(n):
        events.record("rel.backlog", "rel", {"seq": i, "payload": "x" * 64})
    result(pid=os.getpid(), n=n, buffered=n, exit_started=time.monotonic())


def sequence(n: int, interval_ms: float) -> None:
    """``n`` events ``rel.seq`` {seq} and counter increments at a steady pace; prints the progress."""
    configure()
    interval = interval_ms / 1000
    start = time.monotonic()
    for i in range(n):
        events.record("rel.seq", "rel", {"seq": i})
        metrics.put_metric("rel.seq.count", 1, "rel")
        if i % 10 == 0:
            print(f"REL_SEQ {i}", flush=True)
        # a steady pace: the next event is due at start + (i + 1) * interval
        delay = start + (i + 1) * interval - time.monotonic()
        if delay > 0:
            time.sleep(delay)
    stage("recorded", n=n)
    wait_stdin()  # the parent checks what arrived before the final flush
    flushed = wait_until(lambda: torchelastic_otel.flush(5000), timeout=20, interval=0.2)
    result(pid=os.getpid(), n=n, flushed=flushed, counts=counts())


def _fork_child(mode: str, queue: Any) -> None:
    if mode == "spawn":
        configure()  # a fresh interpreter: the application configures the bridge again
    metrics.put_metric("rel.fork.count", 1, "rel")
    events.record("rel.fork.child", "rel", {"pid": os.getpid()})
    queue.put(os.getpid())
    # no flush: the bridge's exit handler delivers (multiprocessing's exit path for fork, atexit for spawn)


def fork(mode: str) -> None:
    configure()
    metrics.put_metric("rel.fork.count", 5, "rel")
    events.record("rel.fork.parent.exported", "rel", {})
    flushed_before = torchelastic_otel.flush(5000)  # the parent's providers hold the counter (5) now
    ctx = multiprocessing.get_context(mode)
    queue = ctx.Queue()
    with _drainer.paused():  # these two sit in the bridge's buffers while the child starts
        metrics.put_metric("rel.fork.count", 2, "rel")
        events.record("rel.fork.parent.buffered", "rel", {})
        started = time.monotonic()
        child = ctx.Process(target=_fork_child, args=(mode, queue))
        child.start()
        child.join(60)
        seconds = time.monotonic() - started
        alive = child.is_alive()
        if alive:
            child.kill()
            child.join(5)
    child_pid = queue.get(timeout=5) if not alive else None
    result(
        pid=os.getpid(), child_pid=child_pid, exitcode=child.exitcode, alive=alive, seconds=seconds,
        flushed_before=flushed_before, flushed=torchelastic_otel.flush(5000),
    )  # fmt: skip


def _stress_child(i: int) -> None:
    events.record("rel.fork.stress.child", "rel", {"i": i})
    metrics.put_metric("rel.fork.stress.count", 1, "rel")


def fork_stress(n: int) -> None:
    """Fork ``n`` children while another thread records and the drainer and exporters run: no child deadlocks."""
    configure()
    stop = threading.Event()

    def record_forever() -> None:
        i = 0
        while not stop.is_set() and i < 1_000_000:
            events.record("rel.fork.stress.parent", "rel", {"i": i})
            metrics.put_metric("rel.fork.stress.count", 1, "rel")
            i += 1
            if i % 200 == 0:
                torchelastic_otel.flush(1000)
            time.sleep(0.0005)

    recorder = threading.Thread(target=record_forever, daemon=True)
    recorder.start()
    ctx = multiprocessing.get_context("fork")
    outcomes, durations = [], []
    try:
        for i in range(n):
            started = time.monotonic()
            child = ctx.Process(target=_stress_child, args=(i,))
            child.start()
            child.join(30)
            durations.append(time.monotonic() - started)
            if child.is_alive():
                child.kill()
                child.join(5)
                outcomes.append("hung")
            else:
                outcomes.append(child.exitcode)
    finally:
        stop.set()
        recorder.join(10)
    result(pid=os.getpid(), outcomes=outcomes, max_seconds=max(durations), flushed=torchelastic_otel.flush(5000))


SECRET = "s3cr3t-token-6f1d"


def secrets() -> None:
    logging.basicConfig(level=logging.DEBUG, stream=sys.stderr, format="%(name)s %(levelname)s %(message)s")
    logging.getLogger("torchelastic_otel").setLevel(logging.DEBUG)
    configure()
    from opentelemetry import trace

    with trace.get_tracer("rel").start_as_current_span("rel.secrets"):
        events.record(
            Event(
                "rel.spoof",
                EventSource.WORKER,
                metadata={
                    "service.name": "evil-service",
                    "torchelastic.run_id": "other-run",
                    "resource.x": "injected",
                    "host.name": "evil-host",
                    "process.pid": 1,
                    "exception.message": "fake",
                    "nested": {"service.name": "evil-nested"},
                },
            ),
            "otel",
        )
        events.record("rel.spoof.legacy", "rel", {"service.name": "evil-legacy", "torchelastic.rank": 99})
    metrics.put_metric("rel.secrets.count", 1, "rel")
    flushed = torchelastic_otel.flush(5000)
    logging.getLogger("torchelastic_otel").debug("pipeline: %r", torchelastic_otel.get_pipeline())
    result(pid=os.getpid(), flushed=flushed, counts=counts())


def tls() -> None:
    configure()
    for i in range(5):
        events.record("rel.tls", "rel", {"i": i})
    metrics.put_metric("rel.tls.count", 5, "rel")
    started = time.monotonic()
    flushed = torchelastic_otel.flush(5000)
    seconds = time.monotonic() - started
    if not flushed:  # wait (bounded) for the exporters to give up, so the failure is counted
        wait_until(lambda: dropped("logs", "export_failed") or dropped("all", "flush_timeout"), timeout=15)
    result(pid=os.getpid(), flushed=flushed, flush_seconds=seconds, counts=counts())


def prometheus() -> None:
    metrics.configure(metrics.OtelMetricHandler())
    metrics.put_metric("rel.prom.count", 3, "rel")
    result(pid=os.getpid(), ready=True)
    wait_stdin(float(os.environ.get("REL_CHILD_WAIT", "30")))


def main(argv: list[str]) -> None:
    scenario, args = argv[0], argv[1:]
    if scenario == "export_faults":
        export_faults()
    elif scenario == "flood":
        flood(int(args[0]))
    elif scenario == "backlog":
        backlog(int(args[0]))
    elif scenario == "sequence":
        sequence(int(args[0]), float(args[1]))
    elif scenario == "fork":
        fork(args[0])
    elif scenario == "fork_stress":
        fork_stress(int(args[0]))
    elif scenario == "secrets":
        secrets()
    elif scenario == "tls":
        tls()
    elif scenario == "prometheus":
        prometheus()
    else:
        raise SystemExit(f"unknown scenario {scenario!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
