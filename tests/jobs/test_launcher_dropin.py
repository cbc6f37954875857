"""The bridge as a drop-in for torch's launcher: what torch's own launcher, agent and events tests check holds with
``torchelastic_otel.install()`` in the launching process, compared in each test with plain torch running the same code.

Each scenario runs twice in a process of its own (``_dropin_child.py``): plain, and with the bridge installed the
custom-launcher way, exporting over real OTLP to a receiver on 127.0.0.1 (live) or to a closed port (collector down).
Workers are real: spawned, forked and subprocess workers started by torch's ``LocalElasticAgent``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support import ROOT, WORKERS
from tests.support.env import closed_endpoint, otlp_env
from tests.support.otlp_receiver import OtlpReceiver
from tests.support.procs import stop_tree

pytest.importorskip("torch.distributed.launcher.api")

CHILD = WORKERS / "_dropin_child.py"
#: Bound on one scenario run (a hang, such as an agent whose forked child never exits, fails instead of blocking).
SCENARIO_TIMEOUT = 300
BOOTSTRAP = str(ROOT / "torchelastic_otel" / "_bootstrap")


def _env(endpoint: str) -> dict[str, str]:
    """Every signal over OTLP/gRPC to ``endpoint`` at the SDK's own intervals."""
    return otlp_env(endpoint, pace={}, OTEL_TRACES_EXPORTER="otlp", OTEL_METRICS_EXPORTER="otlp",
                    OTEL_LOGS_EXPORTER="otlp", OTEL_SERVICE_NAME="dropin-test")  # fmt: skip


def run_scenario(mode: str, scenario: str, endpoint: str, tmp_path: Path) -> dict[str, Any]:
    """``scenario`` in a fresh process, ``plain`` or ``bridged``; its observations."""
    out = tmp_path / f"{scenario}-{mode}.json"
    log = tmp_path / f"{scenario}-{mode}.log"
    with open(log, "wb") as fh:
        proc = subprocess.Popen(
            [sys.executable, str(CHILD), mode, scenario, str(out)],
            env=_env(endpoint),
            stdout=fh,
            stderr=subprocess.STDOUT,
            cwd=tmp_path,
        )
        try:
            code = proc.wait(timeout=SCENARIO_TIMEOUT)
        except subprocess.TimeoutExpired:
            code = None
        finally:
            stop_tree(proc)
    tail = log.read_text(errors="replace")[-3000:]
    assert code == 0, f"{scenario} ({mode}) ended with {code}:\n{tail}"
    return json.loads(out.read_text())


@pytest.fixture(params=["live", "down"])
def endpoint(request: pytest.FixtureRequest) -> Any:
    """A live collector on 127.0.0.1, or a closed port (collector down)."""
    if request.param == "down":
        yield closed_endpoint()
        return
    with OtlpReceiver() as rx:
        yield rx.grpc_endpoint


def _plain_and_bridged(scenario: str, endpoint: str, tmp_path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    return run_scenario("plain", scenario, endpoint, tmp_path), run_scenario("bridged", scenario, endpoint, tmp_path)


def _assert_handed_down(env: dict[str, Any]) -> None:
    """What a bridged agent gives the workers it starts (and only them)."""
    assert env["TRACEPARENT"] and env["TRACEPARENT"].startswith("00-"), env
    assert env["TORCHELASTIC_OTEL_FAILURE_DIR"], env
    assert env["TORCHELASTIC_OTEL_AUTO_INSTALL"] == "1", env
    assert env["PYTHONPATH"].split(os.pathsep)[0] == BOOTSTRAP, env


def _assert_not_handed_down(env: dict[str, Any]) -> None:
    assert BOOTSTRAP not in (env["PYTHONPATH"] or "").split(os.pathsep), env
    assert not any(env[name] for name in env if name != "PYTHONPATH"), env


def test_in_process_launches_one_after_another(endpoint: str, tmp_path: Path) -> None:
    """Launches in one process one after another -- spawned, forked and subprocess workers -- return what plain
    torch returns, leave the launching process's environment as plain torch leaves it, and hand the bridge's
    variables to the workers of every start method."""
    plain, bridged = _plain_and_bridged("sequential", endpoint, tmp_path)
    for name in ("spawn", "fork"):
        assert [v["rank"] for v in bridged[name]["views"]] == [v["rank"] for v in plain[name]["views"]] == [0, 1]
        assert bridged[name]["environ_changed"] == plain[name]["environ_changed"]
        for view in plain[name]["views"]:
            _assert_not_handed_down(view["env"])
        for view in bridged[name]["views"]:
            _assert_handed_down(view["env"])
    assert bridged["fork"]["views"][0]["installed"] is True  # a forked worker inherits the agent's bridge
    assert bridged["script"]["returns"] == plain["script"]["returns"] == [[0, None], [1, None]]
    assert bridged["script"]["environ_changed"] == plain["script"]["environ_changed"]
    for rank, view in bridged["script"]["views"].items():
        _assert_handed_down(view["env"])
        assert view["installed"] is True, f"script worker {rank} did not load the bridge"
    for view in plain["script"]["views"].values():
        _assert_not_handed_down(view["env"])
        assert view["installed"] is False
    # Each launch's workers get their own attempt's trace context.
    parents = {bridged[name]["views"][0]["env"]["TRACEPARENT"] for name in ("spawn", "fork")}
    parents.add(bridged["script"]["views"]["0"]["env"]["TRACEPARENT"])
    assert len(parents) == 3
    assert bridged["environ_changed_overall"] == plain["environ_changed_overall"]


@pytest.mark.parametrize("context_name", ["spawn", "fork"])
def test_several_agents_in_one_process(context_name: str, tmp_path: Path) -> None:
    """An agent in this process and one in a spawned or forked child, as torch's launcher and agent tests run them,
    after an in-process launch that hosted its store here and one that failed: the job completes as with plain
    torch. The forked child collects the garbage it inherited first: with the collector down, failed gRPC exports
    leave the exporter's old channel in reference cycles, and a child destroying a gRPC channel of its parent's
    aborts (``std::system_error``), its peers then waiting for it -- the hang of torch's
    ``test_correct_rank_assignment_heterogeneous_etcd_v2``."""
    endpoint = closed_endpoint()
    plain, bridged = _plain_and_bridged(f"agents_{context_name}", endpoint, tmp_path)
    assert plain["hung"] is False and bridged["hung"] is False
    assert bridged["child_exitcode"] == plain["child_exitcode"] == 0
    assert bridged["ranks"] == plain["ranks"] == [0, 1, 2, 3]
    assert bridged["failed_launch"] == plain["failed_launch"] == "ChildFailedError"
    assert bridged["previous_environ_changed"] == plain["previous_environ_changed"]
    assert bridged["environ_changed"] == plain["environ_changed"]
    assert bridged["environ_changed_overall"] == plain["environ_changed_overall"]


def _without_numbers(calls: list[list[str]]) -> list[tuple[str, ...]]:
    return [tuple(re.sub(r"[0-9]+", "N", part) for part in call) for call in calls]


def test_rendezvous_events_take_torchs_call_chain(tmp_path: Path) -> None:
    """``construct_and_record_rdzv_event`` reaches torch's ``record_rdzv_event`` (a wrapper a library put there)
    exactly as often as with plain torch -- never while torch's destination is a NullHandler -- with torch's
    ``RdzvEvent``, whether called directly or by a real rendezvous."""
    with OtlpReceiver() as rx:
        endpoint = rx.grpc_endpoint
        plain, bridged = _plain_and_bridged("events", endpoint, tmp_path)
        # ... and the bridge still exports every rendezvous event, NullHandler or not.
        assert rx.wait_for(lambda r: any("called directly" in str(rec.get("body")) + json.dumps(
            rec.get("attributes", {}), default=str) for rec in r.logs()), timeout=30)  # fmt: skip
    assert plain["null"] == bridged["null"] == []
    assert plain["stream"], "plain torch recorded no rendezvous event"
    assert _without_numbers(bridged["stream"]) == _without_numbers(plain["stream"])  # pids and ports differ
    assert {module for module, _, _ in bridged["stream"]} == {"torch.distributed.elastic.events.api"}
    assert ["torch.distributed.elastic.events.api", "called directly", "RUNNING"] in bridged["stream"]


def test_the_bridges_launcher_in_place_of_torchs_main(tmp_path: Path) -> None:
    """``torchelastic_otel.run.main`` called in-process twice where code calls ``torch.distributed.run.main``:
    the same workers run, and the launching process's environment changes as with torch's (the run id the agent's
    resource needs is set for the launch only)."""
    endpoint = closed_endpoint()
    plain, bridged = _plain_and_bridged("run_main", endpoint, tmp_path)
    for launched_plain, launched in zip(plain["launches"], bridged["launches"], strict=True):
        assert sorted(launched["views"]) == sorted(launched_plain["views"]) == ["0", "1"]
        assert launched["environ_changed"] == launched_plain["environ_changed"]
        for view in launched["views"].values():
            _assert_handed_down(view["env"])
    assert bridged["environ_changed_overall"] == plain["environ_changed_overall"]


def test_no_reference_to_torch_objects_past_their_run(tmp_path: Path) -> None:
    """Once an agent's run is over and its caller lets go of it, the agent, its rendezvous handler and the TCP store
    it hosted are freed by reference counting alone (garbage collector off), as with plain torch: the bridge keeps
    none of them (a store kept alive only through a cycle would be destroyed whenever a collection runs, maybe in a
    forked child)."""
    endpoint = closed_endpoint()
    plain, bridged = _plain_and_bridged("lifetime", endpoint, tmp_path)
    gone = {"agent_alive": False, "handler_alive": False, "store_port_open": False}
    assert plain["function"] == plain["script"] == gone, plain
    assert bridged["function"] == bridged["script"] == gone, bridged


def test_the_workers_get_the_bootstrap_first_on_their_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """What ``install()`` hands down is computed against the launching process's environment when workers start:
    the bootstrap goes first on the workers' ``PYTHONPATH`` (also where it is already on it further down, as behind
    OpenTelemetry's auto-instrumentation directory), and nothing is left once the bridge is uninstalled."""
    from torchelastic_otel._torch.patches import Patches
    from torchelastic_otel._torch.worker_env import prepend_env_path, set_env, worker_environ

    patches = Patches()
    prepend_env_path(patches, "PYTHONPATH", BOOTSTRAP)
    set_env(patches, "TORCHELASTIC_OTEL_AUTO_INSTALL", "1")
    try:
        for current, expected in (
            (None, [BOOTSTRAP]),
            ("/a:/b", [BOOTSTRAP, "/a", "/b"]),
            (f"/auto:{BOOTSTRAP}:/b", [BOOTSTRAP, "/auto", "/b"]),
        ):
            if current is None:
                monkeypatch.delenv("PYTHONPATH", raising=False)
            else:
                monkeypatch.setenv("PYTHONPATH", current)
            before = dict(os.environ)
            env = worker_environ()
            assert env["PYTHONPATH"].split(os.pathsep) == expected
            assert env["TORCHELASTIC_OTEL_AUTO_INSTALL"] == "1"
            assert dict(os.environ) == before
    finally:
        patches.restore()
    assert worker_environ() == {}
