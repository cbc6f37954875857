"""A torchrun worker builds its pipeline in a thread of its own, from start-up (``pipeline.start_building``).

Each test starts a real interpreter with torchrun's worker environment and the bridge's bootstrap
``sitecustomize`` (exactly what a bridged agent gives its workers), exporting over real OTLP/gRPC to a receiver on
127.0.0.1, and checks at the receiver:

- at the training script's first line the bridge is installed and its pipeline is being built or ready -- the
  script did not wait for it: the main thread imported neither the SDK nor an exporter for it; a span the script
  starts right away is exported, with the worker's resource, under the agent's attempt span;
- a worker that records nothing still gets its ``torchelastic.worker.start`` span out, with no delay to wait for;
- the first event is exported by the background drainer, the script never waits;
- an application that sets its own tracer provider during start-up gets the bridge's telemetry in it;
- with a Prometheus exporter the pipeline is built before the script starts: the endpoint is up at its first line;
- a worker that exits at once still delivers its span and its event (the build is waited for, bounded, before
  the interpreter refuses new threads);
- a worker of a bridged agent (a failure directory: the agent sends what it leaves behind) defers the build until
  it records something or ``TORCHELASTIC_OTEL_SETUP_DELAY_MILLIS`` are over, and one that ends sooner never builds.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any

import pytest

from tests.support import ROOT
from tests.support.env import clean_env, otlp_env, use_otlp
from tests.support.final_words import delivered_by_agent
from tests.support.marks import needs_a_deferred_build
from tests.support.otlp_receiver import OtlpReceiver
from torchelastic_otel import _compat
from torchelastic_otel._install import AUTO_INSTALL_ENV, BOOTSTRAP_DIR

pytest.importorskip("torch.distributed.elastic.events")

RUN_ID = "deferred-setup"
TIMEOUT = 90


def worker_env(target: OtlpReceiver | str | None, **overrides: str) -> dict[str, str]:
    """torchrun's worker environment, the bridge's bootstrap, OTLP/gRPC to ``target`` (a receiver or an endpoint;
    ``None``: no OTLP endpoint)."""
    worker = dict(
        RANK="1", LOCAL_RANK="1", GROUP_RANK="0", WORLD_SIZE="2", LOCAL_WORLD_SIZE="2", ROLE_NAME="trainer",
        TORCHELASTIC_RUN_ID=RUN_ID, TORCHELASTIC_RESTART_COUNT="0", OTEL_BSP_SCHEDULE_DELAY="100",
        OTEL_BLRP_SCHEDULE_DELAY="100", TRACEPARENT="00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        **{AUTO_INSTALL_ENV: "1"},
    )  # fmt: skip
    env = clean_env(**worker) if target is None else otlp_env(target, pace={}, **worker)
    env["PYTHONPATH"] = os.pathsep.join([BOOTSTRAP_DIR, env["PYTHONPATH"]])
    env.update(overrides)
    return env


def run_worker(code: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a worker interpreter to its end, which must be an exit 0; the finished process."""
    result = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True,
                            timeout=TIMEOUT, stdin=subprocess.DEVNULL)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def last_json(result: subprocess.CompletedProcess[str]) -> Any:
    """The JSON line a worker printed last."""
    return json.loads(result.stdout.strip().splitlines()[-1])


def run(code: str, env: dict[str, str]) -> dict[str, Any]:
    """Run ``code`` (which prints one JSON line last) in a worker interpreter; its parsed last line."""
    return last_json(run_worker(code, env))


#: What the worker's script sees at its first line: the bridge installed, its pipeline being built or built, and
#: whether the main thread was the one that built it (it never is: the builder thread is).
FIRST_LINE = r"""
import json, sys, threading
from opentelemetry import trace
from torchelastic_otel import pipeline
first_line = {
    "installed": __import__("torchelastic_otel").is_installed(),
    "phase": pipeline.state.phase.value,
    "builder": pipeline.state.builder is not None and pipeline.state.builder is not threading.main_thread(),
}
"""


def run_until_received(code: str, env: dict[str, str], rx: OtlpReceiver, what: Any) -> tuple[dict[str, Any], bool]:
    """Run ``code`` in a worker interpreter that stays alive (reading its stdin) until ``what(rx)`` holds at the
    receiver (or 30 s pass), then ends with ``os._exit``: no flush, no exit handler, so what arrived was sent by
    the bridge's background threads. Returns the child's JSON line and whether ``what`` held."""
    code += "\nsys.stdin.read()\nprint(json.dumps(first_line), flush=True)\nimport os\nos._exit(0)\n"
    proc = subprocess.Popen([sys.executable, "-c", code], env=env, cwd=ROOT, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        arrived = rx.wait_for(what, timeout=30)
        out, err = proc.communicate("", timeout=TIMEOUT)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1]), arrived


def worker_start(rx: OtlpReceiver) -> list[dict[str, Any]]:
    return [s for s in rx.spans("torchelastic.worker.start") if s["resource"].get("torchelastic.run_id") == RUN_ID]


def test_the_pipeline_is_built_beside_the_script_and_a_span_started_at_once_is_exported() -> None:
    code = (
        FIRST_LINE
        + r"""
with trace.get_tracer("app").start_as_current_span("app.first"):
    pass
first_line["phase_after_first_span"] = pipeline.state.phase.value
print(json.dumps(first_line))
"""
    )
    with OtlpReceiver() as rx:
        got = run(code, worker_env(rx))  # a normal exit: the exit handler flushes
        assert got["installed"] is True and got["phase_after_first_span"] == "ready"
        assert got["phase"] == "ready" or (got["phase"] == "building" and got["builder"]), got
        assert rx.wait_for(lambda r: r.spans("app.first") and worker_start(r), timeout=30)
        app = rx.spans("app.first")[0]
        assert app["resource"]["torchelastic.rank"] == 1 and app["resource"]["torchelastic.run_id"] == RUN_ID
        assert app["trace_id"] == "0af7651916cd43dd8448eb211c80319c"  # a child of the agent's attempt span
        start = worker_start(rx)[0]
        assert start["parent_span_id"] == "b7ad6b7169203331"
        assert start["end_time_unix_nano"] >= start["start_time_unix_nano"] > 0


def test_the_first_event_is_exported_in_the_background() -> None:
    """The drainer moves the first event (0.5 s rounds) once the pipeline is built; the script never waits."""
    code = (
        FIRST_LINE
        + r"""
from torch.distributed.elastic import events
events.record(events.Event("trainer.started", events.EventSource.WORKER, metadata={"rank": 1}), destination="otel")
"""
    )
    with OtlpReceiver() as rx:
        arrived_both = lambda r: r.logs("trainer.started") and worker_start(r)  # noqa: E731
        got, arrived = run_until_received(code, worker_env(rx), rx, arrived_both)
        assert got["installed"] is True
        assert arrived, (rx.requests, got)
        assert rx.logs("trainer.started")[0]["resource"]["torchelastic.rank"] == 1


def test_a_worker_that_records_nothing_is_set_up_at_once() -> None:
    """No first use to wait for, and no agent to send its span (no failure directory): the build starts at once
    and the worker span goes out by the batch processor alone (the process ends with ``os._exit``, so no flush or
    exit handler sent it)."""
    code = FIRST_LINE
    with OtlpReceiver() as rx:
        got, arrived = run_until_received(code, worker_env(rx), rx, lambda r: len(worker_start(r)) == 1)
        assert got["installed"] is True and arrived, rx.requests


def test_an_application_provider_set_at_start_up_is_the_global_one() -> None:
    """An application that sets its own tracer provider in its script (after the bridge built its own) can: no
    "Overriding ... is not allowed", its spans go to its provider; the bridge goes on exporting through its own."""
    code = (
        FIRST_LINE
        + r"""
import logging, io
warnings = io.StringIO()
logging.getLogger("opentelemetry").addHandler(logging.StreamHandler(warnings))
pipeline.wait_built(30)
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(provider)
with trace.get_tracer("app").start_as_current_span("app.own"):
    pass
import torchelastic_otel
torchelastic_otel.flush()
first_line["app_spans"] = sorted(s.name for s in exporter.get_finished_spans())
first_line["global_is_app"] = trace.get_tracer_provider() is provider
first_line["bridge_kept_its_own"] = torchelastic_otel.get_pipeline().tracer_provider is not provider
first_line["warnings"] = warnings.getvalue()
print(json.dumps(first_line))
"""
    )
    with OtlpReceiver() as rx:
        got = run(code, worker_env(rx))
        assert got["app_spans"] == ["app.own"] and got["global_is_app"] and got["bridge_kept_its_own"], got
        assert "Overriding" not in got["warnings"]
        assert rx.wait_for(lambda r: worker_start(r), timeout=30), rx.requests


def test_with_a_prometheus_exporter_the_pipeline_is_ready_at_the_first_line() -> None:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        base = sock.getsockname()[1]
    port = base + 1 + 1  # the worker's port: base + 1 + LOCAL_RANK
    code = (
        FIRST_LINE
        + rf"""
import urllib.request
first_line["status"] = urllib.request.urlopen("http://127.0.0.1:{port}/metrics", timeout=10).status
print(json.dumps(first_line))
import os
os._exit(0)
"""
    )
    env = worker_env(None, OTEL_METRICS_EXPORTER="prometheus", OTEL_TRACES_EXPORTER="none",
                     OTEL_LOGS_EXPORTER="none", OTEL_EXPORTER_PROMETHEUS_PORT=str(base))  # fmt: skip
    got = run(code, env)
    assert got["phase"] == "ready" and got["status"] == 200


@pytest.mark.parametrize("record", [False, True], ids=["quiet", "one-event"])
def test_a_worker_that_exits_at_once_delivers_at_exit(record: bool) -> None:
    """A normal exit at once, the pipeline perhaps still being built: the build is waited for before the
    interpreter shuts down (whose thread pools refuse work by the time ``atexit`` handlers run), so the worker span
    and the event arrive."""
    code = FIRST_LINE
    if record:
        code += (
            "from torch.distributed.elastic import events\n"
            "events.record(events.Event('trainer.done', events.EventSource.WORKER), destination='otel')\n"
        )
    code += "print(json.dumps(first_line))\n"
    with OtlpReceiver() as rx:
        # No agent here to hand the span to, so the exit waits for the build, within the exit bound: a generous one,
        # as on a loaded 2-core machine the build alone can take over a second; what is tested is the delivery.
        got = run(code, worker_env(rx, TORCHELASTIC_OTEL_EXIT_TIMEOUT_MILLIS="10000"))
        assert got["installed"] is True
        assert rx.wait_for(lambda r: worker_start(r) and (not record or r.logs("trainer.done")), timeout=30), (
            rx.requests
        )


def test_an_exit_that_waits_for_the_build_waits_for_what_waited_for_it() -> None:
    """The build's READY callbacks (a worker's ``torchelastic.worker.start`` span, the final words' logger) run in
    the builder thread after the phase turned READY; an exit that waited for the build must not shut the providers
    down under them. A callback that takes its time (0.5 s, as on a loaded machine) still gets its span out: the
    exit's wait covers it. (Once it did not: the worker span was lost at random on a busy CI machine.)"""
    code = r"""
import json, sys, time
import torchelastic_otel._process.runtime  # the exit handlers, registered when a build starts
from torchelastic_otel import pipeline

def late_span():
    time.sleep(0.5)
    pipeline.get_pipeline().tracer_provider.get_tracer("test").start_span("app.after_ready").end()

pipeline.when_ready(late_span)
print(json.dumps({"started": pipeline.start_building()}))
"""
    with OtlpReceiver() as rx:
        env = worker_env(rx, TORCHELASTIC_OTEL_EXIT_TIMEOUT_MILLIS="10000")
        del env[AUTO_INSTALL_ENV]  # a plain interpreter: the build is the script's own
        got = run(code, env)
        # Python 3.12.0-3.12.1 build at once, in the caller's thread (``_compat.threads_start_at_exit``): there the
        # callback ran before the script's exit; the span must arrive all the same.
        assert got["started"] is _compat.threads_start_at_exit()
        assert rx.wait_for(lambda r: r.spans("app.after_ready"), timeout=30), rx.requests


def test_a_worker_that_exits_mid_build_hands_its_span_over_and_stays_quiet(tmp_path: Any) -> None:
    """A worker of a bridged agent (a failure directory in its environment) that exits while its pipeline is still
    being built does not wait for the build: its span goes to the agent as a file. The abandoned build goes on in
    its thread while the interpreter shuts down (here during the application's own slow exit handler), where its
    steps fail; it must not print false configuration warnings ("ignoring OTEL_TRACES_SAMPLER (cannot schedule new
    futures after interpreter shutdown)") into the worker's stderr. Without the fix 2 runs in 3 printed them."""
    code = FIRST_LINE + (
        "import atexit, time\n"
        "atexit.register(time.sleep, 0.5)  # the application's own slow exit handler\n"
        "print(json.dumps(first_line))\n"
    )
    env = worker_env("http://127.0.0.1:9", TORCHELASTIC_OTEL_FAILURE_DIR=str(tmp_path),
                     TORCHELASTIC_OTEL_SETUP_DELAY_MILLIS="0")  # build at once: the exit lands mid-build  # fmt: skip
    if not _compat.threads_start_at_exit():
        pytest.skip("this Python builds a worker's pipeline at once (3.12.0-3.12.1): no worker exits mid-build")
    handed = 0
    for _ in range(4):
        result = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True,
                                timeout=TIMEOUT, stdin=subprocess.DEVNULL)  # fmt: skip
        assert result.returncode == 0, result.stderr[-3000:]
        assert "torchelastic_otel" not in result.stderr, result.stderr[-3000:]
        for file in tmp_path.glob("final-*.json"):
            assert json.loads(file.read_text())["span"] == "torchelastic.worker.start"
            handed += 1
            file.unlink()
    assert handed, "no worker exited mid-build: the case was not exercised"


#: What a worker of a bridged agent has of the SDK: ``sdk`` is whether any of its modules was imported.
SDK_STATE = r"""
def sdk_state():
    return {"phase": pipeline.state.phase.value, "sdk": any(m.startswith("opentelemetry.sdk") for m in sys.modules)}
"""


@needs_a_deferred_build
@pytest.mark.parametrize("outgrow", ["metric", "records"])
def test_a_worker_of_a_bridged_agent_builds_once_its_exit_could_not_hand_over(tmp_path: Any, outgrow: str) -> None:
    """With an agent to send what it leaves behind (a failure directory), a worker defers its build: its start-up
    imports neither the SDK nor an exporter, in any thread, and an event and a few log records do not change that
    (an exit would hand them to the agent). A metric value (which cannot be handed over), or more records than an
    exit hands over, starts the build at once (the delay here is a minute), in the background; the event, the
    records, the value and the worker span arrive."""
    more = (
        "from torchelastic_otel import metrics\n"
        "metrics.configure(metrics.OtelMetricHandler(), 'trainer')\n"
        "metrics.put_metric('trainer.value', 3, 'trainer')\n"
        if outgrow == "metric"
        else "for i in range(300):\n    logging.getLogger('trainer').warning('line %d', i)\n"
    )
    code = (
        FIRST_LINE
        + SDK_STATE
        + r"""
import logging, time
logging.basicConfig(level=logging.INFO)
time.sleep(0.3)  # the script's own start-up: the builder thread waits meanwhile
first_line["before"] = sdk_state()
from torchelastic_otel import events
events.record(events.Event("trainer.first", events.EventSource.WORKER), destination="otel")
for i in range(5):
    logging.getLogger("trainer").warning("early %d", i)
time.sleep(0.5)  # several of the builder's looks at the buffers
first_line["recorded"] = sdk_state()
"""
        + more
        + r"""
deadline = time.monotonic() + 60
while pipeline.state.phase.value != "ready" and time.monotonic() < deadline:
    time.sleep(0.05)
first_line["after"] = sdk_state()
"""
    )

    def arrived(r: OtlpReceiver) -> Any:
        if not (r.logs("trainer.first") and worker_start(r)):
            return False
        bodies = [str(rec.get("body")) for rec in r.logs()]
        if not any("early 4" in body for body in bodies):
            return False
        if outgrow == "metric":
            return r.metric_points("trainer.value")
        return any("line 299" in body for body in bodies)

    with OtlpReceiver() as rx:
        env = worker_env(rx, TORCHELASTIC_OTEL_FAILURE_DIR=str(tmp_path), TORCHELASTIC_OTEL_SETUP_DELAY_MILLIS="60000",
                         OTEL_METRIC_EXPORT_INTERVAL="200")  # fmt: skip
        got, ok = run_until_received(code, env, rx, arrived)
        assert got["phase"] == "building" and got["builder"], got
        assert got["before"] == {"phase": "building", "sdk": False}, got
        assert got["recorded"] == {"phase": "building", "sdk": False}, got
        assert got["after"] == {"phase": "ready", "sdk": True}, got
        assert ok, rx.requests
    assert not list(tmp_path.glob("final-*.json"))  # the worker sent its span and records itself


@needs_a_deferred_build
def test_a_worker_of_a_bridged_agent_that_records_nothing_builds_once_the_delay_is_over(tmp_path: Any) -> None:
    """A silent worker builds after ``TORCHELASTIC_OTEL_SETUP_DELAY_MILLIS`` all the same, so a long-lived rank's
    own span goes out (and its final words later find a pipeline)."""
    code = FIRST_LINE + SDK_STATE + "first_line['before'] = sdk_state()\n"
    with OtlpReceiver() as rx:
        env = worker_env(rx, TORCHELASTIC_OTEL_FAILURE_DIR=str(tmp_path), TORCHELASTIC_OTEL_SETUP_DELAY_MILLIS="300")
        got, arrived = run_until_received(code, env, rx, lambda r: len(worker_start(r)) == 1)
        assert got["before"] == {"phase": "building", "sdk": False}, got
        assert arrived, rx.requests
        assert "torchelastic.delivered_by" not in worker_start(rx)[0]["attributes"]


@needs_a_deferred_build
def test_a_worker_of_a_bridged_agent_that_ends_early_builds_nothing(tmp_path: Any) -> None:
    """A worker that ends within the delay, having recorded nothing, never builds (no SDK import even at exit, no
    output on stderr): its start span is left for the agent."""
    code = (
        FIRST_LINE
        + SDK_STATE
        + r"""
import atexit
atexit.register(lambda: print(json.dumps(sdk_state()), flush=True))  # runs after the bridge's exit hooks
"""
    )
    result = run_worker(code, worker_env("http://127.0.0.1:9", TORCHELASTIC_OTEL_FAILURE_DIR=str(tmp_path)))
    assert last_json(result) == {"phase": "unset", "sdk": False}, result.stdout
    assert result.stderr == "", result.stderr[-3000:]
    files = list(tmp_path.glob("final-*.json"))
    assert [json.loads(f.read_text())["span"] for f in files] == ["torchelastic.worker.start"]


@needs_a_deferred_build
def test_a_worker_that_logs_and_ends_early_leaves_its_records_to_its_agent(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker of a bridged agent that logs (Python ``logging``, an exception too) and records an event, then
    ends before its pipeline was built, does not wait for the build: its records are kept for its agent, which
    sends them through its own exporters (here: the bridge's providers over OTLP/gRPC to a receiver on 127.0.0.1)
    as OpenTelemetry's logging handler would have -- body, severity, ``code.*``, ``exception.*`` -- under the
    worker's resource and the agent's attempt span."""

    code = (
        FIRST_LINE
        + SDK_STATE
        + r"""
import atexit, logging
logging.basicConfig(level=logging.INFO)
logging.getLogger("trainer").warning("about to fail on %s", "rank 1")
try:
    raise ValueError("bad batch")
except ValueError:
    logging.getLogger("trainer").exception("step failed")
from torchelastic_otel import events
events.record(events.Event("trainer.early", events.EventSource.WORKER), destination="otel")
atexit.register(lambda: print(json.dumps(sdk_state()), flush=True))  # runs after the bridge's exit hooks
"""
    )
    result = run_worker(code, worker_env("http://127.0.0.1:9", TORCHELASTIC_OTEL_FAILURE_DIR=str(tmp_path)))
    assert last_json(result) == {"phase": "unset", "sdk": False}, result.stdout
    assert len(list(tmp_path.glob("final-*.json"))) == 4  # the span, two log records, the event

    with OtlpReceiver() as rx:
        use_otlp(monkeypatch, rx, pace={})
        with delivered_by_agent(tmp_path) as (delivered, _resource):
            assert delivered == 4
            arrived = lambda r: len(r.logs()) >= 3 and worker_start(r)  # noqa: E731
            assert rx.wait_for(arrived, timeout=30), rx.requests
        by_body = {str(r["body"]): r for r in rx.logs()}
        warning, failed = by_body["about to fail on rank 1"], by_body["step failed"]
        line = 1 + next(i for i, text in enumerate(code.splitlines()) if "about to fail" in text)
        assert warning["severity_number"] == 13 and warning["attributes"]["code.line.number"] == line, warning
        assert failed["attributes"]["exception.type"] == "ValueError", failed
        assert failed["attributes"]["exception.message"] == "bad batch", failed
        assert "ValueError: bad batch" in failed["attributes"]["exception.stacktrace"], failed
        assert rx.logs("trainer.early"), rx.logs()
        for record in (warning, failed, rx.logs("trainer.early")[0]):
            assert record["attributes"]["torchelastic.delivered_by"] == "agent", record
            assert record["resource"]["torchelastic.rank"] == 1, record
            assert record["trace_id"] == "0af7651916cd43dd8448eb211c80319c", record  # the agent's attempt
    assert not list(tmp_path.glob("final-*.json"))


@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="the process start is read from /proc (Linux)")
def test_the_worker_span_never_starts_before_the_process_does() -> None:
    """The worker span's start is the process's (``/proc/<pid>/stat``, whole clock ticks): never before the moment
    its parent started it, which an agent that starts its workers within a tick of opening the attempt span would
    otherwise see as a worker span starting before its parent. Eight interpreters, each asked right away."""
    code = (
        "from torchelastic_otel._torch.worker.hooks import _process_start_ns as s; import time; "
        "print(s(), time.time_ns())"
    )
    env = clean_env()
    for _ in range(8):
        before = time.time_ns()
        out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                             timeout=TIMEOUT, stdin=subprocess.DEVNULL)  # fmt: skip
        start, now = (int(x) for x in out.stdout.split())
        assert before <= start <= now, (before, start, now, out.stderr)
