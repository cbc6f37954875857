"""``collector-config/otelcol-aggregate-per-node.yaml`` checked structurally (no collector binary runs here; with
``otelcol-contrib`` on PATH, tests/stack/test_collector_aggregate.py runs it), and ``bench/cardinality.py``'s
translation of OpenTelemetry points into Prometheus series.

The config: every component is a real Collector component and every option one its config accepts (allow-lists
below, from collector-contrib's config.go / README of each); pipelines use only defined components, memory_limiter
first, batch in each; it listens on 127.0.0.1 only; the OTTL statements call only functions the transform / filter
processors have, with aggregations they support (histograms: sum only); the two filters select exactly complementary
sets with one regular expression naming real instruments of ``torchelastic_otel/_names.py``, none of them one the
straggler / missing-rank rules read; the resource statements drop the per-rank attributes and keep the node's.
"""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.support import ROOT, stack
from torchelastic_otel import _names as names

yaml = stack.require_yaml()

CONFIG = stack.CONFIG_DIR / "otelcol-aggregate-per-node.yaml"
AGENT = stack.CONFIG_DIR / "otelcol-agent.yaml"
TRAINING_RULES = stack.CONFIG_DIR / "alerts" / "torchelastic-training.rules.yml"
GOODPUT_RULES = stack.CONFIG_DIR / "alerts" / "torchelastic-goodput.rules.yml"
BENCH = ROOT / "bench" / "cardinality.py"
SDK_DEFAULT_EXPORT_INTERVAL_S = 60  # OTEL_METRIC_EXPORT_INTERVAL's default (ms 60000)

#: Options each component type accepts (top level), from opentelemetry-collector(-contrib)'s config structs.
OPTIONS: dict[str, dict[str, set[str]]] = {
    "receivers": {"otlp": {"protocols"}},
    "processors": {
        "memory_limiter": {
            "check_interval", "limit_mib", "spike_limit_mib", "limit_percentage", "spike_limit_percentage",
        },
        "resourcedetection": {"detectors", "timeout", "override", "system", "env", "attributes"},
        "batch": {"send_batch_size", "send_batch_max_size", "timeout", "metadata_keys", "metadata_cardinality_limit"},
        "filter": {"error_mode", "metrics", "traces", "logs"},
        "interval": {"interval", "pass_through"},
        "transform": {"error_mode", "trace_statements", "metric_statements", "log_statements", "flatten_data"},
        "groupbyattrs": {"keys"},
    },
    "exporters": {
        "otlp": {
            "endpoint", "tls", "compression", "timeout", "retry_on_failure", "sending_queue", "headers",
            "balancer_name", "keepalive", "auth", "read_buffer_size", "write_buffer_size", "wait_for_ready",
            "authority",
        },
    },
    "extensions": {"health_check": {"endpoint", "path", "check_collector_pipeline"}, "file_storage": {
        "directory", "timeout", "compaction", "fsync", "create_directory",
    }},
}  # fmt: skip
FILTER_METRICS_OPTIONS = {"metric", "datapoint", "include", "exclude"}
INTERVAL_PASS_THROUGH = {"gauge", "summary"}
STATEMENT_GROUP_OPTIONS = {"context", "statements", "conditions", "error_mode"}
OTTL_CONTEXTS = {"resource", "scope", "metric", "datapoint"}
#: OTTL editors and converters (pkg/ottl/ottlfuncs) and the transform processor's metric functions used here.
OTTL_FUNCTIONS = {
    "set", "delete_key", "keep_keys", "Concat", "IsMatch", "Now", "TruncateTime", "Duration", "UnixNano",
    "aggregate_on_attributes",
}  # fmt: skip
AGGREGATIONS = {"sum", "max", "min", "mean", "median", "count"}
PER_RANK_KEYS = {"process.pid", names.RANK, names.LOCAL_RANK, names.ROLE_RANK}


def component_type(name: str) -> str:
    return name.split("/", 1)[0]


@pytest.fixture(scope="module")
def config() -> dict[str, Any]:
    document = yaml.safe_load(CONFIG.read_text())
    assert isinstance(document, dict)
    return document


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_cardinality", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def statements(config: dict[str, Any], processor: str) -> list[tuple[str, str]]:
    """``(context, statement)`` of a transform processor, statements folded onto one line."""
    return [
        (group["context"], " ".join(statement.split()))
        for group in config["processors"][processor]["metric_statements"]
        for statement in group["statements"]
    ]


def filter_condition(config: dict[str, Any], processor: str) -> str:
    conditions = config["processors"][processor]["metrics"]["metric"]
    assert len(conditions) == 1, conditions
    return " ".join(conditions[0].split())


def aggregated_regex(config: dict[str, Any]) -> re.Pattern[str]:
    match = re.search(r'IsMatch\(metric\.name, "([^"]+)"\)', filter_condition(config, "filter/per-rank-only"))
    assert match, "filter/per-rank-only selects the aggregated instruments by IsMatch(metric.name, ...)"
    return re.compile(match[1].replace("\\\\", "\\"))  # an OTTL string literal: \\ is one backslash


def metric_instruments() -> set[str]:
    """Every instrument name the bridge defines (the ``# ---- metrics`` block of _names.py)."""
    block = Path(names.__file__).read_text().split("# ---- metrics", 1)[1].split("# ----", 1)[0]
    return {value for value in re.findall(r'= "([^"]+)"', block) if not value.endswith(".")}


# ---- structure ----------------------------------------------------------------------------------------------------


def test_components_are_real_and_their_options_accepted(config: dict[str, Any]) -> None:
    for kind, types in OPTIONS.items():
        for name, options in (config.get(kind) or {}).items():
            assert component_type(name) in types, f"unknown {kind[:-1]} type {name!r}"
            unknown = set(options or {}) - types[component_type(name)]
            assert not unknown, f"{kind}.{name}: options the component does not accept: {unknown}"
    for name, options in config["processors"].items():
        if component_type(name) == "filter":
            assert set(options["metrics"]) <= FILTER_METRICS_OPTIONS, name
            assert options["error_mode"] in {"ignore", "silent", "propagate"}, name
        if component_type(name) == "interval":
            assert set(options["pass_through"]) <= INTERVAL_PASS_THROUGH, name
        if component_type(name) == "transform":
            assert options["error_mode"] in {"ignore", "silent", "propagate"}, name
            for group in options["metric_statements"]:
                assert set(group) <= STATEMENT_GROUP_OPTIONS and group["context"] in OTTL_CONTEXTS, (name, group)
        if component_type(name) == "groupbyattrs":
            assert not (options or {}).get("keys"), "no keys: compaction of equal resources"


def test_pipelines_use_defined_components_in_order(config: dict[str, Any]) -> None:
    pipelines = config["service"]["pipelines"]
    assert {component_type(p) for p in pipelines} == {"traces", "metrics", "logs"}
    used: set[str] = set()
    for pipeline_name, pipeline in pipelines.items():
        for kind in ("receivers", "processors", "exporters"):
            for name in pipeline.get(kind) or []:
                assert name in config[kind], f"{pipeline_name}: {kind[:-1]} {name!r} is not defined"
                used.add(name)
        processors = pipeline["processors"]
        assert processors[0] == "memory_limiter" and "batch" in processors, pipeline_name
    for kind in ("receivers", "processors", "exporters"):
        assert set(config[kind]) <= used, f"{kind} defined but in no pipeline: {set(config[kind]) - used}"
    for name in config["service"]["extensions"]:
        assert name in config["extensions"]
    per_node = pipelines["metrics/per-node"]["processors"]
    order = ["filter/per-node-only", "interval", "transform/per-node-resource", "groupbyattrs/per-node"]
    order.append("transform/per-node-aggregate")
    assert [p for p in per_node if p in order] == order, "interval, then the resource, compaction, aggregation"
    assert per_node.index("batch") > per_node.index("transform/per-node-aggregate"), "no batch split before it"
    assert "filter/per-rank-only" in pipelines["metrics/per-rank"]["processors"]


def test_listens_on_loopback_only_and_forwards_like_the_agent(config: dict[str, Any]) -> None:
    protocols = config["receivers"]["otlp"]["protocols"]
    endpoints = [protocols["grpc"]["endpoint"], protocols["http"]["endpoint"]]
    endpoints.append(config["extensions"]["health_check"]["endpoint"])
    for endpoint in endpoints:
        assert endpoint.rsplit(":", 1)[0] == "127.0.0.1", endpoint
    agent = yaml.safe_load(AGENT.read_text())
    assert config["exporters"] == agent["exporters"], "the same route to the gateway as otelcol-agent.yaml"
    assert config["extensions"] == agent["extensions"]
    for reference in re.findall(r"\$\{[^}]*\}", json.dumps(config)):
        assert re.fullmatch(r"\$\{env:[A-Z_][A-Z0-9_]*(:-[^}]*)?\}", reference), reference


def test_interval_covers_two_export_intervals(config: dict[str, Any]) -> None:
    """Every rank exports at least once in every interval (SDK default period 60 s): no rank missing from a sum."""
    default = re.fullmatch(
        r"\$\{env:TORCHELASTIC_AGGREGATE_INTERVAL:-(\d+)s\}", config["processors"]["interval"]["interval"]
    )
    assert default and int(default[1]) >= 2 * SDK_DEFAULT_EXPORT_INTERVAL_S
    assert config["processors"]["interval"]["pass_through"] == {"gauge": False, "summary": False}


# ---- OTTL ----------------------------------------------------------------------------------------------------------


def test_ottl_calls_only_real_functions(config: dict[str, Any]) -> None:
    texts = [
        s for p in ("transform/per-node-resource", "transform/per-node-aggregate") for _, s in statements(config, p)
    ]
    texts += [filter_condition(config, p) for p in ("filter/per-rank-only", "filter/per-node-only")]
    for text in texts:
        unquoted = re.sub(r'"(?:[^"\\]|\\.)*"', '""', text)
        for function in re.findall(r"\b([A-Za-z_]+)\(", unquoted):
            assert function in OTTL_FUNCTIONS, f"{function!r} in {text!r}"
        assert unquoted.count("(") == unquoted.count(")"), text


def test_filters_split_the_instruments_in_two(config: dict[str, Any]) -> None:
    per_rank = filter_condition(config, "filter/per-rank-only")
    per_node = filter_condition(config, "filter/per-node-only")
    assert per_node == f"not ({per_rank})", "the per-node pipeline keeps exactly what the per-rank one drops"
    assert f'resource.attributes["{names.PROCESS_KIND}"] == "worker"' in per_rank, "workers only: not the agent"


def test_aggregated_instruments_are_real_and_spare_the_rank_comparing_rules(
    config: dict[str, Any], bench: ModuleType
) -> None:
    pattern = aggregated_regex(config)
    alternatives = re.fullmatch(r"\^torchelastic\\\.\((.+)\)\$", pattern.pattern)
    assert alternatives, pattern.pattern
    instruments = {"torchelastic." + alt.replace("\\.", ".") for alt in alternatives[1].split("|")}
    real = metric_instruments()
    assert instruments <= real, f"not instruments of the bridge: {instruments - real}"
    assert {i for i in real if pattern.match(i)} == instruments
    assert bench.aggregated_instruments(CONFIG).pattern == pattern.pattern, "bench/cardinality.py reads the same"
    rules = TRAINING_RULES.read_text()
    for instrument in (names.WORKER_STEP_ARRIVAL, names.WORKER_COLLECTIVE_SEQ):
        assert instrument not in instruments
        assert bench.prometheus_name(instrument, "s" if "arrival" in instrument else "{collective}", "gauge") in rules
    for instrument in instruments:
        for kind in ("counter", "gauge", "histogram"):
            assert bench.prometheus_name(instrument, "s", kind) not in rules, (
                f"{instrument}: the training rules read it"
            )
    assert names.GOODPUT_TIME in instruments and "sum by (torchelastic_run_id" in GOODPUT_RULES.read_text()


def test_resource_becomes_the_node(config: dict[str, Any]) -> None:
    resource = [s for context, s in statements(config, "transform/per-node-resource") if context == "resource"]
    deleted = {m for s in resource for m in re.findall(r'^delete_key\(attributes, "([^"]+)"\)$', s)}
    assert deleted == PER_RANK_KEYS
    instance = next(s for s in resource if s.startswith('set(attributes["service.instance.id"]'))
    for key in ("host.name", names.RUN_ID, names.GROUP_RANK, names.RESTART_COUNT):
        assert f'attributes["{key}"]' in instance, f"the node's instance id names {key}"
    assert f'set(attributes["{names.PROCESS_KIND}"], "node")' in resource
    for kept in ("host.name", names.RUN_ID, names.ROLE):
        assert not any(f'"{kept}"' in s for s in resource if s.startswith(("delete_key", "keep_keys"))), kept
    datapoint = [s for context, s in statements(config, "transform/per-node-resource") if context == "datapoint"]
    assert datapoint == ['set(time_unix_nano, UnixNano(TruncateTime(Now(), Duration("1s"))))'], (
        "aggregate_on_attributes adds up only points of equal timestamps"
    )


def test_aggregations_are_supported_for_their_types(config: dict[str, Any]) -> None:
    aggregate = statements(config, "transform/per-node-aggregate")
    assert {context for context, _ in aggregate} == {"metric"}
    for _, statement in aggregate:
        match = re.fullmatch(r'aggregate_on_attributes\("(\w+)"\) where (.+)', statement)
        assert match and match[1] in AGGREGATIONS, statement
        if "HISTOGRAM" in match[2]:
            assert match[1] == "sum", "histograms: sum only"
    covered = " ".join(s for _, s in aggregate)
    for kind in ("SUM", "HISTOGRAM", "GAUGE"):
        assert f"METRIC_DATA_TYPE_{kind}" in covered, kind


# ---- bench/cardinality.py -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "unit", "kind", "expected"),
    [
        (names.FUNCTION_CALLS, "{call}", "counter", "torchelastic_function_calls_total"),
        (names.FUNCTION_DURATION, "s", "histogram", "torchelastic_function_duration_seconds"),
        (names.WORKERS_FLAKINESS, "%", "gauge", "torchelastic_workers_flakiness_percent"),
        (names.WORKERS_REMAINING_RESTARTS, "{restart}", "gauge", "torchelastic_workers_remaining_restarts"),
        (names.GOODPUT_TIME, "s", "counter", "torchelastic_goodput_time_seconds_total"),
        (names.WORKER_COLLECTIVE_SEQ, "{collective}", "gauge", "torchelastic_worker_collective_seq"),
        (names.PROCESS_MEMORY_USAGE, "By", "gauge", "process_memory_usage_bytes"),
        ("samples_total", "", "counter", "samples_total"),
        ("loss", "", "gauge", "loss"),
    ],
)
def test_prometheus_names_are_the_documented_ones(
    bench: ModuleType, name: str, unit: str, kind: str, expected: str
) -> None:
    """The names the docs, rules and dashboards use (the exporters' own spelling, see tests/jobs/test_pipeline_e2e)."""
    assert bench.prometheus_name(name, unit, kind) == expected
    if name.startswith("torchelastic."):
        sources = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *stack.CONFIG_DIR.rglob("*.y*ml")]
        sources += sorted(stack.CONFIG_DIR.rglob("*.json"))
        documented = "\n".join(path.read_text() for path in sources if path.name != "cardinality.md")
        assert expected in documented


def test_series_counted_as_prometheus_stores_them(bench: ModuleType, tmp_path: Path) -> None:
    """A histogram is a _bucket per le (bounds + +Inf) plus _sum and _count, per attribute set; target_info 1."""
    line = {
        "resourceMetrics": [{
            "resource": {"attributes": [
                {"key": "service.instance.id", "value": {"stringValue": "a"}},
                {"key": names.PROCESS_KIND, "value": {"stringValue": "worker"}},
                {"key": names.RANK, "value": {"stringValue": "3"}},
            ]},
            "scopeMetrics": [{"scope": {"name": "torchelastic_otel"}, "metrics": [
                {"name": names.WORKER_STEP_PHASE_DURATION, "unit": "s", "histogram": {"dataPoints": [
                    {"attributes": [{"key": "phase", "value": {"stringValue": p}}], "explicitBounds": [0.1, 1, 10]}
                    for p in ("forward", "backward")
                ]}},
                {"name": names.WORKER_STEPS, "unit": "{step}", "sum": {"isMonotonic": True, "dataPoints": [{}]}},
                {"name": names.PROCESS_MEMORY_USAGE, "unit": "By", "sum": {"isMonotonic": False, "dataPoints": [{}]}},
            ]}],
        }]
    }  # fmt: skip
    path = tmp_path / "metrics-host-rank3-restart0-1.jsonl"
    path.write_text(json.dumps(line) + "\n" + json.dumps(line) + "\n{cut short")
    [process] = bench.read_processes([path])
    assert (process.kind, process.rank) == ("worker", "3")
    assert process.families[names.WORKER_STEP_PHASE_DURATION].series() == 2 * (3 + 1 + 2)
    assert process.families[names.WORKER_STEPS].prom_name == "torchelastic_worker_steps_total"
    assert process.families[names.PROCESS_MEMORY_USAGE].kind == "gauge"
    assert process.series() == 12 + 1 + 1 + 1
    report = bench.table([process], 1000, 8, aggregated_regex(yaml.safe_load(CONFIG.read_text())))
    assert "| a rank (one worker process, target_info included) | 15 |" in report
    assert f"**{1000 * 8 * 15:,}**" in report  # no agent in the input: 8 ranks a node
