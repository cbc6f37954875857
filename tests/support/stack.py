"""Helpers of the stack tests (``tests/stack/test_stack_*.py``): real servers (Prometheus, promtool, rotel), real jobs.

Everything binds and targets 127.0.0.1 only; every process started here is stopped by the code that started it
(context managers, ``finally``); every wait has a deadline.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.support import ROOT, WORKERS
from tests.support.ports import HOST, free_port
from tests.support.procs import stop_tree

CONFIG_DIR = ROOT / "collector-config"
RULES = CONFIG_DIR / "alerts" / "torchelastic.rules.yml"
RULES_TEST = CONFIG_DIR / "alerts" / "torchelastic.rules.test.yml"
DASHBOARD = CONFIG_DIR / "grafana" / "dashboards" / "torchelastic.json"
PROMETHEUS_YML = CONFIG_DIR / "prometheus.yml"
WORKER = WORKERS / "_stack_worker.py"
LAUNCHER = WORKERS / "_stack_launcher.py"


# ---- tools ------------------------------------------------------------------------------------------------------


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


def require_tool(name: str, *candidates: str | Path, how: str) -> str:
    """The path of a tool; when it is missing: skip only off CI and when not root (root gets it from ``make test``)."""
    for candidate in (*candidates, shutil.which(name)):
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    message = f"{name} is not installed ({how})"
    if in_ci() or os.geteuid() == 0:
        pytest.fail(message + "; `make test` installs it")
    pytest.skip(message)


def prometheus_bin() -> str:
    return require_tool("prometheus", "/usr/bin/prometheus", how="Debian package prometheus")


def promtool_bin() -> str:
    return require_tool("promtool", "/usr/bin/promtool", how="Debian package prometheus")


def rotel_bin() -> str:
    """The collector binary the ``rotel`` wheel ships (``rotel/rotel-agent``; the package has no console script)."""
    try:
        import rotel  # type: ignore[import-not-found]

        candidate: Path | None = Path(rotel.__file__).with_name("rotel-agent")
    except ImportError:
        candidate = None
    return require_tool("rotel-agent", *([candidate] if candidate else []), how="pip install --pre rotel")


def run_tool(cmd: list[str], timeout: float = 60.0, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        cmd, capture_output=True, text=True, timeout=timeout, cwd=cwd, stdin=subprocess.DEVNULL, check=False
    )


# ---- ports and processes ----------------------------------------------------------------------------------------


@dataclass
class Proc:
    """A started process with its output in a file; :meth:`stop` ends it and everything it started."""

    proc: subprocess.Popen
    log: Path

    def output(self, tail: int = 6000) -> str:
        try:
            return self.log.read_text(errors="replace")[-tail:]
        except OSError:
            return ""

    def running(self) -> bool:
        return self.proc.poll() is None

    def wait(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.stop()
            pytest.fail(f"{self.proc.args[0]} did not finish within {timeout} s:\n{self.output()}")

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM (a torchrun agent stops its workers on it), then SIGKILL whatever of the tree is left."""
        stop_tree(self.proc, grace)


def start(cmd: list[str | Path], log: Path, env: dict[str, str] | None = None, cwd: Path = ROOT) -> Proc:
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [str(c) for c in cmd], env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )
    return Proc(proc, log)


def http_get(url: str, timeout: float = 5.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()
    except (urllib.error.URLError, OSError):
        return 0, b""


# ---- Prometheus ---------------------------------------------------------------------------------------------------


@dataclass
class Prometheus:
    """A real ``prometheus`` server on 127.0.0.1 with the given configuration and a temporary TSDB."""

    binary: str
    workdir: Path
    config: str
    avoid: set[int] = field(default_factory=set)  # ports the scraped job will bind later
    port: int = 0
    proc: Proc | None = None
    started_at: float = 0.0

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def start(self, timeout: float = 30.0) -> Prometheus:
        self.workdir.mkdir(parents=True, exist_ok=True)
        config = self.workdir / "prometheus.yml"
        config.write_text(self.config)
        for _ in range(5):  # the port is picked free, but may be taken before prometheus binds it
            self.port = next(p for p in (free_port() for _ in range(50)) if p not in self.avoid)
            self.proc = start(
                [
                    self.binary,
                    f"--config.file={config}",
                    f"--storage.tsdb.path={self.workdir / 'tsdb'}",
                    f"--web.listen-address={HOST}:{self.port}",
                    "--log.level=warn",
                ],
                self.workdir / "prometheus.log",
                cwd=self.workdir,
            )
            self.started_at = time.time()
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline and self.proc.running():
                if http_get(f"{self.url}/-/ready", timeout=1.0)[0] == 200:
                    return self
                time.sleep(0.1)
            log = self.proc.output()
            self.proc.stop()
            if "address already in use" not in log:
                pytest.fail(f"prometheus did not become ready within {timeout} s:\n{log}")
        pytest.fail("prometheus could not bind a free port")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop()

    def __enter__(self) -> Prometheus:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def api(self, path: str, **params: Any) -> Any:
        query = urllib.parse.urlencode({k: v for k, v in params.items() if v is not None})
        status, body = http_get(f"{self.url}/api/v1/{path}?{query}", timeout=10.0)
        try:
            payload = json.loads(body or b"{}")
        except ValueError:
            payload = {}
        if status != 200 or payload.get("status") != "success":
            raise AssertionError(f"prometheus /api/v1/{path} {params}: HTTP {status}: {body[:2000]!r}")
        return payload["data"]

    def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        """Instant vector result: ``[{"metric": {...}, "value": float}]``."""
        data = self.api("query", query=expr, time=at)
        if data["resultType"] == "scalar":
            return [{"metric": {}, "value": float(data["result"][1])}]
        return [{"metric": r["metric"], "value": float(r["value"][1])} for r in data["result"]]

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
        """Range result: ``[{"metric": {...}, "values": [(t, float), ...]}]``."""
        data = self.api("query_range", query=expr, start=f"{start:.3f}", end=f"{end:.3f}", step=f"{step:g}")
        return [
            {"metric": r["metric"], "values": [(float(t), float(v)) for t, v in r["values"]]} for r in data["result"]
        ]

    def names(self, match: str | None = None) -> set[str]:
        """Metric names stored (optionally only of the series matching the selector ``match``)."""
        return set(self.api("label/__name__/values", **({"match[]": match} if match else {})))

    def firing(self) -> list[dict[str, Any]]:
        """The alerts the server's rule evaluation has firing now (labels and rendered annotations)."""
        return [a for a in self.api("alerts")["alerts"] if a["state"] == "firing"]

    def targets(self) -> list[dict[str, Any]]:
        return self.api("targets")["activeTargets"]

    def describe(self) -> str:
        """What this server has, for failure messages."""
        try:
            targets = [(t["scrapeUrl"], t["health"], t.get("lastError", "")) for t in self.targets()]
            names = sorted(n for n in self.names() if not n.startswith(("python_", "process_", "scrape_")))
        except Exception as exc:
            return f"(prometheus not answering: {exc})"
        log = self.proc.output(3000) if self.proc else ""
        return f"targets: {targets}\nnames: {names}\nprometheus log:\n{log}"


# ---- PromQL: the metric names an expression uses ------------------------------------------------------------------

_PROMQL_KEYWORDS = {
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "offset",
    "bool",
    "and",
    "or",
    "unless",
    "inf",
    "nan",
    "atan2",
    "start",
    "end",
}
_GRAFANA_VARIABLE = re.compile(r"\$\{[^}]*\}|\$\w+|\[\[\w+\]\]")
_STRING = re.compile(r'"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])*\'|`[^`]*`')
_GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_IDENT = re.compile(r"(?<![\w.:])([a-zA-Z_:][a-zA-Z0-9_:]*)(?![\w.])")


def promql_metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (functions, keywords, labels, durations and numbers removed).

    Grafana's ``$variables`` are removed first. ``{__name__="x"}`` selectors count as ``x``.
    """
    names = set(re.findall(r'__name__\s*=\s*"([^"]+)"', expr))
    text = _GRAFANA_VARIABLE.sub("1", expr)
    text = _STRING.sub('""', text)
    text = re.sub(r"\{[^{}]*\}", " ", text)  # label matchers
    text = re.sub(r"\[[^\[\]]*\]", " ", text)  # ranges and subqueries
    text = _GROUPING.sub(" ", text)
    text = re.sub(r"\b\d+(?:\.\d+)?(?:e[+-]?\d+)?(?:ms|[smhdwy])?\b", " ", text, flags=re.IGNORECASE)
    for match in _IDENT.finditer(text):
        word = match.group(1)
        following = text[match.end() :].lstrip()
        if following.startswith("("):  # a function or an aggregation
            continue
        if word.lower() in _PROMQL_KEYWORDS:
            continue
        names.add(word)
    return names


def require_yaml() -> Any:
    """PyYAML (the ``test`` extra): skipped without it off CI, a failure in CI."""
    try:
        import yaml
    except ImportError:
        if in_ci():
            pytest.fail("PyYAML is not installed (pip install pyyaml): the stack tests read YAML configuration")
        pytest.skip("PyYAML is not installed (pip install pyyaml)", allow_module_level=True)
    return yaml


def load_yaml(path: Path) -> Any:
    return require_yaml().safe_load(path.read_text())


def rule_exprs(path: Path = RULES) -> dict[str, str]:
    """``{alert or record name: expr}`` of a Prometheus rules file."""
    out = {}
    for group in load_yaml(path)["groups"]:
        for rule in group["rules"]:
            out[rule.get("alert") or rule.get("record")] = rule["expr"]
    return out


def dashboard_targets(path: Path = DASHBOARD) -> list[dict[str, Any]]:
    """Every query target of the dashboard (panels, rows' panels, templating queries), each with its panel title."""
    board = json.loads(path.read_text())
    found: list[dict[str, Any]] = []

    def walk(panels: Iterable[dict[str, Any]]) -> None:
        for panel in panels:
            for target in panel.get("targets", []):
                found.append(
                    {
                        "panel": panel.get("title", ""),
                        "datasource": target.get("datasource") or panel.get("datasource"),
                        **target,
                    }
                )
            walk(panel.get("panels", []))

    walk(board.get("panels", []))
    for annotation in board.get("annotations", {}).get("list", []):
        if annotation.get("expr"):
            found.append(
                {
                    "panel": f"annotation {annotation['name']}",
                    "datasource": annotation.get("datasource"),
                    "expr": annotation["expr"],
                }
            )
    for variable in board.get("templating", {}).get("list", []):
        query = variable.get("query")
        if variable.get("type") == "query":
            expr = query.get("query") if isinstance(query, dict) else query
            found.append(
                {
                    "panel": f"variable {variable['name']}",
                    "datasource": variable.get("datasource"),
                    "expr": expr,
                    "templating": True,
                }
            )
    return found


def grafana_to_promql(expr: str) -> str:
    """A dashboard query made runnable on a bare Prometheus: Grafana's variables get values that match anything."""
    label_values = re.fullmatch(r"\s*label_values\((.+),\s*(\w+)\)\s*", expr)
    if label_values:  # templating: label_values(metric_selector, label)
        expr = f"count by ({label_values.group(2)}) ({label_values.group(1)})"
    replacements = {
        "$__rate_interval": "1m",
        "${__rate_interval}": "1m",
        "$__interval": "1s",
        "${__interval}": "1s",
        "$__range": "10m",
        "${__range}": "10m",
    }
    for variable, value in replacements.items():
        expr = expr.replace(variable, value)
    return _GRAFANA_VARIABLE.sub(".*", expr)


# ---- promtool test input from real series -----------------------------------------------------------------------


def series_selector(metric: dict[str, str]) -> str:
    labels = {k: v for k, v in metric.items() if k != "__name__"}
    inner = ",".join(f"{k}={json.dumps(v)}" for k, v in sorted(labels.items()))
    return f"{metric['__name__']}{{{inner}}}"


def promtool_values(values: list[tuple[float, float]], start: float, step: float, n: int) -> str:
    """Samples at ``start + i*step`` (``i < n``) in promtool's notation: ``_`` before a series exists, ``stale``
    where it ended (Prometheus' staleness: the process stopped), the real values in between."""
    by_index = {round((t - start) / step): v for t, v in values}
    out: list[str] = []
    seen = False
    for i in range(n):
        if i in by_index:
            out.append(repr(by_index[i]) if by_index[i] != int(by_index[i]) else str(int(by_index[i])))
            seen = True
        elif seen and out and out[-1] not in ("_", "stale"):
            out.append("stale")
        else:
            out.append("_")
    return " ".join(out)


@dataclass
class Recording:
    """Series recorded by a real Prometheus over a window: ``[(selector, values)]`` plus the time axis."""

    start: float
    step: float
    n: int
    series: list[tuple[str, str]] = field(default_factory=list)

    def input_series_yaml(self, indent: str = "      ") -> str:
        lines = []
        for selector, values in self.series:
            lines.append(f"{indent}- series: {json.dumps(selector)}\n{indent}  values: {json.dumps(values)}")
        return "\n".join(lines)


def record_series(prom: Prometheus, selector: str, start: float, end: float, step: float = 1.0) -> Recording:
    """Every series matching ``selector`` in ``[start, end]``, as Prometheus really stored and serves them."""
    n = int((end - start) // step) + 1
    recording = Recording(start, step, n)
    for result in prom.query_range(selector, start, start + (n - 1) * step, step):
        recording.series.append((series_selector(result["metric"]), promtool_values(result["values"], start, step, n)))
    recording.series.sort()
    return recording
