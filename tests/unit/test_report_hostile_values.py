"""Hostile numbers in the figures the report computes with: skipped and counted, never a traceback, never NaN out.

Each case is one run of two ranks whose every figure the report computes with -- the step phases (a device-clock
histogram and its median), the GPU's idle time, the arrivals and their median, the step durations, the goodput
counters, the progress at risk, the step counter, the memory -- is valid but one field of one point of rank 1: NaN,
infinite, negative, 1e300, a string that is no number, 2**64 (as OTLP JSON writes a 64-bit integer, and as a bare
number), in every field of that point (a number point's value; a histogram's sum, count, min, max, first bucket
count and first bound). The lines are OTLP JSON as a writer would put them (``NaN`` and ``Infinity`` as the
standard library writes them, or as strings, as OTLP's JSON encoding does), all cases in one directory, and
``torchelastic-otel report`` reads them as a user would run it: ``--json`` and the terminal with its HTML file.
Every run is there with finite figures; every case is counted once in ``skipped`` (``implausible_value`` where the
number was read, ``invalid_metrics_item`` where it was no number at all).
"""

from __future__ import annotations

import copy
import json
import math
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from torchelastic_otel import _names as names
from torchelastic_otel.report.cli import main as report_main

T0 = 1_700_000_000 * 1_000_000_000
BOUNDS = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1]
NAN, INF = float("nan"), float("inf")
#: what a double field becomes, and what an integer field becomes (2**64 is beyond OTLP's 64-bit integers)
DOUBLES = {"nan": NAN, "nan-string": "NaN", "infinity": "Infinity", "minus-infinity": -INF, "negative": -1.0,
           "huge": 1e300, "string": "soon", "two-to-the-64": 2**64}  # fmt: skip
INTEGERS = {"two-to-the-64": str(2**64), "two-to-the-64-number": 2**64, "negative": "-1", "string": "soon",
            "nan": NAN}  # fmt: skip


def _attr(key: str, value: Any) -> dict[str, Any]:
    if isinstance(value, str):
        return {"key": key, "value": {"stringValue": value}}
    return {"key": key, "value": {"intValue": str(value)}}


def _resource(run: str, rank: int) -> dict[str, Any]:
    pairs = (
        (names.RUN_ID, run),
        (names.PROCESS_KIND, "worker"),
        (names.RANK, rank),
        (names.LOCAL_RANK, rank),
        (names.RESTART_COUNT, 0),
        ("host.name", "node"),
        ("process.pid", 100 + rank),
        ("service.name", "w"),
    )
    return {"attributes": [_attr(k, v) for k, v in pairs]}


def _histogram(name: str, seconds: float, steps: int = 20, **attrs: str) -> dict[str, Any]:
    """A cumulative histogram of ``steps`` observations of ``seconds`` (all in one bucket)."""
    buckets = [0] * (len(BOUNDS) + 1)
    buckets[next((i for i, b in enumerate(BOUNDS) if seconds <= b), len(BOUNDS))] = steps
    point = {"attributes": [_attr(k, v) for k, v in attrs.items()], "timeUnixNano": str(T0 + 10**10),
             "startTimeUnixNano": str(T0), "count": str(steps), "sum": seconds * steps,
             "bucketCounts": [str(n) for n in buckets], "explicitBounds": BOUNDS, "min": seconds,
             "max": seconds}  # fmt: skip
    return {"name": name, "unit": "s", "histogram": {"dataPoints": [point], "aggregationTemporality": 2}}


def _number(name: str, kind: str, value: float | int, unit: str = "s", **attrs: str) -> dict[str, Any]:
    point: dict[str, Any] = {"attributes": [_attr(k, v) for k, v in attrs.items()], "timeUnixNano": str(T0 + 10**10)}
    if isinstance(value, int):
        point["asInt"] = str(value)
    else:
        point["asDouble"] = value
    data: dict[str, Any] = {"dataPoints": [point]}
    if kind == "sum":
        data.update(aggregationTemporality=2, isMonotonic=True)
    return {"name": name, "unit": unit, kind: data}


def _figures(rank: int) -> list[dict[str, Any]]:
    """Every figure the report computes with, valid (rank 1 arrives a little later than rank 0)."""
    device = {names.CLOCK: "device"}
    phases = {"input": 0.002, "forward": 0.004, "backward": 0.004, "optimizer": 0.001, "collective_wait": 0.003,
              "other": 0.001}  # fmt: skip
    out = []
    for phase, seconds in phases.items():
        out.append(_histogram(names.WORKER_STEP_PHASE_DURATION, seconds, **{names.PHASE: phase, **device}))
        out.append(_number(names.WORKER_STEP_PHASE_MEDIAN, "gauge", seconds, **{names.PHASE: phase, **device}))
    out += [
        _histogram(names.WORKER_STEP_GPU_IDLE, 0.002),
        _histogram(names.WORKER_STEP_ARRIVAL, 0.010 + 0.001 * rank),
        _number(names.WORKER_STEP_ARRIVAL_MEDIAN, "gauge", 0.010 + 0.001 * rank),
        _histogram(names.WORKER_STEP_DURATION, 0.015, steps=19),
        _number(names.GOODPUT_TIME, "sum", 0.3, **{names.CAUSE: "productive"}),
        _number(names.WORKER_PROGRESS_AT_RISK, "gauge", 0.2, **{names.CAUSE: "productive"}),
        _number(names.WORKER_STEPS, "sum", 20, unit="{step}"),
        _number(names.PROCESS_MEMORY_USAGE, "sum", 2**30, unit="By"),
        _number(names.WORKER_CUDA_MEMORY_ALLOCATED, "gauge", 2**29, unit="By", **{names.DEVICE: "0"}),
    ]
    return out


#: the fields of a point a case makes hostile: (key, is it an integer field, is it the first of a list)
_HISTOGRAM_FIELDS = (("sum", False, False), ("count", True, False), ("min", False, False), ("max", False, False),
                     ("bucketCounts", True, True), ("explicitBounds", False, True))  # fmt: skip


def _cases() -> Iterator[tuple[str, int, str, Any]]:
    """(case id, which metric of rank 1's figures, which field, the value)."""
    for index, metric in enumerate(_figures(1)):
        label = metric["name"] + "".join(f"/{a['value']['stringValue']}" for a in _points(metric)[0]["attributes"]
                                         if a["key"] == names.PHASE)  # fmt: skip
        if "histogram" in metric:
            if metric["name"] == names.WORKER_STEP_PHASE_DURATION and "forward" not in label:
                continue  # one phase stands for all
            fields = _HISTOGRAM_FIELDS
        else:
            if metric["name"] == names.WORKER_STEP_PHASE_MEDIAN and "forward" not in label:
                continue
            fields = (("asInt", True, False),) if "asInt" in _points(metric)[0] else (("asDouble", False, False),)
        for key, integer, first in fields:
            for what, value in (INTEGERS if integer else DOUBLES).items():
                yield f"{label}.{key}{'[0]' if first else ''}={what}", index, key, value


def _points(metric: dict[str, Any]) -> list[dict[str, Any]]:
    return next(metric[k]["dataPoints"] for k in ("histogram", "gauge", "sum") if k in metric)


def _write(directory: Path) -> list[str]:
    """One file per case (its run), each with the two ranks' lines; returns the case ids."""
    ids = []
    for n, (case, index, key, value) in enumerate(_cases()):
        run = f"case-{n}"
        lines = []
        for rank in (0, 1):
            figures = _figures(rank)
            if rank == 1:
                point = _points(figures[index])[0]
                if key in ("bucketCounts", "explicitBounds"):
                    point[key] = copy.copy(point[key])
                    point[key][0] = value
                else:
                    point[key] = value
            lines.append(json.dumps({"resourceMetrics": [{"resource": _resource(run, rank),
                                                          "scopeMetrics": [{"metrics": figures}]}]}))  # fmt: skip
        (directory / f"metrics-{run}.jsonl").write_text("\n".join(lines) + "\n")
        ids.append(case)
    return ids


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    directory = tmp_path_factory.mktemp("hostile") / "files"
    directory.mkdir()
    return directory, _write(directory)


def _no_constant(name: str) -> Any:
    raise AssertionError(f"{name} in the JSON")


def _numbers(value: Any) -> Iterator[float]:
    if isinstance(value, bool):
        return
    if isinstance(value, (int, float)):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _numbers(item)
    elif isinstance(value, list):
        for item in value:
            yield from _numbers(item)


def _check_json(text: str, cases: list[str]) -> None:
    summary = json.loads(text, parse_constant=_no_constant)  # NaN, Infinity, -Infinity: not JSON
    runs = {r["run_id"]: r for r in summary["runs"]}
    assert set(runs) == {f"case-{n}" for n in range(len(cases))}
    for n, case in enumerate(cases):
        run = runs[f"case-{n}"]
        bad = [x for x in _numbers(run) if not math.isfinite(x) or abs(x) > 1e6]
        assert not bad, (case, bad)
        assert run["verdict"]["verdict"] and isinstance(run["verdict"]["steps"], int), case
        assert [s["clock"] for s in run["steps"]] == ["device", "device"], case
    skipped = summary["skipped"]
    assert set(skipped) <= {"implausible_value", "invalid_metrics_item"}, skipped
    assert sum(skipped.values()) == len(cases), (skipped, len(cases))  # each case counted once
    assert skipped["implausible_value"] > len(cases) // 2


def test_hostile_values_are_skipped_and_counted_in_report_json(
    files: tuple[Path, list[str]], capsys: pytest.CaptureFixture[str]
) -> None:
    directory, cases = files
    assert len(cases) > 100
    assert report_main([str(directory), "--json"]) == 0
    _check_json(capsys.readouterr().out, cases)


def test_hostile_values_in_the_terminal_and_html_report(
    files: tuple[Path, list[str]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    directory, cases = files
    page = tmp_path / "report.html"
    assert report_main([str(directory), "--html", str(page), "--width", "120"]) == 0
    text = capsys.readouterr().out
    assert "SKIPPED" in text and "implausible_value" in text
    assert "nan" not in text.lower().replace("nanosecond", "") and "inf " not in text, "no figure shows NaN or inf"
    assert "implausible_value" in page.read_text()


def test_a_hostile_value_without_the_screen_would_have_ended_the_report() -> None:
    """The case this guards (``Infinity`` in a phase median made ``verdict`` raise ``ValueError: cannot convert
    float NaN to integer``): the screen leaves it out, counted."""
    from torchelastic_otel.report import figures
    from torchelastic_otel.report.records import Point, Proc, Telemetry

    proc = Proc("worker", "node", 1, "r", 0, 0, 0, "w")
    tel = Telemetry(points=[Point(names.WORKER_STEP_PHASE_MEDIAN, "gauge", "s", T0, INF, {names.PHASE: "input"}, proc),
                            Point("loss", "gauge", "", T0, NAN, {}, proc)])  # fmt: skip
    figures.screen(tel)
    assert [p.name for p in tel.points] == ["loss"], "a user's own NaN stays: only the bridge's figures are screened"
    assert dict(tel.problems.counts) == {"implausible_value": 1}
    assert tel.problems.examples == [
        f"rank 0, restart 0: implausible_value: {names.WORKER_STEP_PHASE_MEDIAN}: value inf"]  # fmt: skip


@pytest.mark.jobs
def test_hostile_values_through_the_installed_command(files: tuple[Path, list[str]], tmp_path: Path) -> None:
    """``torchelastic-otel report`` as a user runs it: exit 0, no traceback, the same JSON."""
    directory, cases = files
    launcher = Path(sys.executable).with_name("torchelastic-otel")
    done = subprocess.run([str(launcher), "report", str(directory), "--json"], capture_output=True, text=True,
                          timeout=300, cwd=tmp_path, stdin=subprocess.DEVNULL)  # fmt: skip
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-3000:]
    _check_json(done.stdout, cases)
    html = ["--html", str(tmp_path / "r.html")]
    done = subprocess.run([str(launcher), "report", str(directory), *html], capture_output=True, text=True,
                          timeout=300, cwd=tmp_path, stdin=subprocess.DEVNULL)  # fmt: skip
    assert done.returncode == 0 and "Traceback" not in done.stderr + done.stdout, done.stderr[-3000:]
