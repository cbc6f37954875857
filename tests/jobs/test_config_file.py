"""``OTEL_CONFIG_FILE`` and installed distros, on every route of the bridge, in real torchrun jobs.

Each job runs 2 ranks of a silent worker script (gloo, one ``all_reduce``; it never imports the bridge). A declarative
configuration file (``docs/config-file.md``) configures the agent and every worker:

- OTLP over gRPC to the loopback receiver, on the three routes (``torchelastic-otel run``, ``opentelemetry-instrument
  torchrun``, a custom launcher calling ``install()``); over HTTP with a header the receiver must see; OTLP JSON
  Lines files that ``torchelastic-otel report`` renders; a sampler that samples nothing (no spans, the logs and
  metrics still flow). Each is compared with the same settings given as ``OTEL_*``: the same span names, metric
  names and resource attributes, per process kind.
- an invalid file: one error line on stderr naming the file and the fault, no traceback, and the job ends as under
  plain torchrun (exit code, the workers' output).
- a distro and configurator installed (``tests/support/distro_pkg``, pip-installed into a temporary directory put on
  the job's ``PYTHONPATH``: the project's venv stays untouched): its resource attribute is on the agent's and every
  worker's telemetry, on every route.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from tests.support import ROOT
from tests.support.env import files_env, otlp_env, plain_env
from tests.support.jobs import OTEL_INSTRUMENT, TORCHELASTIC_OTEL, TORCHRUN, c10d_args, is_worker, unique_id
from tests.support.otlp_receiver import OtlpReceiver
from tests.support.procs import Job, run_job
from torchelastic_otel._torch.output.records import SCOPE as OUTPUT_SCOPE

pytest.importorskip("torch.distributed.elastic.agent.server.local_elastic_agent")
pytest.importorskip("opentelemetry.configuration")

LAUNCHER = ROOT / "examples" / "my_launcher.py"
DISTRO_PKG = ROOT / "tests" / "support" / "distro_pkg"
ROUTES = ("run", "instrument", "launcher")
JOB_TIMEOUT = 120.0
WAIT = 30.0
#: Resource attributes that differ between any two processes or runs (compared by presence only).
VARYING = {"process.pid", "torchelastic.run_id", "host.name"}


def _detected(key: str) -> bool:
    """An attribute of the SDK's default resource detectors (``Resource.create``: ``service.instance.id``, the
    ``process.*`` attributes): a configuration file's resource has them only if it lists the detectors."""
    return key == "service.instance.id" or (key.startswith("process.") and key != "process.pid")


WORKER = '''\
"""Silent: never imports the bridge. One all_reduce over gloo, one line of output, 30 barriers."""
import os
import time
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
value = torch.ones(1)
dist.all_reduce(value)
print(f"rank {os.environ['RANK']} sum {value.item():.0f}", flush=True)
for _ in range(30):  # ~3 s of a training job's life: long enough for a worker's pipeline to be built
    dist.barrier()
    time.sleep(0.1)
dist.destroy_process_group()
'''

HEADER = ("x-platform-token", "s3cret")


def _config(exporter: str, sampler: str = "always_on") -> str:
    """A configuration file for all three signals, every exporter given as ``exporter`` (a YAML flow mapping with
    ``${SIGNAL}`` where the signal's name goes), fast batches, ``service.name`` from ``${CF_SERVICE}``."""
    sections = {
        "tracer_provider": f"""\
tracer_provider:
  sampler:
    {sampler}: {{}}
  processors:
    - batch:
        schedule_delay: 200
        exporter: {exporter.replace("${SIGNAL}", "traces")}
""",
        "meter_provider": f"""\
meter_provider:
  readers:
    - periodic:
        interval: 1000
        exporter: {exporter.replace("${SIGNAL}", "metrics")}
""",
        "logger_provider": f"""\
logger_provider:
  processors:
    - batch:
        schedule_delay: 200
        exporter: {exporter.replace("${SIGNAL}", "logs")}
""",
    }
    return (
        'file_format: "1.0"\nresource:\n  attributes:\n    - name: service.name\n      value: ${CF_SERVICE}\n'
        + "".join(sections.values())
    )


def _command(route: str, run_id: str, worker: Path) -> list[str]:
    if route == "launcher":
        return [sys.executable, str(LAUNCHER), "--nproc-per-node", "2", "--run-id", run_id, str(worker)]
    torchrun = [str(TORCHRUN)] if route in ("instrument", "plain") else [str(TORCHELASTIC_OTEL), "run"]
    prefix = [str(OTEL_INSTRUMENT)] if route == "instrument" else []
    return [*prefix, *torchrun, "--nproc-per-node", "2", *c10d_args(run_id), "--max-restarts", "0", str(worker)]


@pytest.fixture(scope="module")
def worker(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("worker") / "silent_worker.py"
    path.write_text(WORKER)
    return path


def _run(route: str, env: dict[str, str], base: Path, worker: Path) -> Job:
    run_id = unique_id(f"cf-{route}")
    base.mkdir(parents=True, exist_ok=True)
    return run_job(_command(route, run_id, worker), env, ROOT, base / f"{route}.log", timeout=JOB_TIMEOUT)


#: A worker shorter-lived than its deferred pipeline build (2 s by default, then the build itself: ~0.35 s from
#: ``OTEL_*``, ~0.5 s from a file) hands its span and records to its agent and never exports its own metrics (the
#: observable gauges): by design, a short worker does not pay the build. The workers here build at once and live ~3 s,
#: so that each configuration source is compared on every process, whatever the machine's load.
BUILD_AT_ONCE = {"TORCHELASTIC_OTEL_SETUP_DELAY_MILLIS": "0"}


def _otel_env(rx: OtlpReceiver, protocol: str = "grpc", **extra: str) -> dict[str, str]:
    otel = dict(OTEL_SERVICE_NAME="cf-test", OTEL_TRACES_EXPORTER="otlp", OTEL_METRICS_EXPORTER="otlp",
                OTEL_LOGS_EXPORTER="otlp", **BUILD_AT_ONCE)  # fmt: skip
    return otlp_env(rx, protocol, **{**otel, **extra})


def _file_env(config: Path, **extra: str) -> dict[str, str]:
    """The job's environment with ``OTEL_CONFIG_FILE``, and ``OTEL_*`` that point elsewhere (a closed port, another
    service name, no sampling): the file must win."""
    elsewhere = dict(OTEL_CONFIG_FILE=str(config), CF_SERVICE="cf-test", OTEL_SERVICE_NAME="ignored",
                     OTEL_TRACES_SAMPLER="always_off", **BUILD_AT_ONCE)  # fmt: skip
    return otlp_env("http://127.0.0.1:9", **{**elsewhere, **extra})


def _kind(item: dict[str, Any]) -> str:
    return "worker" if is_worker(item) else "agent"


def _shape(items: Iterable[dict[str, Any]], name: str = "name") -> dict[str, set[str]]:
    """Per process kind: the names, and the resource attribute keys (values of the ones that do not vary)."""
    shape: dict[str, set[str]] = {}
    for item in items:
        kind = _kind(item)
        shape.setdefault(f"{kind} names", set()).add(str(item[name]))
        for key, value in item["resource"].items():
            if _detected(key):
                continue
            shape.setdefault(f"{kind} resource", set()).add(key if key in VARYING else f"{key}={value}")
    return shape


def _telemetry(rx: OtlpReceiver) -> dict[str, Any]:
    return {"spans": _shape(rx.spans()), "metrics": _shape(rx.metric_points()),
            "logs": _shape(rx.logs(), "event_name")}  # fmt: skip


def _settled(rx: OtlpReceiver, job: Job, spans: bool = True) -> None:
    """Wait until both ranks' and the agent's telemetry arrived (metrics from every process; spans unless the
    sampler drops them all)."""

    def done(r: OtlpReceiver) -> bool:
        kinds = {(_kind(p), p["resource"].get("torchelastic.rank")) for p in r.metric_points()}
        logs = {_kind(p) for p in r.logs()}
        have_spans = not spans or {_kind(s) for s in r.spans()} == {"agent", "worker"}
        return {("agent", None), ("worker", 0), ("worker", 1)} <= kinds and logs == {"agent", "worker"} and have_spans

    assert rx.wait_for(done, timeout=WAIT), f"telemetry missing: {rx.requests}\n{job.tail()}"
    # the last periodic exports and flushes of every process at exit are in by now; one more interval for stragglers
    count = rx.requests
    rx.wait_for(lambda r: r.requests != count, timeout=1.5)


def _job_ok(job: Job) -> None:
    assert job.returncode == 0, job.tail()
    assert "Traceback" not in job.output(), job.tail()


def _compare(file_telemetry: dict[str, Any], env_telemetry: dict[str, Any]) -> None:
    for signal in ("spans", "metrics", "logs"):
        assert file_telemetry[signal] == env_telemetry[signal], signal


# ---- over gRPC, on every route ------------------------------------------------------------------------------------


@pytest.mark.parametrize("route", ROUTES)
def test_grpc_from_the_file_on_every_route(route: str, worker: Path, tmp_path: Path) -> None:
    """The file's OTLP gRPC exporters, batch settings and resource configure the agent and both workers; the
    ``OTEL_*`` it covers (endpoint, service name, sampler) are ignored; the same settings as ``OTEL_*`` give the
    same span names, metric names, log events and resource attributes."""
    with OtlpReceiver() as rx:
        config = tmp_path / "otel.yaml"
        config.write_text(_config("{otlp_grpc: {endpoint: 'http://127.0.0.1:${CF_GRPC_PORT}'}}"))
        job = _run(route, _file_env(config, CF_GRPC_PORT=str(rx.grpc_port)), tmp_path / "file", worker)
        _job_ok(job)
        _settled(rx, job)
        from_file = _telemetry(rx)
        assert {r.transport for r in rx.raw_requests()} == {"grpc"}
        rx.clear()
        job = _run(route, _otel_env(rx), tmp_path / "env", worker)
        _job_ok(job)
        _settled(rx, job)
        from_env = _telemetry(rx)
    assert "service.name=cf-test" in from_file["spans"]["worker resource"]
    assert {"torchelastic.rank=0", "torchelastic.rank=1"} <= from_file["metrics"]["worker resource"]
    _compare(from_file, from_env)


# ---- over HTTP with a header -------------------------------------------------------------------------------------


def test_http_with_a_header(worker: Path, tmp_path: Path) -> None:
    """OTLP over HTTP with a header from the file: every request of every process carries it."""
    with OtlpReceiver() as rx:
        config = tmp_path / "otel.yaml"
        exporter = ("{otlp_http: {endpoint: 'http://127.0.0.1:${CF_HTTP_PORT}/v1/${SIGNAL}', "
                    f"headers: [{{name: {HEADER[0]}, value: '${{CF_TOKEN}}'}}]}}}}")  # fmt: skip
        config.write_text(_config(exporter))
        env = _file_env(config, CF_HTTP_PORT=str(rx.http_port), CF_TOKEN=HEADER[1])
        job = _run("run", env, tmp_path / "file", worker)
        _job_ok(job)
        _settled(rx, job)
        from_file = _telemetry(rx)
        requests = rx.raw_requests()
        assert {r.transport for r in requests} == {"http"}
        assert all(r.headers.get(HEADER[0]) == HEADER[1] for r in requests), {
            r.headers.get(HEADER[0]) for r in requests
        }
        rx.clear()
        env = _otel_env(rx, "http/protobuf", OTEL_EXPORTER_OTLP_HEADERS=f"{HEADER[0]}={HEADER[1]}")
        job = _run("run", env, tmp_path / "env", worker)
        _job_ok(job)
        _settled(rx, job)
        assert all(r.headers.get(HEADER[0]) == HEADER[1] for r in rx.raw_requests())
        _compare(from_file, _telemetry(rx))


# ---- sampling off ----------------------------------------------------------------------------------------------------


def test_sampler_always_off(worker: Path, tmp_path: Path) -> None:
    """``always_off``: no span from any process; the logs and metrics still flow, as with
    ``OTEL_TRACES_SAMPLER=always_off``."""
    with OtlpReceiver() as rx:
        config = tmp_path / "otel.yaml"
        config.write_text(_config("{otlp_grpc: {endpoint: 'http://127.0.0.1:${CF_GRPC_PORT}'}}", "always_off"))
        env = _file_env(config, CF_GRPC_PORT=str(rx.grpc_port), OTEL_TRACES_SAMPLER="always_on")
        job = _run("run", env, tmp_path / "file", worker)
        _job_ok(job)
        _settled(rx, job, spans=False)
        assert rx.spans() == []
        from_file = _telemetry(rx)
        rx.clear()
        job = _run("run", _otel_env(rx, OTEL_TRACES_SAMPLER="always_off"), tmp_path / "env", worker)
        _job_ok(job)
        _settled(rx, job, spans=False)
        assert rx.spans() == []
        _compare(from_file, _telemetry(rx))


# ---- OTLP JSON Lines files ------------------------------------------------------------------------------------------


def test_otlp_json_files_the_report_renders(worker: Path, tmp_path: Path) -> None:
    """``otlp_file_development`` writes OTLP JSON Lines (one file per process and signal, named with ``${RANK}``
    substitution); ``torchelastic-otel report --json`` renders them as it renders the bridge's own files
    (``OTEL_*_EXPORTER=otlp_json_file``)."""
    pytest.importorskip("opentelemetry.exporter.otlp.json.file")
    files = tmp_path / "files"
    files.mkdir()
    config = tmp_path / "otel.yaml"
    stream = "file://${CF_DIR}/${SIGNAL}-${RANK:-agent}.jsonl"
    config.write_text(_config(f"{{otlp_file_development: {{output_stream: '{stream}'}}}}"))
    job = _run("run", plain_env() | {"OTEL_CONFIG_FILE": str(config), "CF_DIR": str(files), "CF_SERVICE": "cf-test"},
               tmp_path / "file", worker)  # fmt: skip
    _job_ok(job)
    names = sorted(p.name for p in files.iterdir())
    assert {"traces-agent.jsonl", "traces-0.jsonl", "traces-1.jsonl", "metrics-0.jsonl", "logs-agent.jsonl"} <= set(
        names
    ), names
    env_files = tmp_path / "env-files"
    env = files_env(env_files, OTEL_SERVICE_NAME="cf-test")
    _job_ok(_run("run", env, tmp_path / "env", worker))
    from_file, from_env = _report(files), _report(env_files)
    assert from_file == from_env == [("SUCCEEDED", [0, 1], 1, 1, "healthy")], (from_file, from_env)


def _report(files: Path) -> list[tuple[Any, ...]]:
    """What ``torchelastic-otel report --json`` says of a job's files: per run, its outcome, ranks, attempts,
    agents and verdict."""
    done = subprocess.run([str(TORCHELASTIC_OTEL), "report", "--json", str(files)], capture_output=True, text=True,
                          timeout=60, cwd=ROOT)  # fmt: skip
    assert done.returncode == 0, done.stderr
    runs = json.loads(done.stdout)["runs"]
    return [(r["outcome"], r["ranks"], r["attempts"], r["agents"], r["verdict"]["verdict"]) for r in runs]


# ---- an invalid file -------------------------------------------------------------------------------------------------

INVALID = {
    "unparsable": ('file_format: "1.0"\ntracer_provider: {processors: [\n', "Failed to parse YAML"),
    "schema": ('file_format: "1.0"\ntracer_provider:\n  processors: 5\n', "does not match schema"),
}


@pytest.fixture(scope="module")
def plain(worker: Path, tmp_path_factory: pytest.TempPathFactory) -> Job:
    """The same job under plain torchrun."""
    return _run("plain", plain_env(), tmp_path_factory.mktemp("plain"), worker)


@pytest.mark.parametrize(("route", "fault"), [("run", "unparsable"), ("instrument", "schema"), ("launcher", "schema")])
def test_an_invalid_file_is_one_line_and_a_plain_job(route: str, fault: str, plain: Job, worker: Path,
                                                     tmp_path: Path) -> None:  # fmt: skip
    """One line on stderr names the file and the fault; no traceback; the job ends as under plain torchrun, with the
    same exit code and the workers' own output; nothing reaches the endpoint the ``OTEL_*`` name."""
    text, expected = INVALID[fault]
    config = tmp_path / f"broken-{fault}.yaml"
    config.write_text(text)
    with OtlpReceiver() as rx:
        job = _run(route, otlp_env(rx, OTEL_CONFIG_FILE=str(config)), tmp_path / "bridged", worker)
        rx.wait_for(lambda r: sum(r.requests.values()) > 0, timeout=1.0)
        assert sum(rx.requests.values()) == 0
    output = job.output()
    lines = [line for line in output.splitlines() if "OTEL_CONFIG_FILE" in line or "torchelastic_otel" in line]
    assert len(lines) == 1, output
    assert str(config) in lines[0] and expected in lines[0], lines
    assert "Traceback" not in output
    assert job.returncode == plain.returncode == 0
    # the workers' own lines (two processes write to one stdout: a line may be cut by the other's)
    ours, theirs = (sorted(re.findall(r"rank \d sum 2", text)) for text in (output, plain.output()))
    assert ours == theirs and len(ours) == 2, (output, plain.output())


# ---- an installed distro -----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def distro_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``tests/support/distro_pkg`` installed into a temporary target directory (not the project's venv), built
    from a copy (a build leaves ``build/`` and ``*.egg-info`` beside its sources)."""
    target, source = tmp_path_factory.mktemp("distro"), tmp_path_factory.mktemp("distro-src") / "pkg"
    shutil.copytree(DISTRO_PKG, source, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                           "--target", str(target), str(source)], capture_output=True, text=True,
                          timeout=180)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return target


@pytest.mark.parametrize("route", ROUTES)
def test_an_installed_distro_configures_every_process(route: str, distro_path: Path, worker: Path,
                                                      tmp_path: Path) -> None:  # fmt: skip
    """The distro's configurator (found through its entry points on ``PYTHONPATH``) configures the agent and both
    workers on every route: its resource attribute is on every span, point and record of the job (the workers'
    output lines aside, see docs/config-file.md). On the bridge's routes the workers' own resources also name their
    ranks (the bridge runs the configurator with the torchrun attributes in ``OTEL_RESOURCE_ATTRIBUTES``);
    under ``opentelemetry-instrument`` the configurator runs before the bridge, with its own resource."""
    with OtlpReceiver() as rx:
        env = otlp_env(rx)
        env["PYTHONPATH"] = ":".join(p for p in (str(distro_path), env.get("PYTHONPATH", "")) if p)
        job = _run(route, env, tmp_path, worker)
        assert job.returncode == 0, job.tail()
        assert "Traceback" not in job.output(), job.tail()

        def settled(r: OtlpReceiver) -> bool:
            return len(r.spans("torchelastic.run")) == 1 and len(r.spans("torchelastic.worker.start")) == 2

        assert rx.wait_for(settled, timeout=WAIT), f"telemetry missing: {rx.requests}\n{job.tail()}"
        rx.wait_for(lambda r: False, timeout=1.5)  # the last exports of the processes' exits
        # not the workers' output lines: the output-capture process builds its providers itself (docs/config-file.md)
        items = [*rx.spans(), *rx.metric_points(), *(r for r in rx.logs() if r["scope"] != OUTPUT_SCOPE)]
        own = {
            str(p["resource"].get("torchelastic.rank")) for p in rx.metric_points() if "test.distro" in p["resource"]
        }
    assert {item["resource"].get("test.distro") for item in items} == {"yes"}
    assert {s["name"] for s in rx.spans()} >= {"torchelastic.run", "torchelastic.attempt"}
    # A worker that ends before its pipeline is built hands its telemetry to its agent (final words), which sends it
    # with the agent's configurator's resource: only the workers' own telemetry names their ranks.
    if route != "instrument":
        assert own <= {"None", "0", "1"} and "None" in own, own
