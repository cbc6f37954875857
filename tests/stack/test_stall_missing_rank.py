"""A hang, seen before the timeout: a real 4-rank job (gloo, CPU) in which rank 1 never comes to an ``all_reduce``.

The job (``tests/support/workers/_missing_rank_worker.py``, bridge-unaware): 5 DDP steps, then rank 1 stays in Python
(sleeping) while ranks 0, 2 and 3 wait for it inside ``dist.all_reduce`` (gloo's C++); the collective timeout is far
away (300 s). When the test has seen what it needs, it lets rank 1 go on: it raises, and the job fails. Under
``torchelastic-otel run`` with ``TORCHELASTIC_OTEL_STALL_SECONDS=3``, each worker exporting OTLP/gRPC to the in-process
receiver, serving its Prometheus endpoint (scraped every second by Debian's ``prometheus`` with the committed training
rules, their clock sped up 20x) and writing OTLP JSON Lines files. The same job runs under plain torchrun beside it,
released at the same moment.

- within the stall threshold, ``torchelastic.worker.stalled`` records (WARN) from ranks 0, 2 and 3 with their main
  thread's stack in ``all_reduce`` and ``code.*`` at the script's ``all_reduce`` line, the pending collective in
  their summary; rank 1's at its sleeping line, one collective behind;
- the docs' live query (docs/training.md) names rank 1 alone, behind in ``default_pg``; so does the alert
  ``TorchElasticRankMissingFromCollective``, and the training dashboard's table;
- the terminated / exception records of the stopped ranks carry the same summary;
- ``torchelastic-otel report`` (``--json``, terminal, HTML in Chromium): "rank 1 is missing from collective #N,
  gloo:all_reduce, default_pg", the stalls with their stack tops, rank 1 as the root cause;
- plain torchrun: the same exit code, the same failed rank, the same time to end once released.
"""

from __future__ import annotations

import collections
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support import WORKERS, stack, training_jobs
from tests.support.env import plain_env
from tests.support.jobs import SEVERITY_WARN, is_worker
from tests.support.otlp_receiver import OtlpReceiver
from tests.support.ports import free_port_block
from tests.support.waiting import wait_for

pytest.importorskip("torch.distributed.elastic.agent.server.local_elastic_agent")
pytest.importorskip("opentelemetry.exporter.otlp.json.file")

#: The job's time after the release is compared with plain torchrun's: ``make test`` runs this file alone (``solo``).
#: Beside the parallel part's other 4-rank and framework jobs on 2 cores, both jobs took 17-20 s to end after it.
pytestmark = pytest.mark.solo

WORKER = WORKERS / "_missing_rank_worker.py"
STALL = 3.0  # TORCHELASTIC_OTEL_STALL_SECONDS in the job
MISSING, WAITING = 1, (0, 2, 3)
STALLED, TERMINATED = "torchelastic.worker.stalled", "torchelastic.worker.terminated"
EXCEPTION = "torchelastic.worker.exception"
START_TIMEOUT = 120.0  # seconds for the 4 ranks to start and reach the hang (under load)
QUERY_TIMEOUT = 120.0  # seconds for the live query (it wants a minute without a move)
GROUP = "torchelastic.collectives.default_pg."


@dataclass
class Outcome:
    bridged: stack.Proc
    plain: stack.Proc
    code: int
    plain_code: int
    hang_started: float  # time.time() when every rank had printed where it waits
    query: list[dict[str, Any]]
    alerts: list[dict[str, Any]]
    table: list[dict[str, Any]]
    released: float
    ended: float
    plain_ended: float
    logs: list[dict[str, Any]]
    files: Path
    html: Path

    def records(self, name: str, rank: int | None = None) -> list[dict[str, Any]]:
        return [r for r in self.logs if r["event_name"] == name and is_worker(r)
                and (rank is None or int(r["resource"]["torchelastic.rank"]) == rank)]  # fmt: skip

    def stall_digest(self, rank: int) -> list[tuple[Any, ...]]:
        """For failure messages: each stalled record of ``rank`` as (time, steps, count, since, seconds, last
        enqueued, last completed, pending, code line)."""
        return [
            (
                r["time_unix_nano"],
                *(
                    r["attributes"].get(k)
                    for k in (
                        "torchelastic.stalled.steps",
                        "torchelastic.stalled.count",
                        "torchelastic.stalled.since_unix_nano",
                        "torchelastic.stalled.seconds",
                        GROUP + "last_enqueued",
                        GROUP + "last_completed",
                        GROUP + "pending",
                        "code.line.number",
                    )
                ),
            )
            for r in sorted(self.records(STALLED, rank), key=lambda r: r["time_unix_nano"])
        ]

    def hang_stalls(self, rank: int) -> list[dict[str, Any]]:
        """Rank's stalled records of the hang (after its 5 steps; not those of a slow start-up)."""
        return [r for r in self.records(STALLED, rank) if str(r["attributes"].get("torchelastic.stalled.steps")) == "5"]


def _printed_where_it_waits(proc: stack.Proc) -> bool:
    text = proc.output(200_000)
    return ("rank 1: about to sleep" in text
            and all(f"rank {r}: about to block in all_reduce" in text for r in WAITING))  # fmt: skip


def _ranks_named(result: list[dict[str, Any]]) -> list[tuple[str, str, float]]:
    return sorted((r["metric"].get("torchelastic_rank", "?"), r["metric"].get("process_group", "?"), r["value"])
                  for r in result)  # fmt: skip


@pytest.fixture(scope="module")
def outcome(tmp_path_factory: pytest.TempPathFactory) -> Any:
    tmp = tmp_path_factory.mktemp("missing_rank")
    files, go, plain_go = tmp / "telemetry", tmp / "go", tmp / "plain-go"
    base = free_port_block(5)
    rules = training_jobs.scaled_rules(tmp)
    targets = [f"{stack.HOST}:{base + i}" for i in range(5)]
    prom = stack.Prometheus(stack.prometheus_bin(), tmp / "prometheus", training_jobs.prometheus_config(targets, rules),
                            avoid={base + i for i in range(5)})  # fmt: skip
    rx = OtlpReceiver().start()
    torchrun = ["--standalone", "--nproc-per-node", "4", "--max-restarts", "0", "--monitor-interval", "0.1"]
    procs: list[stack.Proc] = []
    prom.start()
    try:
        env = training_jobs.bridged_env(rx, files, base, TORCHELASTIC_OTEL_STALL_SECONDS=str(STALL))
        bridged = stack.start([sys.executable, "-m", "torchelastic_otel.run", *torchrun, WORKER, "--go", go],
                              tmp / "bridged.log", env=env)  # fmt: skip
        procs.append(bridged)
        plain = stack.start([sys.executable, "-m", "torch.distributed.run", *torchrun, WORKER, "--go", plain_go],
                            tmp / "plain.log", env=plain_env(OMP_NUM_THREADS="1"))  # fmt: skip
        procs.append(plain)

        def describe() -> str:
            return f"{prom.describe()}\nbridged job:\n{bridged.output()}\nplain job:\n{plain.output(3000)}"

        wait_for(lambda: _printed_where_it_waits(bridged) and _printed_where_it_waits(plain), START_TIMEOUT,
                         "every rank of both jobs at the hang", on_timeout=describe, interval=0.2)  # fmt: skip
        hang_started = time.time()
        query = training_jobs.readme_query()
        wait_for(lambda: _ranks_named(prom.query(query)) == [("1", "default_pg", 1.0)], QUERY_TIMEOUT,
                         "the docs' query to name rank 1", on_timeout=describe, interval=0.2)  # fmt: skip
        named = prom.query(query)
        wait_for(lambda: [a for a in prom.firing() if a["labels"]["alertname"]
                                  == "TorchElasticRankMissingFromCollective"], 30, "the missing-rank alert",
                         on_timeout=describe, interval=0.2)  # fmt: skip
        alerts = [a for a in prom.firing() if a["labels"]["alertname"] == "TorchElasticRankMissingFromCollective"]
        ((panel, table_query),) = [(p, q) for p, q in training_jobs.dashboard_queries() if "missing from" in p]
        table = prom.query(table_query)

        def waiting_ranks_stalled() -> bool:
            """The live query may name rank 1 before the stall records are out: the back-off test wants four of
            each waiting rank (at 3, 6, 12 and 24 s)."""
            counts = collections.Counter(int(r["resource"]["torchelastic.rank"]) for r in rx.logs(STALLED)
                                         if is_worker(r) and str(r["attributes"].get("torchelastic.stalled.steps"))
                                         == "5")  # fmt: skip
            return all(counts[rank] >= 4 for rank in WAITING)

        wait_for(waiting_ranks_stalled, QUERY_TIMEOUT, "four stalled records of each waiting rank",
                         on_timeout=describe, interval=0.2)  # fmt: skip
        released = time.monotonic()
        go.touch()
        plain_go.touch()
        code = bridged.wait(60)
        ended = time.monotonic()
        plain_code = plain.wait(60)
        plain_ended = time.monotonic()
        wait_for(lambda: {int(r["resource"]["torchelastic.rank"]) for r in rx.logs()
                                  if r["event_name"] in (TERMINATED, EXCEPTION) and is_worker(r)} == {0, 1, 2, 3},
                         20, "the final records of every rank", interval=0.2)  # fmt: skip
        yield Outcome(bridged, plain, code, plain_code, hang_started, named, alerts, table, released, ended,
                      plain_ended, rx.logs(), files, tmp / "report.html")  # fmt: skip
    finally:
        go.touch()
        plain_go.touch()
        for proc in procs:
            proc.stop()
        prom.stop()
        rx.stop()


# ---- the job ---------------------------------------------------------------------------------------------------


def test_the_job_fails_the_same_under_the_bridge_and_under_plain_torchrun(outcome: Outcome) -> None:
    assert outcome.code == outcome.plain_code == 1, (outcome.bridged.output(), outcome.plain.output())
    for proc in (outcome.bridged, outcome.plain):
        report = proc.output(200_000).split("Root Cause (first observed failure):", 1)
        assert len(report) == 2 and re.search(r"rank\s+:\s+1 \(local_rank: 1\)", report[1]), proc.output()
    # released at the same moment, both end alike: nothing of the bridge holds the job up
    assert outcome.ended - outcome.released < 20 and abs(outcome.ended - outcome.plain_ended) < 10


# ---- the stalled records -----------------------------------------------------------------------------------------


def test_the_waiting_ranks_report_their_stall_within_the_threshold(outcome: Outcome) -> None:
    line = training_jobs.marker_line(WORKER, "all_reduce")
    for rank in WAITING:
        records = outcome.hang_stalls(rank)
        assert records, f"no stalled record of rank {rank} for the hang: {outcome.records(STALLED, rank)}"
        first = min(records, key=lambda r: r["time_unix_nano"])
        attrs = first["attributes"]
        assert first["severity_number"] == SEVERITY_WARN and first["severity_text"] == "WARN"
        since = int(attrs["torchelastic.stalled.since_unix_nano"])
        # seen at the threshold (+ the watchdog's 1 s tick, the drainer's 0.5 s round, a loaded machine's delays),
        # 100x sooner than the job's collective timeout
        assert STALL <= (first["time_unix_nano"] - since) / 1e9 <= STALL + 4, attrs
        assert float(attrs["torchelastic.stalled.threshold_seconds"]) == STALL
        stack_text = attrs["torchelastic.stack"]
        main = stack_text.split("\nThread ", 1)[0]
        assert re.search(r", in all_reduce\n", main), main
        assert (attrs["code.file.path"], int(attrs["code.line.number"])) == (str(WORKER), line), attrs
        assert attrs[GROUP + "pending"] == "gloo:all_reduce"
        assert int(attrs[GROUP + "pending_seq"]) == int(attrs[GROUP + "last_enqueued"])
        assert int(attrs[GROUP + "last_completed"]) == int(attrs[GROUP + "last_enqueued"]) - 1
        assert first["trace_id"] and first["span_id"]  # in the agent's attempt trace


def test_the_missing_rank_reports_its_stall_one_collective_behind(outcome: Outcome) -> None:
    records = outcome.hang_stalls(MISSING)
    digest = {rank: outcome.stall_digest(rank) for rank in (MISSING, *WAITING)}
    assert records, digest
    attrs = records[0]["attributes"]
    assert int(attrs["code.line.number"]) == training_jobs.marker_line(WORKER, "sleep"), digest
    assert "time.sleep" in attrs["torchelastic.stack"].split("\nThread ", 1)[0]
    waiting = outcome.hang_stalls(WAITING[0])[0]["attributes"]
    assert int(attrs[GROUP + "last_enqueued"]) == int(waiting[GROUP + "last_enqueued"]) - 1, digest
    assert GROUP + "pending" not in attrs, digest


def test_the_stall_repeats_with_back_off(outcome: Outcome) -> None:
    """Over a minute of hang: records at 1x, 2x, 4x, 8x the threshold (3, 6, 12, 24, 48 s), counted: each once it is
    due, never before, and one per period (the watchdog looks every second; a loaded machine may delay a look)."""
    for rank in WAITING:
        records = sorted(outcome.hang_stalls(rank), key=lambda r: int(r["attributes"]["torchelastic.stalled.count"]))
        counts = [int(r["attributes"]["torchelastic.stalled.count"]) for r in records]
        assert counts[:4] == [1, 2, 3, 4], outcome.stall_digest(rank)
        for count, record in zip(counts, records, strict=True):
            due = STALL * 2 ** (count - 1)
            seconds = float(record["attributes"]["torchelastic.stalled.seconds"])
            assert due <= seconds < 2 * due, (count, outcome.stall_digest(rank))


def test_the_final_records_carry_the_summary(outcome: Outcome) -> None:
    seq = int(outcome.hang_stalls(WAITING[0])[0]["attributes"][GROUP + "last_enqueued"])
    for rank in (*WAITING, MISSING):
        final = outcome.records(TERMINATED, rank) + outcome.records(EXCEPTION, rank)
        assert final, rank
        enqueued = {int(r["attributes"][GROUP + "last_enqueued"]) for r in final}
        assert enqueued == ({seq - 1} if rank == MISSING else {seq}), (rank, [r["attributes"] for r in final])


# ---- live: Prometheus -----------------------------------------------------------------------------------------------


def test_the_readme_query_names_rank_1_live(outcome: Outcome) -> None:
    (result,) = outcome.query
    labels = result["metric"]
    assert (labels["torchelastic_rank"], labels["process_group"], result["value"]) == ("1", "default_pg", 1.0)
    assert labels["torchelastic_run_id"] and labels["host_name"]


def test_the_alert_and_the_dashboard_table_name_rank_1(outcome: Outcome) -> None:
    (alert,) = outcome.alerts
    assert alert["labels"]["torchelastic_rank"] == "1" and alert["labels"]["severity"] == "critical"
    assert "rank 1 is missing from a collective of default_pg" in alert["annotations"]["summary"]
    assert [r["metric"]["torchelastic_rank"] for r in outcome.table] == ["1"]


# ---- the report ------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def reported(outcome: Outcome) -> tuple[dict[str, Any], str]:
    return training_jobs.report(outcome.files, outcome.html)


def test_report_json_names_the_missing_rank_and_the_stalls(reported: tuple[dict[str, Any], str]) -> None:
    summary, _ = reported
    (run,) = summary["runs"]
    assert run["outcome"] == "FAILED" and run["root_cause"]["rank"] == MISSING
    assert run["root_cause"]["exception_type"] == "RuntimeError"
    (missing,) = run["missing_ranks"]
    assert (missing["process_group"], missing["collective"], missing["ranks"], missing["waiting"]) == (
        "default_pg",
        "gloo:all_reduce",
        [MISSING],
        list(WAITING),
    )
    assert missing["text"] == f"rank 1 is missing from collective #{missing['seq']}, gloo:all_reduce, default_pg"
    line = training_jobs.marker_line(WORKER, "all_reduce")
    for rank in WAITING:
        ours = [s for s in run["stalls"] if s["rank"] == rank and s["code"] == f"{WORKER}:{line} in main"]
        assert len(ours) == 1, run["stalls"]
        assert ours[0]["stack_top"].endswith(" in all_reduce") and ours[0]["records"] >= 4, run["stalls"]
    assert any(s["rank"] == MISSING and s["code"] == f"{WORKER}:{training_jobs.marker_line(WORKER, 'sleep')} in main"
               for s in run["stalls"]), run["stalls"]  # fmt: skip
    assert run["stragglers"] == []


def test_terminal_report_says_who_is_missing(outcome: Outcome, reported: tuple[dict[str, Any], str]) -> None:
    summary, text = reported
    (missing,) = summary["runs"][0]["missing_ranks"]
    assert "MISSING FROM A COLLECTIVE" in text and "STALLS" in text, text[-4000:]
    assert (f"attempt 0: rank 1 is missing from collective #{missing['seq']}, gloo:all_reduce, default_pg "
            "(ranks 0, 2, 3 waited in it)") in text  # fmt: skip


_PAGE = """(() => ({
  missing: [...document.querySelectorAll('p.missing')].map(p => ({ranks: p.dataset.ranks, group: p.dataset.group,
    text: p.textContent})),
  stalls: [...document.querySelectorAll('table.stalls tbody tr')].map(r => ({rank: r.dataset.rank,
    top: r.querySelector('code.stack-top').textContent})),
  rendered: document.documentElement.dataset.rendered}))()"""


@pytest.mark.browser
def test_the_html_report_in_a_real_browser(outcome: Outcome, reported: Any, tmp_path: Path) -> None:
    from tests.support.report_browser import rendered

    page = rendered(outcome.html, _PAGE)
    assert page["rendered"] == "true"
    (missing,) = page["missing"]
    assert missing["ranks"] == "1" and missing["group"] == "default_pg" and "gloo:all_reduce" in missing["text"]
    waiting = {s["rank"] for s in page["stalls"] if s["top"].endswith(" in all_reduce")}
    assert waiting == {"0", "2", "3"}, page["stalls"]
