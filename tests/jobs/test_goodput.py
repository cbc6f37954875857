"""Where a real torchrun job's time went: the report's goodput, step phases and verdict against the job's own clock.

Each job (``tests/support/workers/goodput_worker.py``: DDP on gloo, 2 ranks, never imports the bridge) writes its own
ground truth -- each step's start and end, its wait in the DataLoader, its checkpoint saves -- and the expected
figures come from those files and from this test's clock around the launcher, never from the bridge's code. Each
bridged job writes OTLP JSON Lines files that ``torchelastic-otel report --json`` reads in a subprocess; the same
job under plain torchrun must end the same way.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

import pytest

from tests.support import ROOT
from tests.support.env import clean_env, files_env
from tests.support.jobs import launcher, report_run, unique_id
from tests.support.procs import run_job
from torchelastic_otel import _names as names
from torchelastic_otel.report import otlpjson

WORKER = ROOT / "tests" / "support" / "workers" / "goodput_worker.py"
S = 1e9


def _launch(bridged: bool, out: Path, files: Path, restarts: int = 0, **settings: str) -> tuple[int, float, str]:
    """Run the job; (exit code, wall seconds measured here, output)."""
    out.mkdir(parents=True, exist_ok=True)
    job_settings = dict(OMP_NUM_THREADS="1", GOODPUT_OUT=str(out), **settings)
    env = files_env(files, OTEL_SERVICE_NAME="goodput-test", **job_settings) if bridged else clean_env(**job_settings)
    cmd = [*launcher(bridged), "--standalone", "--nproc-per-node", "2", "--max-restarts", str(restarts),
           "--rdzv-id", unique_id("goodput"), "--monitor-interval", "0.1", str(WORKER)]  # fmt: skip
    job = run_job(cmd, env, ROOT, out.parent / f"{out.name}.log")
    return job.proc.returncode, job.seconds, job.output()


def _truth(out: Path) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted(out.glob("rank*-restart*.json"))]


def _mean_per_rank(records: list[dict[str, Any]], seconds: Any) -> float:
    """The mean over ranks of ``seconds(record)`` summed over each rank's attempts."""
    by_rank: dict[int, float] = {}
    for record in records:
        by_rank[record["rank"]] = by_rank.get(record["rank"], 0.0) + seconds(record)
    return statistics.mean(by_rank.values())


def _step_seconds(record: dict[str, Any], after_ns: int = 0) -> float:
    return sum((end - start) / S for start, end, _ in record["steps"] if start >= after_ns)


def _input_seconds(record: dict[str, Any]) -> float:
    return sum(waited for _, _, waited in record["steps"])


@pytest.fixture(scope="module")
def input_bound(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Each batch costs the loader 60 ms, each forward 20 ms: about three quarters of a step is input wait."""
    base = tmp_path_factory.mktemp("input-bound")
    settings = {"GOODPUT_STEPS": "40", "GOODPUT_INPUT_DELAY": "0.06", "GOODPUT_COMPUTE": "0.02"}
    code, wall, output = _launch(True, base / "out", base / "files", **settings)
    assert code == 0, output[-3000:]
    plain_code, _, plain_output = _launch(False, base / "plain-out", base / "plain-files", **settings)
    return {"run": report_run(base / "files"), "truth": _truth(base / "out"), "wall": wall, "plain": plain_code,
            "output": output}  # fmt: skip


def test_an_input_bound_job_is_named_input_bound_with_its_own_figures(input_bound: dict[str, Any]) -> None:
    run, truth = input_bound["run"], input_bound["truth"]
    assert input_bound["plain"] == 0  # the same job under plain torchrun ends the same way
    assert run["verdict"]["verdict"] == "input-bound", run["verdict"]
    assert "input wait" in run["verdict"]["reason"]
    # per rank, the median input phase is the job's own median wait in the DataLoader (the first batch aside)
    for entry in run["steps"]:
        (record,) = [r for r in truth if r["rank"] == entry["rank"]]
        measured = statistics.median(waited for _, _, waited in record["steps"][1:])
        assert entry["phases"]["input"] == pytest.approx(measured, rel=0.25), entry
        assert set(entry["phases"]) == {"input", "forward", "backward", "optimizer", "collective_wait", "other"}
    seconds = run["goodput"]["seconds"]
    assert seconds["input_wait"] == pytest.approx(_mean_per_rank(truth, _input_seconds), rel=0.1)
    assert sum(seconds.values()) == pytest.approx(run["seconds"], rel=0.01)
    assert seconds["lost_progress"] == 0 and seconds["restart"] == 0


def test_the_goodput_ratio_is_the_job_s_own(input_bound: dict[str, Any]) -> None:
    """Productive: the steps' time less their input wait, as the job timed them, over the launcher's wall time."""
    run, truth = input_bound["run"], input_bound["truth"]
    productive = _mean_per_rank(truth, lambda r: _step_seconds(r) - _input_seconds(r))
    assert run["goodput"]["seconds"]["productive"] == pytest.approx(productive, rel=0.1)
    assert run["goodput"]["ratio"] == pytest.approx(productive / input_bound["wall"], abs=0.03)


@pytest.fixture(scope="module", params=["1", "all"], ids=["rank-1-raises", "every-rank-raises"])
def fails_after_a_save(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A DCP save every 5 steps; 4 steps after the first save rank 1 raises (rank 0 is then in its next step's
    collective: the failure stops it), or every rank does; the second attempt loads the save and goes on."""
    base = tmp_path_factory.mktemp("lost-progress")
    settings = {"GOODPUT_STEPS": "14", "GOODPUT_INPUT_DELAY": "0", "GOODPUT_COMPUTE": "0.25", "GOODPUT_SAVE_EVERY": "5",
                "GOODPUT_FAIL_AFTER_SAVE": "4", "GOODPUT_FAIL_RANKS": request.param}  # fmt: skip
    code, wall, output = _launch(True, base / "out", base / "files", restarts=1, **settings)
    plain_code, _, _ = _launch(False, base / "plain-out", base / "plain-files", restarts=1, **settings)
    return {"run": report_run(base / "files"), "truth": _truth(base / "out"), "wall": wall, "code": code,
            "plain": plain_code, "output": output, "files": base / "files", "failing": request.param}  # fmt: skip


def test_a_failure_after_a_save_loses_the_steps_since_the_save(fails_after_a_save: dict[str, Any]) -> None:
    run, truth = fails_after_a_save["run"], fails_after_a_save["truth"]
    assert fails_after_a_save["code"] == fails_after_a_save["plain"] == 0, fails_after_a_save["output"][-3000:]
    assert run["attempts"] == 2
    failed = [r for r in truth if r["restart"] == 0]
    assert len(failed) == 2 and all(r["saves"] for r in failed)

    def lost(record: dict[str, Any]) -> float:
        if record["restart"] != 0:
            return 0.0
        return _step_seconds(record, after_ns=record["saves"][-1][1])

    expected = _mean_per_rank(truth, lost)
    assert expected > 0.8  # four steps of 0.25 s at least
    seconds = run["goodput"]["seconds"]
    assert seconds["lost_progress"] == pytest.approx(expected, rel=0.1)
    assert seconds["checkpoint_save"] > 0 and seconds["checkpoint_load"] > 0
    assert seconds["restart"] > 0 and seconds["rendezvous"] > 0
    kept = _mean_per_rank(truth, lambda r: _step_seconds(r) - lost(r) - _input_seconds(r))
    assert seconds["productive"] == pytest.approx(kept, rel=0.1)
    assert run["goodput"]["ratio"] == pytest.approx(kept / fails_after_a_save["wall"], abs=0.03)
    assert sum(seconds.values()) == pytest.approx(run["seconds"], rel=0.01)


def test_a_rank_that_raises_says_what_it_lost(fails_after_a_save: dict[str, Any]) -> None:
    """Live: the final words of a rank that raised carry the seconds it threw away (``torchelastic.goodput.
    lost_seconds``) and add them to ``torchelastic.goodput.time`` {cause=lost_progress} -- its steps since the save."""
    tel = otlpjson.read([fails_after_a_save["files"]])
    raised = {0, 1} if fails_after_a_save["failing"] == "all" else {1}
    truth = {r["rank"]: r for r in fails_after_a_save["truth"] if r["restart"] == 0}
    found = {}
    for rec in tel.logs:
        if rec.name == names.WORKER_EXCEPTION and rec.proc.rank in raised and rec.proc.restart == 0:
            found[rec.proc.rank] = rec.attrs.get("torchelastic.goodput.lost_seconds")
    assert set(found) == raised, found
    for rank, seconds in found.items():
        expected = _step_seconds(truth[rank], after_ns=truth[rank]["saves"][-1][1])
        assert seconds == pytest.approx(expected, rel=0.15), (rank, seconds, expected)
    counted = {p.proc.rank: p.value for p in tel.points
               if p.name == names.GOODPUT_TIME and p.attrs.get(names.CAUSE) == "lost_progress" and p.proc.restart == 0
               and p.value}  # fmt: skip
    assert set(counted) >= raised, counted


def test_a_healthy_job_is_named_healthy(tmp_path: Path) -> None:
    """The model's own forward and backward fill the step (no input wait, no straggler, no creep): ``healthy``, and
    nothing lost or restarted."""
    settings = {"GOODPUT_STEPS": "20", "GOODPUT_INPUT_DELAY": "0", "GOODPUT_COMPUTE": "0.1"}
    code, _, output = _launch(True, tmp_path / "out", tmp_path / "files", **settings)
    assert code == 0, output[-3000:]
    run = report_run(tmp_path / "files")
    assert run["verdict"]["verdict"] == "healthy", run["verdict"]
    seconds = run["goodput"]["seconds"]
    assert seconds["lost_progress"] == seconds["restart"] == seconds["stalled"] == 0
    truth = _truth(tmp_path / "out")
    productive = _mean_per_rank(truth, lambda r: _step_seconds(r) - _input_seconds(r))
    assert seconds["productive"] == pytest.approx(productive, rel=0.1)
