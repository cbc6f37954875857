"""What ``torchelastic-otel report`` makes of its input: files of any OTLP JSON Lines writer, and bad input.

The input is written by the real exporter package (``tests/support/report_files.py``: a synthetic job of the shape the
bridge exports, with known times), then rearranged the way other writers do it (the Collector's file exporter puts
every signal in one file and may compress it) or damaged (a line cut short, not JSON, not OTLP, an unknown field,
one bad span among good ones, a binary file). Bad input is skipped and counted with where it was, never an
exception; a path with nothing usable is a one-line error with exit status 2. Hostile strings in the telemetry
stay text in the HTML. The bridge's side is checked too: ``otlp_json_file`` with ``TORCHELASTIC_OTEL_FILE_DIR``
writes one file per process and signal.
"""

from __future__ import annotations

import gzip
import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import ROOT
from tests.support.env import clean_env

pytest.importorskip("opentelemetry.exporter.otlp.json.file")

from tests.support.report_files import Shape, write_job
from torchelastic_otel.report import html, model, otlpjson, terminal, timeline
from torchelastic_otel.report.cli import main as report_main
from torchelastic_otel.report.metrics import thin


@pytest.fixture
def job_files(tmp_path: Path) -> Path:
    directory = tmp_path / "job"
    write_job(directory, Shape())
    return directory


def counts(tel: otlpjson.Telemetry) -> tuple[int, int, int]:
    return len(tel.spans), len(tel.logs), len(tel.points)


# ---- the model of a known job -------------------------------------------------------------------------------------


def test_a_synthetic_job(job_files: Path) -> None:
    tel = otlpjson.read([job_files])
    assert not tel.problems
    (job,) = model.build(tel)
    assert job.run_id == "synthetic-run" and job.outcome == "SUCCEEDED"
    assert [(a.restart, a.failed) for a in job.attempts] == [(0, True), (1, False)]
    runs = {(w.restart, w.rank): w for w in job.workers}
    assert {k: w.state for k, w in runs.items()} == {
        (0, 0): "terminated", (0, 1): "failed", (1, 0): "succeeded", (1, 1): "succeeded"}  # fmt: skip
    assert all(len(w.spans) == 3 for w in runs.values())
    cause = job.attempts[0].root_cause
    assert cause is not None and (cause.rank, cause.source, cause.consequences) == (1, "derived", [0])
    assert cause.exc_type == "ValueError" and "line 7" in cause.stacktrace
    rows, left_out = timeline.rows(job)
    assert [r.kind for r in rows] == ["agent", "rank", "rank"] and left_out == 0
    assert [len(r.bars) for r in rows] == [2, 2, 2]


# ---- other writers ------------------------------------------------------------------------------------------------


def test_every_signal_in_one_file_and_compressed(job_files: Path, tmp_path: Path) -> None:
    """The Collector's file exporter writes every signal into one file (and can compress it)."""
    expected = counts(otlpjson.read([job_files]))
    lines = [line for path in sorted(job_files.iterdir()) for line in path.read_text().splitlines()]
    mixed = tmp_path / "otelcol.json"
    mixed.write_text("\n".join(lines[::2] + lines[1::2]) + "\n")
    assert counts(otlpjson.read([mixed])) == expected
    packed = tmp_path / "packed" / "otelcol.jsonl.gz"
    packed.parent.mkdir()
    with gzip.open(packed, "wt") as fh:
        fh.write("\n".join(lines) + "\n")
    tel = otlpjson.read([packed.parent])
    assert counts(tel) == expected and not tel.problems
    (job,) = model.build(tel)
    assert len(job.workers) == 4 and job.attempts[0].root_cause is not None


def test_snake_case_keys_are_not_otlp_json(job_files: Path, tmp_path: Path) -> None:
    """OTLP's JSON encoding uses lowerCamelCase keys; a file of protobuf field names is said to be something else."""
    line = next(iter(sorted(job_files.glob("traces-*")))).read_text().splitlines()[0]
    (tmp_path / "snake.jsonl").write_text(line.replace('"resourceSpans"', '"resource_spans"') + "\n")
    with pytest.raises(otlpjson.ReportError, match="resource_spans"):
        otlpjson.read([tmp_path / "snake.jsonl"])


# ---- bad input ----------------------------------------------------------------------------------------------------


def test_bad_lines_are_skipped_and_counted(job_files: Path, tmp_path: Path) -> None:
    good = counts(otlpjson.read([job_files]))
    traces = sorted(job_files.glob("traces-rank0-restart0*"))[0]
    valid = traces.read_text().splitlines()[0]
    spans_in_line = valid.count('"spanId"')
    broken = json.loads(valid)
    broken["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["startTimeUnixNano"] = "soon"  # one bad span
    extra = json.loads(valid)
    extra["fromAnotherWriter"] = {"version": 2}
    damaged = tmp_path / "damaged.jsonl"
    damaged.write_text("\n".join([
        "this is not json",
        json.dumps({"hello": "world"}),
        "[1, 2, 3]",
        json.dumps(broken),
        json.dumps(extra),
        valid[: len(valid) // 2],  # the writer died mid-line: no newline at the end
    ]))  # fmt: skip
    tel = otlpjson.read([job_files, damaged])
    assert dict(tel.problems.counts) == {
        "malformed_json": 1, "not_otlp": 2, "invalid_traces_item": 1, "unknown_field": 1, "truncated_line": 1,
    }  # fmt: skip
    spans, logs, points = counts(tel)
    assert (spans, logs, points) == (good[0] + (spans_in_line - 1) + spans_in_line, good[1], good[2])
    assert any(e.startswith(f"{damaged}:1: malformed_json") for e in tel.problems.examples)
    assert any(e.startswith(f"{damaged}:4: invalid_traces_item") and "start_time_unix_nano" in e
               for e in tel.problems.examples)  # fmt: skip
    text = terminal.render(tel, model.build(tel))
    assert "SKIPPED" in text and "truncated_line: 1" in text
    assert "not_otlp: 2" in html.render(tel, model.build(tel))


def test_a_binary_file_among_good_ones(job_files: Path) -> None:
    (job_files / "otelcol.proto.json").write_bytes(b"\x00\x00\x01\x0a\x12binary protobuf\xff\xfe")
    tel = otlpjson.read([job_files])
    assert tel.problems.counts == {"not_json_lines": 1}
    assert len(model.build(tel)[0].workers) == 4


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    launcher = Path(sys.executable).with_name("torchelastic-otel")
    return subprocess.run([str(launcher), "report", *args], capture_output=True, text=True, timeout=60, cwd=ROOT)


@pytest.mark.jobs
def test_cli_errors_are_one_line(tmp_path: Path) -> None:
    missing = run_cli(str(tmp_path / "nope"))
    assert missing.returncode == 2 and missing.stdout == ""
    assert missing.stderr.strip() == f"torchelastic-otel report: {tmp_path / 'nope'}: no such file or directory"
    (tmp_path / "empty").mkdir()
    assert "no OTLP JSON Lines files" in run_cli(str(tmp_path / "empty")).stderr
    (tmp_path / "junk.jsonl").write_text('{"a": 1}\nnot json\n')
    junk = run_cli(str(tmp_path / "junk.jsonl"))
    assert junk.returncode == 2 and "Traceback" not in junk.stderr
    assert "no OTLP spans, log records or metric points in 1 file(s)" in junk.stderr and "not_otlp" in junk.stderr


def test_cli_writes_the_html_where_asked(job_files: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "deep" / "r.html"
    assert report_main([str(job_files), "--html", str(out), "--width", "90"]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[-1] == f"report: {out}" and out.read_text().startswith("<!doctype html>")
    assert max(len(line) for line in printed if line.startswith(("agent", "rank"))) <= 90
    assert report_main([str(job_files), "--html", str(out), "--quiet"]) == 0
    assert capsys.readouterr().out == f"report: {out}\n"


# ---- the HTML: hostile strings stay text; sizes stay bounded ------------------------------------------------------


HOSTILE = '</script><script>alert(1)</script><img src=x onerror=alert(2)> & "quotes"'


def test_hostile_strings_stay_text(tmp_path: Path) -> None:
    write_job(tmp_path / "job", Shape(run_id=HOSTILE, error=HOSTILE))
    tel = otlpjson.read([tmp_path / "job"])
    page = html.render(tel, model.build(tel))
    assert "<script>alert" not in page and "<img src=x" not in page
    assert page.count("<script") == 2 and page.count("</script>") == 2  # the JSON island and the script
    island = re.search(r'<script id="report-data" type="application/json">(.*?)</script>', page, re.S)
    assert island is not None
    data = json.loads(island.group(1))
    rows = [row for group in data["jobs"][0]["groups"] for row in group["rows"]]  # the timeline by node
    titles = [bar["t"] for row in rows for bar in row["bars"]]
    assert any(HOSTILE in t for t in titles), titles  # the script gets the string exactly, and sets it as text
    assert html.e(HOSTILE) in page  # the static parts show it escaped


def test_timeline_and_series_are_bounded() -> None:
    bars = [timeline.Bar(i * 10, i * 10 + 5, "span", "s", "s") for i in range(10_000)]
    merged = timeline._bounded(bars, 100)
    assert len(merged) <= 101 and merged[0].start == 0 and merged[-1].end == bars[-1].end
    assert sum(int(b.label.split()[0]) if b.label.endswith("spans") else 1 for b in merged) == 10_000
    points = [(i, float(i)) for i in range(10_000)]
    kept = thin(points, 150)
    assert len(kept) == 150 and kept[0] == points[0] and kept[-1] == points[-1]


# ---- the bridge writes the files ------------------------------------------------------------------------------------


@pytest.mark.jobs
def test_the_file_exporter_writes_one_file_per_process_and_signal(tmp_path: Path) -> None:
    """``OTEL_TRACES_EXPORTER=otlp_json_file`` with ``TORCHELASTIC_OTEL_FILE_DIR``: a file named by signal, host,
    rank, restart and pid (a worker's), holding OTLP JSON Lines the report reads; without the directory the
    exporter keeps its own default (stdout)."""
    script = (
        "import torchelastic_otel; from opentelemetry import trace; "
        "trace.get_tracer('t').start_span('hello').end(); torchelastic_otel.flush()"
    )
    env = clean_env(OTEL_TRACES_EXPORTER="otlp_json_file", OTEL_METRICS_EXPORTER="none", OTEL_LOGS_EXPORTER="none",
                    RANK="3", TORCHELASTIC_RESTART_COUNT="2", TORCHELASTIC_RUN_ID="r1")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", "import torchelastic_otel._install as i; i.install(); " + script],
                          env={**env, "TORCHELASTIC_OTEL_FILE_DIR": str(tmp_path)}, capture_output=True, text=True,
                          timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    (written,) = tmp_path.iterdir()
    assert re.fullmatch(r"traces-.+-rank3-restart2-\d+\.jsonl", written.name), written.name
    tel = otlpjson.read([written])
    assert [s.name for s in tel.spans] == ["hello"] and tel.spans[0].proc.rank == 3
    to_stdout = subprocess.run([sys.executable, "-c", "import torchelastic_otel._install as i; i.install(); " + script],
                               env=env, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert to_stdout.returncode == 0 and '"resourceSpans"' in to_stdout.stdout


# ---- reading on two CPUs ------------------------------------------------------------------------------------------


def _summary(tel: otlpjson.Telemetry) -> tuple[object, ...]:
    return (tel.spans, tel.logs, tel.points, sorted(tel.files), tel.lines, dict(tel.problems.counts))


@pytest.mark.jobs  # it forks the reading helper
def test_reading_on_two_cpus_reads_what_one_reads(job_files: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Inputs over ``PARALLEL_BYTES`` are half read by a forked helper: the same records, in file order, the same
    skipped lines counted (a bad line in the helper's half), as one process reading them all. A fork that fails,
    and a helper that dies, leave the main process reading its files itself."""
    files = otlpjson.find_files([job_files])
    assert len(files) >= 2
    with files[-1].open("a") as out:  # the helper's half: the last file is past the middle
        out.write('{"resourceSpans": [\n')
    alone = _summary(otlpjson.read([job_files]))
    assert alone[-1], "the cut line is counted"
    monkeypatch.setattr(otlpjson, "PARALLEL_BYTES", 0)
    monkeypatch.setattr(otlpjson, "_parallel_worth", lambda total: True)  # the input has two files at least (above)
    started: list[object] = []
    start = otlpjson._Helper.start
    monkeypatch.setattr(otlpjson._Helper, "start", lambda *args: started.append(start(*args)) or started[-1])
    merged: list[bool] = []
    merge = otlpjson._Helper.merge_into
    monkeypatch.setattr(otlpjson._Helper, "merge_into", lambda self, r: merged.append(merge(self, r)) or merged[-1])
    assert _summary(otlpjson.read([job_files])) == alone
    assert started and started[0] is not None and merged == [True], "the helper read half of the files"

    def no_fork() -> int:
        raise OSError("no fork here")

    with monkeypatch.context() as m:
        m.setattr(otlpjson.os, "fork", no_fork)
        assert _summary(otlpjson.read([job_files])) == alone

    def helper_dies(files: list[Path], out: object) -> None:
        raise RuntimeError("the helper died")

    with monkeypatch.context() as m:
        m.setattr(otlpjson, "_read_into", helper_dies)
        assert _summary(otlpjson.read([job_files])) == alone


# ---- reading fast: a resource read once ---------------------------------------------------------------------------


def _fresh(lines: list[str]) -> tuple[object, ...]:
    """What readers without any history make of each line, one reader a line, the records concatenated."""
    tels = []
    for line in lines:
        reader = otlpjson.Reader()
        reader.read_line(line, "x")
        tels.append(reader.telemetry)
    return (
        [s for t in tels for s in t.spans],
        [r for t in tels for r in t.logs],
        [p for t in tels for p in t.points],
        sum((t.problems.counts for t in tels), start=otlpjson.Telemetry().problems.counts),
    )


def test_a_repeated_resource_is_parsed_once_and_read_the_same(job_files: Path) -> None:
    """A line that begins with the very text of the last line's resource has that text cut out and its process
    taken from the last line. Every line reads as it reads alone: a line naming its signal twice (JSON keeps the
    second), a second block with another resource, a different resource, a line cut short after the resource, a
    line of another signal in between."""
    lines = [line + "\n" for path in sorted(job_files.iterdir()) for line in path.read_text().splitlines()]
    span_line = next(line for line in lines if line.startswith('{"resourceSpans":[{"resource":'))
    doc = json.loads(span_line)
    block = doc["resourceSpans"][0]
    other = {**block, "resource": {"attributes": [{"key": "host.name", "value": {"stringValue": "elsewhere"}}]}}
    compact = {"separators": (",", ":")}
    twice = span_line.rstrip("\n")[:-1] + ',"resourceSpans":' + json.dumps([other], **compact) + "}\n"
    two_blocks = json.dumps({"resourceSpans": [block, other]}, **compact) + "\n"
    cut_short = span_line[: span_line.index('"scopeSpans"') + 20]
    crafted = [span_line, twice, span_line, two_blocks, span_line, cut_short, span_line,
               json.dumps({"resourceSpans": [other]}, **compact) + "\n", span_line]  # fmt: skip
    reader = otlpjson.Reader()
    cuts = []
    known = reader._known_resource
    reader._known_resource = lambda line: (lambda out: cuts.append(out[1] is not None) or out)(known(line))  # type: ignore[method-assign]
    everything = lines + crafted
    for line in everything:
        reader.read_line(line, "x")
    tel = reader.telemetry
    assert (tel.spans, tel.logs, tel.points, tel.problems.counts) == _fresh(everything)
    assert sum(cuts) >= len(lines) // 2, "most lines of a process's file repeat its resource"
    assert cuts[len(lines) + 1 :] == [False, False, True, True, True, True, False, False]
    assert tel.problems.counts == {"truncated_line": 1}
    (where,) = [e for e in tel.problems.examples if "truncated_line" in e]
    assert str(_error_of_alone(cut_short)) in where, "the error is the whole line's, not the cut text's"


def _error_of_alone(line: str) -> ValueError:
    with pytest.raises(ValueError) as caught:
        json.loads(line)
    return caught.value


def test_files_are_found_in_one_walk(tmp_path: Path) -> None:
    """A directory is walked once, symbolic links followed, a link cycle ended; the files are those five patterns
    name, in ``Path`` order."""
    for name in ("b/x.jsonl", "a-b/y.json", "a/z.jsonl.gz", "a/deeper/w.ndjson", "a/not.txt", "c.json.gz", "a.jsonl"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("{}\n")
    (tmp_path / "a" / "loop").symlink_to(tmp_path)
    expected = sorted({p for pattern in otlpjson.PATTERNS for p in (tmp_path / "b").parent.glob("**/" + pattern)
                       if p.is_file() and "loop" not in p.parts})  # fmt: skip
    found = otlpjson.find_files([tmp_path])
    assert [p for p in found if "loop" not in p.parts] == expected
    assert len(found) == len(expected), "the cycle is walked once at most (tmp_path is already walked)"


def test_msgspec_parses_what_json_parses(job_files: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With the ``report`` extra (installed by ``make test``), lines are parsed by msgspec: the same records as the
    standard library's parser makes. What msgspec refuses (``NaN``, a number beyond a double, a lone surrogate, a
    line cut short) is the standard parser's to take or to reject, with its own message."""
    assert otlpjson._FAST_LOADS is not None, "msgspec (the report extra) is installed with the test extra"
    valid = (job_files / "metrics-rank0-restart0.jsonl").read_text().splitlines()[0]
    doc = json.loads(valid)
    point = doc["resourceMetrics"][0]["scopeMetrics"][0]["metrics"][0]
    kind = next(k for k in ("gauge", "sum", "histogram") if k in point)
    odd = []
    for number in ("NaN", "1e400", "-Infinity"):  # the standard parser takes these; msgspec does not
        text = json.dumps(doc, separators=(",", ":"))
        first = point[kind]["dataPoints"][0]
        key = "asDouble" if "asDouble" in first or "asInt" in first else "sum"
        marker = json.dumps(first[key])
        odd.append(text.replace(f'"{key}":{marker}', f'"{key}":{number}', 1))
    assert all('":NaN' in t or '":1e400' in t or '":-Infinity' in t for t in odd)
    extra = tmp_path / "extra"
    extra.mkdir()
    surrogate = '{"resourceLogs":[{"resource":{"attributes":[{"key":"a","value":{"stringValue":"\\ud800"}}]}}]}'
    (extra / "odd.jsonl").write_text("\n".join([*odd, surrogate, valid[:-9]]))
    fast = otlpjson.read([job_files, extra])
    monkeypatch.setattr(otlpjson, "_FAST_LOADS", None)
    standard = otlpjson.read([job_files, extra])
    assert _summary(fast)[:3] == _summary(standard)[:3] and fast.problems.examples == standard.problems.examples
    assert dict(fast.problems.counts) == {"truncated_line": 1}, "NaN, 1e400, -Infinity and a lone surrogate parse"
    odd_values = [p.value for p in fast.points if p.value is not None and not math.isfinite(p.value)]
    assert len(odd_values) >= 3, "the odd numbers arrive as the standard parser reads them"


# ---- reading fast: the typed path ----------------------------------------------------------------------------------

#: what a field of a mutated line is set to: every JSON type, and strings that are and are not numbers or hex
_ODD_VALUES = (None, "x", "12", "0a0b", 7, -1, 1.5, True, [], {}, [1], {"stringValue": "v"})


def _mutations(doc: object, limit: int) -> list[str]:
    """Lines that differ from ``doc`` in one place: a field set to each of ``_ODD_VALUES``, a field left out, an
    unknown field added (the first ``limit``, walking the document depth-first)."""
    out: list[str] = []

    def emit() -> None:
        out.append(json.dumps(doc, separators=(",", ":")) + "\n")

    def walk(node: object) -> None:
        if len(out) >= limit:
            return
        if isinstance(node, dict):
            for key in list(node):
                value = node[key]
                for odd in _ODD_VALUES:
                    node[key] = odd
                    emit()
                del node[key]
                emit()
                node[key] = value
                walk(value)
            node["unknownField"] = 1
            emit()
            del node["unknownField"]
        elif isinstance(node, list) and node:
            walk(node[0])

    walk(doc)
    return out[:limit]


def _read_lines(lines: list[str], typed: bool) -> tuple[object, ...]:
    reader = otlpjson.Reader()
    if not typed:
        reader._typed = None
    for number, line in enumerate(lines, 1):
        reader.read_line(line, f"x:{number}")
    tel = reader.telemetry
    return tel.spans, tel.logs, tel.points, tel.lines, dict(tel.problems.counts), tel.problems.examples


def test_the_typed_path_reads_what_the_general_path_reads(job_files: Path) -> None:
    """With msgspec, lines are decoded into typed structs, attribute lists and resources kept as raw text and
    converted once per distinct text (``typedlines``). Whatever the typed path cannot read exactly as the general
    path does is handed to it whole: a line with a field of each JSON type in each place, a field left out, an
    unknown field, a kind of metric it does not read, gives the same records in the same order and the same
    problems, with the same messages, as the general path alone. Valid lines take the typed path."""
    assert otlpjson.typedlines is not None and otlpjson._FAST_LOADS is not None, "msgspec: the report extra"
    valid = [line + "\n" for path in sorted(job_files.iterdir()) for line in path.read_text().splitlines()]
    firsts = {}
    for line in valid:
        firsts.setdefault(next(iter(json.loads(line))), line)
    assert set(firsts) == {"resourceSpans", "resourceLogs", "resourceMetrics"}
    mutated = [m for line in firsts.values() for m in _mutations(json.loads(line), 4000)]
    histogram = json.loads(firsts["resourceMetrics"])
    histogram["resourceMetrics"][0]["scopeMetrics"][0]["metrics"] = [{"name": "h", "unit": "s", "histogram": {
        "dataPoints": [{"attributes": [{"key": "rank", "value": {"intValue": "3"}}], "timeUnixNano": "5",
                        "count": "3", "sum": 1.5, "bucketCounts": ["1", "2"], "explicitBounds": [1.0], "min": 0.1,
                        "max": 2}], "aggregationTemporality": 2}}]  # fmt: skip
    mutated += _mutations(histogram, 2000)
    for other in ("exponentialHistogram", "summary"):
        text = json.dumps(histogram).replace('"histogram"', f'"{other}"', 1)
        mutated += [text + "\n", text.replace('"name": "h"', '"name": "h", "histogram": null', 1) + "\n"]
    # every mutated line between two valid ones: the resource cut applies to the one after it, or not
    lines = [part for m in mutated for part in (m, valid[0])] + valid
    taken = []
    read = otlpjson.Reader._read_typed
    otlpjson.Reader._read_typed = lambda self, *a: taken.append(read(self, *a)) or taken[-1]  # type: ignore[method-assign]
    try:
        fast = _read_lines(lines, typed=True)
    finally:
        otlpjson.Reader._read_typed = read  # type: ignore[method-assign]
    general = _read_lines(lines, typed=False)
    assert fast[3:] == general[3:], "the same lines, problems and messages"
    for records_fast, records_general in zip(fast[:3], general[:3], strict=True):
        assert records_fast == records_general
    assert min(map(len, fast[:3])) > 300 and sum(general[4].values()) > 400, "records and problems of each kind"
    assert sum(taken) >= len(valid) + len(mutated) // 3, "valid lines, and most odd ones, take the typed path"
    assert not all(taken), "some lines are the general path's"


def test_equal_histogram_texts_are_converted_once(job_files: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The typed path converts a histogram point's bounds and bucket counts once for equal texts (a metric's points
    share their bounds; a cumulative histogram repeats its counts): the points are those the general path reads,
    counts that do not match their bounds are dropped alike, and equal texts give one tuple."""
    doc = json.loads((job_files / "metrics-rank0-restart0.jsonl").read_text().splitlines()[0])

    def point(time: int, counts: list[object], bounds: list[object]) -> dict[str, object]:
        return {"timeUnixNano": str(time), "count": "3", "sum": 1.5, "bucketCounts": counts, "explicitBounds": bounds}

    same, other = (["1", "2"], [1.0]), (["0", "3"], [1.0])
    points = [point(1, *same), point(2, *other), point(3, *same), point(4, ["1"], [1.0]), point(5, [1, 2], [1])]
    doc["resourceMetrics"][0]["scopeMetrics"][0]["metrics"] = [
        {"name": "h", "unit": "s", "histogram": {"dataPoints": points, "aggregationTemporality": 2}}
    ]
    line = json.dumps(doc, separators=(",", ":")) + "\n"
    fast, general = _read_lines([line, line], typed=True), _read_lines([line, line], typed=False)
    assert fast == general and not fast[4], "the same points, no problem"
    read = fast[2]
    assert [(p.bounds, p.buckets) for p in read[:5]] == [
        ((1.0,), (1, 2)),
        ((1.0,), (0, 3)),
        ((1.0,), (1, 2)),
        ((), ()),
        ((1.0,), (1, 2)),
    ], "counts that do not match their bounds are dropped"
    assert read[0].buckets is read[2].buckets, "equal texts: one tuple (not the last point's: it had other counts)"
    assert read[0].bounds is read[1].bounds is read[4].bounds, "equal bounds: one tuple"
    monkeypatch.setattr(otlpjson.typedlines, "MAX_BUCKET_TEXTS", 1)  # a busy run's: past the limit, each converted
    assert _read_lines([line, line], typed=True) == general


def test_reading_ends_with_its_caches_freed(job_files: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The reader's caches (decoded ids, attribute sets, the typed path's texts: hundreds of MB at 1,000 nodes)
    are freed by reference counting when ``read`` returns: the report then builds its views with cyclic collection
    off, so a reader left in a reference cycle would hold them to the end."""
    import gc
    import weakref

    readers: list[weakref.ref[otlpjson.Reader]] = []
    init = otlpjson.Reader.__init__

    def remembered(self: otlpjson.Reader, summary: bool = False) -> None:
        init(self, summary)
        readers.append(weakref.ref(self))

    monkeypatch.setattr(otlpjson.Reader, "__init__", remembered)
    gc.disable()
    try:
        tel = otlpjson.read([job_files])
        assert readers and all(ref() is None for ref in readers), "no reader outlives reading"
    finally:
        gc.enable()
    assert tel.spans and tel.logs and tel.points


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.gz"])
def test_a_file_is_read_in_the_lines_it_has(tmp_path: Path, suffix: str) -> None:
    """The first 256 characters are read to tell a binary file; the lines are then those the file has, whatever
    their length and ends (the head is not read again): short lines, a line ending at the 256th character, one
    longer than the head, CRLF and CR ends, no newline at the end, an empty file."""
    contents = [
        "",
        "a\n",
        "a",
        "short\nlines\nhere\n",
        "x" * 255 + "\n" + "y\n",
        "x" * 256 + "\nlast",
        "long" * 300 + "\n" + "z" * 10,
        "crlf\r\nends\r\n" + "w" * 300 + "\r\nmore",
        "cr\rends\r",
        "é" * 300 + "\n\n\nend\n",
    ]
    for index, content in enumerate(contents):
        path = tmp_path / f"f{index}{suffix}"
        data = content.encode()
        path.write_bytes(gzip.compress(data) if suffix.endswith(".gz") else data)
        with otlpjson._open(path) as fh:
            expected = fh.readlines()
        with otlpjson._open(path) as fh:
            got = [*otlpjson._head_lines(fh.read(256), fh), *fh]
        assert got == expected, content[:40]
