"""A straggler, named: a real 4-rank DDP job (gloo, CPU) on two agents, rank 2's forward half a step slower.

The job (``tests/support/workers/_straggler_worker.py``, bridge-unaware) runs as two ``torchelastic-otel run`` agents
("nodes", 2 ranks each) joining one c10d rendezvous whose store the test hosts; rank 2 is on the second agent. Its
forward sleeps 0.1 s longer than the others' 0.2 s. Every worker serves its own Prometheus endpoint, exports OTLP/gRPC
to the in-process receiver and writes OTLP JSON Lines files (``TORCHELASTIC_OTEL_FILE_DIR``). Debian's ``prometheus``
scrapes them every second and evaluates the committed ``torchelastic-training.rules.yml`` with its clock sped up 20x
(every second instead of every 20 s, ``for: 2s`` instead of ``40s``: the same three evaluations). The same job runs
under plain torchrun beside it (its own rendezvous), and both stop when the test says so.

The trap the tests guard against: every rank's step takes the same time (the fast ranks wait in the gradient
all-reduce for rank 2), so step time cannot name it; arrival at the step's last collective can.

- Prometheus: ``TorchElasticStraggler`` fires for rank 2 and no other; its ratio >= 1.2, the others' < 1.2;
- the receiver: every rank's step durations agree, rank 2's arrival is the latest;
- ``torchelastic-otel report --json`` names rank 2 alone; the terminal report says so; the HTML page in Chromium
  marks rank 2's row and draws one arrival line per rank;
- every query of the training dashboard returns data from the job (but the hung-job table);
- plain torchrun: the same exit code (0) and the same step time.
"""

from __future__ import annotations

import re
import statistics
import sys
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.support import WORKERS, stack, training_jobs
from tests.support.env import plain_env
from tests.support.jobs import c10d_args, is_worker, unique_id
from tests.support.otlp_receiver import OtlpReceiver
from tests.support.ports import free_port, free_port_block
from tests.support.waiting import wait_for

pytest.importorskip("torch.distributed.elastic.agent.server.local_elastic_agent")
pytest.importorskip("opentelemetry.exporter.otlp.json.file")
from torch.distributed import TCPStore

#: arrival ratios and step times compared across ranks and with plain torchrun: another test file's job on the same
#: two cores slowed rank 3 to 1.13x the median once; ``make test`` runs this file alone
pytestmark = pytest.mark.solo

WORKER = WORKERS / "_straggler_worker.py"
SLOW_RANK = 2
BASE, EXTRA = 0.2, 0.1  # seconds of each forward; the slow rank's extra (half a step)
TIMEOUT = 150.0  # seconds for the alert to fire (the jobs start, the 1-minute rates fill)
HOLD = 3.0  # seconds the firing alerts must stay as expected
ALERT = "TorchElasticStraggler"
STEP_LINE = re.compile(r"straggler_worker rank (\d+): steps (\d+), median step ([\d.]+) ms")


@dataclass
class Outcome:
    run_id: str
    bridged: list[stack.Proc]
    plain: list[stack.Proc]
    codes: list[int]
    plain_codes: list[int]
    firing: list[dict[str, Any]]
    ratios: dict[str, float]
    dashboard: dict[str, int]  # panel -> series returned
    logs: list[dict[str, Any]]
    points: list[dict[str, Any]]
    files: Path
    html: Path

    def output(self, procs: list[stack.Proc]) -> str:
        return "".join(p.log.read_text(errors="replace") for p in procs)

    def step_times(self, procs: list[stack.Proc]) -> dict[int, float]:
        return {int(m[1]): float(m[3]) for m in STEP_LINE.finditer(self.output(procs))}


def _agents(
    tmp: Path, name: str, env_of: Any, launcher: list[str], go: Path, run_id: str
) -> tuple[list[stack.Proc], Any]:
    """Two agents of one job ("nodes" 0 and 1), on a rendezvous store hosted here (as a dedicated store host would
    be: the agents' exits cannot take it away from each other)."""
    port = free_port()
    store = TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=120))
    rdzv = [*c10d_args(run_id, port), "--rdzv-conf", "is_host=false"]
    procs = []
    for node in range(2):
        cmd = [*launcher, "--nnodes", "2", "--nproc-per-node", "2", "--max-restarts", "0", *rdzv, WORKER,
               "--go", go, "--base", str(BASE), "--extra", str(EXTRA), "--slow-rank", str(SLOW_RANK)]  # fmt: skip
        procs.append(stack.start(cmd, tmp / f"{name}{node}.log", env=env_of(node)))
    return procs, store


def _wait_for_alert(prom: stack.Prometheus, describe: Any) -> list[dict[str, Any]]:
    """Until exactly the straggler alert for rank 2 has been firing for ``HOLD`` seconds."""
    deadline, since = time.monotonic() + TIMEOUT, None
    last: Any = None
    while time.monotonic() < deadline:
        firing = [a for a in prom.firing() if a["labels"]["alertname"] == ALERT]
        ranks = sorted(a["labels"].get("torchelastic_rank", "?") for a in firing)
        last = ranks
        if ranks == [str(SLOW_RANK)]:
            since = since or time.monotonic()
            if time.monotonic() - since >= HOLD:
                return firing
        else:
            since = None
        time.sleep(0.25)
    pytest.fail(
        f"{ALERT} did not fire for rank {SLOW_RANK} alone within {TIMEOUT} s (firing for ranks {last})\n{describe()}"
    )


@pytest.fixture(scope="module")
def outcome(tmp_path_factory: pytest.TempPathFactory) -> Any:
    tmp = tmp_path_factory.mktemp("straggler")
    files, go, plain_go = tmp / "telemetry", tmp / "go", tmp / "plain-go"
    bases = [free_port_block(3), free_port_block(3)]
    targets = [f"{stack.HOST}:{base + i}" for base in bases for i in range(3)]
    rules = training_jobs.scaled_rules(tmp)
    prom = stack.Prometheus(stack.prometheus_bin(), tmp / "prometheus", training_jobs.prometheus_config(targets, rules),
                            avoid={base + i for base in bases for i in range(3)})  # fmt: skip
    rx = OtlpReceiver().start()
    run_id = unique_id("straggler")
    bridged: list[stack.Proc] = []
    plain: list[stack.Proc] = []
    stores: list[Any] = []
    prom.start()
    try:
        launcher = [sys.executable, "-m", "torchelastic_otel.run"]
        procs, store = _agents(tmp, "bridged", lambda node: training_jobs.bridged_env(rx, files, bases[node]),
                               launcher, go, run_id)  # fmt: skip
        bridged, stores = procs, [store]
        plain_launcher = [sys.executable, "-m", "torch.distributed.run"]
        procs, store = _agents(tmp, "plain", lambda node: plain_env(OMP_NUM_THREADS="1"), plain_launcher, plain_go,
                               unique_id("plain"))  # fmt: skip
        plain, stores = procs, [*stores, store]

        def describe() -> str:
            return prom.describe() + "".join(f"\nagent {i}:\n{p.output(3000)}" for i, p in enumerate(bridged))

        firing = _wait_for_alert(prom, describe)
        ratios = {
            r["metric"]["torchelastic_rank"]: r["value"]
            for r in prom.query(f'torchelastic:worker_step_arrival:ratio_to_median{{torchelastic_run_id="{run_id}"}}')
        }
        dashboard = {panel: len(prom.query(expr)) for panel, expr in training_jobs.dashboard_queries()}
        go.touch()
        plain_go.touch()
        codes = [p.wait(90) for p in bridged]
        plain_codes = [p.wait(90) for p in plain]
        wait_for(lambda: len({p["resource"].get("torchelastic.rank") for p in
                                      rx.metric_points("torchelastic.worker.step.arrival")}) == 4, 20,
                         "every rank's arrival at the receiver", interval=0.2)  # fmt: skip
        yield Outcome(run_id, bridged, plain, codes, plain_codes, firing, ratios, dashboard, rx.logs(),
                      rx.metric_points(), files, tmp / "report.html")  # fmt: skip
    finally:
        go.touch()
        plain_go.touch()
        for proc in [*bridged, *plain]:
            proc.stop()
        prom.stop()
        rx.stop()
        del stores


# ---- the job -----------------------------------------------------------------------------------------------------


def test_the_job_succeeds_under_the_bridge_and_under_plain_torchrun(outcome: Outcome) -> None:
    assert outcome.codes == [0, 0], outcome.output(outcome.bridged)[-4000:]
    assert outcome.plain_codes == [0, 0], outcome.output(outcome.plain)[-4000:]


def test_step_time_is_the_same_on_every_rank_and_as_under_plain_torchrun(outcome: Outcome) -> None:
    """The trap: every rank's step takes as long as the slow rank's. The bridge adds no time to a step."""
    bridged, plain = outcome.step_times(outcome.bridged), outcome.step_times(outcome.plain)
    assert set(bridged) == set(plain) == {0, 1, 2, 3}, (bridged, plain)
    assert max(bridged.values()) / min(bridged.values()) < 1.05, bridged
    assert statistics.median(bridged.values()) <= statistics.median(plain.values()) * 1.05 + 5, (bridged, plain)


# ---- Prometheus ----------------------------------------------------------------------------------------------------


def test_the_straggler_alert_fires_for_rank_2_alone(outcome: Outcome) -> None:
    (alert,) = outcome.firing
    labels = alert["labels"]
    assert labels["torchelastic_rank"] == str(SLOW_RANK) and labels["torchelastic_run_id"] == outcome.run_id
    assert labels["severity"] == "warning"
    assert f"rank {SLOW_RANK} is a straggler" in alert["annotations"]["summary"]


def test_the_ratios_name_rank_2_across_both_agents(outcome: Outcome) -> None:
    """Ranks 0-1 are on the first agent, 2-3 on the second: the median is the job's, not one agent's."""
    assert set(outcome.ratios) == {"0", "1", "2", "3"}, outcome.ratios
    assert outcome.ratios[str(SLOW_RANK)] >= 1.2, outcome.ratios
    assert all(v < 1.1 for rank, v in outcome.ratios.items() if rank != str(SLOW_RANK)), outcome.ratios


def test_every_dashboard_query_returns_data(outcome: Outcome) -> None:
    """But the table of ranks missing from a collective: a job that is not hung has none (the missing-rank test
    runs that one); and the GPU panels of the devices row: this CPU job has no GPU (tests/unit/test_devices.py)."""
    empty = [
        panel
        for panel, n in outcome.dashboard.items()
        if not n and "missing from a collective" not in panel and not panel.startswith("GPU ")
    ]
    assert not empty, outcome.dashboard
    assert len(outcome.dashboard) >= 5


# ---- what the workers exported over OTLP ------------------------------------------------------------------------


def _by_rank(points: list[dict[str, Any]], name: str) -> dict[int, dict[str, Any]]:
    latest: dict[int, dict[str, Any]] = {}
    for point in points:
        if point["name"] != name or not is_worker(point):
            continue
        rank = int(point["resource"]["torchelastic.rank"])
        if rank not in latest or point["count"] >= latest[rank]["count"]:
            latest[rank] = point
    return latest


def test_the_workers_exported_step_time_and_arrival(outcome: Outcome) -> None:
    durations = _by_rank(outcome.points, "torchelastic.worker.step.duration")
    arrivals = _by_rank(outcome.points, "torchelastic.worker.step.arrival")
    assert set(durations) == set(arrivals) == {0, 1, 2, 3}
    for point in durations.values():
        assert point["unit"] == "s" and point["count"] >= 10, point
        assert point["resource"]["torchelastic.run_id"] == outcome.run_id
    means = {rank: p["sum"] / p["count"] for rank, p in durations.items()}
    assert max(means.values()) / min(means.values()) < 1.05, means  # step time: the same on every rank
    arrival = {rank: p["sum"] / p["count"] for rank, p in arrivals.items()}
    others = [v for rank, v in arrival.items() if rank != SLOW_RANK]
    assert arrival[SLOW_RANK] - max(others) > EXTRA * 0.7, arrival  # later by its extra forward time
    steps = {int(p["resource"]["torchelastic.rank"]) for p in outcome.points
             if p["name"] == "torchelastic.worker.steps"}  # fmt: skip
    assert steps == {0, 1, 2, 3}
    assert not [r for r in outcome.logs if r["event_name"] == "torchelastic.worker.stalled"]  # 120 s default


# ---- the report ----------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def reported(outcome: Outcome) -> tuple[dict[str, Any], str]:
    return training_jobs.report(outcome.files, outcome.html)


def test_report_json_names_rank_2_and_no_other(outcome: Outcome, reported: tuple[dict[str, Any], str]) -> None:
    summary, _ = reported
    (run,) = [r for r in summary["runs"] if r["run_id"] == outcome.run_id]
    assert run["outcome"] == "SUCCEEDED" and run["attempts"] == 1 and run["root_cause"] is None
    assert [s["rank"] for s in run["stragglers"]] == [SLOW_RANK], run["stragglers"]
    assert run["stragglers"][0]["ratio"] >= 1.2
    assert {s["rank"] for s in run["steps"]} == {0, 1, 2, 3}
    assert len({s["host"] for s in run["steps"]}) == 1  # (both "nodes" are this machine)
    assert run["stalls"] == [] and run["missing_ranks"] == []


def test_terminal_report_has_the_straggler_table(reported: tuple[dict[str, Any], str]) -> None:
    _, text = reported
    assert "STRAGGLERS" in text, text[-3000:]
    assert re.search(rf"attempt 0: rank {SLOW_RANK} \(.*\) is a straggler: 1\.\d\dx the median rank", text), text
    flagged = [line for line in text.splitlines() if line.endswith("<- straggler")]
    assert len(flagged) == 1 and re.match(rf"\s+0\s+{SLOW_RANK}\s", flagged[0]), flagged


_PAGE = """(() => ({
  rows: [...document.querySelectorAll('table.stragglers tbody tr')].map(r => ({rank: r.dataset.rank,
    straggler: r.classList.contains('straggler')})),
  lines: [...document.querySelectorAll('.charts.training polyline')].map(p => p.dataset.rank),
  title: (document.querySelector('.charts.training .chart') || {dataset: {}}).dataset.metric,
  metricCharts: document.querySelectorAll('.charts:not(.training) .chart').length,
  rendered: document.documentElement.dataset.rendered}))()"""


@pytest.mark.browser
def test_the_html_report_in_a_real_browser(outcome: Outcome, reported: Any, tmp_path: Path) -> None:
    from tests.support.report_browser import rendered

    page = rendered(outcome.html, _PAGE, tmp_path / "stragglers.png")
    assert page["rendered"] == "true"
    assert sorted(r["rank"] for r in page["rows"]) == ["0", "1", "2", "3"]
    assert [r["rank"] for r in page["rows"] if r["straggler"]] == [str(SLOW_RANK)]
    assert sorted(page["lines"]) == ["0", "1", "2", "3"]
    assert page["title"] == "torchelastic.worker.step.arrival per rank"
    assert page["metricCharts"] > 0  # the metric charts are still drawn in their own place


# ---- the committed stack configuration -------------------------------------------------------------------------


def test_the_training_dashboard_and_rules_are_wired_into_the_stack() -> None:
    """Grafana loads every file of the dashboards directory; Prometheus (and docker compose's mount) the rules."""
    import json

    board = json.loads(training_jobs.TRAINING_DASHBOARD.read_text())
    assert board["uid"] == "torchelastic-training" and board["uid"] != json.loads(stack.DASHBOARD.read_text())["uid"]
    assert training_jobs.TRAINING_DASHBOARD.parent == stack.DASHBOARD.parent
    targets = stack.dashboard_targets(training_jobs.TRAINING_DASHBOARD)
    sources = {(t.get("datasource") or {}).get("uid") for t in targets}
    assert sources == {"prometheus", "loki"}  # provisioned (grafana/provisioning/datasources)
    config = training_jobs.yaml.safe_load(stack.PROMETHEUS_YML.read_text())
    assert f"alerts/{training_jobs.TRAINING_RULES.name}" in config["rule_files"]
    exprs = "\n".join(stack.rule_exprs(training_jobs.TRAINING_RULES).values())
    assert "torchelastic_worker_step_arrival_seconds_sum" in exprs and "torchelastic_worker_collective_seq" in exprs
