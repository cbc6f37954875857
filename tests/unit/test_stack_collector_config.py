"""The committed stack configuration, checked structurally (no collector binary or Docker engine runs here).

- ``otelcol-agent.yaml`` / ``otelcol-gateway.yaml``: every component a pipeline uses is defined; every component's
  type (``otlp/jaeger`` is type ``otlp``) is a real component of the OpenTelemetry Collector (core or contrib,
  allow-list below); service.extensions are defined; push exporters retry and queue; the routes the stack needs
  (agent -> gateway; traces -> Jaeger over OTLP, metrics -> Prometheus, logs -> Loki's /otlp);
- ``docker-compose.yaml``: parses, runs the five services, mounts files that exist at the paths the services read,
  publishes only on 127.0.0.1, and OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4317 reaches the collector;
- Grafana provisioning and the dashboard: the datasources the dashboard uses are provisioned (by uid), the panels
  the issue asks for are there, and a run links to its trace in Jaeger.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from tests.support import stack

yaml = stack.require_yaml()

CONFIG = stack.CONFIG_DIR
AGENT = CONFIG / "otelcol-agent.yaml"
GATEWAY = CONFIG / "otelcol-gateway.yaml"
COMPOSE = CONFIG / "docker-compose.yaml"
DATASOURCES = CONFIG / "grafana" / "provisioning" / "datasources"
DASHBOARD_PROVIDERS = CONFIG / "grafana" / "provisioning" / "dashboards"

#: Component types of the OpenTelemetry Collector (core and contrib distributions) this stack may use.
KNOWN_TYPES: dict[str, set[str]] = {
    "receivers": {
        "otlp",
        "prometheus",
        "hostmetrics",
        "filelog",
        "journald",
        "kubeletstats",
        "k8s_cluster",
        "jaeger",
        "zipkin",
        "statsd",
        "docker_stats",
    },
    "processors": {
        "batch",
        "memory_limiter",
        "resourcedetection",
        "resource",
        "attributes",
        "filter",
        "transform",
        "k8sattributes",
        "tail_sampling",
        "probabilistic_sampler",
        "cumulativetodelta",
        "deltatocumulative",
        "groupbyattrs",
        "metricstransform",
        "redaction",
    },
    "exporters": {"otlp", "otlphttp", "prometheus", "prometheusremotewrite", "debug", "loki", "file", "kafka", "nop"},
    "extensions": {
        "health_check",
        "pprof",
        "zpages",
        "file_storage",
        "basicauth",
        "bearertokenauth",
        "oauth2client",
        "headers_setter",
        "memory_ballast",
    },
    "connectors": {"forward", "spanmetrics", "count", "routing", "servicegraph"},
}
PULL_EXPORTERS = {"prometheus"}  # serve a scrape endpoint: nothing to send, so no retry or queue
PIPELINE_SIGNALS = {"traces", "metrics", "logs"}


def component_type(name: str) -> str:
    return name.split("/", 1)[0]


def load(path: Path) -> dict[str, Any]:
    document = yaml.safe_load(path.read_text())
    assert isinstance(document, dict), path
    return document


def host_port(endpoint: str) -> tuple[str, int]:
    endpoint = re.sub(r"^\w+://", "", endpoint).split("/", 1)[0]
    host, _, port = endpoint.rpartition(":")
    return host, int(port)


# ---- both collector configurations ------------------------------------------------------------------------------


@pytest.fixture(params=["otelcol-agent.yaml", "otelcol-gateway.yaml"])
def collector(request: pytest.FixtureRequest) -> dict[str, Any]:
    return load(CONFIG / request.param)


def test_component_types_are_real_collector_components(collector: dict[str, Any]) -> None:
    for kind in ("receivers", "processors", "exporters", "extensions", "connectors"):
        for name in collector.get(kind) or {}:
            assert re.fullmatch(r"[a-z0-9_]+(/[A-Za-z0-9_.-]+)?", name), f"bad component id {kind}.{name}"
            assert component_type(name) in KNOWN_TYPES[kind], f"unknown {kind[:-1]} type {name!r}"


def test_pipelines_use_only_defined_components(collector: dict[str, Any]) -> None:
    service = collector["service"]
    pipelines = service["pipelines"]
    assert {component_type(p) for p in pipelines} == PIPELINE_SIGNALS
    for pipeline_name, pipeline in pipelines.items():
        assert component_type(pipeline_name) in PIPELINE_SIGNALS
        assert pipeline.get("receivers") and pipeline.get("exporters"), pipeline_name
        for kind in ("receivers", "processors", "exporters"):
            for name in pipeline.get(kind) or []:
                defined = set(collector.get(kind) or {}) | set(collector.get("connectors") or {})
                assert name in defined, f"{pipeline_name}: {kind[:-1]} {name!r} is not defined"
        processors = pipeline.get("processors") or []
        assert processors and processors[0] == "memory_limiter", f"{pipeline_name}: memory_limiter must come first"
        assert "batch" in processors, pipeline_name
    for name in service.get("extensions") or []:
        assert name in (collector.get("extensions") or {}), f"service extension {name!r} is not defined"
    used = {
        n for p in pipelines.values() for kind in ("receivers", "processors", "exporters") for n in p.get(kind) or []
    }
    for kind in ("receivers", "processors", "exporters"):
        unused = set(collector.get(kind) or {}) - used
        assert not unused, f"{kind} defined but in no pipeline: {unused}"


def test_push_exporters_retry_and_queue(collector: dict[str, Any]) -> None:
    extensions = collector.get("extensions") or {}
    for name, config in collector["exporters"].items():
        if component_type(name) in PULL_EXPORTERS:
            assert not {"retry_on_failure", "sending_queue"} & set(config), f"{name}: a pull exporter has no queue"
            continue
        assert config["retry_on_failure"]["enabled"] is True, name
        assert config["retry_on_failure"]["max_elapsed_time"], name
        queue = config["sending_queue"]
        assert queue["enabled"] is True and queue["queue_size"] > 0, name
        if "storage" in queue:  # a persistent queue needs a file_storage extension the service starts
            assert component_type(queue["storage"]) == "file_storage" and queue["storage"] in extensions, name
            assert queue["storage"] in collector["service"]["extensions"], name


def test_environment_references_are_well_formed(collector: dict[str, Any]) -> None:
    text = json.dumps(collector)
    for reference in re.findall(r"\$\{[^}]*\}", text):
        assert re.fullmatch(r"\$\{env:[A-Z_][A-Z0-9_]*(:-[^}]*)?\}", reference), reference


def test_memory_limiter_and_resourcedetection(collector: dict[str, Any]) -> None:
    limiter = collector["processors"]["memory_limiter"]
    assert limiter["check_interval"] and (limiter.get("limit_percentage") or limiter.get("limit_mib"))
    detection = collector["processors"]["resourcedetection"]
    assert {"env", "system"} <= set(detection["detectors"])
    assert detection.get("override") is False  # the bridge's host.name and torchelastic.* attributes win


# ---- the agent --------------------------------------------------------------------------------------------------


def test_agent_receives_otlp_and_forwards_to_the_gateway() -> None:
    agent = load(AGENT)
    protocols = agent["receivers"]["otlp"]["protocols"]
    assert host_port(protocols["grpc"]["endpoint"])[1] == 4317
    assert host_port(protocols["http"]["endpoint"])[1] == 4318
    exporter = agent["exporters"]["otlp"]
    assert "gateway" in exporter["endpoint"] or "OTEL_GATEWAY_ENDPOINT" in exporter["endpoint"]
    assert exporter["sending_queue"]["storage"] == "file_storage/queue"
    assert agent["extensions"]["file_storage/queue"]["directory"]
    for pipeline in agent["service"]["pipelines"].values():
        assert pipeline["receivers"] == ["otlp"] and pipeline["exporters"] == ["otlp"]
        assert pipeline["processors"] == ["memory_limiter", "resourcedetection", "batch"]


# ---- the gateway ------------------------------------------------------------------------------------------------


def test_gateway_routes_each_signal_to_its_backend() -> None:
    gateway = load(GATEWAY)
    pipelines = gateway["service"]["pipelines"]
    exporters = gateway["exporters"]
    assert pipelines["traces"]["exporters"] == ["otlp/jaeger"]
    assert host_port(exporters["otlp/jaeger"]["endpoint"]) == ("jaeger", 4317)
    assert pipelines["metrics"]["exporters"] in (["prometheus"], ["prometheusremotewrite"])
    if "prometheus" in exporters:
        assert host_port(exporters["prometheus"]["endpoint"])[1] == 8889
    assert pipelines["logs"]["exporters"] == ["otlphttp/loki"]
    loki = exporters["otlphttp/loki"]["endpoint"]
    assert loki.rstrip("/").endswith("/otlp") and host_port(loki) == ("loki", 3100)
    for pipeline in pipelines.values():
        assert pipeline["receivers"] == ["otlp"]


# ---- docker compose -----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return load(COMPOSE)


def _mounts(service: dict[str, Any]) -> dict[str, Path]:
    """``{container path: host path}`` of the service's bind mounts (relative to the compose file)."""
    out = {}
    for volume in service.get("volumes") or []:
        source, target = volume.split(":")[:2]
        assert source.startswith("./"), f"bind mounts only (relative to the compose file): {volume}"
        out[target] = (COMPOSE.parent / source).resolve()
    return out


def test_compose_runs_the_stack(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert set(services) == {"otel-collector", "jaeger", "prometheus", "grafana", "loki"}
    for name, service in services.items():
        assert re.fullmatch(r"[\w./-]+:[\w.-]+", service["image"]), f"{name}: pin an image tag"
        assert service["image"].split(":")[1] != "latest", name
        for source in _mounts(service).values():
            assert source.exists(), f"{name} mounts {source}, which does not exist"
        for port in service.get("ports") or []:
            assert str(port).startswith("127.0.0.1:"), f"{name} publishes {port} beyond 127.0.0.1"
        for dependency in service.get("depends_on") or []:
            assert dependency in services, f"{name} depends on unknown {dependency}"
    assert services["jaeger"]["environment"]["COLLECTOR_OTLP_ENABLED"] == "true"


def test_compose_collector_is_the_gateway_on_4317(compose: dict[str, Any]) -> None:
    collector = compose["services"]["otel-collector"]
    config_arg = next(a for a in collector["command"] if a.startswith("--config"))
    config_path = config_arg.split("=", 1)[1]
    assert _mounts(collector)[config_path] == GATEWAY.resolve()
    ports = set(collector["ports"])
    assert {"127.0.0.1:4317:4317", "127.0.0.1:4318:4318", "127.0.0.1:8889:8889"} <= ports
    # OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4317 alone reaches the gateway's OTLP/gRPC receiver.
    gateway = load(GATEWAY)
    assert host_port(gateway["receivers"]["otlp"]["protocols"]["grpc"]["endpoint"]) == ("0.0.0.0", 4317)
    assert host_port(gateway["receivers"]["otlp"]["protocols"]["http"]["endpoint"]) == ("0.0.0.0", 4318)


def test_compose_prometheus_reads_the_committed_config_and_rules(compose: dict[str, Any]) -> None:
    prometheus = compose["services"]["prometheus"]
    mounts = _mounts(prometheus)
    config_path = next(a for a in prometheus["command"] if a.startswith("--config.file=")).split("=", 1)[1]
    assert mounts[config_path] == stack.PROMETHEUS_YML.resolve()
    config = load(stack.PROMETHEUS_YML)
    for rule_file in config["rule_files"]:  # resolved relative to the config file, in the container too
        in_container = str(Path(config_path).parent / rule_file)
        mount = next(t for t in mounts if in_container.startswith(t.rstrip("/") + "/") or in_container == t)
        assert (mounts[mount] / Path(in_container).relative_to(mount)).exists(), rule_file
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    collector_job = jobs["otel-collector"]
    assert collector_job["honor_labels"] is True  # keep job=service.name, instance=service.instance.id
    assert collector_job["static_configs"][0]["targets"] == ["otel-collector:8889"]
    direct = jobs["torchelastic"]["static_configs"][0]["targets"]
    assert [host_port(t)[1] for t in direct] == [9464, 9465, 9466]  # agent, local ranks 0 and 1


def test_compose_grafana_is_provisioned(compose: dict[str, Any]) -> None:
    grafana = compose["services"]["grafana"]
    mounts = _mounts(grafana)
    assert mounts["/etc/grafana/provisioning/datasources"] == DATASOURCES.resolve()
    assert mounts["/etc/grafana/provisioning/dashboards"] == DASHBOARD_PROVIDERS.resolve()
    providers = [p for f in DASHBOARD_PROVIDERS.glob("*.yaml") for p in load(f)["providers"]]
    assert providers
    for provider in providers:
        assert mounts[provider["options"]["path"]] == stack.DASHBOARD.parent.resolve()


# ---- Grafana ------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def datasources() -> dict[str, dict[str, Any]]:
    found = {}
    for path in sorted(DATASOURCES.glob("*.yaml")):
        for source in load(path)["datasources"]:
            found[source["uid"]] = source
    return found


def test_datasources_point_at_the_compose_services(
    datasources: dict[str, dict[str, Any]], compose: dict[str, Any]
) -> None:
    assert {s["type"] for s in datasources.values()} == {"prometheus", "jaeger", "loki"}
    expected_ports = {"prometheus": 9090, "jaeger": 16686, "loki": 3100}
    for source in datasources.values():
        host, port = host_port(source["url"])
        assert host in compose["services"], source
        assert port == expected_ports[source["type"]], source


def test_dashboard_uses_provisioned_datasources(datasources: dict[str, dict[str, Any]]) -> None:
    board = json.loads(stack.DASHBOARD.read_text())
    assert board["uid"] and board["title"]
    refs = [t["datasource"] for t in stack.dashboard_targets() if t.get("datasource")]
    assert refs
    for ref in refs:
        assert ref["uid"] in datasources and datasources[ref["uid"]]["type"] == ref["type"], ref


def test_dashboard_has_the_panels_of_the_issue() -> None:
    exprs = [t["expr"] for t in stack.dashboard_targets() if (t.get("datasource") or {}).get("type") == "prometheus"]
    text = "\n".join(exprs)
    assert "torchelastic_workers_runs_total" in text and "torchelastic_workers_run_outcomes_total" in text
    assert "torchelastic_workers_restarts_total" in text
    assert "torchelastic_workers_remaining_restarts" in text
    assert "torchelastic_workers_flakiness_percent" in text
    assert re.search(r"sum by \(state\) \(rate\(torchelastic_workers_state_observations_total", text)
    quantiles = [e for e in exprs if "histogram_quantile" in e and "torchelastic_function_duration_seconds_bucket" in e]
    assert any("SimpleElasticAgent._rendezvous" in e for e in quantiles)
    assert any("_start_workers" in e and "by (function, le)" in e for e in quantiles)
    assert any(re.match(r"\s*loss\b", e) for e in exprs) and any("samples_total" in e for e in exprs)


def test_a_run_links_to_its_trace_in_jaeger() -> None:
    board = json.loads(stack.DASHBOARD.read_text())
    links = []

    def walk(panels: list[dict[str, Any]]) -> None:
        for panel in panels:
            for override in panel.get("fieldConfig", {}).get("overrides", []):
                if override["matcher"].get("options") == "torchelastic_run_id":
                    links.extend(p["value"] for p in override["properties"] if p["id"] == "links")
            walk(panel.get("panels", []))

    walk(board["panels"])
    links = [link for group in links for link in group]
    internal = [link["internal"] for link in links if link.get("internal")]
    assert any(
        i["datasourceUid"] == "jaeger" and "torchelastic.run_id=${__value.raw}" in i["query"]["tags"] for i in internal
    ), links
    external = [link["url"] for link in links if link.get("url")]
    assert any("/search?" in url and "torchelastic.run_id" in url and "${__value.raw}" in url for url in external)
