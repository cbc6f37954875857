"""Many runs from one process (issue 31, item 4): ``torchelastic_otel.run.main`` called again and again in one
process (a notebook, a test suite) gives runs that are each their own in the report -- its own run id, the outcome
its ``torchelastic.run`` span tells, its own attempt -- and the launching agent's records carry each run's own
``torchelastic.run_id`` on their resource, never an earlier run's.

Real jobs: one launching process (``many_runs_launcher.py``) making the launches one after another, 2 gloo workers
each (``init_process_group``, an ``all_reduce``), c10d rendezvous on 127.0.0.1, exporting OTLP JSON Lines files.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import ROOT, WORKERS
from tests.support.env import PACE, files_env
from tests.support.jobs import unique_id
from tests.support.procs import run_job

pytest.importorskip("torch.distributed.run")
pytest.importorskip("opentelemetry.exporter.otlp.json.file")

LAUNCHER = WORKERS / "many_runs_launcher.py"
#: Bound on one launching process (all its launches).
JOB_TIMEOUT = 240.0
EXPECTED = {"ok": "SUCCEEDED", "fail": "FAILED"}


def _report(files: Path) -> list[dict]:
    done = subprocess.run([sys.executable, "-m", "torchelastic_otel.report", str(files), "--json"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return list(json.loads(done.stdout)["runs"])


@pytest.mark.parametrize("modes", [("ok", "fail", "ok"), ("fail", "ok")], ids=["three", "two"])
def test_each_in_process_launch_is_its_own_run(tmp_path: Path, modes: tuple[str, ...]) -> None:
    from torchelastic_otel import _names as names
    from torchelastic_otel.report import otlpjson

    files, prefix = tmp_path / "otel", unique_id("many")
    job = run_job([sys.executable, str(LAUNCHER), prefix, *modes], files_env(files, PACE), ROOT,
                  tmp_path / "launcher.log", timeout=JOB_TIMEOUT)  # fmt: skip
    assert job.returncode == 0, job.tail()
    launched = [line for line in job.output().splitlines() if line.startswith("launch ")]
    outcomes = {"ok": "ok", "fail": "ChildFailedError"}
    assert launched == [f"launch {i} {outcomes[m]}" for i, m in enumerate(modes, 1)], job.tail()
    run_ids = [f"{prefix}-{i}" for i in range(1, len(modes) + 1)]

    runs = _report(files)
    assert [r["run_id"] for r in runs] == run_ids
    assert [r["outcome"] for r in runs] == [EXPECTED[m] for m in modes]
    assert [r["attempts"] for r in runs] == [1] * len(modes)
    for run, mode in zip(runs, modes, strict=True):
        assert (run["root_cause"] is not None) == (mode == "fail"), run["root_cause"]
        assert sorted(run["ranks"]) == [0, 1], run["ranks"]

    tel = otlpjson.read([files])
    agents = {s.proc.pid for s in tel.spans if s.name == names.RUN}
    assert len(agents) == 1, agents  # one launching process made every run
    # Each run span: its own run id, on its resource and as its attribute, and the state the report tells.
    run_spans = sorted((s for s in tel.spans if s.name == names.RUN), key=lambda s: s.start)
    assert [s.attrs[names.RUN_ID] for s in run_spans] == run_ids
    assert [s.proc.run_id for s in run_spans] == run_ids
    assert [s.attrs.get(names.RUN_STATE) for s in run_spans] == [r["outcome"] for r in runs]
    # Every record of the launching agent: its resource's run id is the run the record is about.
    agent_logs = [r for r in tel.logs if r.proc.kind == "agent"]
    assert {r.proc.run_id for r in agent_logs} == set(run_ids)
    for rec in agent_logs:
        if names.RUN_ID in rec.attrs:
            assert rec.proc.run_id == rec.attrs[names.RUN_ID], (rec.event_name, rec.proc, rec.attrs)
    records = [(r.time, r.proc, r.event_name) for r in agent_logs]
    records += [(p.time, p.proc, p.name) for p in tel.points if p.proc.kind == "agent"]
    for k, span in enumerate(run_spans):  # from run k's start on, no record carries an earlier run's id
        earlier = [
            (name, proc.run_id) for time, proc, name in records if time >= span.start and proc.run_id in run_ids[:k]
        ]
        assert not earlier, (run_ids[k], earlier[:5])
    for later in run_ids[1:]:
        later_spans = [s for s in tel.spans if s.proc.kind == "agent" and s.attrs.get(names.RUN_ID) == later]
        assert later_spans and all(s.proc.run_id == later for s in later_spans)
