"""Every worker's stdout, stderr and logging as correlated log records: real torchrun jobs (CPU, gloo, 127.0.0.1).

The worker is ``tests/support/workers/_output_worker.py``, a bridge-unaware script (``tests/support/output_jobs.py``
runs it). In the main job rank 0 writes its lines and blocks in gloo (a collective call rank 1 never joins) until the
agent SIGTERMs it; rank 1 writes, logs and raises. Each layout runs under plain torchrun and under the bridge:

- console: what each rank wrote -- through Python, fd 1 directly (as native code does), a child process,
  logging's last resort, a traceback -- arrives at the receiver, line by line, with the rank's resource and the
  attempt's trace context, including the lines of rank 0, which the agent SIGTERMed; logging records carry the
  trace and span ids of where they were logged; the console (and exit codes) are those of plain torchrun;
- files (``--redirects 1 --tee 2 --local-ranks-filter 0 --log-dir``): torchrun's files and console are those of
  plain torchrun; rank 1's lines, kept off the console by the filter, are exported all the same;
- terminal: torchrun on a pty: the worker still sees a terminal of the same size, the text shown is the same;
- a print flood beyond the rate limit: every line is on the console, the records are bounded, every line not
  exported is counted, the last lines are exported;
- the two variables off: no output or logging record arrives, the worker's fds are its own, nothing else changes.

"Ignoring timing" (``output_jobs.normalize``): numbers, the run id and log directory are masked and the
launcher's own traceback frames left out; lines are compared as a multiset, and in order per rank and stream
(two streams carry no order between them: see ``output_passthrough``). About 50 s on 2 cores for 8 jobs.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import output_jobs as jobs
from tests.support.jobs import SEVERITY_ERROR, SEVERITY_INFO, SEVERITY_WARN
from tests.support.otlp_receiver import OtlpReceiver

pytest.importorskip("torch.distributed.elastic.agent.server.local_elastic_agent")

WAIT = 30.0  # seconds to wait at the receiver once a job ended
OUTPUT_SCOPE = "torchelastic_otel.worker.output"
TAIL_LINES = 100
FLOOD = {"lines": 20000, "long": 5000, "rate": 200, "burst": 1000, "max_line": 1000}
OFF = {"TORCHELASTIC_OTEL_WORKER_OUTPUT": "0", "TORCHELASTIC_OTEL_WORKER_LOGGING": "0"}
JOB = ["--mode", "job"]


class Runs:
    """Each job once per module, with a receiver of its own; every receiver is stopped at the end."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.done: dict[str, tuple[jobs.Finished, OtlpReceiver | None]] = {}
        self.receivers: list[OtlpReceiver] = []

    def __enter__(self) -> Runs:
        return self

    def __exit__(self, *exc: object) -> None:
        for rx in self.receivers:
            rx.stop()

    def get(self, name: str, kind: str, mode: list[str], **options: Any) -> tuple[jobs.Finished, OtlpReceiver]:
        if name not in self.done:
            rx = None
            if kind != "plain":
                rx = OtlpReceiver().start()
                self.receivers.append(rx)
            self.done[name] = (jobs.run(kind, self.tmp, mode, rx=rx, **options), rx)
        return self.done[name]  # type: ignore[return-value]

    def plain(self, layout: str) -> jobs.Finished:
        mode, options = _layout(layout)
        return self.get(f"plain-{layout}", "plain", mode, **options)[0]

    def bridged(self, layout: str) -> tuple[jobs.Finished, OtlpReceiver]:
        mode, options = _layout(layout)
        return self.get(f"bridged-{layout}", "bridged", mode, **options)


def _layout(layout: str) -> tuple[list[str], dict[str, Any]]:
    if layout == "files":
        return JOB, {"layout": jobs.FILE_LAYOUT}
    if layout == "terminal":
        return ["--mode", "terminal"], {"nproc": 1, "terminal": True}
    return JOB, {}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Runs]:
    with Runs(tmp_path_factory.mktemp("worker-output")) as runner:
        yield runner


# ---- reading the receiver ----------------------------------------------------------------------------------------


def output_records(rx: OtlpReceiver, rank: int | None = None) -> list[dict[str, Any]]:
    found = [r for r in rx.logs() if r["scope"] == OUTPUT_SCOPE]
    return [r for r in found if rank is None or r["resource"].get("torchelastic.rank") == rank]


def bodies(records: list[dict[str, Any]], stream: str) -> list[str]:
    ordered = sorted(records, key=lambda r: r["time_unix_nano"])
    return [r["body"] for r in ordered if r["attributes"].get("log.iostream") == stream]


def wait(rx: OtlpReceiver, what: str, condition: Callable[[OtlpReceiver], bool], job: jobs.Finished) -> None:
    if not rx.wait_for(condition, timeout=WAIT, interval=0.2):
        got = collections.Counter((r["scope"], r["resource"].get("torchelastic.rank")) for r in rx.logs())
        pytest.fail(f"timed out waiting for {what}; received log records {dict(got)}\n{job.console[-3000:]}")


def attempt(rx: OtlpReceiver) -> dict[str, Any]:
    attempts = [s for s in rx.spans("torchelastic.attempt") if "torchelastic.rank" not in s["resource"]]
    assert len(attempts) == 1, attempts
    return attempts[0]


def dropped(rx: OtlpReceiver, worker_pid: int, kind: str, reason: str) -> int:
    """The latest ``torchelastic_otel.<kind>{signal="logs", reason}`` of the output processes of ``worker_pid``."""
    points = [
        p for p in rx.metric_points(f"torchelastic_otel.{kind}")
        if p["attributes"] == {"signal": "logs", "reason": reason}
        and p["resource"].get("process.parent_pid") == worker_pid
    ]  # fmt: skip
    return max(points, key=lambda p: p["time_unix_nano"])["value"] if points else 0


#: What the worker's logging handlers print (logging's last resort): logging records, never line records as well.
LOGGED_LINE = ": logging, unconfigured"


def _not_logged(lines: dict[tuple[int, str], list[str]]) -> dict[tuple[int, str], list[str]]:
    """The worker's lines that become line records: all but those a logging handler printed."""
    return {key: [line for line in found if not line.endswith(LOGGED_LINE)] for key, found in lines.items()}


def _expected_lines(plain: jobs.Finished) -> dict[tuple[int, str], list[str]]:
    lines = jobs.worker_lines(plain.console)
    assert set(lines) == {(r, s) for r in (0, 1) for s in ("stdout", "stderr")}, lines
    return _not_logged(lines)


def _all_arrived(expected: dict[tuple[int, str], list[str]]) -> Callable[[OtlpReceiver], bool]:
    def arrived(rx: OtlpReceiver) -> bool:
        got = {(rank, stream): set(bodies(output_records(rx, rank), stream)) for rank, stream in expected}
        traceback_done = "[rank1]: RuntimeError: output_worker rank 1 failed" in got[(1, "stderr")]
        return traceback_done and all(set(lines) <= got[key] for key, lines in expected.items())

    return arrived


# ---- the console job: records --------------------------------------------------------------------------------


def test_both_ranks_lines_arrive_with_their_rank_and_the_attempts_trace(runs: Runs) -> None:
    """Each rank's lines (Python, fd 1, a child process, the traceback) become records: in order per stream,
    ``log.iostream``, the rank's resource, the attempt span as trace context -- rank 0's too, although the agent
    SIGTERMed it while it was blocked in gloo. What logging's handlers printed is not among them: logging records."""
    expected = _expected_lines(runs.plain("console"))
    job, rx = runs.bridged("console")
    assert job.returncode == 1 and job.probes[0]["captured"] and job.probes[1]["captured"], job.console[-3000:]
    wait(rx, "every worker line and rank 1's traceback", _all_arrived(expected), job)
    wait(rx, "the attempt span", lambda r: bool(r.spans("torchelastic.attempt")), job)
    run_attempt = attempt(rx)

    for (rank, stream), lines in expected.items():
        got = [b for b in bodies(output_records(rx, rank), stream) if jobs.WORKER_LINE.fullmatch(b)]
        assert got == lines, (rank, stream)
    rank1_stderr = bodies(output_records(rx, 1), "stderr")
    assert "[rank1]: RuntimeError: output_worker rank 1 failed" in rank1_stderr, rank1_stderr
    for text in ("INFO output_worker.trainer: rank 1: step 7 done", "ValueError: bad batch",
                 "output_worker rank 1 stderr 2: logging, unconfigured"):  # fmt: skip
        assert text not in rank1_stderr, rank1_stderr  # printed by logging's handlers: logging records
    assert "output_worker rank 0 stdout 4: blocking in new_group" == bodies(output_records(rx, 0), "stdout")[-1]

    for record in output_records(rx):
        rank = record["resource"]["torchelastic.rank"]
        assert record["resource"]["torchelastic.run_id"] == job.run_id
        assert record["resource"]["torchelastic.restart_count"] == 0
        assert record["resource"]["torchelastic.process.kind"] == "worker"
        assert record["resource"]["process.parent_pid"] == job.probes[rank]["pid"]
        assert (record["trace_id"], record["span_id"]) == (run_attempt["trace_id"], run_attempt["span_id"])
        stdout = record["attributes"] == {"log.iostream": "stdout"}
        assert stdout or record["attributes"] == {"log.iostream": "stderr"}, record["attributes"]
        assert (record["severity_number"], record["severity_text"]) == (
            (SEVERITY_INFO, "INFO") if stdout else (SEVERITY_WARN, "WARN")
        )
    assert "output_worker rank 1 stdout 3: ünïcödé ✓ and a tab\there" in bodies(output_records(rx, 1), "stdout")


def test_logging_records_carry_the_trace_and_span_of_where_they_were_logged(runs: Runs) -> None:
    """Python logging becomes records through OpenTelemetry's handler: level, code location, exception, and the
    span that was current (the attempt, or the script's own span); logging left unconfigured too. Each once."""
    expected = _expected_lines(runs.plain("console"))
    job, rx = runs.bridged("console")
    wait(rx, "every worker line", _all_arrived(expected), job)
    wait(rx, "the logging records", lambda r: len([x for x in r.logs() if x["scope"].startswith("output_worker")]) >= 5,
         job)  # fmt: skip
    run_attempt = attempt(rx)
    step = [s for s in rx.spans("output_worker.step") if s["resource"].get("torchelastic.rank") == 1]
    assert len(step) == 1 and step[0]["parent_span_id"] == run_attempt["span_id"]

    trainer = {r["body"]: r for r in rx.logs() if r["scope"] == "output_worker.trainer"}
    assert sorted(trainer) == ["rank 1: loss is nan", "rank 1: skipping a batch", "rank 1: step 7 done"]
    info, warning, error = (
        trainer["rank 1: step 7 done"],
        trainer["rank 1: loss is nan"],
        trainer["rank 1: skipping a batch"],
    )
    assert (info["severity_number"], warning["severity_number"], error["severity_number"]) == (
        SEVERITY_INFO, SEVERITY_WARN, SEVERITY_ERROR,
    )  # fmt: skip
    assert (info["trace_id"], info["span_id"]) == (run_attempt["trace_id"], run_attempt["span_id"])
    assert (warning["trace_id"], warning["span_id"]) == (run_attempt["trace_id"], step[0]["span_id"])
    assert error["attributes"]["exception.type"] == "ValueError"
    assert error["attributes"]["exception.message"] == "bad batch"
    assert 'raise ValueError("bad batch")' in error["attributes"]["exception.stacktrace"]
    for record in trainer.values():
        assert record["resource"]["torchelastic.rank"] == 1
        assert record["resource"]["process.pid"] == job.probes[1]["pid"]  # the worker's own pipeline
        assert record["attributes"]["code.file.path"].endswith("_output_worker.py")

    unconfigured = [r for r in rx.logs() if r["scope"] == "output_worker.unconfigured"]
    assert sorted(r["resource"]["torchelastic.rank"] for r in unconfigured) == [0, 1]
    assert all(r["severity_text"] == "WARN" and r["trace_id"] == run_attempt["trace_id"] for r in unconfigured)


def test_the_opentelemetry_instrument_route_captures_output_and_logging(runs: Runs) -> None:
    """``opentelemetry-instrument torchrun``: the workers run the bridge's ``sitecustomize`` before OpenTelemetry's
    (``instrumentation.keep_bootstrap_first``; contrib 0.63b0 and later would put its own in front), so the output
    is captured before OpenTelemetry's exporter threads start, and the instrumentor installs the bridge with the
    distro's providers: both ranks' lines and logging records arrive, with the rank's resource and the attempt's
    trace; the console and exit code are plain torchrun's."""
    plain = runs.plain("console")
    expected = _expected_lines(plain)
    job, rx = runs.get("instrument-console", "instrument", JOB)
    assert job.returncode == plain.returncode == 1, job.console[-3000:]
    assert job.probes[0]["captured"] and job.probes[1]["captured"], job.console[-3000:]
    wait(rx, "every worker line and rank 1's traceback", _all_arrived(expected), job)
    wait(rx, "the logging records", lambda r: len([x for x in r.logs() if x["scope"] == "output_worker.trainer"]) >= 3,
         job)  # fmt: skip
    wait(rx, "the attempt span", lambda r: bool(r.spans("torchelastic.attempt")), job)
    run_attempt = attempt(rx)
    for (rank, stream), lines in expected.items():
        got = [b for b in bodies(output_records(rx, rank), stream) if jobs.WORKER_LINE.fullmatch(b)]
        assert got == lines, (rank, stream)
    for record in output_records(rx):
        assert record["resource"]["process.parent_pid"] == job.probes[record["resource"]["torchelastic.rank"]]["pid"]
        assert (record["trace_id"], record["span_id"]) == (run_attempt["trace_id"], run_attempt["span_id"])
    trainer = sorted(r["body"] for r in rx.logs() if r["scope"] == "output_worker.trainer")
    assert trainer == ["rank 1: loss is nan", "rank 1: skipping a batch", "rank 1: step 7 done"]
    assert jobs.worker_lines(job.console) == jobs.worker_lines(plain.console)


# ---- as with plain torchrun ----------------------------------------------------------------------------------


@pytest.mark.parametrize("layout", ["console", "files"])
def test_console_and_exit_code_are_those_of_plain_torchrun(runs: Runs, layout: str) -> None:
    plain = runs.plain(layout)
    bridged, _rx = runs.bridged(layout)
    assert plain.returncode == bridged.returncode == 1, bridged.console[-3000:]
    assert jobs.worker_lines(bridged.console) == jobs.worker_lines(plain.console)
    assert jobs.multiset_difference(
        jobs.normalize(plain.console, plain.masks()), jobs.normalize(bridged.console, bridged.masks())
    ) == ([], [])
    assert [p["stdout_isatty"] for p in bridged.probes.values()] == [p["stdout_isatty"] for p in plain.probes.values()]


def test_log_dir_files_are_those_of_plain_torchrun_and_filtered_ranks_are_exported(runs: Runs) -> None:
    """``--redirects 1 --tee 2 --local-ranks-filter 0 --log-dir``: the same files with the same lines in the same
    order; rank 1's stdout, in a file only, and its stderr, off the console, still become records."""
    plain = runs.plain("files")
    bridged, rx = runs.bridged("files")
    plain_files, bridged_files = plain.files(), bridged.files()
    assert sorted(plain_files) == [(r, s) for r in (0, 1) for s in ("stderr", "stdout")]
    assert sorted(bridged_files) == sorted(plain_files)
    for key, text in plain_files.items():
        assert jobs.normalize(bridged_files[key], bridged.masks()) == jobs.normalize(text, plain.masks()), key
    assert "[default0]:output_worker rank 0 stderr 0: sys.stderr" in bridged.console
    assert "output_worker rank 1" not in bridged.console  # filtered: as with plain torchrun

    expected = _not_logged(jobs.worker_lines(plain_files[(1, "stdout")] + plain_files[(1, "stderr")]))
    wait(rx, "rank 1's lines", lambda r: all(
        set(lines) <= set(bodies(output_records(r, 1), stream)) for (_rank, stream), lines in expected.items()
    ), bridged)  # fmt: skip


def test_a_worker_on_a_terminal_keeps_its_terminal(runs: Runs) -> None:
    """torchrun on a terminal: the worker's fds 1 and 2 are still terminals of the same size (a pty where the
    bridge reads them), and the text shown is the same."""
    plain = runs.plain("terminal")
    bridged, rx = runs.bridged("terminal")
    assert plain.returncode == bridged.returncode == 0, bridged.console[-3000:]
    keys = ("stdout_isatty", "stderr_isatty", "terminal_size", "line_buffering")
    assert {k: plain.probes[0][k] for k in keys} == {"stdout_isatty": True, "stderr_isatty": True,
                                                    "terminal_size": [120, 40], "line_buffering": False}  # fmt: skip
    assert {k: bridged.probes[0][k] for k in keys} == {k: plain.probes[0][k] for k in keys}
    assert bridged.probes[0]["captured"] and not plain.probes[0]["captured"]
    assert jobs.worker_lines(bridged.console) == jobs.worker_lines(plain.console)
    assert jobs.multiset_difference(
        jobs.normalize(plain.console, plain.masks()), jobs.normalize(bridged.console, bridged.masks())
    ) == ([], [])
    assert bridged.console.count("\r\n") == plain.console.count("\r\n")  # the terminal's own line endings
    wait(
        rx,
        "the terminal lines",
        lambda r: "output_worker rank 0 stdout 1: done" in bodies(output_records(r), "stdout"),
        bridged,
    )
    assert "output_worker rank 0 stderr 0: on a terminal" in bodies(output_records(rx), "stderr")


# ---- bounds --------------------------------------------------------------------------------------------------


def test_a_print_flood_is_bounded_and_counted(runs: Runs) -> None:
    """20,000 lines as fast as the worker can print them, limit 200 lines/s with a burst of 1,000: every line is
    on the console; records + lines counted as rate-limited = lines printed, exactly; the records stay within
    the burst, the rate and the tail; the last 100 lines arrive; the one long line is cut and counted."""
    env = {
        "TORCHELASTIC_OTEL_WORKER_OUTPUT_RATE": str(FLOOD["rate"]),
        "TORCHELASTIC_OTEL_WORKER_OUTPUT_BURST": str(FLOOD["burst"]),
        "TORCHELASTIC_OTEL_WORKER_OUTPUT_MAX_LINE": str(FLOOD["max_line"]),
    }
    mode = ["--mode", "flood", "--lines", str(FLOOD["lines"]), "--long", str(FLOOD["long"])]
    job, rx = runs.get("flood", "bridged", mode, nproc=1, env_extra=env)
    assert job.returncode == 0, job.console[-3000:]
    printed = [line for line in job.console.splitlines() if line.startswith("output_worker")]
    assert len(printed) == FLOOD["lines"] + 1 and printed[-1] == "output_worker flood done"
    assert printed[:3] == [f"output_worker rank 0 stdout {n}: flood" for n in range(3)]

    pid = job.probes[0]["pid"]

    def flood_records(r: OtlpReceiver) -> list[str]:
        return [b for b in bodies(output_records(r, 0), "stdout") if b.startswith("output_worker")]

    def accounted(r: OtlpReceiver) -> bool:
        return len(flood_records(r)) + dropped(r, pid, "dropped", "rate_limited") == len(printed)

    wait(rx, "records + rate-limited lines = lines printed", accounted, job)
    received = flood_records(rx)
    limit = FLOOD["burst"] + FLOOD["rate"] * (job.probes[0]["seconds"] + 2) + TAIL_LINES
    assert 0 < len(received) <= limit, (len(received), limit)
    assert dropped(rx, pid, "dropped", "rate_limited") > 0
    missing = set(printed[-TAIL_LINES:]) - set(received)  # the last lines are never rate-limited (order across
    assert not missing, sorted(missing)  # export batches read at the same instant is not asserted)
    long = [b for b in received if "xxxx" in b]
    assert len(long) == 1 and len(long[0].encode()) == FLOOD["max_line"]
    wait(rx, "the truncation counted", lambda r: dropped(r, pid, "sanitized", "line_truncated") == 1, job)


# ---- turned off ----------------------------------------------------------------------------------------------


def test_turned_off_nothing_is_captured_and_nothing_else_changes(runs: Runs) -> None:
    """``TORCHELASTIC_OTEL_WORKER_OUTPUT=0`` and ``TORCHELASTIC_OTEL_WORKER_LOGGING=0``: the worker's fds are
    torchrun's own, no output or logging record arrives, the worker's other telemetry does, the console is plain
    torchrun's."""
    plain = runs.plain("console")
    job, rx = runs.get("off-console", "bridged", JOB, env_extra=OFF)
    assert not any(p["captured"] for p in job.probes.values())
    wait(rx, "rank 1's exception and rank 0's terminated record", lambda r: bool(
        [x for x in r.logs("torchelastic.worker.exception") if x["resource"].get("torchelastic.rank") == 1]
        and [x for x in r.logs("torchelastic.worker.terminated") if x["resource"].get("torchelastic.rank") == 0]
    ), job)  # fmt: skip
    assert output_records(rx) == []
    assert [r for r in rx.logs() if r["scope"].startswith("output_worker")] == []
    assert job.returncode == plain.returncode
    assert jobs.worker_lines(job.console) == jobs.worker_lines(plain.console)
    assert jobs.multiset_difference(
        jobs.normalize(plain.console, plain.masks()), jobs.normalize(job.console, job.masks())
    ) == ([], [])
