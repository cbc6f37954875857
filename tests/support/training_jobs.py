"""What the straggler and missing-rank tests share: their jobs (bridged and plain torchrun), a real Prometheus with
the committed training rules, the docs' query, and the report of the jobs' files.

Everything binds and targets 127.0.0.1; every process and server started here is stopped by the test that started
it (``finally``); every wait has a deadline.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.support import ROOT, stack
from tests.support.env import otlp_env
from tests.support.otlp_receiver import OtlpReceiver

yaml = stack.require_yaml()

README = ROOT / "docs" / "training.md"
TRAINING_RULES = stack.CONFIG_DIR / "alerts" / "torchelastic-training.rules.yml"
TRAINING_DASHBOARD = stack.CONFIG_DIR / "grafana" / "dashboards" / "torchelastic-training.json"
#: The committed rule group evaluates every 20 s; the tests' Prometheus every second (``scaled_rules``).
TIME_SCALE = 20


def scaled_rules(directory: Path) -> Path:
    """The committed training rules with their clock sped up 20x: the group evaluates every second and each
    ``for`` is a 20th (40 s -> 2 s): the same number of evaluations (three for a straggler), in a test's time.
    The expressions (and their 1-minute windows) are the committed ones, unchanged."""
    document = yaml.safe_load(TRAINING_RULES.read_text())
    for group in document["groups"]:
        assert _seconds(group["interval"]) == TIME_SCALE, group["interval"]
        group["interval"] = "1s"
        for rule in group["rules"]:
            if "for" in rule:
                rule["for"] = f"{_seconds(rule['for']) / TIME_SCALE:g}s"
    path = directory / TRAINING_RULES.name
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


def _seconds(duration: str) -> float:
    match = re.fullmatch(r"(\d+)([smh])", duration)
    assert match, duration
    return int(match[1]) * {"s": 1, "m": 60, "h": 3600}[match[2]]


def prometheus_config(targets: list[str], rules: Path) -> str:
    """Scrape every process of the job (agents and workers serve their own endpoints) every second."""
    job = {"job_name": "torchelastic", "scrape_interval": "1s", "scrape_timeout": "1s",
           "static_configs": [{"targets": targets}]}  # fmt: skip
    config = {"global": {"scrape_interval": "1s", "evaluation_interval": "1s"}, "rule_files": [str(rules)],
              "scrape_configs": [job]}  # fmt: skip
    return yaml.safe_dump(config, sort_keys=False)


def readme_query() -> str:
    """The PromQL query of the docs' "The rank that did not come" section (``docs/training.md``; the fenced block
    after it)."""
    text = README.read_text()
    section = text[text.index("## The rank that did not come") :]
    block = re.search(r"```promql\n(.*?)```", section, re.DOTALL)
    assert block, "docs/training.md shows the query in a ```promql block"
    return block[1].strip()


def bridged_env(rx: OtlpReceiver, files: Path, prometheus_port: int, **extra: str) -> dict[str, str]:
    """A bridged agent's environment: OTLP/gRPC to ``rx``, a Prometheus endpoint per process from
    ``prometheus_port`` (agent) on, and OTLP JSON Lines files in ``files`` for the report."""
    return otlp_env(
        rx,
        OTEL_TRACES_EXPORTER="otlp,otlp_json_file",
        OTEL_METRICS_EXPORTER="prometheus,otlp,otlp_json_file",
        OTEL_LOGS_EXPORTER="otlp,otlp_json_file",
        OTEL_EXPORTER_PROMETHEUS_HOST=stack.HOST,
        OTEL_EXPORTER_PROMETHEUS_PORT=str(prometheus_port),
        TORCHELASTIC_OTEL_FILE_DIR=str(files),
        TORCHELASTIC_OTEL_COLLECTIVES_INTERVAL="1",
        OMP_NUM_THREADS="1",
        **extra,
    )


def report(files: Path, html: Path) -> tuple[dict[str, Any], str]:
    """``torchelastic-otel report --json`` and the terminal report of the job's files (a real subprocess each)."""
    common = [sys.executable, "-m", "torchelastic_otel.report", str(files)]
    as_json = subprocess.run([*common, "--json"], capture_output=True, text=True, timeout=120, cwd=ROOT,
                             stdin=subprocess.DEVNULL)  # fmt: skip
    assert as_json.returncode == 0, as_json.stderr
    text = subprocess.run([*common, "--html", str(html), "--width", "140"], capture_output=True, text=True,
                          timeout=120, cwd=ROOT, stdin=subprocess.DEVNULL)  # fmt: skip
    assert text.returncode == 0, text.stderr
    return json.loads(as_json.stdout), text.stdout


def dashboard_queries() -> list[tuple[str, str]]:
    """(panel, PromQL) of every Prometheus query of the training dashboard, runnable on a bare Prometheus."""
    return [(t["panel"], stack.grafana_to_promql(t["expr"])) for t in stack.dashboard_targets(TRAINING_DASHBOARD)
            if (t.get("datasource") or {}).get("type") == "prometheus" and not t.get("templating")]  # fmt: skip


def marker_line(worker: Path, marker: str) -> int:
    text = worker.read_text().splitlines()
    lines = [n for n, line in enumerate(text, 1) if line.rstrip().endswith(f"# BLOCKS: {marker}")]
    assert len(lines) == 1, (marker, lines)
    return lines[0]
