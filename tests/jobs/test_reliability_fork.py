"""Processes started by fork and by spawn (``multiprocessing``) after the bridge was used in the parent.

The parent (``tests/support/workers/_rel_child.py fork MODE``) exports a counter (5) and an event, then -- with a
counter increment (2) and an event still in the bridge's buffers -- starts a child that adds 1 and records its own
event, and exits without flushing. At the receiver:

- no deadlock: the child ends, within a bounded join;
- no duplicated cumulative values: the child's counter series is the child's own (1), not the parent's 5 or 7
  (fork copies the SDK's metric storage: the bridge rebuilds its own providers in a forked child on first use);
- the child exports under its own resource (``process.pid``), and delivers without an explicit flush (the bridge's
  exit handler runs on multiprocessing's exit path, which skips ``atexit``);
- no duplicated records: what sat in the parent's buffers at the fork is exported once, by the parent.

A stress run forks 20 children while another thread records, flushes and exports: none hangs.
"""

from __future__ import annotations

import collections

import pytest

from tests.support.env import BATCHES, otlp_env
from tests.support.rel_common import OtlpReceiver, latest_value, report, run_child


@pytest.mark.parametrize("mode", ["fork", "spawn"])
def test_children_export_their_own_telemetry_once(mode: str) -> None:
    with OtlpReceiver() as rx:
        # A generous exit bound: on a loaded machine a fresh child's first connection can take a while, and what
        # is under test here is what the child delivers, not how fast (tests/jobs/test_reliability_collector.py).
        env = otlp_env(rx, pace={**BATCHES, "OTEL_METRIC_EXPORT_INTERVAL": "600000"},
                       TORCHELASTIC_OTEL_EXIT_TIMEOUT_MILLIS="10000")  # fmt: skip
        child = run_child("fork", env, mode, timeout=120)
        result = child.result
        parent, kid = result["pid"], result["child_pid"]
        assert (result["alive"], result["exitcode"]) == (False, 0), result
        assert result["flushed_before"] is True and result["flushed"] is True

        def arrived(r: OtlpReceiver) -> bool:
            return latest_value(r, "rel.fork.count", **{"process.pid": kid}) is not None and bool(
                r.logs("rel.fork.child")
            )

        # the parent exited (and flushed) already; the child delivered on its own exit path
        assert rx.wait_for(arrived, timeout=10), rx.requests
        counter = collections.defaultdict(list)
        for point in rx.metric_points("rel.fork.count"):
            counter[point["resource"]["process.pid"]].append(point["value"])
        records = collections.Counter((r["event_name"], r["resource"]["process.pid"]) for r in rx.logs())
        report(
            f"{mode}: counter values received per process, records per (name, process)",
            [("parent pid", parent), ("child pid", kid), ("counter", dict(counter)), ("records", dict(records)),
             ("child start + join", f"{result['seconds']:.2f} s")],
        )  # fmt: skip
        assert set(counter) == {parent, kid}
        assert set(counter[kid]) == {1}, counter  # the child's own series: never the parent's 5 (or 7)
        assert max(counter[parent]) == 7  # 5 exported before the fork + 2 buffered at the fork
        assert records == {
            ("rel.fork.parent.exported", parent): 1,
            ("rel.fork.parent.buffered", parent): 1,  # once: the child's copy of the buffer was cleared
            ("rel.fork.child", kid): 1,
        }, records
        for item in [*rx.logs(), *rx.metric_points("rel.fork.count")]:
            assert item["resource"]["process.pid"] in (parent, kid)
            assert item["resource"]["service.name"] == "torchelastic"


def test_fork_while_recording_never_hangs() -> None:
    n = 20
    with OtlpReceiver() as rx:
        env = otlp_env(rx, pace=BATCHES, TORCHELASTIC_OTEL_EXIT_TIMEOUT_MILLIS="10000")
        child = run_child("fork_stress", env, str(n), timeout=180)
        result = child.result
        report("fork while recording", [("children", n), ("outcomes", result["outcomes"]),
                                        ("slowest child start + join", f"{result['max_seconds']:.2f} s")])  # fmt: skip
        assert result["outcomes"] == [0] * n, result
        # every child delivered its record, under its own pid
        assert rx.wait_for(lambda r: len(r.logs("rel.fork.stress.child")) >= n, timeout=15), len(
            rx.logs("rel.fork.stress.child")
        )
        pids = {r["resource"]["process.pid"] for r in rx.logs("rel.fork.stress.child")}
        assert len(pids) == n and result["pid"] not in pids
        assert sorted(r["attributes"]["torchelastic.i"] for r in rx.logs("rel.fork.stress.child")) == list(range(n))
