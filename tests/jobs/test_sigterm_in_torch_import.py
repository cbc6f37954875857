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
from tests.support.env import otlp_env
from tests.support.jobs import rank_1_fails_after
from tests.support.marks import needs_a_deferred_build
from tests.support.otlp_receiver import OtlpReceiver

pytest.importorskip("torch.distributed.elastic.agent.server.local_elastic_agent")

JOB_TIMEOUT = 90.0
TELEMETRY_WAIT = 10.0
FORCED_KILL = "forcefully exiting via 9"
TERMINATED = "torchelastic.worker.terminated"

_SCRIPT = (
    "import os, sys, time\n"
    + rank_1_fails_after("rank-0-imports-torch")
    + """\
open(flag, "w").close()
import torch  # rank 0 is stopped here
print("rank 0 has imported torch", flush=True)
time.sleep(60)
"""
)
IMPORT_LINE = 9

_REPORT = re.compile(r"rank\s*:\s*(\d+) \(local_rank: \d+\)\s*\n\s*exitcode\s*:\s*(-?\d+)")


def _run(launcher: str, script: Path, flag_dir: Path, rx: OtlpReceiver,
         **extra: str) -> subprocess.CompletedProcess[str]:  # fmt: skip
    env = otlp_env(rx, FLAG_DIR=str(flag_dir), **extra)
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


#: Rank 0's script starts a thread that, once the main thread is inside ``import torch``, logs more than 256
#: records (so the worker's pipeline is built at once, before the import ends) and, once the pipeline is READY and
#: its batch span processor (``OTEL_BSP_SCHEDULE_DELAY``, 200 ms) would have exported a span it held, marks a file;
#: rank 1 waits for the mark and exits 1, so the agent SIGTERMs rank 0 while it still imports torch.
_BUILT_DURING_THE_IMPORT = (
    "import logging, os, sys, threading, time\n"
    + rank_1_fails_after("rank-0-built")
    + """
def built() -> bool:
    return "opentelemetry.sdk.trace" in sys.modules and not any(
        t.name == "torchelastic-otel-setup" for t in threading.enumerate())

def prefetch() -> None:
    deadline = time.monotonic() + 60
    while not getattr(sys.modules.get("torch"), "LOADING", False) and time.monotonic() < deadline:
        time.sleep(0.001)  # until the stand-in's code runs (in sys.modules a moment before)
    for i in range(300):
        logging.getLogger("prefetch").warning("prefetched batch %d", i)
    while not built() and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.5)
    open(flag, "w").close()

threading.Thread(target=prefetch, daemon=True).start()
import torch  # the stand-in beside this script: its import lasts until the rank is stopped
print("rank 0 has imported torch", flush=True)
time.sleep(60)
"""
)

#: Stands in for torch's import, whose length is not the test's to choose (1-2 s on a 2-core machine, less on a
#: faster one); it runs Python where torch's loads C++ libraries, which makes no difference to a SIGTERM handled in
#: C. Only rank 0 of this test's job imports it; the agent imports the real torch.
_SLOW_TORCH = """\
LOADING = True
import os, time
flag = os.path.join(os.environ["FLAG_DIR"], "rank-0-built")
deadline = time.monotonic() + 60
while time.monotonic() < deadline and not (os.environ.get("IMPORT_ENDS") and os.path.exists(flag)):
    time.sleep(0.01)
"""


@needs_a_deferred_build
@pytest.mark.parametrize("import_ends", [False, True], ids=["stopped-in-the-import", "import-ends-first"])
def test_a_pipeline_built_during_the_import_sends_the_start_span_once(tmp_path: Path, import_ends: bool) -> None:
    """While ``import torch`` runs with SIGTERM handled in C, the file the agent turns into the terminated record
    also holds the worker's start span. A pipeline that another thread of the script has built meanwhile does not
    send the span as well: a stop in that stretch has the agent send it; an import that ends first has the
    worker's pipeline send it then (and the SIGTERM that follows is the watcher's) -- once either way."""
    script = tmp_path / "train.py"
    script.write_text(_BUILT_DURING_THE_IMPORT)
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text(_SLOW_TORCH)
    flags = tmp_path / "flags"
    flags.mkdir()
    with OtlpReceiver() as rx:
        done = _run("torchelastic_otel.run", script, flags, rx, **({"IMPORT_ENDS": "1"} if import_ends else {}))
        output = done.stdout + done.stderr
        assert ("rank 0 has imported torch" in output) == import_ends and FORCED_KILL not in output, output[-3000:]
        assert done.returncode == 1 and _REPORT.findall(output), output[-3000:]

        def arrived(r: OtlpReceiver) -> bool:
            prefetched = [i for i in _rank_0(r.logs()) if "prefetched batch" in str(i.get("body"))]
            return bool(prefetched and _rank_0(r.logs(TERMINATED)) and _rank_0(r.spans("torchelastic.worker.start")))

        # the prefetch records come from rank 0's own pipeline: it was READY inside the import
        assert rx.wait_for(arrived, timeout=TELEMETRY_WAIT), output[-3000:]
        (record,) = _rank_0(rx.logs(TERMINATED))
        source = record["attributes"].get("torchelastic.stack_source")
        assert (source == "faulthandler") != import_ends, record  # stopped in C, or by the watcher afterwards
        spans = _rank_0(rx.spans("torchelastic.worker.start"))
    assert len(spans) == 1, spans
    assert (spans[0]["attributes"].get("torchelastic.delivered_by") == "agent") != import_ends, spans
