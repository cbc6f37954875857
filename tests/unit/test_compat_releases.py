"""The package on every release it declares: what differs between releases of OpenTelemetry and torch.

``make test-compat`` runs this file (with the torchrun, worker and mapping tests) in venvs with the oldest and the
newest releases of each declared range; ``make test`` runs it with the main venv's. Each test fails on some release
if the fix it pins is undone:

- ``opentelemetry-instrumentation`` before 0.63b0 takes its ``sitecustomize`` off ``PYTHONPATH`` for good, so the
  workers of ``opentelemetry-instrument torchrun`` are bridged only because the instrumentor hands them the bridge's
  own bootstrap (end to end: ``tests/jobs/test_torchrun.py::test_opentelemetry_instrument_route``);
- a flush must not collect a reader that the application reads itself: on every SDK the collection's delta points
  are lost, and before SDK 1.45 its synchronous gauges too (they were reported in one collection only);
- the releases installed are inside the ranges ``pyproject.toml`` declares, so what runs here is what is declared.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from importlib import metadata

import pytest
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk.metrics import Counter, MeterProvider
from opentelemetry.sdk.metrics.export import AggregationTemporality, InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from packaging.requirements import Requirement

import torchelastic_otel
from tests.support import ROOT
from tests.support.otel import KEEP_ALIVE, points_of
from torchelastic_otel import metrics, pipeline
from torchelastic_otel.package import _instruments

PYPROJECT = ROOT / "pyproject.toml"


# ---- the declared ranges -----------------------------------------------------------------------------------


def _optional_dependencies(extra: str) -> list[str]:
    """The requirements of ``extra`` in pyproject.toml (``tomllib`` is not in Python 3.10: a one-line list)."""
    found = re.search(rf"^{extra} = \[(.*?)\]", PYPROJECT.read_text(), re.MULTILINE | re.DOTALL)
    assert found, f"no [project.optional-dependencies] {extra} in {PYPROJECT}"
    return re.findall(r'"([^"]+)"', found.group(1))


def test_the_instrumentor_declares_the_torch_range_of_the_torch_extra() -> None:
    """``BaseInstrumentor`` refuses exactly the torch releases that ``pip install torchelastic-otel[torch]`` does."""
    (declared,) = [Requirement(r) for r in _optional_dependencies("torch")]
    (instruments,) = [Requirement(r) for r in _instruments]
    assert (instruments.name, instruments.specifier) == (declared.name, declared.specifier)
    assert "2.8.0" in declared.specifier and "2.15.0" in declared.specifier and "2.7.1" not in declared.specifier


@pytest.mark.parametrize("name", ["opentelemetry-api", "opentelemetry-sdk", "opentelemetry-exporter-otlp", "torch"])
def test_the_installed_release_is_inside_the_declared_range(name: str) -> None:
    requirements = [Requirement(r) for r in metadata.requires("torchelastic-otel") or ()]
    (declared,) = [r for r in requirements if r.name == name]
    try:
        installed = metadata.version(name)
    except metadata.PackageNotFoundError:
        pytest.skip(f"{name} is not installed")
    assert declared.specifier.contains(installed.split("+")[0], prereleases=True), (name, installed, declared)


# ---- opentelemetry-instrument's workers --------------------------------------------------------------------


@pytest.fixture
def no_bridge_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    pytest.importorskip("torch.distributed.elastic.agent.server.local_elastic_agent")
    for var in ("RANK", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_OTEL_AUTO_INSTALL", "TRACEPARENT"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("PYTHONPATH", "/somewhere")
    assert not torchelastic_otel.is_installed(), "another test left the bridge installed"
    yield
    pipeline._reset_for_tests()


def test_the_instrumentor_hands_the_workers_the_bridge(no_bridge_env: None) -> None:
    """``TorchElasticInstrumentor`` (what ``opentelemetry-instrument`` loads in the agent) puts the bridge's bootstrap
    on the workers' ``PYTHONPATH``, whatever the auto-instrumentation ``sitecustomize`` does, and takes it off."""
    from torchelastic_otel._install import AUTO_INSTALL_ENV, BOOTSTRAP_DIR
    from torchelastic_otel._torch.worker_env import worker_environ
    from torchelastic_otel.instrumentation import TorchElasticInstrumentor

    providers = (TracerProvider(), MeterProvider(), LoggerProvider())
    KEEP_ALIVE.extend(providers)
    instrumentor = TorchElasticInstrumentor()
    tracer_provider, meter_provider, logger_provider = providers
    instrumentor.instrument(
        tracer_provider=tracer_provider, meter_provider=meter_provider, logger_provider=logger_provider
    )
    try:
        assert torchelastic_otel.is_installed()
        assert worker_environ()["PYTHONPATH"].split(os.pathsep) == [BOOTSTRAP_DIR, "/somewhere"]
        assert worker_environ()[AUTO_INSTALL_ENV] == "1"
        assert os.environ["PYTHONPATH"] == "/somewhere" and AUTO_INSTALL_ENV not in os.environ  # the agent's own
    finally:
        instrumentor.uninstrument()
    assert not torchelastic_otel.is_installed()
    assert worker_environ() == {}
    assert os.environ["PYTHONPATH"] == "/somewhere" and AUTO_INSTALL_ENV not in os.environ


# ---- a flush and the application's own readers -------------------------------------------------------------


@pytest.fixture
def delta_reader(clean_state: None) -> Iterator[InMemoryMetricReader]:
    """The bridge set up with an application's meter provider whose in-memory reader asks for delta counters."""
    reader = InMemoryMetricReader(preferred_temporality={Counter: AggregationTemporality.DELTA})
    providers = (TracerProvider(), MeterProvider(metric_readers=[reader]), LoggerProvider())
    KEEP_ALIVE.extend(providers)
    torchelastic_otel.setup(*providers)
    metrics.configure(metrics.OtelMetricHandler())
    try:
        yield reader
    finally:
        pipeline._reset_for_tests()


def test_a_flush_leaves_the_applications_reader_its_delta_points_and_gauges(delta_reader: InMemoryMetricReader) -> None:
    metrics.put_metric("samples_total", 5, "app")  # a counter (delta for this reader)
    metrics.put_metric("loss", 0.25, "app")  # a gauge
    assert torchelastic_otel.flush() is True  # drains the bridge's buffers into the SDK
    data = delta_reader.get_metrics_data()  # the application's one collection
    assert [point.value for _, point in points_of(data, "samples_total")] == [5]
    assert [point.value for _, point in points_of(data, "loss")] == [0.25]


# ---- Pythons that start no thread at exit ------------------------------------------------------------------

_AT_EXIT = r"""
import atexit, json, threading
from torchelastic_otel._export import bounded as _bounded
from torchelastic_otel import _compat

_bounded.start_exit_thread()  # as the bridge's exit handlers' registration does

def report():
    try:
        threading.Thread(target=lambda: None).start()
        started = True
    except RuntimeError:
        started = False
    # A flush that would take 5 s, bounded to 0.2 s: None if it was waited for on another thread, bounded.
    bounded = _bounded.run_bounded(lambda: threading.Event().wait(5) or True, 200)
    print(json.dumps({"started": started, "compat": _compat.threads_start_at_exit(), "bounded": bounded}))

atexit.register(report)
"""


@pytest.mark.jobs
def test_what_starts_a_thread_at_exit_is_what_compat_says_and_exit_flushes_stay_bounded() -> None:
    """``_compat.threads_start_at_exit`` is what this Python does in an ``atexit`` handler (False on CPython
    3.12.0-3.12.1, gh-113964); there too an exit flush is waited for at most its bound, on the thread started
    beforehand -- not run to its end in the exiting thread."""
    import json
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _AT_EXIT], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["compat"] == got["started"], got
    assert got["bounded"] is None, got
