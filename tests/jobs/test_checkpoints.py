"""A real torchrun job that checkpoints with ``torch.distributed.checkpoint`` (2 ranks, CPU, gloo, 127.0.0.1),
bridged with ``torchelastic-otel run`` and exporting over OTLP/gRPC to the in-process receiver.

The worker (``tests/support/workers/ckpt_worker.py``) knows nothing of the bridge and writes its own ground truth: the
step count at each of its saves and its load. Every rank's saves and load must arrive as spans in the attempt's
trace, each with the step the script recorded, the checkpoint's size on disk, and the duration histogram and the
last saved step's gauge beside them. The in-process side (nesting, in-memory buffers, errors, uninstall) is
``tests/unit/test_checkpoints.py``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.support import ROOT, WORKERS
from tests.support.env import otlp_env
from tests.support.jobs import TORCHELASTIC_OTEL, c10d_args, is_worker, unique_id
from tests.support.lazy import require
from tests.support.otlp_receiver import OtlpReceiver
from tests.support.procs import Job, run_job
from torchelastic_otel import _names as names

require("torch.distributed.checkpoint")

WORKER = WORKERS / "ckpt_worker.py"
RANKS = 2
STEPS, EVERY = 6, 2
SAVES = STEPS // EVERY
JOB_TIMEOUT = 60.0
WAIT = 30.0


def _run(tmp_path: Path, rx: OtlpReceiver, worker: Path = WORKER) -> Job:
    checkpoints = tmp_path / "checkpoints"
    checkpoints.mkdir()
    cmd = [TORCHELASTIC_OTEL, "run", "--nproc-per-node", str(RANKS), *c10d_args(unique_id("ckpt")), worker,
           "--dir", checkpoints, "--steps", str(STEPS), "--every", str(EVERY)]  # fmt: skip
    return run_job([str(c) for c in cmd], otlp_env(rx), ROOT, tmp_path / "job.log", timeout=JOB_TIMEOUT)


def _checkpoint_spans(rx: OtlpReceiver) -> list[dict[str, Any]]:
    return [s for s in rx.spans() if s["name"] in (names.CHECKPOINT_SAVE, names.CHECKPOINT_LOAD) and is_worker(s)]


def _dir_bytes(directory: Path) -> int:
    return sum(f.stat().st_size for f in directory.rglob("*") if f.is_file())


def _last(points: list[dict[str, Any]], rank: int) -> dict[str, Any] | None:
    mine = [p for p in points if p["resource"].get("torchelastic.rank") == rank]
    return max(mine, key=lambda p: p["time_unix_nano"]) if mine else None


def test_every_ranks_dcp_checkpoints_are_spans_of_the_attempt_with_the_scripts_steps(tmp_path: Path) -> None:
    with OtlpReceiver() as rx:
        job = _run(tmp_path, rx)
        assert job.returncode == 0, job.tail()
        truth = {r: json.loads((tmp_path / "checkpoints" / f"rank{r}.json").read_text()) for r in range(RANKS)}
        assert all(len(t) == SAVES + 1 for t in truth.values()), truth

        def arrived(rx: OtlpReceiver) -> bool:
            durations = [
                p for p in rx.metric_points(names.CHECKPOINT_DURATION) if p["attributes"].get("operation") == "save"
            ]
            saved = {r: _last(durations, r) for r in range(RANKS)}
            return (
                len(_checkpoint_spans(rx)) >= RANKS * (SAVES + 1)
                and bool(rx.spans(names.ATTEMPT))
                and all(p is not None and p["count"] == SAVES for p in saved.values())
                and all(_last(rx.metric_points(names.WORKER_CHECKPOINT_STEP), r) is not None for r in range(RANKS))
            )

        received = lambda: [(s["name"], s["resource"].get("torchelastic.rank")) for s in rx.spans()]  # noqa: E731
        assert rx.wait_for(arrived, timeout=WAIT, interval=0.2), f"missing; spans: {received()}\n{job.tail()}"
        (attempt,) = rx.spans(names.ATTEMPT)
        spans = _checkpoint_spans(rx)
        assert len(spans) == RANKS * (SAVES + 1), [(s["name"], s["attributes"]) for s in spans]
        for rank in range(RANKS):
            mine = sorted(
                (s for s in spans if s["resource"]["torchelastic.rank"] == rank),
                key=lambda s: s["start_time_unix_nano"],
            )
            expected = truth[rank]
            assert [s["name"] for s in mine] == [f"torchelastic.checkpoint.{t['operation']}" for t in expected]
            for span, recorded in zip(mine, expected, strict=True):
                attributes = span["attributes"]
                assert (span["trace_id"], span["parent_span_id"]) == (attempt["trace_id"], attempt["span_id"])
                assert attempt["start_time_unix_nano"] <= span["start_time_unix_nano"] <= span["end_time_unix_nano"]
                assert span["status_code"] != 2, span
                assert attributes[names.CHECKPOINT_STEP] == recorded["step"], (rank, attributes, recorded)
                assert attributes[names.CHECKPOINT_API] == f"torch.distributed.checkpoint.{recorded['operation']}"
                assert attributes[names.CHECKPOINT_BYTES] == _dir_bytes(Path(recorded["dir"])) > 0
                if recorded["operation"] == "save":
                    assert attributes[names.CHECKPOINT_ASYNC] is False

            step = _last(rx.metric_points(names.WORKER_CHECKPOINT_STEP), rank)
            assert step is not None and step["value"] == expected[-2]["step"] == STEPS  # the last save's step
            loads = [
                p
                for p in rx.metric_points(names.CHECKPOINT_DURATION)
                if p["attributes"].get("operation") == "load" and p["resource"].get("torchelastic.rank") == rank
            ]
            load = max(loads, key=lambda p: p["time_unix_nano"])
            assert load["count"] == 1 and load["sum"] > 0
