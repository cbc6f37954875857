"""``collector-config/otelcol-aggregate-per-node.yaml`` run by a real OpenTelemetry Collector (``otelcol-contrib`` on
PATH), fed by a real 2-rank torchrun job.

The committed config runs with only its endpoints moved to free 127.0.0.1 ports (its OTLP receiver, its health
check, and its exporter aimed at this test's loopback OTLP receiver, ``tests/support/otlp_receiver.py``) and a 3 s
aggregation interval (``TORCHELASTIC_AGGREGATE_INTERVAL``, at least twice the job's 1 s export interval). First
``otelcol-contrib validate`` accepts it -- every component and option name. Then the job
(``bench/_cardinality_worker.py``: DDP on CPU/gloo, ``--steps`` steps on each of 2 ranks, checkpoints) exports to it
over OTLP/gRPC, and what reaches the receiver must be per node where the config says so: one
``torchelastic.worker.steps`` stream whose resource is the node (``torchelastic.process.kind=node``, no rank, the
node's instance id), valued the sum of both ranks' steps, and none per rank; the step arrival (the straggler rule's
input) still per rank, for ranks 0 and 1.

No collector binary can be downloaded here (only the PyPI / Debian / npm registries are reachable) and rotel, the
collector in the venv (tests/stack/test_stack_rotel.py), has no aggregation of its own: its metric processors are
per-request Python hooks, with none of the interval / groupbyattrs / transform processors this config uses. So
without ``otelcol-contrib`` the run is skipped; the config is still checked statically, by
tests/unit/test_collector_aggregate_config.py, and here for what this test would change in it.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import ROOT, stack
from tests.support.env import EVERY_SECOND, clean_env, otlp_env
from tests.support.jobs import TORCHELASTIC_OTEL
from tests.support.otlp_receiver import OtlpReceiver
from tests.support.ports import free_port, listening
from tests.support.procs import run_job
from tests.support.waiting import wait_for
from torchelastic_otel import _names as names

yaml = stack.require_yaml()

CONFIG = stack.CONFIG_DIR / "otelcol-aggregate-per-node.yaml"
WORKER = ROOT / "bench" / "_cardinality_worker.py"
RANKS = 2
STEPS = 40
INTERVAL = "3s"
LINGER = 8  # seconds the ranks stay up after their last step: their final values fill a whole 3 s interval
ARRIVAL_TIMEOUT = 120.0  # seconds for the node's final sum to come through after the job's end
COLLECTOR = shutil.which("otelcol-contrib")
NO_COLLECTOR = (
    "otelcol-contrib is not on PATH: it cannot be downloaded here (PyPI / Debian / npm only), and rotel has no "
    "aggregation (no interval / groupbyattrs / transform processors); the config is checked statically instead"
)


def local_config(collector_grpc: int, collector_http: int, health: int, receiver_grpc: int) -> dict[str, Any]:
    """The committed config with its endpoints on this test's free 127.0.0.1 ports: nothing else changed."""
    config = yaml.safe_load(CONFIG.read_text())
    protocols = config["receivers"]["otlp"]["protocols"]
    protocols["grpc"]["endpoint"] = f"127.0.0.1:{collector_grpc}"
    protocols["http"]["endpoint"] = f"127.0.0.1:{collector_http}"
    config["extensions"]["health_check"]["endpoint"] = f"127.0.0.1:{health}"
    config["exporters"]["otlp"]["endpoint"] = f"127.0.0.1:{receiver_grpc}"
    return config


def collector_env(queue_dir: Path) -> dict[str, str]:
    return clean_env(OTELCOL_QUEUE_DIR=str(queue_dir), TORCHELASTIC_AGGREGATE_INTERVAL=INTERVAL)


def test_the_run_changes_only_endpoints_all_on_loopback() -> None:
    committed = yaml.safe_load(CONFIG.read_text())
    local = local_config(1, 2, 3, 4)
    endpoints = [
        local["receivers"]["otlp"]["protocols"]["grpc"]["endpoint"],
        local["receivers"]["otlp"]["protocols"]["http"]["endpoint"],
        local["extensions"]["health_check"]["endpoint"],
        local["exporters"]["otlp"]["endpoint"],
    ]
    assert all(e.startswith("127.0.0.1:") for e in endpoints)
    for section in ("processors", "service", "connectors"):
        assert local.get(section) == committed.get(section), section


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as rx:
        yield rx


@pytest.mark.skipif(COLLECTOR is None, reason=NO_COLLECTOR)
def test_a_real_job_comes_out_per_node(receiver: OtlpReceiver, tmp_path: Path) -> None:
    assert COLLECTOR is not None
    queue = tmp_path / "queue"
    queue.mkdir()
    grpc_port, http_port, health = free_port(), free_port(), free_port()
    config = tmp_path / "otelcol.yaml"
    config.write_text(yaml.safe_dump(local_config(grpc_port, http_port, health, receiver.grpc_port), sort_keys=False))
    env = collector_env(queue)
    validated = subprocess.run(
        [COLLECTOR, "validate", f"--config={config}"], env=env, capture_output=True, text=True, timeout=60
    )
    assert validated.returncode == 0, f"otelcol-contrib rejects the config:\n{validated.stdout}\n{validated.stderr}"

    collector = stack.start([COLLECTOR, f"--config={config}"], tmp_path / "otelcol.log", env=env)
    try:
        wait_for(
            lambda: listening(grpc_port) or not collector.running(),
            30.0,
            "the collector to listen",
            interval=0.1,
            on_timeout=collector.output,
        )
        assert collector.running(), f"the collector exited:\n{collector.output()}"
        job_env = otlp_env(
            f"http://127.0.0.1:{grpc_port}",
            pace=EVERY_SECOND,
            OTEL_TRACES_EXPORTER="none",
            OTEL_LOGS_EXPORTER="none",
            TORCHELASTIC_OTEL_COLLECTIVES_INTERVAL="1",
        )
        cmd = [
            str(TORCHELASTIC_OTEL), "run", "--standalone", "--nproc-per-node", str(RANKS), "--monitor-interval", "0.1",
            str(WORKER), "--dir", str(tmp_path / "ckpt"), "--steps", str(STEPS), "--save-every", str(STEPS // 2),
            "--linger", str(LINGER),
        ]  # fmt: skip
        (tmp_path / "ckpt").mkdir()
        job = run_job(cmd, job_env, ROOT, tmp_path / "job.log", timeout=240.0)
        assert job.returncode == 0, job.tail()

        def node_steps(rx: OtlpReceiver) -> list[dict[str, Any]]:
            points = rx.metric_points(names.WORKER_STEPS)
            return [p for p in points if p["resource"].get(names.PROCESS_KIND) == "node"]

        complete = receiver.wait_for(
            lambda rx: any(p["value"] == RANKS * STEPS for p in node_steps(rx)), ARRIVAL_TIMEOUT
        )
        assert complete, f"no per-node sum of {RANKS * STEPS} steps: {node_steps(receiver)}\n{collector.output()}"
        steps = receiver.metric_points(names.WORKER_STEPS)
        assert all(p["resource"].get(names.PROCESS_KIND) == "node" for p in steps), "no per-rank steps series"
        for point in node_steps(receiver):
            resource = point["resource"]
            assert names.RANK not in resource and "process.pid" not in resource
            assert resource["host.name"] and resource[names.RUN_ID]
            assert resource["service.instance.id"].endswith("/workers")
        assert len({p["resource"]["service.instance.id"] for p in node_steps(receiver)}) == 1, "one node"
        arrival = receiver.metric_points(names.WORKER_STEP_ARRIVAL)
        assert {p["resource"].get(names.RANK) for p in arrival} == set(range(RANKS)), (
            "the straggler rule's input per rank"
        )
    finally:
        collector.stop()
    print(f"per-node aggregation through {COLLECTOR}: ok", file=sys.stderr)
