"""The report's split of records into runs (``model.split_runs``) where one process launched several runs: a
record's own ``torchelastic.run_id`` tells its run before its resource's, which a launching process that
made several runs may have kept from an earlier run (files of earlier versions of the bridge)."""

from __future__ import annotations

from torchelastic_otel import _names as names
from torchelastic_otel.report import model
from torchelastic_otel.report.records import STATUS_ERROR, LogRecord, Proc, Span, Telemetry

HOST = "node0"
SEC = 1_000_000_000


def _agent(run_id: str | None) -> Proc:
    return Proc("agent", HOST, 10, run_id, None, None, None, "torchelastic")


def _span(trace: str, span_id: str, parent: str, name: str, start: int, proc: Proc, **attrs: object) -> Span:
    status = STATUS_ERROR if attrs.get(names.RUN_STATE) == "FAILED" else 0
    return Span(trace * 32, span_id * 16, parent * 16 if parent else "", name, start * SEC, (start + 5) * SEC,
                dict(attrs), status, "", [], proc)  # fmt: skip


def _run(tel: Telemetry, run_id: str, trace: str, start: int, state: str, resource_run_id: str) -> None:
    """One run of the launching agent: its run span and attempt (with the run id as their attribute), a span without
    it (as ``torchelastic.workers.start``), and a log record with it, all on a resource saying ``resource_run_id``."""
    proc = _agent(resource_run_id)
    tel.spans.append(_span(trace, "1", "", names.RUN, start, proc, **{names.RUN_ID: run_id, names.RUN_STATE: state}))
    tel.spans.append(_span(trace, "2", "1", names.ATTEMPT, start, proc, **{names.RUN_ID: run_id}))
    tel.spans.append(_span(trace, "3", "2", "torchelastic.workers.start", start, proc))
    tel.logs.append(LogRecord((start + 1) * SEC, 9, "INFO", "x", "x", {names.RUN_ID: run_id}, "", "", proc))


def test_a_records_own_run_id_wins_over_a_stale_resources() -> None:
    tel = Telemetry()
    _run(tel, "run1", "a", 0, "SUCCEEDED", "run1")
    _run(tel, "run2", "b", 10, "FAILED", "run1")  # the agent's resource kept the first run's id
    _run(tel, "run3", "c", 20, "SUCCEEDED", "run1")
    jobs = model.build(tel)
    assert [j.run_id for j in jobs] == ["run1", "run2", "run3"]
    assert [j.outcome for j in jobs] == ["SUCCEEDED", "FAILED", "SUCCEEDED"]
    assert [sum(s.name == names.RUN for s in j.spans) for j in jobs] == [1, 1, 1]
    assert [len(j.logs) for j in jobs] == [1, 1, 1]
    assert [len(j.attempts) for j in jobs] == [1, 1, 1]


def test_records_without_a_run_id_go_by_their_resource() -> None:
    tel = Telemetry()
    _run(tel, "run1", "a", 0, "SUCCEEDED", "run1")
    _run(tel, "run2", "b", 10, "SUCCEEDED", "run2")
    tel.logs.append(LogRecord(30 * SEC, 9, "INFO", "y", "y", {}, "", "", _agent("run2")))
    jobs = model.build(tel)
    assert [(j.run_id, j.outcome, len(j.logs)) for j in jobs] == [("run1", "SUCCEEDED", 1), ("run2", "SUCCEEDED", 2)]
