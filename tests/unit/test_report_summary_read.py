"""``report --json`` reads for the summary alone: a worker's plain spans and the log records that are no event of the
bridge's are folded as they are read (``otlpjson.read(..., summary=True)``), and the summary is the same as from
every record.

The input is written by the real exporter package (``tests/support/report_files.py``), then read both ways: by one
process, by two (the reading helper's records handed over), and with lines the typed path gives up on halfway (one
bad span after good ones: the general path reads the line again), so that what folding did for the dropped part is
undone.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

pytest.importorskip("opentelemetry.exporter.otlp.json.file")

from tests.support.report_files import Shape, write_job
from torchelastic_otel.report import figures, model, otlpjson, training
from torchelastic_otel.report.cli import main as report_main


def _summary(tel: otlpjson.Telemetry) -> str:
    return json.dumps(training.summary(model.build(tel), dict(tel.problems.counts)), indent=2, default=str)


@pytest.fixture
def job_files(tmp_path: Path) -> Path:
    directory = tmp_path / "job"
    write_job(directory, Shape(ranks=3, steps=12, records=60, collections=4))
    return directory


def test_the_summary_is_the_same_from_fewer_records(job_files: Path) -> None:
    whole, folded = otlpjson.read([job_files]), otlpjson.read([job_files], summary=True)
    assert not whole.problems and not folded.problems
    assert len(folded.spans) < len(whole.spans) and len(folded.logs) < len(whole.logs)
    assert len(folded.points) == len(whole.points)
    assert _summary(folded) == _summary(whole)
    assert len([s for s in folded.spans if s.name == "train.step"]) < len(
        [s for s in whole.spans if s.name == "train.step"]
    )
    assert _extent(folded) == _extent(whole)


def test_the_reading_helper_folds_too(job_files: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The helper's work (``_read_into``: here in this process, unit tests start none) in several batches, folding
    anew in each, handed over as ``read`` does it after the first half."""
    whole = otlpjson.read([job_files])
    monkeypatch.setattr(otlpjson, "_BATCH", 50)
    files = otlpjson.find_files([job_files])
    reader = otlpjson.Reader(summary=True)
    for path in files[: len(files) // 2]:
        reader.read_file(path)
    handed = io.BytesIO()
    otlpjson._read_into(files[len(files) // 2 :], handed, summary=True)
    reader.forget()
    handed.seek(0)
    otlpjson._load_into(handed, reader)
    reader.close()
    folded = reader.telemetry
    figures.screen(folded)
    assert len(folded.spans) < len(whole.spans) and len(folded.logs) < len(whole.logs)
    assert _summary(folded) == _summary(whole)


def _extent(tel: otlpjson.Telemetry) -> dict[tuple[object, str], tuple[int, int, int]]:
    """Per process and span name: the earliest start, the latest start, the latest end (what folding keeps)."""
    out: dict[tuple[object, str], tuple[int, int, int]] = {}
    for span in tel.spans:
        key = (span.proc, span.name)
        low, high, end = out.get(key, (span.start, span.start, span.end))
        out[key] = (min(low, span.start), max(high, span.start), max(end, span.end))
    return out


def test_a_line_read_again_undoes_its_folding(job_files: Path) -> None:
    """A worker's spans in two lines, the first with a bad span at its end: the typed path folds its good spans,
    then gives up; the general path reads the line again, counts the bad span and keeps the good ones; the second
    line's spans fold into what was kept, not into what was dropped."""
    damaged = 0
    for path in sorted(job_files.glob("traces-*rank*.jsonl")):
        out = []
        for line in path.read_text().splitlines():
            data = json.loads(line)
            spans = data["resourceSpans"][0]["scopeSpans"][0]["spans"]
            steps = [i for i, span in enumerate(spans) if span["name"] == "train.step"]
            if len(steps) < 4:
                out.append(json.dumps(data, separators=(",", ":")))
                continue
            cut = steps[len(steps) // 2]
            first = json.loads(json.dumps(data))
            first["resourceSpans"][0]["scopeSpans"][0]["spans"] = [*spans[:cut], dict(spans[0], endTimeUnixNano="x")]
            data["resourceSpans"][0]["scopeSpans"][0]["spans"] = spans[cut:]
            out += [json.dumps(first, separators=(",", ":")), json.dumps(data, separators=(",", ":"))]
            damaged += 1
        path.write_text("\n".join(out) + "\n")
    assert damaged
    whole, folded = otlpjson.read([job_files]), otlpjson.read([job_files], summary=True)
    assert whole.problems.counts == folded.problems.counts and whole.problems.counts["invalid_traces_item"] == damaged
    assert len(folded.spans) < len(whole.spans)
    assert _extent(folded) == _extent(whole)
    assert _summary(folded) == _summary(whole)


def test_json_alone_reads_folded_and_prints_the_same(
    job_files: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert report_main([str(job_files), "--json", "--html", str(tmp_path / "r.html")]) == 0  # every record
    with_html = capsys.readouterr().out
    assert report_main([str(job_files), "--json"]) == 0
    assert capsys.readouterr().out == with_html
