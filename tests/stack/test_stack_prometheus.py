"""A real Prometheus server scrapes a real failing 2-worker torchrun job through the bridge's Prometheus endpoints.

One job (module fixture) is run and watched phase by phase:

- ``/usr/bin/prometheus`` (Debian's package) runs on 127.0.0.1 with a configuration derived from the committed
  ``collector-config/prometheus.yml`` (its direct-pull job ``torchelastic``, targets rewritten to this job's ports:
  the agent on the base port, the worker of local rank k on base + 1 + k, scraped every second) and the committed
  alert rules ``collector-config/alerts/torchelastic.rules.yml``, evaluated every second;
- the job: ``torchelastic-otel run`` (through ``tests/support/workers/_stack_launcher.py``, which keeps the agent's
  process -- and its endpoint -- up after the run so its final values can be scraped), ``--nproc-per-node 2
  --max-restarts 1 --nnodes 1:2 --rdzv-conf last_call_timeout=6`` (each rendezvous round really waits 6 s for a second
  node: a slow rendezvous), workers ``tests/support/workers/_stack_worker.py`` with rank 1 failing in every attempt, so
  the job restarts once, exhausts its restarts and fails (flakiness 100). The workers wait for the test's go-ahead after
  their steps, so every attempt is scraped.

At each phase (attempt 0 running, attempt 1 running, run ended) the test waits until Prometheus has stored what
the job produced and the alerts firing in Prometheus are the expected ones, stable for 2 s. Then it checks the
values by Prometheus' HTTP API; replays the recorded series through ``promtool test rules`` (the alerts it computes
must be exactly those the live server fired, labels and annotations); and checks that every metric name the
Grafana dashboard and the alert rules use is one the bridge really exported (and every dashboard query returns
data).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.support import ROOT, stack
from tests.support.env import prometheus_env
from tests.support.ports import free_port, free_port_block
from tests.support.waiting import wait_for

pytest.importorskip("torch.distributed.elastic.agent.server.local_elastic_agent")
yaml = stack.require_yaml()

STEPS = 5
BATCH = 16
LAST_CALL_TIMEOUT = 6  # seconds each rendezvous round waits for a 2nd node (--nnodes 1:2): p90 > 5 s, really
PHASE_TIMEOUT = 90.0  # seconds for one phase (an attempt starting: rendezvous + worker start-up under load)
HOLD = 2.0  # seconds a phase's state must stay as expected in Prometheus
ALL_ALERTS = {
    "TorchElasticWorkerGroupFailed",
    "TorchElasticRestartsExhausted",
    "TorchElasticRestartsHappening",
    "TorchElasticRendezvousSlow",
    "TorchElasticHighFlakiness",
}
#: The alerts that must fire in each phase of the job.
EXPECTED_ALERTS = {
    "attempt0": {"TorchElasticRendezvousSlow"},
    "attempt1": {"TorchElasticRendezvousSlow", "TorchElasticRestartsHappening", "TorchElasticRestartsExhausted"},
    "final": ALL_ALERTS,
}
PROMETHEUS_SYNTHETIC = {
    "up",
    "scrape_duration_seconds",
    "scrape_samples_scraped",
    "scrape_samples_post_metric_relabeling",
    "scrape_series_added",
    "ALERTS",
    "ALERTS_FOR_STATE",
}


@dataclass
class Phase:
    name: str
    at: float  # a wall-clock time inside the interval the state was stable
    firing: list[dict[str, Any]]
    values: dict[str, list[dict[str, Any]]] = field(default_factory=dict)


@dataclass
class FailingJob:
    prom: stack.Prometheus
    base: int
    reports: dict[tuple[int, int], dict[str, Any]]
    phases: dict[str, Phase]
    start: float
    end: float
    returncode: int
    output: str

    def instance(self, offset: int) -> str:
        return f"{stack.HOST}:{self.base + offset}"


def prometheus_config(base: int) -> str:
    """The committed prometheus.yml's direct-pull job, pointed at this job's ports, with the committed rules."""
    committed = yaml.safe_load(stack.PROMETHEUS_YML.read_text())
    job = next(j for j in committed["scrape_configs"] if j["job_name"] == "torchelastic")
    static = job["static_configs"][0]
    assert len(static["targets"]) == 3, "the committed direct-pull job lists the agent and two workers"
    job = {
        **job,
        "scrape_interval": "1s",
        "scrape_timeout": "1s",
        "static_configs": [{**static, "targets": [f"{stack.HOST}:{base + i}" for i in range(3)]}],
    }
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(stack.RULES)],
        "scrape_configs": [job],
    }
    return yaml.safe_dump(config, sort_keys=False)


def _worker_query(metric: str, restart: int) -> str:
    return (
        f"{metric} * on (job, instance) group_left (torchelastic_rank, torchelastic_local_rank, "
        f'torchelastic_restart_count, torchelastic_run_id) target_info{{torchelastic_restart_count="{restart}"}}'
    )


def _value(prom: stack.Prometheus, expr: str) -> float | None:
    result = prom.query(expr)
    return result[0]["value"] if len(result) == 1 else None


def _hold(prom: stack.Prometheus, name: str, ready: Any, expected: set[str], describe: Any) -> Phase:
    """Wait until ``ready()`` and the firing alerts == ``expected`` have held for ``HOLD`` s in a row."""
    since: float | None = None
    deadline = time.monotonic() + PHASE_TIMEOUT
    last: Any = None
    while time.monotonic() < deadline:
        firing = prom.firing()
        names = {a["labels"]["alertname"] for a in firing}
        is_ready = bool(ready())
        ok = is_ready and names == expected
        last = (names, is_ready)
        now = time.time()
        if not ok:
            since = None
        elif since is None:
            since = now
        elif now - since >= HOLD:
            return Phase(name, since + HOLD / 2, firing)
        time.sleep(0.2)
    pytest.fail(
        f"phase {name}: not reached in {PHASE_TIMEOUT} s (firing, ready = {last}; expected {expected})\n{describe()}"
    )


def prometheus_only_env(port: int) -> dict[str, str]:
    """Metrics only, pulled by Prometheus from 127.0.0.1:``port`` (a worker's: ``port`` + 1 + its local rank)."""
    return prometheus_env(port)


@pytest.fixture(scope="module")
def failing_job(tmp_path_factory: pytest.TempPathFactory) -> Any:
    binary = stack.prometheus_bin()
    tmp = tmp_path_factory.mktemp("stack_prometheus")
    flags = tmp / "flags"
    flags.mkdir()
    base = free_port_block(3)
    prom = stack.Prometheus(binary, tmp / "prometheus", prometheus_config(base), avoid={base, base + 1, base + 2})
    job: stack.Proc | None = None
    prom.start()
    try:
        env = prometheus_only_env(base)
        cmd = [
            sys.executable, stack.LAUNCHER, flags, "60",
            "--standalone", "--nnodes", "1:2", "--rdzv-conf", f"last_call_timeout={LAST_CALL_TIMEOUT}",
            "--nproc-per-node", "2", "--max-restarts", "1", "--monitor-interval", "0.1",
            stack.WORKER, "--flag-dir", flags, "--steps", str(STEPS), "--wait", "60", "--fail-always-rank", "1",
        ]  # fmt: skip
        job = stack.start(cmd, tmp / "job.log", env=env)

        def describe() -> str:
            return f"{prom.describe()}\njob output:\n{job.output()}"

        reports: dict[tuple[int, int], dict[str, Any]] = {}
        phases: dict[str, Phase] = {}
        for restart in (0, 1):
            files = [flags / f"ready-r{restart}-rank{rank}.json" for rank in (0, 1)]
            wait_for(
                lambda files=files: all(f.exists() for f in files),
                PHASE_TIMEOUT,
                f"both workers of attempt {restart} to finish their steps",
                on_timeout=describe,
                interval=0.2,
            )
            for rank, path in enumerate(files):
                reports[(restart, rank)] = json.loads(path.read_text())

            def ready(restart: int = restart) -> bool:
                samples = prom.query(_worker_query("samples_total", restart))
                return (
                    len(samples) == 2
                    and all(s["value"] == BATCH * STEPS for s in samples)
                    and _value(prom, "torchelastic_workers_remaining_restarts") == 1 - restart
                    and (restart == 0 or _value(prom, "torchelastic_workers_restarts_total") == 1)
                )

            name = f"attempt{restart}"
            phase = _hold(prom, name, ready, EXPECTED_ALERTS[name], describe)
            for metric in (
                "loss",
                "samples_total",
                'torchelastic_function_calls_total{function="__main__.train_step"}',
            ):
                phase.values[metric] = prom.query(_worker_query(metric, restart))
            phases[name] = phase
            (flags / f"go-r{restart}").touch()

        wait_for(
            lambda: (flags / "agent-done").exists(),
            PHASE_TIMEOUT,
            "the agent's run to end",
            on_timeout=describe,
            interval=0.2,
        )
        phases["final"] = _hold(
            prom, "final",
            lambda: _value(prom, "torchelastic_workers_runs_total") == 1
            and _value(prom, "torchelastic_workers_flakiness_percent") == 100,
            EXPECTED_ALERTS["final"], describe,
        )  # fmt: skip
        for expr in (
            "torchelastic_workers_remaining_restarts",
            "torchelastic_workers_restarts_total",
            "torchelastic_workers_flakiness_percent",
            "torchelastic_workers_runs_total",
            "torchelastic_workers_run_outcomes_total",
            "torchelastic_workers_state_observations_total",
            'torchelastic_function_calls_total{function="SimpleElasticAgent._rendezvous"}',
            'torchelastic_function_duration_seconds_count{function="SimpleElasticAgent._rendezvous"}',
            "histogram_quantile(0.9, sum by (le) "
            '(torchelastic_function_duration_seconds_bucket{function="SimpleElasticAgent._rendezvous"}))',
        ):
            phases["final"].values[expr] = prom.query(expr)
        for restart in (0, 1):  # the agent's values as they were during each attempt
            phase = phases[f"attempt{restart}"]
            phase.values["agent"] = [
                *prom.query("torchelastic_workers_remaining_restarts", at=phase.at),
                *prom.query("torchelastic_workers_restarts_total", at=phase.at),
                *prom.query(
                    'torchelastic_function_calls_total{function="SimpleElasticAgent._rendezvous"}', at=phase.at
                ),
            ]
        end = time.time()
        (flags / "agent-exit").touch()
        returncode = job.wait(30)
        yield FailingJob(prom, base, reports, phases, prom.started_at, end, returncode, job.output())
    finally:
        if job is not None:
            job.stop()
        prom.stop()


# ---- what Prometheus scraped ----------------------------------------------------------------------------------


def test_the_job_failed_after_one_restart(failing_job: FailingJob) -> None:
    assert failing_job.returncode == 1, failing_job.output
    assert set(failing_job.reports) == {(0, 0), (0, 1), (1, 0), (1, 1)}


@pytest.mark.parametrize("restart", [0, 1])
def test_worker_series_scraped_with_their_values_and_labels(failing_job: FailingJob, restart: int) -> None:
    """The workers' own put_metric values (loss gauge, samples_total counter) and @prof calls, per rank."""
    values = failing_job.phases[f"attempt{restart}"].values
    run_ids = set()
    for metric, key in (
        ("loss", "loss"),
        ("samples_total", "samples"),
        ('torchelastic_function_calls_total{function="__main__.train_step"}', "steps"),
    ):
        by_rank = {int(r["metric"]["torchelastic_rank"]): r for r in values[metric]}
        assert set(by_rank) == {0, 1}, values[metric]
        for rank, result in by_rank.items():
            report = failing_job.reports[(restart, rank)]
            labels = result["metric"]
            assert result["value"] == pytest.approx(report[key], rel=1e-9), (metric, rank, result, report)
            assert labels["metric_group"] == "trainer"
            assert labels["job"] == "torchelastic"
            assert labels["route"] == "direct"  # the committed prometheus.yml's target labels
            assert labels["instance"] == failing_job.instance(1 + report["local_rank"])  # port + 1 + local rank
            assert labels["torchelastic_local_rank"] == str(report["local_rank"])
            assert labels["torchelastic_restart_count"] == str(restart)
            run_ids.add(labels["torchelastic_run_id"])
    assert len(run_ids) == 1 and "" not in run_ids


def test_agent_series_scraped_during_the_run(failing_job: FailingJob) -> None:
    def by_name(phase: str) -> dict[str, dict[str, Any]]:
        return {r["metric"]["__name__"]: r for r in failing_job.phases[phase].values["agent"]}

    first, second = by_name("attempt0"), by_name("attempt1")
    assert first["torchelastic_workers_remaining_restarts"]["value"] == 1
    assert "torchelastic_workers_restarts_total" not in first
    assert first["torchelastic_function_calls_total"]["value"] == 1
    assert first["torchelastic_function_calls_total"]["metric"]["outcome"] == "success"
    assert second["torchelastic_workers_remaining_restarts"]["value"] == 0
    assert second["torchelastic_workers_restarts_total"]["value"] == 1
    assert second["torchelastic_function_calls_total"]["value"] == 2
    for result in (*first.values(), *second.values()):
        assert result["metric"]["instance"] == failing_job.instance(0)  # the agent: the base port
        assert result["metric"]["metric_group"] == "torchelastic"


def test_agent_final_values_scraped(failing_job: FailingJob) -> None:
    values = failing_job.phases["final"].values

    def one(expr: str) -> dict[str, Any]:
        assert len(values[expr]) == 1, values[expr]
        return values[expr][0]

    assert one("torchelastic_workers_remaining_restarts")["value"] == 0
    assert one("torchelastic_workers_restarts_total")["value"] == 1
    flakiness = one("torchelastic_workers_flakiness_percent")
    assert flakiness["value"] == 100 and flakiness["metric"]["role"] == "default"
    assert one("torchelastic_workers_runs_total")["value"] == 1
    outcomes = {r["metric"]["outcome"]: r["value"] for r in values["torchelastic_workers_run_outcomes_total"]}
    assert outcomes == {
        "failed_with_retries": 1,
        "failed_no_retries": 0,
        "success_with_retries": 0,
        "success_no_retries": 0,
    }
    states = {r["metric"]["state"]: r["value"] for r in values["torchelastic_workers_state_observations_total"]}
    assert states["failed"] == 2 and states["healthy"] > 0, states  # one FAILED observation per attempt
    assert one('torchelastic_function_calls_total{function="SimpleElasticAgent._rendezvous"}')["value"] == 2
    assert one('torchelastic_function_duration_seconds_count{function="SimpleElasticAgent._rendezvous"}')["value"] == 2
    p90 = one(
        "histogram_quantile(0.9, sum by (le) "
        '(torchelastic_function_duration_seconds_bucket{function="SimpleElasticAgent._rendezvous"}))'
    )
    assert p90["value"] > 5, p90  # two rounds of ~6 s (last_call_timeout): slow, as the alert says


# ---- the alert rules ------------------------------------------------------------------------------------------


def test_alerts_fired_live_in_prometheus(failing_job: FailingJob) -> None:
    for name, phase in failing_job.phases.items():
        firing = {a["labels"]["alertname"]: a for a in phase.firing}
        assert set(firing) == EXPECTED_ALERTS[name]
        for alert in firing.values():
            labels = alert["labels"]
            assert labels["job"] == "torchelastic" and labels["instance"] == failing_job.instance(0), labels
            assert labels["severity"] in ("warning", "critical")
            if alert["labels"]["alertname"] != "TorchElasticRendezvousSlow":
                assert labels["role"] == "default"


def _alert_expectations(phase: Phase) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {name: [] for name in ALL_ALERTS}
    for alert in phase.firing:
        labels = {k: v for k, v in alert["labels"].items() if k != "alertname"}
        out[alert["labels"]["alertname"]].append({"exp_labels": labels, "exp_annotations": alert["annotations"]})
    return out


def promtool_test_file(job: FailingJob, rules: Path, path: Path, names: set[str]) -> Path:
    """A ``promtool test rules`` file: the series of ``names`` as the live Prometheus stored them, and at each
    phase's time the alerts the live Prometheus had firing (labels, rendered annotations)."""
    recording = stack.record_series(job.prom, f'{{__name__=~"{"|".join(sorted(names))}"}}', job.start, job.end)
    assert recording.series, "nothing recorded"
    tests = []
    for phase in job.phases.values():
        eval_index = round(phase.at - recording.start)
        assert 0 < eval_index < recording.n, (phase.at, recording.start, recording.n)
        for alertname, expected in sorted(_alert_expectations(phase).items()):
            tests.append({"eval_time": f"{eval_index}s", "alertname": alertname, "exp_alerts": expected})
    document = {
        "rule_files": [str(rules)],
        "evaluation_interval": "1s",
        "tests": [{
            "interval": "1s",
            "input_series": [{"series": s, "values": v} for s, v in recording.series],
            "alert_rule_test": tests,
        }],
    }  # fmt: skip
    path.write_text(yaml.safe_dump(document, sort_keys=False, width=1_000_000))
    return path


def test_promtool_fires_every_alert_on_the_recorded_series(failing_job: FailingJob, tmp_path: Path) -> None:
    """The live alerts are reproduced by ``promtool test rules`` from the stored series alone."""
    promtool = stack.promtool_bin()
    names = set().union(*(stack.promql_metric_names(e) for e in stack.rule_exprs().values()))
    test_file = promtool_test_file(failing_job, stack.RULES, tmp_path / "recorded.rules.test.yml", names)
    result = stack.run_tool([promtool, "test", "rules", str(test_file)])
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}\n(test file kept at {test_file})"
    assert "SUCCESS" in result.stdout
    fired = {
        t["alertname"] for t in yaml.safe_load(test_file.read_text())["tests"][0]["alert_rule_test"] if t["exp_alerts"]
    }
    assert fired == ALL_ALERTS
    target = os.environ.get("STACK_WRITE_RULES_TEST")  # regenerate the committed example from this real run
    if target:
        write_committed_example(failing_job, test_file, Path(target))


def write_committed_example(job: FailingJob, recorded: Path, target: Path) -> None:
    """``alerts/torchelastic.rules.test.yml``: the recorded test, with only the series the rules select (the
    rendezvous' buckets of all the histogram's functions) and the ports of this run shown as the defaults
    (agent 9464, workers 9465 / 9466)."""
    document = yaml.safe_load(recorded.read_text())
    document["rule_files"] = [stack.RULES.name]
    test = document["tests"][0]
    test["input_series"] = [
        s for s in test["input_series"]
        if "function=" not in s["series"] or 'function="SimpleElasticAgent._rendezvous"' in s["series"]
    ]  # fmt: skip
    text = yaml.safe_dump(document, sort_keys=False, width=1_000_000)
    for offset in range(3):
        text = text.replace(job.instance(offset), f"{stack.HOST}:{9464 + offset}")
    target.write_text(
        "# `promtool test rules` of torchelastic.rules.yml on series recorded by a real Prometheus from a real\n"
        "# failing job: 2 workers, rank 1 failing in every attempt, --max-restarts 1, a 6 s rendezvous. At each\n"
        "# eval_time the expected alerts are those the live Prometheus had firing (attempt 0; attempt 1 after the\n"
        "# restart; after the run failed). Regenerate: STACK_WRITE_RULES_TEST=collector-config/alerts/\n"
        "# torchelastic.rules.test.yml python -m pytest tests/stack/test_stack_prometheus.py\n" + text
    )


# ---- names and queries used by the dashboard and the rules ------------------------------------------------------


def _used_names() -> dict[str, set[str]]:
    used: dict[str, set[str]] = {}
    for alert, expr in stack.rule_exprs().items():
        for name in stack.promql_metric_names(expr):
            used.setdefault(name, set()).add(f"rule {alert}")
    for target in stack.dashboard_targets():
        if (target.get("datasource") or {}).get("type") != "prometheus":
            continue
        for name in stack.promql_metric_names(stack.grafana_to_promql(target["expr"])):
            used.setdefault(name, set()).add(f"dashboard {target['panel']}")
    return used


def test_dashboard_and_rules_use_only_names_the_bridge_exported(failing_job: FailingJob) -> None:
    exported = failing_job.prom.names('{job="torchelastic"}') - PROMETHEUS_SYNTHETIC
    used = _used_names()
    assert {
        "torchelastic_workers_restarts_total",
        "torchelastic_function_duration_seconds_bucket",
        "loss",
        "samples_total",
        "target_info",
    } <= set(used), sorted(used)
    missing = {name: sorted(where) for name, where in used.items() if name not in exported}
    assert not missing, f"not exported by the bridge: {missing}\nexported: {sorted(exported)}"


def test_every_dashboard_query_returns_data_from_the_job(failing_job: FailingJob) -> None:
    prom = failing_job.prom
    empty = []
    for target in stack.dashboard_targets():
        if (target.get("datasource") or {}).get("type") != "prometheus":
            continue
        expr = stack.grafana_to_promql(target["expr"])
        result = prom.query_range(expr, failing_job.start, failing_job.end, 1.0)
        if not result:
            empty.append((target["panel"], expr))
    assert not empty, f"queries without data: {empty}"


def test_promql_name_extraction() -> None:
    names = stack.promql_metric_names(
        'histogram_quantile(0.9, sum by (le, job) (rate(a_bucket{function="x.y", le!="1"}[5m] offset 1h)))'
        ' > on (job) group_left (foo) b_total unless c offset 15m or vector(1) and d{__name__="e"} * 2e3'
        " + sum without (x) (f) / $__range + g[$__rate_interval]"
    )
    assert names == {"a_bucket", "b_total", "c", "d", "e", "f", "g"}


_FLUSH_THEN_SCRAPE = """
import os, sys, urllib.request
import torchelastic_otel
from torchelastic_otel import metrics
metrics.configure(metrics.OtelMetricHandler())
metrics.put_metric("loss", 0.5, "trainer")
torchelastic_otel.flush()
metrics.put_metric("loss", 0.25, "trainer")
url = "http://127.0.0.1:%s/metrics" % os.environ["OTEL_EXPORTER_PROMETHEUS_PORT"]
sys.stdout.write(urllib.request.urlopen(url, timeout=10).read().decode())
sys.stdout.flush()
os._exit(0)
"""


def test_a_scrape_after_flush_serves_each_series_once_with_its_current_value() -> None:
    """Prometheus keeps the first sample of a series in a scrape: it must be the current value, once.

    ``flush()`` must not collect the pull-only Prometheus reader: its collector would queue that snapshot and the
    next scrape would repeat every metric family with the stale value first (opentelemetry-python#2500)."""
    port = free_port()
    env = prometheus_only_env(port)
    result = subprocess.run(
        [sys.executable, "-c", _FLUSH_THEN_SCRAPE],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
    )
    assert result.returncode == 0, result.stderr
    samples = [line for line in result.stdout.splitlines() if line.startswith("loss{")]
    assert len(samples) == 1 and samples[0].endswith(" 0.25"), samples
