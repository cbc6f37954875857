"""The report of a run on many nodes: the same counts everywhere, the exception first, the healthy nodes folded.

Source: a real job (``examples/demo.py``: ``torchelastic-otel run``, 2 gloo workers on CPU, rank 1 raises in the first
attempt, the agent restarts the group) exporting through the real ``otlp_json_file`` exporter. ``bench/scale_gen.py``
re-identifies its files into a 16-node run (2 ranks each) in which local rank 1 of ``node0003`` (global rank 7) is
the one that raises in attempt 0, and every other node's workers were stopped by their agents. Then the real
``torchelastic-otel report`` command renders it: terminal text, HTML, ``--json``; and a headless Chromium shows
the HTML (the deviating node's group open and drawn, the healthy ones folded and drawn only when opened).

From the same source, runs of 16 and 1,024 nodes in which the other nodes' ranks do not wait to be stopped but fail
themselves when the root cause's rank dies, as a large job's do (``scale_gen --fail-alike``: gloo's ``Connection
closed by peer`` with each rank's own address and port), and three nodes fail differently (``--fail-unlike``:
``Connection reset by peer``, NCCL's watchdog, a DataLoader worker killed): every view shows the many as one group
(its nodes and ranks in ranges, counted), after the root cause's, and each of the three as a group of its own.
"""

from __future__ import annotations

import gc
import importlib.util
import json
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
from tests.support.env import clean_env
from tests.support.jobs import run_demo
from tests.support.report_browser import Chromium, started_browser
from tests.support.report_files import without_named
from torchelastic_otel.report import hosts, model, terminal, training
from torchelastic_otel.report import html as report_html
from torchelastic_otel.report import read as report_read

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
            lines = [without_named(line, "torchelastic.worker.step.arrival") for line in lines]
        (out / path.name).write_text("".join(line + "\n" for line in lines))
    return out


@dataclass
class Scaled:
    files: Path
    text: str  # the terminal report
    page: str  # the HTML file
    html: Path
    run: dict[str, Any]  # --json's run


def _report(*args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "torchelastic_otel.report", *args]
    return subprocess.run(cmd, cwd=ROOT, env=clean_env(), capture_output=True, text=True, timeout=REPORT_TIMEOUT)


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo's files (a real job), less the straggler signal: what every run of this module is cloned from."""
    out = tmp_path_factory.mktemp("demo")
    job = run_demo(out / "demo", out / "demo.log", DEMO_TIMEOUT)
    assert job.returncode == 0, job.output()[-3000:]
    return _without_arrivals(out / "demo" / "telemetry", out / "source")


def _shown(files: Path, out: Path) -> Scaled:
    """The real ``report`` command's terminal text and HTML file, and its ``--json``, of the run in ``files``."""
    html = out / "report.html"
    shown = _report(str(files), "--html", str(html), "--width", "120")
    assert shown.returncode == 0, shown.stderr[-3000:]
    summary = _report(str(files), "--json")
    assert summary.returncode == 0, summary.stderr[-3000:]
    (run,) = json.loads(summary.stdout)["runs"]
    return Scaled(files, shown.stdout, html.read_text(), html, run)


@pytest.fixture(scope="module")
def scaled(source: Path, tmp_path_factory: pytest.TempPathFactory) -> Scaled:
    out = tmp_path_factory.mktemp("scale")
    files = out / "files"
    _scale_gen().generate(source, files, NODES, RANKS, ATTEMPTS, [f"{FAILING}:1@0"])
    return _shown(files, out)


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
    # every other rank was stopped by its agent: on every node, not only the root cause's
    everyone = f"ranks 0–{CAUSE_RANK - 1}, {CAUSE_RANK + 1}–{NODES * RANKS - 1} ({NODES * RANKS - 1} ranks)"
    assert f"  then failed or stopped: {everyone}" in lines
    assert cause["consequences"] == [r for r in range(NODES * RANKS) if r != CAUSE_RANK]
    assert [g["host_names"] for g in scaled.run["groups"]] == [[FAILING]]


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


# ---- nodes that fail alike --------------------------------------------------------------------------------------


@dataclass
class Alike:
    """A run in which the ranks of ``alike`` nodes fail alike after the root cause's, and those of ``unlike`` nodes
    each differently (in turn: ``Connection reset by peer``, NCCL's watchdog, a DataLoader worker killed)."""

    nodes: int
    failing: int  # the root cause's node (its local rank 1 raises)
    unlike: list[int]
    alike: list[int]
    line: str  # the alike group's line, as the terminal and --json say it
    text: str
    page: str
    run: dict[str, Any]

    @property
    def cause_rank(self) -> int:
        return self.failing * RANKS + 1


GLOO = "failed in attempt 0 (exit code 1): RuntimeError: [<path>] Connection closed by peer <addr>. This is typically"
UNLIKE = [
    "failed in attempt 0 (exit code 1): RuntimeError: [<path>] Connection reset by peer <addr>.",
    "failed in attempt 0 (exit code 1): torch.distributed.DistBackendError: [Rank <n>] NCCL watchdog thread",
    "failed in attempt 0 (exit code 1): RuntimeError: DataLoader worker (pid <n>) is killed by signal: Bus error.",
]


@pytest.fixture(scope="module")
def alike16(source: Path, tmp_path_factory: pytest.TempPathFactory) -> Alike:
    """16 nodes: node 3's rank raises; 11 nodes fail alike, nodes 4, 8 and 11 differently, node 15 is stopped.
    Rendered by the real ``report`` command."""
    out = tmp_path_factory.mktemp("alike16")
    _scale_gen().generate(source, out / "files", 16, RANKS, ATTEMPTS, ["node0003:1@0"], alike=11, unlike=3)
    shown = _shown(out / "files", out)
    line = (
        "node0000…node0002, node0005…node0007, node0009…node0010, node0012…node0014 (11 hosts)  "
        "failure: ranks 0–5, 10–15, 18–21, 24–29 (22 ranks)"
    )
    alike = [0, 1, 2, 5, 6, 7, 9, 10, 12, 13, 14]
    return Alike(16, 3, [4, 8, 11], alike, line, shown.text, shown.page, shown.run)


@pytest.fixture(scope="module")
def alike1024(source: Path, tmp_path_factory: pytest.TempPathFactory) -> Alike:
    """1,024 nodes: node 417's rank raises, nodes 255, 512 and 768 fail differently, the 1,020 others alike. Read
    once and rendered by the three functions the ``report`` command calls (terminal, HTML, ``--json``): reading the
    files is most of a report's time, and the command itself is the 16-node run's."""
    out = tmp_path_factory.mktemp("alike1024")
    files = out / "files"
    fails = ["node0417:1@0"]
    _scale_gen().generate(source, files, 1024, RANKS, ATTEMPTS, fails, alike=1020, unlike=3, metric_every=1000)
    gc.disable()  # as the command does: millions of objects in no cycle, each collection would walk them all
    try:
        tel = report_read([str(files)])
        jobs = model.build(tel)
        text = terminal.render(tel, jobs, width=120)
        page = report_html.render(tel, jobs)
        (run,) = json.loads(json.dumps(training.summary(jobs, dict(tel.problems.counts)), default=str))["runs"]
    finally:
        gc.enable()
    line = (
        "node0000…node0254, node0256…node0416, node0418…node0511, node0513…node0767, node0769…node1023 (1,020 hosts)  "
        "failure: ranks 0–509, 512–833, 836–1023, 1026–1535, 1538–2047 (2,040 ranks)"
    )
    alike = [n for n in range(1024) if n not in (255, 417, 512, 768)]
    return Alike(1024, 417, [255, 512, 768], alike, line, text, page, run)


@pytest.fixture(scope="module", params=[16, 1024], ids=["16-nodes", "1024-nodes"])
def alike(request: pytest.FixtureRequest) -> Alike:
    found: Alike = request.getfixturevalue(f"alike{request.param}")
    return found


def _host(node: int) -> str:
    return f"node{node:04d}"


def test_the_terminal_shows_one_line_for_the_many_and_one_for_each_that_failed_differently(alike: Alike) -> None:
    lines = alike.text.splitlines()
    start = lines.index(next(line for line in lines if line.startswith("DEVIATING NODES")))
    deviating = len(alike.alike) + len(alike.unlike) + 1
    healthy = alike.nodes - deviating
    assert lines[start] == (
        f"DEVIATING NODES  ({deviating:,} of {alike.nodes:,} in 5 groups; {hosts.plural(healthy, 'healthy node')})"
    )
    end = lines.index("", start)
    section = lines[start + 1 : end]
    heads = [line for line in section if not line.startswith("  ")]
    cause = alike.cause_rank
    assert heads == [
        f"{_host(alike.failing)}  root cause: rank {cause}",
        alike.line,
        *(f"{_host(n)}  failure: ranks {2 * n}, {2 * n + 1}" for n in alike.unlike),
    ]
    # under the many's line, what they did with the numbers masked; under each of the few, its ranks' own words
    assert section[section.index(alike.line) + 1].startswith("  " + GLOO)
    for node, what in zip(
        alike.unlike, ["Connection reset by peer", "NCCL watchdog", "DataLoader worker"], strict=True
    ):
        below = section[section.index(f"{_host(node)}  failure: ranks {2 * node}, {2 * node + 1}") + 1]
        assert below.startswith(f"  rank {2 * node}: failed in attempt 0 (exit code 1): ") and what in below
    assert len(section) < 16  # 1,020 nodes in one line: the section does not grow with them
    everyone = [r for r in range(alike.nodes * RANKS) if r != cause]
    assert f"  then failed or stopped: {hosts.rank_list(everyone)}" in lines


def test_the_html_shows_one_item_for_the_many_and_one_for_each_that_failed_differently(alike: Alike) -> None:
    page = alike.page
    deviating = len(alike.alike) + len(alike.unlike) + 1
    assert f"<h3>Deviating nodes <small>({deviating:,} of {alike.nodes:,} in 5 groups; " in page
    section = page[page.index("<ul class=deviating>") : page.index("<h3>Timeline</h3>")]
    hosts_text, ranks_text = alike.line.split("  failure: ")
    many = (
        f'<li class=group data-nodes="{len(alike.alike)}" data-ranks="{2 * len(alike.alike)}" '
        f'data-reasons="failure"><b>{hosts_text}</b> failure: {ranks_text}<ul><li>'
    )
    items = [f'<li data-host="{_host(alike.failing)}" data-reasons="root cause">', many]
    items += [f'<li data-host="{_host(n)}" data-reasons="failure">' for n in alike.unlike]
    at = [section.index(item) for item in items]
    assert at == sorted(at)
    assert section.count("<li data-host=") + section.count("<li class=group") == 5
    assert report_html.e(GLOO) in section[at[1] :]
    everyone = [r for r in range(alike.nodes * RANKS) if r != alike.cause_rank]
    assert f"<p>then failed or stopped: {report_html.e(hosts.rank_list(everyone))}</p>" in page


def test_the_json_has_the_groups_the_root_causes_first(alike: Alike) -> None:
    run = alike.run
    assert set(run) == SUMMARY_KEYS | {"groups"}  # the keys of before, and the groups
    groups = run["groups"]
    expected = [[_host(alike.failing)], [_host(n) for n in alike.alike], *([_host(n)] for n in alike.unlike)]
    assert [g["host_names"] for g in groups] == expected
    cause, many, *few = groups
    assert cause["root_cause"] and cause["reasons"] == ["root cause"] and cause["ranks"] == [alike.cause_rank]
    assert many["line"] == alike.line and many["nodes"] == len(alike.alike) and not many["root_cause"]
    assert many["ranks"] == [r for n in alike.alike for r in (2 * n, 2 * n + 1)]
    assert many["rank_count"] == 2 * len(alike.alike)
    assert len(many["what"]) == 1 and many["what"][0].startswith(GLOO)
    assert many["example"].startswith(f"rank {2 * alike.alike[0]}: failed in attempt 0 (exit code 1): RuntimeError: [")
    for group, node, what in zip(few, alike.unlike, UNLIKE, strict=True):  # never folded into the many, nor together
        assert group["nodes"] == 1 and group["ranks"] == [2 * node, 2 * node + 1]
        assert len(group["what"]) == 1 and group["what"][0].startswith(what), group["what"]
    everyone = [r for r in range(alike.nodes * RANKS) if r != alike.cause_rank]
    assert run["root_cause"]["consequences"] == everyone
    assert run["failures"] == 1 + RANKS * (len(alike.alike) + len(alike.unlike))


#: the keys of a run in ``report --json`` before the groups
SUMMARY_KEYS = {
    "run_id", "outcome", "start", "seconds", "ranks", "attempts", "agents", "nodes", "failures", "hosts", "root_cause",
    "root_causes", "restarts", "stragglers", "steps", "stalls", "missing_ranks", "goodput", "goodput_attempts",
    "verdict", "memory_creep",
}  # fmt: skip


# ---- the browser ------------------------------------------------------------------------------------------------


@pytest.fixture
def browser() -> Iterator[Chromium]:
    with started_browser() as started:
        yield started


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
