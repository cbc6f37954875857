"""The README's quickstart job gets the same verdict run after run.

``examples/train_ddp.py --steps 20`` under ``torchelastic-otel run`` (2 ranks, gloo on CPU), three times, each
writing OTLP JSON Lines files that ``torchelastic-otel report --json`` reads in a subprocess. Its step is a few
milliseconds, its arrivals at the step's collective under one: on 2 cores a descheduled rank makes a few steps
arrive 10x later. The straggler rule compared the ranks' *mean* arrivals (1.5x between two ranks sufficed), so such
outliers named a straggler in some runs and not in others; it now needs a delay of a tenth of the step in most steps
(``tests/unit/test_report_stragglers.py`` on constructed points). Each verdict says on how many steps it rests.

The job is shorter than a worker's deferred pipeline build: it destroys its process group before the pipeline is
ready, and the Flight Recorder's entries kept then are its steps' only read. A drain after the build used to record
the steps' phases without them (no collective wait carved: "healthy" in some runs, "communication-bound" in
others); every rank's wait for DDP's all-reduce is now carved in every run.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support import ROOT
from tests.support.env import files_env
from tests.support.jobs import report_run, unique_id
from tests.support.procs import run_job

#: alone, after the other files (``make test``): another file's job on the same 2 cores deschedules a rank for whole
#: steps, and its peer's wait in the all-reduce is then real -- a communication-bound run among healthy ones
pytestmark = pytest.mark.solo

RUNS = 3
STEPS = 20


def _quickstart(base: Path) -> dict[str, Any]:
    env = files_env(base / "files", {})
    cmd = [sys.executable, "-m", "torchelastic_otel.run", "--standalone", "--nproc-per-node", "2", "--rdzv-id",
           unique_id("quickstart"), str(ROOT / "examples" / "train_ddp.py"), "--steps", str(STEPS)]  # fmt: skip
    job = run_job(cmd, env, ROOT, base / "job.log")
    assert job.proc.returncode == 0, job.output()[-3000:]
    return report_run(base / "files")


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    return [_quickstart(tmp_path_factory.mktemp(f"quickstart-{i}")) for i in range(RUNS)]


def test_the_same_verdict_every_run(runs: list[dict[str, Any]]) -> None:
    verdicts = [run["verdict"] for run in runs]
    assert len({v["verdict"] for v in verdicts}) == 1, verdicts
    assert verdicts[0]["verdict"] != "straggler", verdicts  # two equal ranks: neither is one
    assert all(run["stragglers"] == [] for run in runs), [run["steps"] for run in runs]


def test_each_verdict_says_on_how_many_steps_it_rests(runs: list[dict[str, Any]]) -> None:
    for run in runs:
        verdict = run["verdict"]
        assert verdict["steps"] == STEPS, verdict
        assert f"over {STEPS} steps" in verdict["reason"], verdict
        assert {s["clock"] for s in run["steps"]} == {"host"} and {s["gpu_idle"] for s in run["steps"]} == {None}


def test_every_rank_s_wait_for_the_all_reduce_is_carved_in_every_run(runs: list[dict[str, Any]]) -> None:
    waits = [[s["phases"]["collective_wait"] for s in run["steps"]] for run in runs]
    assert all(len(w) == 2 and min(w) > 0 for w in waits), waits
