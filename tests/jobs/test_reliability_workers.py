"""Workers that die: by an exception, by ``os._exit`` without a flush, by SIGKILL, and workers the agent stops with
SIGTERM (to restart the group, and to stop it for good). One real torchrun job covers them all, one per attempt
(``tests/support/workers/_rel_worker.py --mode faults``, ``--max-restarts 2``):

=========  ======================================  =========================================================
attempt    rank 1                                  rank 0 (records a heartbeat every 20 ms)
=========  ======================================  =========================================================
0          raises RuntimeError                     SIGTERMed by the agent to restart the group
1          ``os._exit(1)``, no flush (a crash)     SIGTERMed to restart
2          SIGKILLs itself                         SIGTERMed to stop the job (no restarts left)
=========  ======================================  =========================================================

Expectations, checked at the receiver:

- a SIGTERMed worker delivers everything it recorded before the signal, and a ``torchelastic.worker.terminated``
  record;
- a worker dying by an exception delivers everything, and a ``torchelastic.worker.exception`` record with the
  exception (type, message);
- a worker that crashes (``os._exit`` or SIGKILL) cannot flush: what it recorded more than ~1 s before (drain
  interval 0.5 s + ``OTEL_BLRP_SCHEDULE_DELAY`` 200 ms, metric export interval 1 s) is delivered, the rest may not;
- the agent reports each failure as ``torchelastic.worker.failure`` with the exit code, the signal and the error.
"""

from __future__ import annotations

import collections
from pathlib import Path
from typing import Any

import pytest

from tests.support.env import otlp_env
from tests.support.rel_common import (
    TORCHELASTIC_OTEL,
    WORKER,
    OtlpReceiver,
    jobs_in,
    marks,
    report,
    standalone,
)

pytest.importorskip("torch.distributed.elastic.agent.server.local_elastic_agent")

EARLY = 5  # rel.early events rank 1 records before going quiet (tests/support/workers/_rel_worker.py)
QUIET = 3.0  # seconds between rank 1's early records and its death: the metric reader exports every 1 s, and a loaded
# machine (make test runs two test files at once on two cores) can delay a collection by a second or more


def of(items: list[dict[str, Any]], rank: int, attempt: int) -> list[dict[str, Any]]:
    return [
        i
        for i in items
        if i["resource"].get("torchelastic.rank") == rank and i["resource"].get("torchelastic.restart_count") == attempt
    ]


def seqs(items: list[dict[str, Any]]) -> set[int]:
    return {i["attributes"]["torchelastic.seq"] for i in items}


def agent_failures(rx: OtlpReceiver) -> dict[int, dict[str, Any]]:
    """The agent's ``torchelastic.worker.failure`` records of global rank 1, by restart count."""
    out = {}
    for record in rx.logs("torchelastic.worker.failure"):
        attrs = record["attributes"]
        if "torchelastic.rank" not in record["resource"] and attrs.get("torchelastic.global_rank") == 1:
            out[attrs["torchelastic.restart_count"]] = attrs
    return out


def test_worker_exception_crash_sigkill_and_sigterm(tmp_path: Path) -> None:
    cmd = [TORCHELASTIC_OTEL, "run", *standalone(2, "--max-restarts", "2"), WORKER, "--mode", "faults",
           "--quiet", str(QUIET)]  # fmt: skip
    with OtlpReceiver() as rx, jobs_in(tmp_path) as jobs:
        job = jobs.run(cmd, otlp_env(rx), timeout=150)
        output = job.output()
        assert job.returncode not in (0, None), f"the job should fail (rank 1 fails in every attempt):\n{job.tail()}"
        assert len(marks(output, "dying")) == 3, output[-4000:]

        last_heartbeat = collections.defaultdict(lambda: -1)
        for m in marks(output, "recorded"):
            attempt = int(m["attempt"])
            last_heartbeat[attempt] = max(last_heartbeat[attempt], int(m["seq"]))
        assert sorted(last_heartbeat) == [0, 1, 2], output[-4000:]

        def everything_arrived(r: OtlpReceiver) -> bool:
            beats, early = r.logs("rel.heartbeat"), r.logs("rel.early")
            terminated = r.logs("torchelastic.worker.terminated")
            return (
                all(set(range(last_heartbeat[a] + 1)) <= seqs(of(beats, 0, a)) for a in range(3))
                and all(seqs(of(early, 1, a)) == set(range(EARLY)) for a in range(3))
                and all(of(terminated, 0, a) for a in range(3))
                and bool(r.logs("torchelastic.worker.exception"))
                and set(agent_failures(r)) == {0, 1, 2}
            )

        arrived = rx.wait_for(everything_arrived, timeout=30, interval=0.2)
        beats, early, late = rx.logs("rel.heartbeat"), rx.logs("rel.early"), rx.logs("rel.late")
        summary = {
            a: {
                "heartbeats recorded/received": f"{last_heartbeat[a] + 1}/{len(seqs(of(beats, 0, a)))}",
                "rank 1 early received": f"{len(seqs(of(early, 1, a)))}/{EARLY}",
                "rank 1 late (recorded just before dying) received": f"{len(seqs(of(late, 1, a)))}/3",
                "rank 0 terminated record": len(of(rx.logs("torchelastic.worker.terminated"), 0, a)),
            }
            for a in range(3)
        }
        report("worker faults (attempt 0: exception, 1: os._exit(1), 2: SIGKILL; rank 0 SIGTERMed each time)",
               [(f"attempt {a}", row) for a, row in summary.items()])  # fmt: skip
        assert arrived, (summary, sorted(agent_failures(rx)), output[-3000:])

        # SIGTERMed workers: everything up to the signal (checked above), and the termination itself
        for a in range(3):
            (terminated,) = of(rx.logs("torchelastic.worker.terminated"), 0, a)
            assert terminated["attributes"]["torchelastic.signal"] == "SIGTERM"
            assert terminated["severity_text"] == "WARN"
            # heartbeats recorded after the last printed one may be there too, but never a gap before it
            got = sorted(seqs(of(beats, 0, a)))
            assert got == list(range(len(got))), got

        # The exception: every record, and the exception itself, from the worker...
        assert seqs(of(late, 1, 0)) == {0, 1, 2}
        (exception,) = of(rx.logs("torchelastic.worker.exception"), 1, 0)
        attrs = exception["attributes"]
        assert (exception["severity_text"], attrs["exception.type"]) == ("ERROR", "RuntimeError")
        assert attrs["exception.message"] == "rel_worker rank 1 failed in attempt 0"
        assert "raise RuntimeError" in attrs["exception.stacktrace"]

        # ... and from the agent, for every failure: exit code, signal, error
        failures = agent_failures(rx)
        assert failures[0]["torchelastic.exit_code"] == 1
        assert failures[0]["exception.message"] == "rel_worker rank 1 failed in attempt 0"
        assert failures[1]["torchelastic.exit_code"] == 1 and "torchelastic.signal" not in failures[1]
        assert failures[2]["torchelastic.exit_code"] == -9 and failures[2]["torchelastic.signal"] == "SIGKILL"

        # The crashed workers' metrics put before going quiet were exported by the periodic reader.
        for a in (1, 2):
            values = [p["value"] for p in of(rx.metric_points("rel.early.count"), 1, a)]
            assert values and max(values) == EARLY, (a, values)
