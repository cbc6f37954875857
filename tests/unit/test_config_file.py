"""``OTEL_CONFIG_FILE`` (``_export.config_file``, ``_export.providers``) and distros (``_export.distro``) in one
process: providers built from a real file through ``opentelemetry-configuration``, what the bridge adds to them,
and what a broken file does."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from torchelastic_otel import _settings
from torchelastic_otel._export import config_file, distro, providers

pytest.importorskip("opentelemetry.configuration")

GOOD = """\
file_format: "1.0"
resource:
  attributes:
    - name: service.name
      value: ${UT_SERVICE:-from-file}
    - name: deployment.environment
      value: test
tracer_provider:
  sampler:
    always_off: {}
  processors:
    - batch:
        schedule_delay: 100
        exporter:
          otlp_grpc:
            endpoint: http://127.0.0.1:1
            timeout: 500
meter_provider:
  readers:
    - periodic:
        interval: 60000
        exporter:
          console: {}
    - pull:
        exporter:
          prometheus/development:
            port: 9700
logger_provider:
  processors:
    - batch:
        exporter:
          console: {}
"""


@pytest.fixture(autouse=True)
def _fresh(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in ("OTEL_CONFIG_FILE", "RANK", "LOCAL_RANK", "TORCHELASTIC_RUN_ID", "OTEL_RESOURCE_ATTRIBUTES",
                 "OTEL_SERVICE_NAME", "OTEL_TRACES_SAMPLER", _settings.DISTRO_FOUND.name):  # fmt: skip
        monkeypatch.delenv(name, raising=False)
    config_file._reset_for_tests()
    distro._reset_for_tests()
    yield
    config_file._reset_for_tests()
    distro._reset_for_tests()


def _write(tmp_path: Path, text: str, name: str = "otel.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_unset_or_blank_is_not_used(monkeypatch: pytest.MonkeyPatch) -> None:
    assert not providers.from_file() and config_file.path() is None and not config_file.refused()
    monkeypatch.setenv("OTEL_CONFIG_FILE", "  ")
    assert not providers.from_file() and config_file.path() is None


def test_resource_is_the_files_over_the_torchrun_attributes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_CONFIG_FILE", str(_write(tmp_path, GOOD)))
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job-7")
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "ignored.attr=1")  # the file covers the resource
    monkeypatch.setenv("UT_SERVICE", "svc-from-env")  # ${UT_SERVICE:-from-file} substitution
    attributes = dict(providers.resource().attributes)
    assert attributes["service.name"] == "svc-from-env"
    assert attributes["deployment.environment"] == "test"
    assert attributes["torchelastic.rank"] == 3 and attributes["torchelastic.run_id"] == "job-7"
    assert attributes["process.pid"] == os.getpid()
    assert "ignored.attr" not in attributes


def test_service_name_defaults_to_the_bridges(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_CONFIG_FILE", str(_write(tmp_path, 'file_format: "1.0"\n')))
    assert providers.resource().attributes["service.name"] == providers.DEFAULT_SERVICE_NAME


def test_providers_from_the_file_are_the_bridges(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Sampler and exporters from the file (``OTEL_TRACES_SAMPLER`` ignored), in the bridge's bounded provider
    classes with counting batch processors; a shutdown with the collector down returns within the exit bound."""
    monkeypatch.setenv("OTEL_CONFIG_FILE", str(_write(tmp_path, GOOD)))
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "always_on")
    resource = providers.resource()
    tracer_provider = providers.build_tracer_provider(resource)
    assert isinstance(tracer_provider, providers._Bounded)
    sampler = getattr(tracer_provider, "sampler", None)
    assert sampler is not None and sampler.get_description() == "AlwaysOffSampler"
    [processor] = providers.processors(tracer_provider)
    assert type(processor).__name__ == "_CountingBatchSpanProcessor"
    assert type(processor._batch_processor._exporter).__name__ == "OTLPSpanExporter"
    logger_provider = providers.build_logger_provider(resource)
    assert isinstance(logger_provider, providers._Bounded) and len(providers.processors(logger_provider)) == 1
    meter_provider = providers.build_meter_provider(resource, pull=False)  # the Prometheus reader left out
    assert [type(r).__name__ for r in providers.readers(meter_provider)] == ["PeriodicExportingMetricReader"]
    # a sampled span to a collector that is not there: shutdown within the exit bound all the same
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.sampling import ALWAYS_ON

    sampled = TracerProvider(sampler=ALWAYS_ON, shutdown_on_exit=False)
    sampled.add_span_processor(processor)
    sampled.get_tracer("t").start_span("s").end()
    started = time.monotonic()
    for provider in (tracer_provider, logger_provider, meter_provider):
        provider.shutdown()
    assert time.monotonic() - started < 3 * _settings.EXIT_TIMEOUT_MILLIS / 1000 + 1.0


def test_each_worker_gets_its_own_prometheus_port(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_CONFIG_FILE", str(_write(tmp_path, GOOD)))
    section = config_file.load().meter_provider
    ports = lambda s: [r.pull.exporter.prometheus_development.port for r in s.readers if r.pull]  # noqa: E731
    assert ports(config_file._meter_section(section, pull=True)) == [9700]  # the agent
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert ports(config_file._meter_section(section, pull=True)) == [9702]
    assert ports(config_file._meter_section(section, pull=False)) == []


def test_disabled_exports_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_CONFIG_FILE", str(_write(tmp_path, GOOD.replace('"1.0"\n', '"1.0"\ndisabled: true\n'))))
    provider = providers.build_tracer_provider(providers.resource())
    assert providers.processors(provider) == []


@pytest.mark.parametrize(
    ("text", "fault"),
    [
        ('file_format: "1.0"\ntracer_provider: {processors: [\n', "Failed to parse YAML"),
        ('file_format: "1.0"\ntracer_provider:\n  processors: 5\n', "does not match schema"),
        ('file_format: "7.0"\n', "Unsupported file_format"),
        (None, "not found"),
    ],
)
def test_a_broken_file_is_one_line_and_refused(
    text: str | None, fault: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    path = tmp_path / "broken.yaml"
    if text is not None:
        path.write_text(text)
    monkeypatch.setenv("OTEL_CONFIG_FILE", str(path))
    with caplog.at_level(logging.DEBUG):
        assert config_file.refused() is True
        assert config_file.refused() is True  # asked again: no second line
        with pytest.raises(config_file.ConfigFileError) as raised:
            providers.resource()
    assert raised.value.reported
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1, lines
    assert str(path) in lines[0] and fault in lines[0] and "telemetry is off" in lines[0]
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]  # the loader's traceback is not logged


def test_a_worker_says_nothing_of_a_broken_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    """Its agent said it: a worker (torchrun's variables) counts it and exports nothing, silently."""
    monkeypatch.setenv("OTEL_CONFIG_FILE", str(tmp_path / "missing.yaml"))
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "r")
    with pytest.raises(config_file.ConfigFileError):
        providers.build_tracer_provider(None)
    assert capsys.readouterr().err == ""


def test_the_pipeline_of_a_broken_file_is_a_noop(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    from torchelastic_otel._export import state

    monkeypatch.setenv("OTEL_CONFIG_FILE", str(tmp_path / "missing.yaml"))
    pipeline = state._build()
    assert type(pipeline.tracer_provider).__name__ == "NoOpTracerProvider"
    assert len(capsys.readouterr().err.splitlines()) == 1


def test_no_distro_where_the_agent_found_none(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(_settings.DISTRO_FOUND.name, "0")
    monkeypatch.delitem(__import__("sys").modules, distro._AUTO_INSTRUMENTATION, raising=False)
    assert distro._worth_looking() is False
    monkeypatch.setenv(_settings.DISTRO_FOUND.name, "1")
    assert distro._worth_looking() is True
    assert distro.for_workers() == ("1" if distro.installed() else "0")
    monkeypatch.setitem(__import__("sys").modules, distro._AUTO_INSTRUMENTATION, object())
    assert distro.for_workers() is None  # opentelemetry-instrument's sitecustomize runs it in every worker
    assert distro._worth_looking() is False


def test_torchrun_attributes_reach_a_configurator(monkeypatch: pytest.MonkeyPatch) -> None:
    """While a configurator runs, ``OTEL_RESOURCE_ATTRIBUTES`` carries the torchrun attributes behind the user's
    (``Resource.create`` reads it); afterwards the variable is as it was."""
    from opentelemetry.sdk.resources import Resource

    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "run/1")
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "torchelastic.rank=9,team=ml")
    with distro._torchrun_attributes_in_environment():
        attributes = Resource.create().attributes
    assert attributes["torchelastic.run_id"] == "run/1" and attributes["team"] == "ml"
    assert attributes["torchelastic.rank"] == "9"  # the user's value wins
    assert os.environ["OTEL_RESOURCE_ATTRIBUTES"] == "torchelastic.rank=9,team=ml"


# ---- the private internals these use (``_compat``), pinned: a release that moves them fails here -------------------


def _fallbacks() -> int:
    from torchelastic_otel import _selftelemetry as selftelemetry

    return selftelemetry.total(selftelemetry.FALLBACK)


def test_compat_provider_processors() -> None:
    from opentelemetry.sdk._logs import LoggerProvider
    from opentelemetry.sdk._logs.export import ConsoleLogRecordExporter, SimpleLogRecordProcessor
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor

    from torchelastic_otel import _compat

    before = _fallbacks()
    tracers, loggers = TracerProvider(shutdown_on_exit=False), LoggerProvider(shutdown_on_exit=False)
    span_processor, log_processor = (
        SimpleSpanProcessor(ConsoleSpanExporter()),
        SimpleLogRecordProcessor(ConsoleLogRecordExporter()),
    )
    tracers.add_span_processor(span_processor)
    loggers.add_log_record_processor(log_processor)
    assert _compat.provider_processors(tracers, "traces") == [span_processor]
    assert _compat.provider_processors(loggers, "logs") == [log_processor]
    assert _fallbacks() == before


def test_compat_auto_instrumentation_loaders() -> None:
    from torchelastic_otel import _compat

    pytest.importorskip("opentelemetry.instrumentation")
    loaders = _compat.auto_instrumentation_loaders()
    assert loaders is not None and [f.__name__ for f in loaders] == ["_load_distro", "_load_configurators"]


@pytest.mark.parametrize(
    "text", [GOOD, 'file_format: "1.0"\ntracer_provider:\n  processors: 5\n', 'file_format: "9.0"\n']
)
def test_compat_declarative_load_is_load_config_file(text: str, tmp_path: Path) -> None:
    """The same model, or the same error, as the package's ``load_config_file``, without a fallback."""
    from opentelemetry.configuration import ConfigurationError, load_config_file

    from torchelastic_otel import _compat

    path = str(_write(tmp_path, text))
    before = _fallbacks()
    try:
        expected: object = load_config_file(path)
    except ConfigurationError as exc:
        expected = str(exc)
    try:
        got: object = _compat.declarative_load(path)
    except ConfigurationError as exc:
        got = str(exc)
    assert got == expected
    assert _fallbacks() == before
