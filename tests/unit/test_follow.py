"""``report --follow``'s reading (``follow.Tail``: ``tail -F`` over OTLP JSON Lines files) and what it keeps
(``follow.State``).

The lines are a job's as the real exporter package writes them (``tests/support/report_files.py``), appended to files
the way writers do: a line at a time and cut in the middle, a file rotated as the Collector's ``file`` exporter
rotates it (renamed with a time stamp, a new one begun), truncated, appearing late, binary, not OTLP at all; and the
Collector's lines that hold many processes' resources each. Whatever the files went through, the follower reads each
line once and counts what it skips as ``report`` counts it on the files as they end up (``otlpjson.read``), and its
kept state tells what the report tells.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("opentelemetry.exporter.otlp.json.file")

from tests.support.report_files import Shape, write_job
from torchelastic_otel import _names as names
from torchelastic_otel.report import follow, memory, model, otlpjson, training
from torchelastic_otel.report.cli import main as report_main
from torchelastic_otel.report.records import LogRecord, Point, Proc, Telemetry


@pytest.fixture(scope="module")
def lines(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """Every line of a synthetic job's files (a failed attempt, a restart, a successful one), newline included."""
    directory = tmp_path_factory.mktemp("job")
    write_job(directory, Shape(records=40))
    return [line for path in sorted(directory.iterdir()) for line in path.read_text().splitlines(keepends=True)]


class Reading:
    """A ``Tail`` over ``paths`` and the reader its lines go through: every record read, kept (no ``State``)."""

    def __init__(self, *paths: Path) -> None:
        self.reader = otlpjson.Reader()
        self.tail = follow.Tail(paths, self.reader.telemetry.problems, chunk=1000)

    def poll(self) -> int:
        lines = 0
        for chunk in self.tail.poll():
            for where, line in chunk:
                self.reader.read_line(line, where)
                lines += 1
        return lines

    @property
    def telemetry(self) -> Telemetry:
        return self.reader.telemetry


def records(tel: Telemetry) -> tuple[object, ...]:
    """The records as a multiset (order aside: files are read in another order as they come)."""
    return tuple(sorted(map(repr, items)) for items in (tel.spans, tel.logs, tel.points))


def append(path: Path, text: str) -> None:
    with open(path, "a", encoding="utf-8") as out:
        out.write(text)


def test_lines_are_read_once_as_they_are_appended_a_partial_line_when_complete(
    lines: list[str], tmp_path: Path
) -> None:
    path = tmp_path / "traces.jsonl"
    reading = Reading(path)
    assert reading.poll() == 0 and reading.tail.stats.waiting == [str(path)], "a file named before it exists"
    half = len(lines) // 2
    append(path, "".join(lines[:half]))
    assert reading.poll() == half
    cut = len(lines[half]) // 2
    append(path, lines[half][:cut])
    assert reading.poll() == 0 and reading.tail.pending, "a partial last line waits"
    append(path, lines[half][cut:] + "".join(lines[half + 1 :]) + "this is not json\n")
    assert reading.poll() == len(lines) - half + 1
    assert reading.poll() == 0, "nothing is read twice"
    expected = otlpjson.read([path])
    assert records(reading.telemetry) == records(expected)
    assert reading.telemetry.problems.counts == expected.problems.counts == {"malformed_json": 1}
    assert reading.telemetry.problems.examples == expected.problems.examples, "counted where report counts it"


@pytest.mark.parametrize("named", [False, True], ids=["in-a-followed-directory", "named-on-the-command-line"])
def test_a_rotated_file_is_read_to_its_end_and_the_new_one_from_its_start(
    lines: list[str], tmp_path: Path, named: bool
) -> None:
    """As the Collector's ``file`` exporter rotates: the file renamed with a time stamp before its extension, a new
    one begun under its name. In a followed directory the old file is found again under its new name; a file named
    on the command line is read to its end through the handle kept on it (``tail -F``), then the new one."""
    directory = tmp_path / "otelcol"
    directory.mkdir()
    current = directory / "otelcol.json"
    reading = Reading(current if named else directory)
    third = len(lines) // 3
    append(current, "".join(lines[:third]))
    assert reading.poll() == third
    append(current, "".join(lines[third : 2 * third]))  # written, then rotated before the next read
    rotated = directory / "otelcol-2026-01-05T10-00-00.000.json"
    current.rename(rotated)
    append(current, "".join(lines[2 * third :]))
    assert reading.poll() == len(lines) - third
    assert reading.poll() == 0
    assert records(reading.telemetry) == records(otlpjson.read([directory]))
    assert not reading.telemetry.problems
    assert reading.tail.stats.rotated == (0 if named else 1)


def test_a_file_renamed_between_the_listing_and_its_look_is_read_once(lines: list[str], tmp_path: Path) -> None:
    """A rotation that lands between the directory's listing and the look at each path leaves the rotated file out
    of one poll: it is found again by its identity under its new name, read on from where it was (its partial last
    line completed), not taken as gone (its partial line counted as cut short) and read again from its start. Here
    the file is moved out of the directory for one poll, then back under its rotated name."""
    directory, aside = tmp_path / "otelcol", tmp_path / "aside"
    directory.mkdir()
    aside.mkdir()
    current = directory / "otelcol.json"
    reading = Reading(directory)
    half = len(lines) // 2
    cut = len(lines[half]) // 2
    append(current, "".join(lines[:half]) + lines[half][:cut])  # the writer is in the middle of a line
    assert reading.poll() == half
    current.rename(aside / "otelcol.json")
    assert reading.poll() == 0  # out of sight for one poll
    (aside / "otelcol.json").rename(directory / "otelcol-2026-01-05T10-00-00.000.json")
    append(directory / "otelcol-2026-01-05T10-00-00.000.json", lines[half][cut:] + "".join(lines[half + 1 :]))
    assert reading.poll() == len(lines) - half
    assert records(reading.telemetry) == records(otlpjson.read([directory]))
    assert not reading.telemetry.problems
    assert reading.tail.stats.rotated == 1


def test_a_file_gone_for_good_is_let_go_with_its_partial_line_counted(lines: list[str], tmp_path: Path) -> None:
    """A file deleted from a followed directory is let go after ``MISSING_POLLS`` polls without it; its last line, cut
    short, is counted as ``report`` counts one."""
    current = tmp_path / "otelcol.json"
    reading = Reading(tmp_path)
    append(current, lines[0] + lines[1][:20])
    assert reading.poll() == 1
    current.unlink()
    polled = [reading.poll() for _ in range(follow.MISSING_POLLS)]
    assert polled[-1] == 1 and sum(polled) == 1, polled
    assert not reading.tail.files
    assert reading.telemetry.problems.counts, "the cut-short line is counted"


def test_a_file_deleted_before_it_was_read_is_counted(lines: list[str], tmp_path: Path) -> None:
    """A follower that falls behind a rotating writer may find a file deleted before it read it (the writer keeps
    a few rotated files): what it saw of the file and never read is counted, not lost silently. Here the second
    file of a poll is deleted while the poll reads the first."""
    first, second = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    append(first, "".join(lines[:10]))
    append(second, "".join(lines[10:20]))
    reading = Reading(tmp_path)
    polling = reading.tail.poll()
    next(polling)  # the first chunk of a.jsonl: b.jsonl was looked at, not read yet
    second.unlink()
    for _ in polling:
        pass
    for _ in range(follow.MISSING_POLLS):
        reading.poll()
    assert reading.telemetry.problems.counts == {"unread_file_end": 1}
    assert f"{len(''.join(lines[10:20]).encode()):,} bytes gone" in reading.telemetry.problems.examples[0]


def test_a_truncated_file_is_read_again_from_its_start(lines: list[str], tmp_path: Path) -> None:
    path = tmp_path / "otelcol.json"
    reading = Reading(tmp_path)
    append(path, "".join(lines))
    assert reading.poll() == len(lines)
    whole = otlpjson.read([path])
    path.write_text("".join(lines[:3]))  # truncated (a Collector restarted without append), three lines written
    assert reading.poll() == 3
    assert reading.tail.stats.truncated == 1
    again = otlpjson.read([path])
    both = Telemetry(whole.spans + again.spans, whole.logs + again.logs, whole.points + again.points)
    assert records(reading.telemetry) == records(both)


def test_a_file_replaced_by_another_under_the_same_identity_is_read_from_its_start(
    lines: list[str], tmp_path: Path
) -> None:
    """A file is known by its device and inode, and a deleted file's inode is given to the next one created (the
    Collector deletes its oldest rotated file and begins a new one): a file under a known identity that no longer
    begins as it began is another file, read from its start -- whether it shows under another name or under the same
    one, truncated and written again beyond where the last read ended."""
    old, new = tmp_path / "otelcol-2026-01-05T10-00-00.000.json", tmp_path / "otelcol.json"
    reading = Reading(tmp_path)
    append(old, "".join(lines[:4]))
    assert reading.poll() == 4
    old.rename(new)  # the same inode under another name, with other contents, longer than what was read
    new.write_text("".join(lines[4:]))
    assert reading.poll() == len(lines) - 4
    assert (reading.tail.stats.rotated, reading.tail.stats.truncated) == (0, 0)
    new.write_text("".join(lines[:2]) + "".join(lines))  # truncated, written again: longer than before
    assert reading.poll() == len(lines) + 2
    assert reading.tail.stats.truncated == 1
    expected = tmp_path.parent / f"{tmp_path.name}-expected"
    expected.mkdir()
    (expected / "first.jsonl").write_text("".join(lines))
    (expected / "then.jsonl").write_text("".join(lines[:2]) + "".join(lines))
    assert records(reading.telemetry) == records(otlpjson.read([expected]))
    assert not reading.telemetry.problems


def test_files_that_appear_later(lines: list[str], tmp_path: Path) -> None:
    """A directory that does not exist yet, then empty, then files in it and deeper; ``.gz`` read whole once it
    holds still; what is not an OTLP JSON Lines name left out, as ``report`` leaves it out."""
    directory = tmp_path / "files"
    reading = Reading(directory)
    assert reading.poll() == 0 and reading.tail.stats.waiting == [str(directory)]
    directory.mkdir()
    assert reading.poll() == 0 and reading.tail.stats.waiting == [str(directory)]
    append(directory / "logs-node0-agent-1.jsonl", "".join(lines[:5]))
    (directory / "notes.txt").write_text("not telemetry\n")
    assert reading.poll() == 5 and reading.tail.stats.waiting == []
    (directory / "node1").mkdir()
    append(directory / "node1" / "traces-node1-agent-2.jsonl", "".join(lines[5:9]))
    with gzip.open(directory / "node1" / "old.jsonl.gz", "wt") as packed:
        packed.write("".join(lines[9:]))
    assert reading.poll() == 4, "a .gz file is read once it holds still"
    assert reading.poll() == len(lines) - 9
    assert reading.poll() == 0
    assert records(reading.telemetry) == records(otlpjson.read([directory]))


def test_what_is_not_otlp_is_counted_as_report_counts_it(lines: list[str], tmp_path: Path) -> None:
    """A binary file (the Collector's ``proto`` format) counted once however it grows; lines that are not JSON,
    not OTLP, of an unknown field, cut short at a file's end that then goes away -- never an exception."""
    reading = Reading(tmp_path)
    binary = tmp_path / "otelcol.proto.json"
    binary.write_bytes(b"\x00\x00\x01\x0a\x12binary")
    other = tmp_path / "other.jsonl"
    append(other, "this is not json\n[1, 2]\n" + json.dumps({"hello": "world"}) + "\n")
    assert reading.poll() == 3
    with open(binary, "ab") as out:
        out.write(b"\xff\xfe protobuf\n" * 200)
    extra = json.loads(lines[0])
    extra["fromAnotherWriter"] = 1
    append(other, json.dumps(extra) + "\n")
    gone = tmp_path / "gone.jsonl"
    append(gone, lines[0][:40])
    assert reading.poll() == 1
    expected = otlpjson.read([tmp_path])
    assert reading.telemetry.problems.counts == {"not_json_lines": 1, "malformed_json": 1, "not_otlp": 2,
                                                 "unknown_field": 1}  # fmt: skip
    assert {k: v for k, v in expected.problems.counts.items() if k != "truncated_line"} == (
        reading.telemetry.problems.counts
    )
    gone.unlink()  # its cut line, never completed, is counted as report counts a cut line
    assert sum(reading.poll() for _ in range(follow.MISSING_POLLS)) == 1
    assert reading.telemetry.problems.counts == expected.problems.counts


def _collector_lines(lines: list[str], per_line: int) -> list[str]:
    """The lines rewritten as the Collector's ``file`` exporter writes a batch: one signal a line, the resource
    blocks of many processes in it, each with the fields the Collector adds (``schemaUrl``, a dropped-attributes
    count, a span's kind and flags)."""
    blocks: dict[str, list[dict[str, object]]] = {}
    for line in lines:
        for key, value in json.loads(line).items():
            blocks.setdefault(key, []).extend(value)
    out = []
    for key, found in blocks.items():
        for i in range(0, len(found), per_line):
            batch = []
            for block in found[i : i + per_line]:
                block = {**block, "schemaUrl": "https://opentelemetry.io/schemas/1.26.0"}
                block["resource"] = {**block["resource"], "droppedAttributesCount": 0}  # type: ignore[dict-item]
                for scope in block.get("scopeSpans", []):  # type: ignore[attr-defined]
                    for span in scope["spans"]:
                        span.update(kind=1, flags=257)
                batch.append(block)
            out.append(json.dumps({key: batch}, separators=(",", ":")) + "\n")
    return out


def test_the_collector_s_lines_hold_many_processes(lines: list[str], tmp_path: Path) -> None:
    """Each resource block of a line is its own process: the records, and their processes, are those of every
    process's own files; the follower's view of them is the report's."""
    path = tmp_path / "otelcol.json"
    path.write_text("".join(_collector_lines(lines, per_line=5)))
    own = tmp_path / "own"
    own.mkdir()
    (own / "all.jsonl").write_text("".join(lines))
    collected, separate = otlpjson.read([path]), otlpjson.read([own])
    assert not collected.problems and collected.lines < separate.lines
    assert records(collected) == records(separate)
    assert len({r.proc for r in collected.logs} | {p.proc for p in collected.points}) == 5, "an agent, 4 workers"
    following = follow.Follower([path])
    following.read()
    assert _summary(following.telemetry()) == _summary(separate)


def _summary(tel: Telemetry) -> dict[str, object]:
    return training.summary(model.build(tel))


def test_the_live_view_tells_what_the_report_tells(lines: list[str], tmp_path: Path) -> None:
    """Read a line at a time, kept as aggregates (fewer records than were read), the job's summary -- outcome,
    attempts, root cause, restarts, steps, goodput, verdict -- is the report's of the whole files."""
    path = tmp_path / "job.jsonl"
    following = follow.Follower([tmp_path])
    for line in lines:
        append(path, line)
        following.read()
    tel = following.telemetry()
    assert following.state.run_over
    assert following.state.kept < following.state.records
    assert _summary(tel) == _summary(otlpjson.read([tmp_path]))


def _point(proc: Proc, name: str, time: int, value: float, **attrs: object) -> Point:
    return Point(name, "sum", "1", time, value, dict(attrs), proc, True)  # type: ignore[arg-type]


def test_what_is_kept_stays_bounded_however_long_the_run() -> None:
    """Ten thousand exports of a worker's streams, events and output lines: per stream the views read its latest
    point (and a thinned series for memory and steps), of another metric the process's first and last point, per
    event name and process the first and the last few, per process the last output lines: a state of the same size
    after a thousand exports as after ten thousand."""
    worker = Proc("worker", "node0", 7, "r", 0, 0, 0, "svc")
    state = follow.State()
    sizes = []
    for i in range(10_000):
        time = (i + 1) * 1_000_000_000
        stalled = LogRecord(time, 13, "WARN", "", "torchelastic.worker.stalled", {}, "", "", worker)
        output = LogRecord(time, 9, "INFO", f"step {i}", "", {"log.iostream": "stdout"}, "", "", worker)
        state.add([], [stalled, output], [
            _point(worker, "loss", time, 1.0 / (i + 1)),
            _point(worker, "torchelastic.goodput.time", time, float(i), **{"torchelastic.goodput.cause": "productive"}),
            _point(worker, memory.USAGE, time, 1e9 + i),
            _point(worker, memory.STEPS, time, float(i)),
        ])  # fmt: skip
        if i in (999, 9_999):
            tel = state.telemetry(Telemetry().problems, [], 0)
            sizes.append((len(tel.spans), len(tel.logs), len(tel.points)))
    bound = 3 + 2 * (follow.SERIES_POINTS + follow.RECENT_POINTS)  # goodput, the first and last point; two series
    logs = 2 + follow.EVENTS_KEPT + follow.LINES_KEPT  # the first and the last of each
    assert all(spans == 0 and n == logs and points <= bound for spans, n, points in sizes), sizes
    assert state.records == 60_000
    tel = state.telemetry(Telemetry().problems, [], 0)
    (goodput,) = [p for p in tel.points if p.name == "torchelastic.goodput.time"]
    assert goodput.time == 10_000 * 1_000_000_000 and goodput.value == 9_999, "the latest point of a stream"
    assert [p.time for p in tel.points if p.name == "loss"] == [1_000_000_000], "of another metric, the first"
    assert [r.body for r in tel.logs if r.body][-1] == "step 9999", "the last output line"
    steps = sorted(p.time for p in tel.points if p.name == memory.STEPS)
    assert steps[0] == 1_000_000_000 and steps[-1] == 10_000 * 1_000_000_000, "the series spans the run"
    (only,) = [v for _, v in training.step_rates(_job(tel)).items()]
    assert only == pytest.approx(1.0), "the rate of the last points"


def test_the_metrics_kept_are_those_the_live_view_reads() -> None:
    """Of the bridge's metrics, the follower keeps the streams of those the live view's analyses name (the rest:
    each process's first and last point): a metric an analysis comes to read is kept, or this fails."""
    block = Path(names.__file__).read_text().split("# ---- metrics", 1)[1].split("# ----", 1)[0]
    metrics = {const: value for const, value in re.findall(r'^([A-Z_]+) = "([^"]+)"', block, re.MULTILINE)}
    package = Path(follow.__file__).parent
    read = set()
    for module in ("model", "training", "goodput", "memory", "stalls", "nodes", "groups", "hosts", "terminal"):
        path = package / f"{module}.py"
        if path.exists():
            read |= {metrics[c] for c in re.findall(r"names\.([A-Z_]+)", path.read_text()) if c in metrics}
    read.discard(names.COLLECTIVES_PREFIX)  # an attribute prefix of stall records, not a metric
    assert read == follow.VIEW_METRICS


def _job(tel: Telemetry) -> model.Job:
    (job,) = model.split_runs(tel)
    return job


def test_follow_on_a_finished_run_shows_one_frame_then_the_report(
    lines: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not on a terminal: a frame of the live view, then, its run over, the report ``report`` prints, byte for
    byte, with its exit status; a path that never holds a file ends as ``report`` ends on it."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "job.jsonl").write_text("".join(lines))
    assert report_main([str(tmp_path), "--width", "100", "--html", "a.html"]) == 0
    plain = capsys.readouterr().out
    assert report_main([str(tmp_path), "--follow", "--interval", "0.05", "--width", "100", "--html", "a.html"]) == 0
    frames, separator, after = capsys.readouterr().out.partition(": the report of the files ====\n")
    assert separator and after == plain
    assert frames.count("NOW  attempt 1 succeeded") == 1 and "root cause rank 1" in frames, frames


@pytest.mark.jobs  # two ``report`` processes
def test_ctrl_c_ends_the_view_with_the_report_of_the_files(lines: list[str], tmp_path: Path) -> None:
    """Files without an agent (workers only) have no end the follower can see: Ctrl-C (SIGINT) ends the view, and
    the report of the files is printed as ``report`` prints it, with its exit status."""
    workers = "".join(line for line in lines if '"stringValue":"agent"' not in line)
    (tmp_path / "workers.jsonl").write_text(workers)
    command = [sys.executable, "-m", "torchelastic_otel.report", str(tmp_path), "--width", "100", "--html", "a.html"]
    plain = subprocess.run(command, capture_output=True, text=True, timeout=60, cwd=tmp_path, check=False)
    # SIGINT as a terminal's Ctrl-C finds it: where the tests run in the background it is ignored, and inherited so
    follower = subprocess.Popen([*command, "--follow", "--interval", "0.1"], cwd=tmp_path, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # fmt: skip
    try:
        assert follower.stdout is not None
        first = os.read(follower.stdout.fileno(), 1 << 16)  # the first frame, unbuffered: communicate reads on
        assert first.startswith(b"\n==== "), first
        follower.send_signal(signal.SIGINT)
        rest, err = follower.communicate(timeout=60)
    finally:
        if follower.poll() is None:
            follower.kill()
            follower.wait()
    out = (first + rest).decode()
    assert follower.returncode == plain.returncode == 0, err
    assert out.partition(": the report of the files ====\n")[2] == plain.stdout


def test_the_view_fits_the_screen() -> None:
    """On a terminal each line is cut to its width (colour codes kept and reset), the frame to its height."""
    red = "\033[31m" + "x" * 30 + "\033[0m"
    assert follow.fit([red, "plain line"], 10, 5) == ["\033[31m" + "x" * 10 + "\033[0m", "plain line"]
    cut = follow.fit([f"line {i}" for i in range(20)], 80, 5)
    assert len(cut) == 5 and cut[-1].startswith("... 16 more lines")
