"""What a job's metrics cost a Prometheus server: the series each rank and each node (agent) adds, counted from a
real job's exported data, and extrapolated to a large job.

    .venv/bin/python bench/cardinality.py                 # runs a real 2-rank job (~15 s), prints the table
    .venv/bin/python bench/cardinality.py DIR_OR_FILES    # counts a job's OTLP JSON metric files instead
    .venv/bin/python bench/cardinality.py --nodes 1000 --ranks-per-node 8 --keep DIR

The job (``bench/_cardinality_worker.py``: DDP on CPU/gloo, a DataLoader, checkpoints, ``@prof``, ``put_metric``) runs
under ``torchelastic-otel run --standalone --nproc-per-node 2`` with ``OTEL_METRICS_EXPORTER=otlp_json_file``:
every process writes its own OTLP JSON Lines file (``TORCHELASTIC_OTEL_FILE_DIR``). Each file's points are
turned into the Prometheus series the OpenTelemetry Prometheus exporters (the SDK's, the Collector's) write for
them: the name with its unit suffix and ``_total`` for a monotonic sum; a histogram is one ``_bucket`` series per
``le`` (its explicit bounds and ``+Inf``) plus ``_sum`` and ``_count``; one ``target_info`` per process. Series are
counted by (name, point attributes) within a process -- a process is one (``job``, ``instance``) in Prometheus,
so every rank and every attempt (restart) has its own.

It is a report, not a test: it prints Markdown (the table of docs/cardinality.md) and exits 0; a job that fails is
reported with its output and exits 1.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
WORKER = Path(__file__).resolve().parent / "_cardinality_worker.py"
AGGREGATE_CONFIG = ROOT / "collector-config" / "otelcol-aggregate-per-node.yaml"
JOB_TIMEOUT = 240.0  # seconds for the whole job (start-up of 2 torch processes on a loaded 2-core machine)

#: Where each instrument's series could go at the collector, and why (the last column of the table).
ADVICE = {
    "torchelastic.worker.step.arrival": "keep per rank: TorchElasticStraggler compares ranks",
    "torchelastic.worker.collective.seq": "keep per rank: TorchElasticRankMissingFromCollective compares ranks",
    "torchelastic.worker.step.duration": "per node (sum); under synchronous DDP every rank's step time is the same",
    "torchelastic.worker.step.phase.duration": "per node (sum), or drop: the report reads the files",
    "torchelastic.worker.step.phase.median": "per node (max), or drop: the phase histogram has the same",
    "torchelastic.worker.progress.at_risk": "per node (max)",
    "torchelastic.worker.checkpoint.step": "per node (min)",
    "torchelastic.checkpoint.duration": "per node (sum)",
    "torchelastic.goodput.time": "per node (sum): the goodput rules sum by run anyway",
    "torchelastic.worker.steps": "per node (sum)",
    "torchelastic.function.calls": "workers: per node (sum); agent: already one per node",
    "torchelastic.function.duration": "workers: per node (sum); agent: already one per node",
    "process.memory.usage": "keep per rank (a leak is one rank's); or drop",
    "target_info": "one per process: per node after aggregation",
    "torchelastic.root_cause.time": "agent: one per failed attempt (labels: restart count, rank, reason)",
    "torchelastic_otel.dropped": "the bridge's health: only once it dropped something, one per (signal, reason)",
    "torchelastic_otel.sanitized": "the bridge's health: only once it altered something, one per (signal, reason)",
}
#: Instruments only the agent exports: one set per node already.
AGENT_ADVICE = "agent: one per node already (the torchelastic.rules.yml alerts group by agent)"


@dataclass
class Family:
    """One instrument as Prometheus sees it, in one process."""

    instrument: str
    prom_name: str
    kind: str  # counter | gauge | histogram
    label_sets: set[tuple[tuple[str, str], ...]] = field(default_factory=set)
    buckets: int = 0  # explicit bounds + 1 (the +Inf bucket) of a histogram

    def series(self) -> int:
        per_set = self.buckets + 2 if self.kind == "histogram" else 1
        return len(self.label_sets) * per_set

    def attribute_values(self) -> dict[str, set[str]]:
        values: dict[str, set[str]] = defaultdict(set)
        for labels in self.label_sets:
            for key, value in labels:
                values[key].add(value)
        return values


@dataclass
class Process:
    """One exporting process (a resource): the agent of a node, or the worker of one rank in one attempt."""

    kind: str  # agent | worker
    rank: str
    restart: str
    host: str
    families: dict[str, Family] = field(default_factory=dict)

    def series(self) -> int:
        return 1 + sum(f.series() for f in self.families.values())  # + target_info


# ---- OpenTelemetry -> Prometheus names (the specification's rules, as the exporters apply them) -----------------

_UNITS = {"s": "seconds", "ms": "milliseconds", "By": "bytes", "%": "percent", "1": "", "W": "watts", "J": "joules",
          "Cel": "celsius"}  # fmt: skip


def prometheus_name(name: str, unit: str, kind: str) -> str:
    """``torchelastic.worker.step.duration`` (``s``, histogram) -> ``torchelastic_worker_step_duration_seconds``.

    Units in braces (``{step}``) are annotations and add nothing; a monotonic sum ends in ``_total``."""
    base = re.sub(r"[^a-zA-Z0-9:]+", "_", name)
    suffix = _UNITS.get(unit, re.sub(r"[^a-zA-Z0-9]+", "_", re.sub(r"\{.*\}", "", unit)).strip("_"))
    if suffix and not base.endswith("_" + suffix):
        base = f"{base}_{suffix}"
    if kind == "counter":
        base = base.removesuffix("_total") + "_total"
    return base


def _value(any_value: dict[str, Any]) -> str:
    for key in ("stringValue", "intValue", "doubleValue", "boolValue"):
        if key in any_value:
            return str(any_value[key])
    return json.dumps(any_value, sort_keys=True)


def _attributes(items: list[dict[str, Any]] | None) -> dict[str, str]:
    return {item["key"]: _value(item.get("value") or {}) for item in items or []}


def _kind(metric: dict[str, Any]) -> tuple[str, list[dict[str, Any]]] | None:
    if "histogram" in metric:
        return "histogram", metric["histogram"].get("dataPoints") or []
    if "gauge" in metric:
        return "gauge", metric["gauge"].get("dataPoints") or []
    if "sum" in metric:
        monotonic = metric["sum"].get("isMonotonic", False)  # non-monotonic sums are gauges in Prometheus
        return ("counter" if monotonic else "gauge"), metric["sum"].get("dataPoints") or []
    return None  # exponential histograms / summaries: the bridge exports none


def read_processes(paths: list[Path]) -> list[Process]:
    """Every process's families, from OTLP JSON Lines metric files (one process a resource, by instance id)."""
    processes: dict[str, Process] = {}
    for path in paths:
        for line in path.read_text(errors="replace").splitlines():
            try:
                document = json.loads(line)
            except ValueError:
                continue  # a line cut short by a killed process: the other lines still count
            for block in document.get("resourceMetrics") or []:
                resource = _attributes((block.get("resource") or {}).get("attributes"))
                key = (
                    resource.get("service.instance.id") or f"{resource.get('host.name')}:{resource.get('process.pid')}"
                )
                process = processes.setdefault(
                    key,
                    Process(
                        kind=resource.get("torchelastic.process.kind", "?"),
                        rank=resource.get("torchelastic.rank", ""),
                        restart=resource.get("torchelastic.restart_count", ""),
                        host=resource.get("host.name", ""),
                    ),
                )
                for scope in block.get("scopeMetrics") or []:
                    for metric in scope.get("metrics") or []:
                        _add_metric(process, metric)
    return sorted(processes.values(), key=lambda p: (p.kind, p.restart, int(p.rank or 0)))


def _add_metric(process: Process, metric: dict[str, Any]) -> None:
    found = _kind(metric)
    if found is None:
        return
    kind, points = found
    name = metric["name"]
    family = process.families.get(name)
    if family is None:
        family = Family(name, prometheus_name(name, metric.get("unit", ""), kind), kind)
        process.families[name] = family
    for point in points:
        labels = {re.sub(r"[^a-zA-Z0-9]+", "_", k): v for k, v in _attributes(point.get("attributes")).items()}
        family.label_sets.add(tuple(sorted(labels.items())))
        if kind == "histogram":
            family.buckets = max(family.buckets, len(point.get("explicitBounds") or []) + 1)


# ---- the aggregation config -------------------------------------------------------------------------------------


def aggregated_instruments(config: Path = AGGREGATE_CONFIG) -> re.Pattern[str]:
    """The instruments ``otelcol-aggregate-per-node.yaml`` turns into per-node series (its AGGREGATED regex)."""
    text = config.read_text()
    match = re.search(r'IsMatch\(metric\.name, "([^"]+)"\)', text)
    if match is None:
        raise SystemExit(f"no IsMatch(metric.name, ...) in {config}")
    return re.compile(match[1].replace("\\\\", "\\"))


# ---- the table ----------------------------------------------------------------------------------------------------


@dataclass
class Row:
    instrument: str
    prom_name: str
    kind: str
    attributes: str
    per_rank: int
    per_agent: int


def rows(processes: list[Process]) -> list[Row]:
    """One row an instrument: its series per rank (the most any worker process had) and per agent."""
    by_name: dict[str, dict[str, Any]] = {}
    for process in processes:
        for family in process.families.values():
            entry = by_name.setdefault(
                family.instrument,
                {"family": family, "values": defaultdict(set), "rank": 0, "agent": 0},
            )
            for key, values in family.attribute_values().items():
                entry["values"][key] |= values
            column = "rank" if process.kind == "worker" else "agent"
            entry[column] = max(entry[column], family.series())
    out = []
    for name, entry in sorted(by_name.items(), key=lambda item: item[1]["family"].prom_name):
        family = entry["family"]
        attrs = ", ".join(f"`{k}` ({len(v)})" for k, v in sorted(entry["values"].items())) or "—"
        if family.kind == "histogram":
            attrs += f"; `le` ({family.buckets})"
        out.append(Row(name, family.prom_name, family.kind, attrs, entry["rank"], entry["agent"]))
    kinds = {p.kind for p in processes}
    out.append(
        Row(
            "target_info",
            "target_info",
            "info",
            "the resource's attributes",
            int("worker" in kinds),
            int("agent" in kinds),
        )
    )
    return out


def _series_column(row: Row) -> str:
    if row.kind == "histogram":
        return f"`{row.prom_name}_bucket` / `_sum` / `_count`"
    return f"`{row.prom_name}`"


def table(processes: list[Process], nodes: int, ranks_per_node: int, aggregated: re.Pattern[str]) -> str:
    """The Markdown report: the per-instrument table, then the totals, measured and extrapolated."""
    all_rows = rows(processes)
    workers = [p for p in processes if p.kind == "worker"]
    agents = [p for p in processes if p.kind == "agent"]
    lines = [
        f"Measured from {len(workers)} worker process(es) (ranks {', '.join(p.rank for p in workers)}) and "
        f"{len(agents)} agent(s) of one job.",
        "",
        "| instrument | Prometheus series | kind | attributes (distinct values seen) | per rank | per node (agent) "
        "| at the collector |",
        "|---|---|---|---|---:|---:|---|",
    ]
    for row in all_rows:
        default = AGENT_ADVICE if row.per_rank == 0 else "your metric: keep, aggregate or drop as you need"
        advice = ADVICE.get(row.instrument, default)
        lines.append(
            f"| `{row.instrument}` | {_series_column(row)} | {row.kind} | {row.attributes} | {row.per_rank} "
            f"| {row.per_agent} | {advice} |"
        )
    per_rank = sum(r.per_rank for r in all_rows)
    per_agent = sum(r.per_agent for r in all_rows)
    per_node = per_agent + ranks_per_node * per_rank
    kept = sum(r.per_rank for r in all_rows if r.instrument != "target_info" and not aggregated.match(r.instrument))
    folded = sum(r.per_rank for r in all_rows if aggregated.match(r.instrument))
    per_node_aggregated = per_agent + ranks_per_node * (kept + 1) + folded + 1  # + the node's target_info
    attempts = sorted({p.restart for p in workers})
    n_aggregated = len([r for r in all_rows if aggregated.match(r.instrument)])
    lines += [
        "",
        "| | series |",
        "|---|---:|",
        f"| a rank (one worker process, target_info included) | {per_rank} |",
        f"| a node's agent | {per_agent} |",
        f"| a node: agent + {ranks_per_node} ranks | {per_node} |",
        f"| **a {nodes:,}-node × {ranks_per_node}-rank job** | **{nodes * per_node:,}** |",
        f"| a node with `otelcol-aggregate-per-node.yaml` ({n_aggregated} instruments per node) "
        f"| {per_node_aggregated} |",
        f"| **the {nodes:,}-node job with it** | **{nodes * per_node_aggregated:,}** |",
        "",
        "Measured per process: "
        + "; ".join(
            f"{p.kind} {p.rank + ' ' if p.rank else ''}(attempt {p.restart or '-'}) {p.series()}" for p in processes
        )
        + f". The job ran {len(attempts)} attempt(s): every restart starts new worker processes, each a new Prometheus "
        "instance, so a restart adds another set of per-rank series until the old ones go stale.",
    ]
    return "\n".join(lines)


# ---- the job --------------------------------------------------------------------------------------------------------


def job_env(files: Path) -> dict[str, str]:
    """This environment without OTEL_* / torchrun state; metrics only, to OTLP JSON files in ``files``."""
    dropped = ("OTEL_", "TORCHELASTIC_", "TRACEPARENT", "TRACESTATE", "ROTEL_")
    torchrun = {"RANK", "LOCAL_RANK", "GROUP_RANK", "ROLE_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "ROLE_NAME"}
    env = {k: v for k, v in os.environ.items() if not k.startswith(dropped) and k not in torchrun}
    env.update(
        OTEL_METRICS_EXPORTER="otlp_json_file",
        OTEL_TRACES_EXPORTER="none",
        OTEL_LOGS_EXPORTER="none",
        OTEL_METRIC_EXPORT_INTERVAL="1000",
        TORCHELASTIC_OTEL_FILE_DIR=str(files),
        TORCHELASTIC_OTEL_COLLECTIVES_INTERVAL="1",  # read the Flight Recorder in a short job too: step arrival
        TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1",
        PYTHONUNBUFFERED="1",
        PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p),
    )
    return env


def run_job(workdir: Path, ranks: int, steps: int, fail_once_rank: int) -> Path:
    """A real ``torchelastic-otel run`` job of ``ranks`` workers, whose rank ``fail_once_rank`` fails in the first
    attempt (-1: none) so that the group restarts once; returns the directory of its metric files.

    A job that fails is run once more, in a fresh directory (a failed job's files would count a third attempt), its
    output printed on stderr: on a machine shared with other jobs a rendezvous can time out."""
    for attempt in (1, 2):
        directory = workdir if attempt == 1 else workdir / "retry"
        files, checkpoints = directory / "files", directory / "checkpoints"
        files.mkdir(parents=True, exist_ok=True)
        checkpoints.mkdir(parents=True, exist_ok=True)
        launcher = Path(sys.executable).parent / "torchelastic-otel"
        cmd = [
            str(launcher), "run", "--standalone", "--nproc-per-node", str(ranks), "--monitor-interval", "0.1",
            "--max-restarts", "1",
            str(WORKER), "--dir", str(checkpoints), "--steps", str(steps), "--save-every", str(max(1, steps // 2)),
            "--fail-once-rank", str(fail_once_rank),
        ]  # fmt: skip
        code, output = _run(cmd, job_env(files))
        if code == 0:
            return files
        print(f"cardinality: the job failed ({code}), attempt {attempt} of 2:\n{output[-6000:]}", file=sys.stderr)
    raise SystemExit("cardinality: the job failed twice (its output is above)")


def _run(cmd: list[str], env: dict[str, str]) -> tuple[int | str, str]:
    """Run ``cmd`` in its own process group (the workers too), at most JOB_TIMEOUT s: its exit code and output."""
    with subprocess.Popen(
        cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    ) as proc:
        try:
            output, _ = proc.communicate(timeout=JOB_TIMEOUT)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the launcher and every worker it started
            output, _ = proc.communicate()
            return f"timeout after {JOB_TIMEOUT:.0f} s", output
        return proc.returncode, output


def metric_files(paths: list[Path]) -> list[Path]:
    found: list[Path] = []
    for path in paths:
        found += sorted(path.rglob("*.jsonl")) + sorted(path.rglob("*.json")) if path.is_dir() else [path]
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("paths", nargs="*", type=Path, help="OTLP JSON Lines metric files or directories")
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--ranks-per-node", type=int, default=8)
    parser.add_argument("--ranks", type=int, default=2, help="ranks of the measured job (no paths given)")
    parser.add_argument("--steps", type=int, default=40, help="steps of the measured job")
    parser.add_argument(
        "--fail-once-rank", type=int, default=1, help="rank that fails in the job's first attempt (-1: none)"
    )
    parser.add_argument("--keep", type=Path, help="run the job in this directory and keep its files")
    args = parser.parse_args(argv)
    if args.paths:
        files = metric_files(args.paths)
    else:
        # absolute: the job runs in the repository's root (its worker's imports), not where this was started
        workdir = (args.keep or Path(tempfile.mkdtemp(prefix="cardinality-"))).resolve()
        files = metric_files([run_job(workdir, args.ranks, args.steps, args.fail_once_rank)])
    processes = read_processes(files)
    if not processes:
        print(f"no OTLP metrics in {', '.join(map(str, args.paths or files))}", file=sys.stderr)
        return 1
    print(table(processes, args.nodes, args.ranks_per_node, aggregated_instruments()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
