"""The report of a run on many nodes: the same counts everywhere, the exception first, the healthy nodes folded.

Source: a real job (``examples/demo.py``: ``torchelastic-otel run``, 2 gloo workers on CPU, rank 1 raises in the first
attempt, the agent restarts the group) exporting through the real ``otlp_json_file`` exporter. ``bench/scale_gen.py``
re-identifies its files into a 16-node run (2 ranks each) in which local rank 1 of ``node0003`` (global rank 7) is
the one that raises in attempt 0, and every other node's workers were stopped by their agents. Then the real
``torchelastic-otel report`` command renders it: terminal text, HTML, ``--json``; and a headless Chromium shows
the HTML (the deviating node's group open and drawn, the healthy ones folded and drawn only when opened).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.support import ROOT
from tests.support.procs import Job
from tests.support.report_browser import Chromium, chromium_binary
from torchelastic_otel.report import hosts

pytest.importorskip("torch.distributed.elastic.agent.server.local_elastic_agent")
pytest.importorskip("opentelemetry.exporter.otlp.json.file")

DEMO_TIMEOUT = 240.0
REPORT_TIMEOUT = 300.0  # seconds for one report of the 16-node run on a loaded 2-core machine
NODES, RANKS, ATTEMPTS = 16, 2, 2
FAILING = "node0003"
CAUSE_RANK = 3 * RANKS + 1  # local rank 1 of node 3


def _scale_gen() -> ModuleType:
    spec = importlib.util.spec_from_file_location("scale_gen", ROOT / "bench" / "scale_gen.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["scale_gen"] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _without_arrivals(src: Path, out: Path) -> Path:
    """The demo's files less the straggler signal (``torchelastic.worker.step.arrival``): its two ranks differ in
    arrival by chance, and cloned eight times the slower half would be stragglers by that chance. Without it, the one
    deviating node is the failing one, whatever the machine's noise."""
    out.mkdir()
    for path in src.iterdir():
        lines = path.read_text().splitlines()
        if path.name.startswith("metrics-"):
            lines = [_drop_metric(line, "torchelastic.worker.step.arrival") for line in lines]
        (out / path.name).write_text("".join(line + "\n" for line in lines))
    return out


def _drop_metric(line: str, name: str) -> str:
    data = json.loads(line)
    for block in data.get("resourceMetrics", []):
        for scope in block.get("scopeMetrics", []):
            scope["metrics"] = [m for m in scope.get("metrics", []) if m.get("name") != name]
    return json.dumps(data)


@dataclass
class Scaled:
    files: Path
    text: str  # the terminal report
    page: str  # the HTML file
    html: Path
    run: dict[str, Any]  # --json's run


def _report(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    cmd = [sys.executable, "-m", "torchelastic_otel.report", *args]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=REPORT_TIMEOUT)


@pytest.fixture(scope="module")
def scaled(tmp_path_factory: pytest.TempPathFactory) -> Scaled:
    out = tmp_path_factory.mktemp("scale")
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    with open(out / "demo.log", "wb") as fh:
        cmd = [sys.executable, str(ROOT / "examples" / "demo.py"), "--out", str(out / "demo"), "--timeout", "150"]
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    job = Job(proc, out / "demo.log")
    try:
        job.wait(timeout=DEMO_TIMEOUT)
    finally:
        job.kill()
    assert job.returncode == 0, job.output()[-3000:]
    source = _without_arrivals(out / "demo" / "telemetry", out / "source")
    files = out / "files"
    _scale_gen().generate(source, files, NODES, RANKS, ATTEMPTS, [f"{FAILING}:1@0"])
    html = out / "report.html"
    shown = _report(str(files), "--html", str(html), "--width", "120")
    assert shown.returncode == 0, shown.stderr[-3000:]
    summary = _report(str(files), "--json")
    assert summary.returncode == 0, summary.stderr[-3000:]
    (run,) = json.loads(summary.stdout)["runs"]
    return Scaled(files, shown.stdout, html.read_text(), html, run)


# ---- the counts ---------------------------------------------------------------------------------------------


def _html_counts(page: str) -> dict[str, int]:
    match = re.search(r"<p class=summary ([^>]*)>", page)
    assert match, page[:3000]
    return {k: int(v) for k, v in re.findall(r'data-(\w+)="(\d+)"', match.group(1))}


def test_the_counts_agree_in_json_terminal_and_html(scaled: Scaled) -> None:
    run = scaled.run
    expected = {"attempts": ATTEMPTS, "ranks": NODES * RANKS, "nodes": NODES, "failures": 1, "agents": NODES}
    assert {"attempts": run["attempts"], "ranks": len(run["ranks"]), "nodes": run["nodes"],
            "failures": run["failures"], "agents": run["agents"]} == expected  # fmt: skip
    assert _html_counts(scaled.page) == expected
    line = f"{NODES * RANKS} ranks, {ATTEMPTS} attempts, {NODES} nodes, 1 failure"
    assert line in scaled.text and f"{NODES} agents" in scaled.text
    assert (
        f"{NODES * RANKS} ranks &middot; {ATTEMPTS} attempts &middot; {NODES} nodes &middot; 1 failure" in scaled.page
    )
    assert len(run["root_causes"]) == 1  # one per failed attempt, not one per agent


def test_the_hosts_in_short(scaled: Scaled) -> None:
    expected = "node0000…node0015 (16 hosts)"
    assert scaled.run["hosts"] == expected
    assert f"hosts: {expected}" in scaled.text.splitlines()[:4]
    assert f"hosts: {expected}</p>" in scaled.page
    assert "node0001, node0002" not in scaled.text and "node0001, node0002" not in scaled.page


# ---- what went wrong comes first --------------------------------------------------------------------------------


def test_the_root_cause_and_the_deviating_node_open_the_terminal_report(scaled: Scaled) -> None:
    cause = scaled.run["root_cause"]
    assert (cause["rank"], cause["host"], cause["exception_type"]) == (CAUSE_RANK, FAILING, "ValueError")
    lines = scaled.text.splitlines()
    headline = next(i for i, line in enumerate(lines) if line.startswith(f"attempt 0: rank {CAUSE_RANK} "))
    assert headline < 10, "\n".join(lines[:12])
    deviating = lines.index(next(line for line in lines if line.startswith("DEVIATING NODES")))
    assert deviating < 40 and lines[deviating] == f"DEVIATING NODES  (1 of {NODES}; {NODES - 1} healthy nodes)"
    assert lines[deviating + 1] == f"{FAILING}  root cause: rank {CAUSE_RANK}"
    assert headline < deviating < lines.index(next(line for line in lines if line.startswith("TIMELINE")))


def test_the_terminal_timeline_folds_the_healthy_nodes(scaled: Scaled) -> None:
    lines = scaled.text.splitlines()
    start = lines.index(next(line for line in lines if line.startswith("TIMELINE")))
    end = lines.index(next(line for line in lines if line.startswith("WHERE THE TIME WENT")))
    timeline = lines[start:end]
    groups = [line for line in timeline if line.startswith(("▾", "▸"))]
    assert groups[0] == f"▾ {FAILING}: ranks 6, 7; root cause: rank {CAUSE_RANK}"
    assert groups[1:] == [f"▸ {NODES - 1} healthy nodes, folded: node0000…node0002, node0004…node0015 (15 hosts)"]
    agents = [line.split()[1] for line in timeline if line.startswith("agent ")]
    assert agents == [FAILING]  # the healthy nodes have no rows of their own
    assert [line.split()[:2] for line in timeline if line.startswith("rank ")] == [["rank", "6"], ["rank", "7"]]
    bands = [line.strip() for line in timeline if re.match(r"^\s+15 healthy nodes: attempt", line)]
    assert [b.split(" (")[0].rsplit(" ", 1)[0] for b in bands] == [
        "15 healthy nodes: attempt 0", "15 healthy nodes: attempt 1"]  # fmt: skip
    assert "30 stopped by the agent" in bands[0] and "30 succeeded" in bands[1]


def test_the_html_puts_the_root_cause_before_the_timeline_and_folds_the_healthy_nodes(scaled: Scaled) -> None:
    page = scaled.page
    cause = page.index('<div class="cause"')
    assert page.index("<p class=summary") < cause < page.index('<ul class=deviating>') < page.index(
        '<div class="timeline"')  # fmt: skip
    groups = re.findall(r'<details class="node (\w+)" data-host="([^"]*)"[^>]*?( open)?>', page)
    assert groups[0] == ("deviating", FAILING, " open")
    healthy = [g for g in groups[1:]]
    assert healthy and all(kind == "healthy" and not opened for kind, _, opened in healthy)
    assert '<div class="healthy" data-nodes="15">' in page
    assert page.index(f'data-host="{FAILING}"') < page.index('<div class="healthy"')
    assert "15 healthy nodes: attempt 0" in page and "15 healthy nodes: attempt 1" in page
    assert len(page) < 1_500_000


# ---- the short forms -------------------------------------------------------------------------------------------


def test_host_and_rank_summaries() -> None:
    assert hosts.summarize(f"node{i:04d}" for i in range(1024)) == "node0000…node1023 (1,024 hosts)"
    assert hosts.summarize(["a", "b"]) == "a, b"
    gaps = [f"gpu{i}" for i in range(1, 13) if i != 7] + ["login"]
    assert hosts.summarize(gaps) == "gpu1…gpu6, gpu8…gpu12, login (12 hosts)"
    many = [f"n{i:03d}.x" for i in range(0, 40, 2)]
    assert hosts.summarize(many, limit=3) == "n000.x, n002.x, n004.x, … (+17 more) (20 hosts)"
    assert hosts.rank_list([7]) == "rank 7"
    assert hosts.rank_list([*range(7), *range(8, 32)]) == "ranks 0–6, 8–31 (31 ranks)"
    assert hosts.rank_list([0, 1]) == "ranks 0, 1"


# ---- the browser ------------------------------------------------------------------------------------------------


@pytest.fixture
def browser() -> Iterator[Chromium]:
    binary = chromium_binary()
    if binary is None:
        pytest.skip("no chromium on PATH: `make browser-deps` installs Debian's chromium (as root, with apt-get)")
    started = Chromium(binary, 1280, 900)
    try:
        yield started
    finally:
        started.close()


_GROUPS = """[...document.querySelectorAll('.timeline details.node')].map(d => ({
  host: d.dataset.host, open: d.open, cls: d.className,
  workers: [...d.querySelectorAll('rect.bar.worker')].map(r => r.dataset.rank + '@' + r.dataset.restart),
  svgs: d.querySelectorAll('svg').length}))"""


def _wait_for(browser: Chromium, condition: str, timeout: float = 10.0) -> bool:
    """Poll ``condition`` in the page (the toggle event is dispatched after the click, as a task) until a deadline."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if browser.evaluate(condition):
            return True
        browser.evaluate("new Promise(resolve => requestAnimationFrame(() => resolve(true)))")  # one frame
    return False


@pytest.mark.browser
def test_the_16_node_report_in_a_real_browser(scaled: Scaled, browser: Chromium) -> None:
    browser.open(scaled.html.as_uri())
    assert browser.evaluate("document.documentElement.dataset.rendered") == "true"
    assert browser.errors() == [] and browser.requests() == [scaled.html.as_uri()]
    groups = browser.evaluate(_GROUPS)
    assert groups[0]["host"] == FAILING and groups[0]["open"] and "deviating" in groups[0]["cls"]
    assert sorted(groups[0]["workers"]) == ["6@0", "6@1", "7@0", "7@1"]
    assert browser.evaluate("document.querySelectorAll('.timeline rect.bar.worker.root-cause').length") == 1
    folded = groups[1:]
    assert folded and all(not g["open"] and g["svgs"] == 0 and "healthy" in g["cls"] for g in folded)
    bands = browser.evaluate("[...document.querySelectorAll('.band-lane rect.bar.band')].map(r => r.dataset.attempt)")
    assert bands == ["0", "1"]
    # a folded healthy node opens on a click on its summary, and is drawn then
    host = folded[0]["host"]
    browser.evaluate(f"document.querySelector('details[data-host=\"{host}\"]').scrollIntoView()")
    center = browser.evaluate(f"(() => {{ const r = document.querySelector('details[data-host=\"{host}\"] summary')"
                              ".getBoundingClientRect(); return [r.x + 20, r.y + r.height / 2]; })()")  # fmt: skip
    for kind in ("mousePressed", "mouseReleased"):
        browser.send("Input.dispatchMouseEvent", type=kind, x=center[0], y=center[1], button="left", clickCount=1)
    drawn = f"document.querySelector('details[data-host=\"{host}\"]').querySelectorAll('svg').length === 1"
    assert _wait_for(browser, drawn), "the opened node was not drawn"
    opened = next(g for g in browser.evaluate(_GROUPS) if g["host"] == host)
    assert opened["open"] and opened["svgs"] == 1 and len(opened["workers"]) == RANKS * ATTEMPTS
    assert browser.errors() == []
