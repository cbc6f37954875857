"""The goodput recording rule, live: a real Prometheus evaluates the committed ``torchelastic-goodput.rules.yml`` over a
real bridged torchrun job.

The job (``tests/support/workers/goodput_live_worker.py``, bridge-unaware): 2 ranks (DDP, gloo, CPU) under one
``torchelastic-otel run`` agent on 127.0.0.1; each step waits ``INPUT`` seconds in its ``DataLoader`` and computes
``COMPUTE`` seconds. The agent and both workers serve their own Prometheus endpoints (the agent's counts its rendezvous
seconds, the workers' their own causes); Debian's ``prometheus`` scrapes them every second and evaluates the committed
rule group with its clock sped up 20x (every second instead of every 20 s; the expressions and their 5-minute
windows unchanged). While the job trains:

- ``torchelastic:job_goodput:ratio`` exists for the run, is between 0 and 1, and is within 0.1 of the ratio the test
  computes itself from the raw counter samples Prometheus scraped (the increases over the rule's window, by cause:
  (productive - lost_progress) / (all - lost_progress));
- the training dashboard's goodput ratio query (the same expression on the counters) gives the rule's value, and
  every query of its goodput row returns data;
- the agent's ``cause=rendezvous`` counter is above 0;
- the workers' input wait is the share of their step time the job itself measured waiting in ``next()`` (within
  0.1).
"""

from __future__ import annotations

import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support import WORKERS, stack, training_jobs
from tests.support.env import prometheus_env
from tests.support.jobs import c10d_args, unique_id
from tests.support.ports import free_port, free_port_block

pytest.importorskip("torch.distributed.elastic.agent.server.local_elastic_agent")

yaml = stack.require_yaml()

WORKER = WORKERS / "goodput_live_worker.py"
GOODPUT_RULES = stack.CONFIG_DIR / "alerts" / "torchelastic-goodput.rules.yml"
RATIO, BY_CAUSE = "torchelastic:job_goodput:ratio", "torchelastic:job_goodput_seconds:rate5m"
COUNTER = "torchelastic_goodput_time_seconds_total"
INPUT, COMPUTE = 0.04, 0.06  # seconds of each step: waiting in the DataLoader, the forward's work
PRODUCTIVE = 20.0  # productive rank-seconds the workers have counted before the rule is read (~15 s of the job)
TIMEOUT = 150.0  # seconds for the job to start and its counters to fill
STEP_LINE = re.compile(r"goodput_live rank (\d+): steps (\d+), input ([\d.]+) s, steps ([\d.]+) s")


def scaled_rules(directory: Path) -> Path:
    """The committed goodput rules evaluated every second instead of every 20 s (the expressions unchanged)."""
    document = yaml.safe_load(GOODPUT_RULES.read_text())
    for group in document["groups"]:
        assert group["interval"] == "20s", group["interval"]
        group["interval"] = "1s"
    path = directory / GOODPUT_RULES.name
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


@dataclass
class Outcome:
    run_id: str
    agent: stack.Proc
    code: int
    at: float  # when the rule's sample was evaluated
    ratio: float
    by_cause: dict[str, float]
    raw: dict[str, float]  # increases over the rule's window, by cause (every process of the run)
    raw_workers: dict[str, float]  # the same, the workers' alone
    dashboard: list[float]
    panels: dict[str, int]  # the goodput row's panels -> series returned
    rendezvous: float  # the agent's counter
    describe: str

    def own_figures(self) -> dict[int, tuple[int, float, float]]:
        """rank -> (steps, seconds waiting in next(), seconds of steps), as the job printed them."""
        text = self.agent.output(200_000)
        return {int(m[1]): (int(m[2]), float(m[3]), float(m[4])) for m in STEP_LINE.finditer(text)}


def _matrix(prom: stack.Prometheus, expr: str, at: float) -> list[dict[str, Any]]:
    data = prom.api("query", query=expr, time=f"{at:.3f}")
    assert data["resultType"] == "matrix", data
    return [{"metric": r["metric"], "values": [(float(t), float(v)) for t, v in r["values"]]} for r in data["result"]]


def _increase(values: list[tuple[float, float]]) -> float:
    """A counter's increase over its samples, across resets (a process restarted on the same port)."""
    total = 0.0
    for (_, before), (_, after) in zip(values, values[1:], strict=False):
        total += after - before if after >= before else after
    return total


def _raw_increases(
    prom: stack.Prometheus, run_id: str, at: float, instances: set[str] | None = None
) -> dict[str, float]:
    """The counters' increases over the rule's window ending at ``at``, summed by cause over the run's processes
    (the run from each process's target_info, as the rule joins it)."""
    runs = {r["metric"]["instance"]: r["metric"].get("torchelastic_run_id") for r in prom.query("target_info", at)}
    out: dict[str, float] = {}
    for series in _matrix(prom, f"{COUNTER}[5m]", at):
        instance = series["metric"]["instance"]
        if runs.get(instance) != run_id or (instances is not None and instance not in instances):
            continue
        cause = series["metric"]["cause"]
        out[cause] = out.get(cause, 0.0) + _increase(series["values"])
    return out


def _ratio(seconds: dict[str, float]) -> float:
    lost = seconds.get("lost_progress", 0.0)
    return max(0.0, (seconds.get("productive", 0.0) - lost) / (sum(seconds.values()) - lost))


def _worker_seconds(prom: stack.Prometheus, run_id: str) -> float:
    """Seconds the workers of the run have counted as productive so far (0 while they have not)."""
    found = prom.query(f'sum({COUNTER}{{cause="productive"}} * on (job, instance) group_left () '
                       f'target_info{{torchelastic_run_id="{run_id}", torchelastic_rank!=""}})')  # fmt: skip
    return found[0]["value"] if found else 0.0


@pytest.fixture(scope="module")
def outcome(tmp_path_factory: pytest.TempPathFactory) -> Any:
    tmp = tmp_path_factory.mktemp("goodput")
    go = tmp / "go"
    base = free_port_block(3)  # the agent, local ranks 0 and 1
    targets = [f"{stack.HOST}:{base + i}" for i in range(3)]
    prom = stack.Prometheus(stack.prometheus_bin(), tmp / "prometheus",
                            training_jobs.prometheus_config(targets, scaled_rules(tmp)),
                            avoid={base + i for i in range(3)})  # fmt: skip
    run_id = unique_id("goodput")
    env = prometheus_env(base, TORCHELASTIC_OTEL_COLLECTIVES_INTERVAL="1", OMP_NUM_THREADS="1")
    cmd: list[str | Path] = [sys.executable, "-m", "torchelastic_otel.run", "--nnodes", "1", "--nproc-per-node", "2",
           "--max-restarts", "0", *c10d_args(run_id, free_port()), WORKER, "--go", go,
           "--input", str(INPUT), "--compute", str(COMPUTE)]  # fmt: skip
    agent: stack.Proc | None = None
    prom.start()
    try:
        agent = stack.start(cmd, tmp / "agent.log", env=env)

        def describe() -> str:
            return prom.describe() + f"\nagent:\n{agent.output(4000) if agent else ''}"

        deadline = time.monotonic() + TIMEOUT
        while _worker_seconds(prom, run_id) < PRODUCTIVE:
            if time.monotonic() > deadline or not agent.running():
                pytest.fail(f"the workers did not count {PRODUCTIVE} productive seconds\n{describe()}")
            time.sleep(1.0)
        workers = {f"{stack.HOST}:{base + 1}", f"{stack.HOST}:{base + 2}"}
        samples = _matrix(prom, f'{RATIO}{{torchelastic_run_id="{run_id}"}}[5s]', time.time())
        assert samples, f"no {RATIO} for run {run_id}\n{describe()}"
        at, ratio = samples[0]["values"][-1]
        by_cause = {
            r["metric"]["cause"]: r["value"] for r in prom.query(f'{BY_CAUSE}{{torchelastic_run_id="{run_id}"}}', at)
        }
        raw = _raw_increases(prom, run_id, at)
        raw_workers = _raw_increases(prom, run_id, at, workers)
        (panel_expr,) = [e for p, e in training_jobs.dashboard_queries() if p.startswith("Goodput ratio")]
        dashboard = [r["value"] for r in prom.query(panel_expr, at) if r["metric"].get("torchelastic_run_id") == run_id]
        panels = {panel: len(prom.query(expr, at)) for panel, expr in training_jobs.dashboard_queries()
                  if any(word in expr for word in ("goodput", "phase_duration", "at_risk"))}  # fmt: skip
        found = prom.query(f'{COUNTER}{{cause="rendezvous", instance="{stack.HOST}:{base}"}}', at)
        rendezvous = found[0]["value"] if found else 0.0
        text = describe()
        go.touch()
        code = agent.wait(90)
        yield Outcome(run_id, agent, code, at, ratio, by_cause, raw, raw_workers, dashboard, panels, rendezvous, text)
    finally:
        go.touch()
        if agent is not None:
            agent.stop()
        prom.stop()


def test_the_job_succeeds(outcome: Outcome) -> None:
    assert outcome.code == 0, outcome.agent.output()
    assert set(outcome.own_figures()) == {0, 1}, outcome.agent.output()


def test_the_rule_gives_the_run_a_ratio_between_0_and_1(outcome: Outcome) -> None:
    assert 0.0 <= outcome.ratio <= 1.0, outcome
    assert {"productive", "input_wait", "rendezvous"} <= set(outcome.by_cause), outcome.by_cause


def test_the_ratio_is_the_ratio_of_the_scraped_counters(outcome: Outcome) -> None:
    """Prometheus' rates extrapolate to the window's edges; the test's increases do not: within 0.1."""
    expected = _ratio(outcome.raw)
    print(f"goodput ratio: rule {outcome.ratio:.4f}, scraped counters {expected:.4f}; seconds {outcome.raw}")
    assert abs(outcome.ratio - expected) <= 0.1, (outcome.ratio, expected, outcome.raw, outcome.by_cause)


def test_the_dashboard_shows_the_rules_ratio(outcome: Outcome) -> None:
    assert outcome.dashboard == [pytest.approx(outcome.ratio, abs=1e-9)], (outcome.dashboard, outcome.ratio)


def test_every_query_of_the_dashboards_goodput_row_returns_data(outcome: Outcome) -> None:
    assert len(outcome.panels) == 4 and all(outcome.panels.values()), outcome.panels


def test_the_agent_counts_its_rendezvous(outcome: Outcome) -> None:
    assert 0.0 < outcome.rendezvous < 60.0 * 2, outcome.describe
    assert outcome.raw.get("rendezvous", 0.0) >= 0.0


def test_the_input_wait_is_the_share_the_job_measured(outcome: Outcome) -> None:
    """The job's own figures (its waits in ``next()`` over its steps' time) against the workers' counters over
    the window (which holds the whole job: it is shorter than 5 minutes)."""
    own = outcome.own_figures()
    waited = sum(w for _, w, _ in own.values())
    stepped = sum(s for _, _, s in own.values())
    job_share = waited / stepped
    seconds = {c: v for c, v in outcome.raw_workers.items() if c not in ("startup", "lost_progress")}
    counted_share = seconds.get("input_wait", 0.0) / sum(seconds.values())
    print(f"input share: job {job_share:.3f}, counters {counted_share:.3f} ({seconds})")
    assert abs(counted_share - job_share) <= 0.1, (counted_share, job_share, seconds)
