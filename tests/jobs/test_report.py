"""``make demo`` for real, and the report of it, in the terminal and in a real browser.

The module runs ``examples/demo.py`` once: a real ``torchelastic-otel run`` job (2 gloo workers on CPU, rank 1
fails in the first attempt, ``--max-restarts 1``) whose agent and workers export through the real
``otlp_json_file`` exporter into one file per process and signal; then ``torchelastic-otel report`` renders the
files. The tests check the files, the terminal report, the model behind it (also without the traces and without
the agent's root-cause record, the fallbacks), and the HTML in headless Chromium (Debian's ``chromium``, from
``make browser-deps``): no console errors, no network request, one timeline bar per attempt and rank, the failure
marked, zoom and details working; a screenshot is taken.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support import ROOT
from tests.support.jobs import run_demo
from tests.support.report_browser import NO_CHROMIUM, Chromium, chromium_binary, started_browser
from tests.support.report_files import without_named
from torchelastic_otel.report import model, otlpjson

pytest.importorskip("torch.distributed.elastic.agent.server.local_elastic_agent")
pytest.importorskip("opentelemetry.exporter.otlp.json.file")

DEMO_TIMEOUT = 240.0  # seconds for the whole demo (the job itself is bounded at 150 s by the demo)


@dataclass
class Demo:
    out: Path
    output: str
    returncode: int

    @property
    def telemetry(self) -> Path:
        return self.out / "telemetry"

    @property
    def html(self) -> Path:
        return self.out / "report.html"


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Demo:
    out = tmp_path_factory.mktemp("demo")
    job = run_demo(out, out / "demo.log", DEMO_TIMEOUT, COLUMNS="120")
    return Demo(out, job.output(), job.returncode if job.returncode is not None else -1)


def _read(demo: Demo) -> otlpjson.Telemetry:
    return otlpjson.read([demo.telemetry])


# ---- the files ------------------------------------------------------------------------------------------------


def test_every_process_writes_its_own_otlp_json_lines_files(demo: Demo) -> None:
    assert demo.returncode == 0, demo.output[-3000:]
    names = sorted(p.name for p in demo.telemetry.iterdir())
    for signal in ("traces", "logs", "metrics"):
        mine = [n for n in names if n.startswith(signal + "-")]
        assert len([n for n in mine if n.split("-")[2] == "agent"]) == 1, names  # <signal>-<host>-<who>-<pid>.jsonl
        workers = {tuple(n.split("-")[2:4]) for n in mine if "-rank" in n}  # (a worker may have helper processes)
        assert workers == {("rank0", "restart0"), ("rank0", "restart1"), ("rank1", "restart0"), ("rank1", "restart1")}
    key = {"traces": "resourceSpans", "logs": "resourceLogs", "metrics": "resourceMetrics"}
    written = set()
    for path in demo.telemetry.iterdir():
        for line in path.read_text().splitlines():  # (a process that exported nothing leaves an empty file)
            assert list(json.loads(line)) == [key[path.name.split("-")[0]]], f"{path.name}: {line[:200]}"
            written.add(tuple(path.name.split("-")[:1] + path.name.split("-")[2:3]))
    assert written == {(s, w) for s in key for w in ("agent", "rank0", "rank1")}, written
    assert not _read(demo).problems, _read(demo).problems.examples


# ---- the terminal report ------------------------------------------------------------------------------------------


def test_make_demo_prints_the_report_and_ends_with_its_path(demo: Demo) -> None:
    assert demo.returncode == 0, demo.output[-3000:]
    lines = demo.output.rstrip().splitlines()
    assert lines[-1] == f"report: {demo.html}", lines[-5:]
    text = demo.output
    for expected in (
        "SUCCEEDED after 1 restart -- 2 ranks, 2 attempts",
        "TIMELINE",
        "ROOT CAUSE",
        "attempt 0: rank 1 (local rank 1",
        "exited with code 1: ValueError: batch 25 of rank 1 holds NaN inputs",
        'demo_worker.py", line',  # the traceback
        "↻ restart 1 at",
        "torchelastic.attempt [ERROR]  <agent>",
        "train.step x",
        "METRICS",
    ):
        assert expected in text, f"{expected!r} not in:\n{text[-4000:]}"
    metric_lines = {line.split()[0]: line for line in text.splitlines() if line.startswith(("loss ", "samples_total "))}
    assert len(metric_lines["samples_total"].split()) == 3, metric_lines  # a value for rank 0 and rank 1
    assert "\x1b[" not in text  # no colour codes when not on a terminal


def test_the_html_file_is_self_contained(demo: Demo) -> None:
    page = demo.html.read_text()
    assert page.startswith("<!doctype html>")
    assert "Content-Security-Policy" in page and "default-src 'none'" in page
    for needle in ("src=", "<link", "@import", "url(http", "url(/", "fetch(", "XMLHttpRequest", "WebSocket", "<iframe"):
        assert needle not in page, needle  # nothing that loads (the browser test checks no request is made)
    assert 10_000 < len(page) < 1_000_000


# ---- the model --------------------------------------------------------------------------------------------------


def _workers(job: model.Job) -> dict[tuple[int, int | None], model.WorkerRun]:
    return {(w.restart, w.rank): w for w in job.workers}


def test_the_model_of_the_demo_job(demo: Demo) -> None:
    (job,) = model.build(_read(demo))
    assert job.outcome == "SUCCEEDED" and job.ranks == [0, 1]
    assert [(a.restart, a.failed) for a in job.attempts] == [(0, True), (1, False)]
    cause = job.attempts[0].root_cause
    assert cause is not None and cause.source == "record"  # the agent's torchelastic.root_cause record
    assert (cause.rank, cause.exit_code, cause.exc_type, cause.consequences) == (1, 1, "ValueError", [0])
    assert "demo_worker.py" in cause.stacktrace and "holds NaN inputs" in cause.exc_message
    workers = _workers(job)
    assert sorted(workers) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert workers[(0, 1)].state == "failed" and workers[(0, 1)].root_cause
    assert workers[(0, 0)].state in ("terminated", "stopped") and not workers[(0, 0)].root_cause
    assert workers[(1, 0)].state == workers[(1, 1)].state == "succeeded"
    for run in workers.values():
        assert job.start <= run.start < run.end <= job.end
        assert run.spans, f"rank {run.rank} restart {run.restart} has no spans of its own"
    assert workers[(0, 1)].failed_at < workers[(0, 1)].end <= job.attempts[1].start
    assert [(r.restart, r.reason) for r in job.restarts] == [(1, "failure")]
    if any("log.iostream" in r.attrs for r in job.logs):  # workers' output captured (log.iostream records)
        assert any("batch 25 holds NaN inputs" in line for line in cause.output), cause.output
        assert not any("raise ValueError" in line for line in cause.output)  # the traceback is shown once


def test_the_fallbacks_without_traces_and_without_a_root_cause_record(demo: Demo, tmp_path: Path) -> None:
    """Files of a job exported before root-cause records existed, and with traces off: the report still finds
    both attempts (from the workers) and the root cause (the first rank not stopped by the agent)."""
    for path in demo.telemetry.iterdir():
        if path.name.startswith("traces-"):
            continue
        with open(path) as src, open(tmp_path / path.name, "w") as dst:
            for line in src:
                dst.write(without_named(line, "torchelastic.root_cause") + "\n")
    tel = otlpjson.read([tmp_path])
    assert not tel.spans and not [r for r in tel.logs if r.name == "torchelastic.root_cause"]
    (job,) = model.build(tel)
    assert [(a.restart, a.failed) for a in job.attempts] == [(0, True), (1, False)]
    assert job.outcome == "SUCCEEDED"  # every worker of the last attempt succeeded (the agent's status records)
    cause = job.attempts[0].root_cause
    assert cause is not None and cause.source == "derived"
    assert (cause.rank, cause.exit_code, cause.consequences) == (1, 1, [0])
    assert "holds NaN inputs" in cause.exc_message and "demo_worker.py" in cause.stacktrace


# ---- the browser ---------------------------------------------------------------------------------------------------


@pytest.fixture
def browser() -> Iterator[Chromium]:
    with started_browser() as started:
        yield started


#: what the page drew, read from its DOM
_RENDERED = """(() => {
  const bars = [...document.querySelectorAll('.timeline rect.bar.worker')].map(r => ({
    rank: r.dataset.rank, restart: r.dataset.restart, cls: r.getAttribute('class'), width: +r.getAttribute('width')}));
  const attempts = [...document.querySelectorAll('.timeline rect.bar.attempt')].map(r => r.getAttribute('class'));
  const failureMarks = [...document.querySelectorAll('.timeline .mark.failure')].map(m => m.dataset.title);
  const restartMarks = document.querySelectorAll('.timeline .mark.restart').length;
  const charts = [...document.querySelectorAll('.chart')].map(c => ({
    metric: c.dataset.metric, lines: c.querySelectorAll('polyline').length}));
  const svg = document.querySelector('.timeline svg');
  return {bars, attempts, failureMarks, restartMarks, charts, rendered: document.documentElement.dataset.rendered,
          view: [+svg.dataset.viewStart, +svg.dataset.viewEnd],
          cause: document.querySelector('.cause .headline').textContent};
})()"""


@pytest.mark.browser
def test_the_html_report_in_a_real_browser(demo: Demo, browser: Chromium, tmp_path: Path) -> None:
    browser.open(demo.html.as_uri())
    page = browser.evaluate(_RENDERED)
    assert browser.errors() == []
    assert browser.requests() == [demo.html.as_uri()]  # nothing but the file itself
    assert page["rendered"] == "true"
    # one bar per attempt and rank, the root cause marked on rank 1's first attempt
    assert sorted((b["restart"], b["rank"]) for b in page["bars"]) == [("0", "0"), ("0", "1"), ("1", "0"), ("1", "1")]
    by_key = {(b["restart"], b["rank"]): b for b in page["bars"]}
    assert "root-cause" in by_key[("0", "1")]["cls"] and "failed" in by_key[("0", "1")]["cls"]
    assert all("root-cause" not in b["cls"] for k, b in by_key.items() if k != ("0", "1"))
    assert all(b["width"] > 2 for b in page["bars"])
    assert sorted(page["attempts"]) == ["bar attempt failed", "bar attempt ok"]
    assert len(page["failureMarks"]) == 1 and "rank 1 failed" in page["failureMarks"][0]
    assert page["restartMarks"] == 1
    assert "rank 1" in page["cause"] and "ValueError" in page["cause"]
    charts = {c["metric"]: c["lines"] for c in page["charts"]}
    assert charts.get("loss", 0) >= 2 and "samples_total" in charts, charts

    browser.screenshot(tmp_path / "report.png", full_page=False)
    assert (tmp_path / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # zoom in with the toolbar, then with the mouse wheel over the timeline: the visible time range narrows
    start, end = page["view"]
    browser.evaluate("document.querySelector('.toolbar button[data-zoom=in]').click()")
    zoomed = browser.evaluate(_RENDERED)["view"]
    assert zoomed[1] - zoomed[0] == pytest.approx((end - start) / 2, rel=0.01)
    browser.evaluate("document.querySelector('.timeline').scrollIntoView()")  # below the root cause since issue 31
    box = browser.evaluate("(() => { const r = document.querySelector('.timeline').getBoundingClientRect();"
                           " return [r.x + r.width / 2, r.y + 40]; })()")  # fmt: skip
    browser.send("Input.dispatchMouseEvent", type="mouseWheel", x=box[0], y=box[1], deltaX=0, deltaY=-100)
    wheeled = browser.evaluate(_RENDERED)["view"]
    assert wheeled[1] - wheeled[0] < zoomed[1] - zoomed[0]
    browser.evaluate("document.querySelector('.toolbar button[data-zoom=reset]').click()")
    assert browser.evaluate(_RENDERED)["view"] == [start, end]

    # a click on the root-cause bar shows its details
    center = browser.evaluate(
        "(() => { const r = document.querySelector('rect.bar.worker.root-cause')"
        ".getBoundingClientRect(); return [r.x + r.width / 2, r.y + r.height / 2]; })()"
    )
    for kind in ("mousePressed", "mouseReleased"):
        browser.send("Input.dispatchMouseEvent", type=kind, x=center[0], y=center[1], button="left", clickCount=1)
    details = browser.evaluate("document.querySelector('.details').textContent")
    assert "rank 1, restart 0: failed (root cause)" in details and "ValueError" in details
    assert browser.errors() == []


@pytest.mark.browser
def test_the_screenshot_script(demo: Demo, tmp_path: Path) -> None:
    """``python -m tests.support.report_browser REPORT OUT`` (how the README's picture is made) writes a PNG."""
    if chromium_binary() is None:
        pytest.skip(NO_CHROMIUM)
    shutil.copy(demo.html, tmp_path / "r.html")
    cmd = [sys.executable, "-m", "tests.support.report_browser", str(tmp_path / "r.html"), str(tmp_path / "r.png")]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "errors: []" in done.stdout
    assert (tmp_path / "r.png").stat().st_size > 10_000


@pytest.mark.browser
def test_hostile_strings_do_not_run_in_the_browser(browser: Chromium, tmp_path: Path) -> None:
    """A run id and an exception message made of markup and script: the page shows them and runs none of it."""
    from tests.support.report_files import Shape, write_job
    from torchelastic_otel.report import html

    hostile = '</script><script>window.pwned = 1</script><img src=x onerror="window.pwned = 2">'
    write_job(tmp_path / "job", Shape(run_id=hostile, error=hostile))
    tel = otlpjson.read([tmp_path / "job"])
    (tmp_path / "r.html").write_text(html.render(tel, model.build(tel)))
    browser.open((tmp_path / "r.html").as_uri())
    assert browser.evaluate("window.pwned === undefined && document.querySelectorAll('img').length === 0")
    assert browser.errors() == [] and browser.requests() == [(tmp_path / "r.html").as_uri()]
    headline = browser.evaluate("document.querySelector('.cause .headline').textContent")
    assert hostile in headline
    titles = browser.evaluate("[...document.querySelectorAll('rect.worker.root-cause title')].map(t => t.textContent)")
    assert any(hostile in t for t in titles)
