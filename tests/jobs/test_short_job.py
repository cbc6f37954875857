"""A job shorter than the Flight Recorder's read interval (10 s) still gets its straggler named (issue 28, item 5).

``tests/support/workers/_straggler_worker.py``: 4 ranks of DDP on gloo, 80 steps, rank 2's forward 50 ms longer a
step; it ends with ``destroy_process_group()`` and ``os._exit(0)`` (which skips every exit hook, as many scripts
do). Before the fix no read of the recorder fell inside the job, and the report named no straggler; the bridge now
reads what is left when the default group is destroyed and exports it. The same job under plain torchrun ends the
same way.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.support import ROOT
from tests.support.env import clean_env, files_env
from tests.support.jobs import launcher, unique_id
from tests.support.procs import run_job

WORKER = ROOT / "tests" / "support" / "workers" / "_straggler_worker.py"
SLOW_RANK = 2


def _launch(bridged: bool, tmp: Path) -> tuple[int, str]:
    env = (
        files_env(tmp / "files", {}, OTEL_SERVICE_NAME="short-job", OMP_NUM_THREADS="1")
        if bridged
        else clean_env(OMP_NUM_THREADS="1")
    )
    cmd = [*launcher(bridged), "--standalone", "--nproc-per-node", "4", "--rdzv-id", unique_id("short"),
           "--monitor-interval", "0.1", str(WORKER), "--base", "0.05", "--extra", "0.05", "--slow-rank",
           str(SLOW_RANK), "--min-steps", "80", "--max-steps", "80", "--check-every", "1000",
           "--go", str(tmp / "never")]  # fmt: skip
    job = run_job(cmd, env, ROOT, tmp / "job.log")
    return job.proc.returncode, job.output()


def test_an_80_step_job_names_its_straggler(tmp_path: Path) -> None:
    code, output = _launch(True, tmp_path)
    assert code == 0, output[-3000:]
    assert output.count("steps 80,") == 4, output[-3000:]  # every rank ran its 80 steps
    done = subprocess.run([sys.executable, "-m", "torchelastic_otel.report", str(tmp_path / "files"), "--json"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)  # fmt: skip
    assert done.returncode == 0, done.stderr
    (run,) = json.loads(done.stdout)["runs"]
    assert [s["rank"] for s in run["stragglers"]] == [SLOW_RANK], run["steps"]
    arrivals = {s["rank"]: s for s in run["steps"]}
    assert all(arrivals[r]["steps"] == 80 for r in range(4)), run["steps"]
    assert run["verdict"]["verdict"] == "straggler", run["verdict"]


def test_plain_torchrun_ends_the_same_way(tmp_path: Path) -> None:
    code, output = _launch(False, tmp_path)
    assert code == 0 and output.count("steps 80,") == 4, output[-3000:]
