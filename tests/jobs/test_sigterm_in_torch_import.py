"""A rank stopped while it loads torch: the stretch of a worker's life in which no Python can run.

``import torch`` loads torch's C++ libraries holding the GIL for 0.1-0.3 s; a SIGTERM landing then waited for the
load to end before the bridge's watcher could run, and the rank died that much later than under plain torchrun.
While ``import torch`` runs, the bridge lets ``faulthandler`` write the stacks from C and the rank die at once; its
agent turns the file into the rank's ``torchelastic.worker.terminated`` record
(``torchelastic.stack_source="faulthandler"``) and sends its start span.

The job: a bridge-unaware script, 2 ranks; rank 0 marks (a file) that it is about to ``import torch``, rank 1 waits
for the mark and exits 1, so the agent SIGTERMs rank 0 inside its import (which takes 1-2 s on a 2-core machine).
The same job under plain torchrun beside it: same exit code and per-rank statuses.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support import ROOT
from tests.support.jobs import job_env
from tests.support.marks import needs_a_deferred_build
from tests.support.otlp_receiver import OtlpReceiver

pytest.importorskip("torch.distributed.elastic.agent.server.local_elastic_agent")

JOB_TIMEOUT = 90.0
TELEMETRY_WAIT = 10.0
FORCED_KILL = "forcefully exiting via 9"
TERMINATED = "torchelastic.worker.terminated"

_SCRIPT = """\
import os, sys, time
flag = os.path.join(os.environ["FLAG_DIR"], "rank-0-imports-torch")
if os.environ["RANK"] == "1":
    deadline = time.monotonic() + 60
    while not os.path.exists(flag) and time.monotonic() < deadline:
        time.sleep(0.005)
    sys.exit(1)
open(flag, "w").close()
import torch  # rank 0 is stopped here
print("rank 0 has imported torch", flush=True)
time.sleep(60)
"""
IMPORT_LINE = 9

_REPORT = re.compile(r"rank\s*:\s*(\d+) \(local_rank: \d+\)\s*\n\s*exitcode\s*:\s*(-?\d+)")


def _run(launcher: str, script: Path, flag_dir: Path, rx: OtlpReceiver) -> subprocess.CompletedProcess[str]:
    env = job_env(rx, FLAG_DIR=str(flag_dir))
    if launcher == "torch.distributed.run":
        env = {k: v for k, v in env.items() if not k.startswith("OTEL_")}
    cmd = [sys.executable, "-m", launcher, "--standalone", "--nproc-per-node", "2", "--monitor-interval", "0.1",
           str(script)]  # fmt: skip
    return subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=JOB_TIMEOUT)


def _rank_0(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [i for i in items if str(i["resource"].get("torchelastic.rank")) == "0"]


@needs_a_deferred_build  # else its pipeline is READY before the import: the watcher's words, as before
def test_a_rank_stopped_while_loading_torch_dies_at_once_and_its_agent_sends_its_stacks(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(_SCRIPT)
    assert script.read_text().splitlines()[IMPORT_LINE - 1].startswith("import torch")
    with OtlpReceiver() as rx:
        outcomes = {}
        for launcher in ("torch.distributed.run", "torchelastic_otel.run"):
            flags = tmp_path / launcher
            flags.mkdir()
            done = _run(launcher, script, flags, rx)
            output = done.stdout + done.stderr
            assert "rank 0 has imported torch" not in output, "the SIGTERM came after the import: " + output[-3000:]
            assert FORCED_KILL not in output, output[-3000:]
            outcomes[launcher] = (done.returncode, {int(r): int(c) for r, c in _REPORT.findall(output)}, output)
        plain, bridged = outcomes["torch.distributed.run"], outcomes["torchelastic_otel.run"]
        assert bridged[0] == plain[0] == 1, bridged[2][-3000:]
        assert bridged[1] == plain[1] and bridged[1].get(1) == 1, (plain[1], bridged[2][-3000:])

        def arrived(r: OtlpReceiver) -> bool:
            return bool(_rank_0(r.logs(TERMINATED)) and _rank_0(r.spans("torchelastic.worker.start")))

        assert rx.wait_for(arrived, timeout=TELEMETRY_WAIT), bridged[2][-3000:]
        (record,) = _rank_0(rx.logs(TERMINATED))
        (span,) = _rank_0(rx.spans("torchelastic.worker.start"))
        attempts = {s["span_id"] for s in rx.spans("torchelastic.attempt")}

    attributes = record["attributes"]
    assert attributes["torchelastic.stack_source"] == "faulthandler", attributes  # not the watcher's words
    assert attributes["torchelastic.signal"] == "SIGTERM" and attributes["torchelastic.state"] == "TERMINATED"
    assert attributes["code.file.path"] == str(script), attributes
    assert attributes["code.line.number"] == IMPORT_LINE and attributes["code.function.name"] == "<module>"
    stack = attributes["torchelastic.stack"]
    assert stack.startswith("Thread ") and '"MainThread" (most recent call last):' in stack.splitlines()[0], stack
    assert f"torch{os.sep}__init__.py" in stack, stack  # inside torch's own import
    assert '"torchelastic-otel' not in stack, stack  # the bridge's threads (its watcher, its build) are left out
    assert record["severity_number"] == 13, record  # WARN, as the watcher's record
    for item in (record, span):
        assert item["attributes"]["torchelastic.delivered_by"] == "agent", item
    assert span["parent_span_id"] in attempts, (span, attempts)
    assert record["trace_id"] == span["trace_id"], (record, span)
