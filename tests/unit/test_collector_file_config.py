"""``collector-config/otelcol-file.yaml`` (a job's telemetry into one rotated file, for ``report --follow``) checked
structurally: no Collector binary runs here (``otelcol-contrib`` is not installable on this machine).

Every component is a real Collector component and every option one its config struct accepts (allow-lists below,
from collector-contrib's ``config.go`` of each); the ``file`` exporter passes the exporter's own ``Validate`` rules
and writes what the report reads (JSON, uncompressed, rotated, a name the report finds, rotated names too); the
three signals go into that one exporter (one file); nothing rewrites the resources the report tells processes by;
it listens on 127.0.0.1 unless told; every setting is commented; ``docs/live.md`` shows it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from tests.support import ROOT, stack
from torchelastic_otel.report import otlpjson

yaml = stack.require_yaml()

CONFIG = stack.CONFIG_DIR / "otelcol-file.yaml"
DOCS = ROOT / "docs" / "live.md"

#: Options each component type accepts, from opentelemetry-collector(-contrib)'s config structs.
OPTIONS: dict[str, dict[str, set[str]]] = {
    "receivers": {"otlp": {"protocols"}},
    "processors": {
        "memory_limiter": {
            "check_interval", "limit_mib", "spike_limit_mib", "limit_percentage", "spike_limit_percentage",
        },
        "batch": {"send_batch_size", "send_batch_max_size", "timeout", "metadata_keys", "metadata_cardinality_limit"},
    },
    "exporters": {
        "file": {
            "path", "append", "rotation", "format", "encoding", "compression", "flush_interval", "group_by",
            "create_directory", "directory_permissions",
        },
    },
    "extensions": {"health_check": {"endpoint", "path", "check_collector_pipeline"}},
}  # fmt: skip
ROTATION_OPTIONS = {"max_megabytes", "max_days", "max_backups", "localtime"}
#: Processors that rewrite attributes: the report tells processes by their resources.
REWRITING = {"resource", "attributes", "transform", "groupbyattrs", "k8sattributes"}


@pytest.fixture(scope="module")
def config() -> dict[str, Any]:
    document = yaml.safe_load(CONFIG.read_text())
    assert isinstance(document, dict)
    return document


def component_type(name: str) -> str:
    return name.split("/", 1)[0]


def default(value: str) -> str:
    """``value`` with each ``${env:NAME:-default}`` replaced by its default."""
    return re.sub(r"\$\{env:[A-Z_][A-Z0-9_]*:-([^}]*)\}", r"\1", value)


def test_every_component_is_real_and_every_option_accepted(config: dict[str, Any]) -> None:
    for kind in ("receivers", "processors", "exporters", "extensions"):
        for name, settings in (config.get(kind) or {}).items():
            accepted = OPTIONS[kind].get(component_type(name))
            assert accepted is not None, f"{kind}: {name!r} is none this config may use"
            assert set(settings or {}) <= accepted, f"{kind}.{name}: unknown options {set(settings) - accepted}"
    protocols = config["receivers"]["otlp"]["protocols"]
    assert set(protocols) == {"grpc", "http"} and all(set(p) == {"endpoint"} for p in protocols.values())
    assert set(config["exporters"]["file"]["rotation"]) <= ROTATION_OPTIONS


def test_the_three_signals_go_into_one_file(config: dict[str, Any]) -> None:
    """One ``file`` exporter in every pipeline: the Collector shares its writer, so every signal is in one file."""
    pipelines = config["service"]["pipelines"]
    assert set(pipelines) == {"traces", "metrics", "logs"}
    for name, pipeline in pipelines.items():
        assert pipeline["receivers"] == ["otlp"], name
        assert pipeline["exporters"] == ["file"], name
        processors = pipeline["processors"]
        assert processors[0] == "memory_limiter" and processors[-1] == "batch", name
        assert set(processors) <= set(config["processors"]), name
    assert config["service"]["extensions"] == list(config["extensions"])


def test_the_file_exporter_is_valid_and_writes_what_the_report_reads(config: dict[str, Any], tmp_path: Path) -> None:
    """The exporter's own ``Config.Validate``, then what the report needs: OTLP JSON lines (``proto`` is binary;
    ``zstd`` compresses each line on its own), rotated, under a name the report finds -- and the rotated names too
    (the time stamp before the extension, as the exporter's rotation names them)."""
    exporter = config["exporters"]["file"]
    path = default(exporter["path"])
    # the exporter's Validate()
    assert path
    assert not (exporter.get("append") and exporter.get("compression"))
    assert not (exporter.get("append") and exporter.get("rotation") is not None)
    assert exporter.get("format", "json") in ("json", "proto")
    assert exporter.get("compression", "") in ("", "zstd")
    assert not (exporter.get("group_by") or {}).get("enabled") or path.count("*") == 1
    # what the report reads
    assert exporter["format"] == "json" and "compression" not in exporter and "encoding" not in exporter
    rotation = exporter["rotation"]
    assert all(isinstance(rotation[k], int) and rotation[k] > 0 for k in ("max_megabytes", "max_backups"))
    assert rotation["localtime"] in (True, False)
    current = Path(path)
    rotated = current.with_name(f"{current.stem}-2026-01-05T10-00-00.000{current.suffix}")
    for name in (current.name, rotated.name):
        (tmp_path / name).write_text("{}\n")
    assert [p.name for p in otlpjson.find_files([tmp_path])] == sorted([current.name, rotated.name])


def test_nothing_rewrites_the_resources(config: dict[str, Any]) -> None:
    """host.name, process.pid and the torchelastic.* resource attributes tell the report which process is which."""
    for name, settings in config["processors"].items():
        assert component_type(name) not in REWRITING, name
        if component_type(name) == "resourcedetection":
            assert (settings or {}).get("override") is False, name


def test_it_listens_on_127_0_0_1_unless_told(config: dict[str, Any]) -> None:
    protocols = config["receivers"]["otlp"]["protocols"]
    assert default(protocols["grpc"]["endpoint"]) == "127.0.0.1:4317"
    assert default(protocols["http"]["endpoint"]) == "127.0.0.1:4318"
    assert default(config["extensions"]["health_check"]["endpoint"]).startswith("127.0.0.1:")
    for reference in re.findall(r"\$\{[^}]*\}", json.dumps(config)):
        assert re.fullmatch(r"\$\{env:[A-Z_][A-Z0-9_]*(:-[^}]*)?\}", reference), reference


def test_every_setting_is_commented() -> None:
    """Each setting has a comment: on its line, on the line above it, or on its component's (a block comment over
    a component tells its settings); a section's name alone (``exporters:``) needs none."""
    lines = CONFIG.read_text().splitlines()
    parents: list[tuple[int, bool]] = []  # (indent, commented) of the keys above
    for number, line in enumerate(lines):
        match = re.match(r"^(\s*)([\w/.-]+):", line)
        if not match or line.lstrip().startswith("#"):
            continue
        indent = len(match[1])
        while parents and parents[-1][0] >= indent:
            parents.pop()
        above = number > 0 and lines[number - 1].strip().startswith("#")
        commented = " #" in line or above or any(c for _, c in parents)
        if indent > 0:
            assert commented, f"line {number + 1} has no comment: {line.strip()}"
        parents.append((indent, commented and indent > 0))


def test_the_docs_show_it() -> None:
    text = DOCS.read_text()
    assert "collector-config/otelcol-file.yaml" in text
    assert "torchelastic-otel report --follow" in text
