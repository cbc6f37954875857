"""How fast ``torchelastic-otel report`` renders a big job, and how big its HTML gets: ``make bench`` runs it.

A synthetic job (``tests/support/report_files.py``: 10 ranks, 2 attempts, the first failed) is written through the real
OTLP JSON Lines exporter at three sizes and each rendered 3 times in one process the way the command does (read,
build, terminal text, HTML); the median time is reported:

- ``records-1k``: 1,000 worker spans, 1,000 log records;
- ``big``: 1,000 worker spans, 100,000 log records (the issue's size);
- ``spans-20k``: 20,000 worker spans, 1,000 log records (more than the timeline draws one by one).

Targets (2-core machine): ``big`` renders in <= 10 s; the HTML is bounded: 100x the log records make it at most
1.1x bigger (records are listed only if WARN or worse, capped), and 20x the spans at most 2 MB (the timeline merges
neighbours past 3,000 bars). Prints figures and one PASS/MISS line per target; always exits 0.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.support.report_files import Shape, lines_of, size_of, write_job  # noqa: E402
from torchelastic_otel.report import html, model, otlpjson, terminal  # noqa: E402

SIZES = {
    "records-1k": Shape(ranks=10, attempts=2, steps=50, records=1_000),
    "big": Shape(ranks=10, attempts=2, steps=50, records=100_000),
    "spans-20k": Shape(ranks=10, attempts=2, steps=1_000, records=1_000),
}
ROUNDS = 3
TARGET_SECONDS, TARGET_BYTES, TARGET_GROWTH = 10.0, 2_000_000, 1.1


def render(directory: Path) -> tuple[float, dict[str, float], int]:
    """(seconds in all, seconds per phase, bytes of HTML) of one rendering."""
    phases: dict[str, float] = {}
    t0 = time.perf_counter()
    tel = otlpjson.read([directory])
    phases["read"] = time.perf_counter() - t0
    jobs = model.build(tel)
    phases["build"] = time.perf_counter() - t0 - phases["read"]
    terminal.render(tel, jobs, width=120)
    phases["terminal"] = time.perf_counter() - t0 - phases["read"] - phases["build"]
    page = html.render(tel, jobs)
    total = time.perf_counter() - t0
    phases["html"] = total - sum(phases.values())
    return total, phases, len(page.encode())


def main() -> int:
    results = {}
    with tempfile.TemporaryDirectory(prefix="bench-report-") as tmp:
        for name, shape in SIZES.items():
            directory = Path(tmp) / name
            t0 = time.perf_counter()
            facts = write_job(directory, shape)
            written = time.perf_counter() - t0
            runs = [render(directory) for _ in range(ROUNDS)]
            seconds = statistics.median(r[0] for r in runs)
            phases = {k: statistics.median(r[1][k] for r in runs) for k in runs[0][1]}
            size = runs[0][2]
            results[name] = (seconds, size)
            spans = shape.ranks * shape.attempts * shape.steps
            print(
                f"{name:>10}: {spans:,} worker spans, {shape.records:,} log records -> {len(facts.files)} files, "
                f"{lines_of(facts.files):,} lines, {size_of(facts.files) / 1e6:.1f} MB (written in {written:.1f} s)"
            )
            print(
                f"            render {seconds:.2f} s (median of {ROUNDS}: "
                + ", ".join(f"{k} {v:.2f} s" for k, v in phases.items())
                + f"); HTML {size / 1e3:,.0f} kB"
            )
    big_s, big_b = results["big"]
    growth = big_b / results["records-1k"][1]
    spans_b = results["spans-20k"][1]
    verdicts = [
        (big_s <= TARGET_SECONDS, f"big job renders in {big_s:.2f} s (target <= {TARGET_SECONDS:.0f} s)"),
        (growth <= TARGET_GROWTH, f"HTML with 100,000 / 1,000 log records = {growth:.2f}x (target <= 1.1x)"),
        (spans_b <= TARGET_BYTES, f"HTML with 20,000 worker spans is {spans_b / 1e6:.2f} MB (target <= 2 MB)"),
    ]
    for ok, text in verdicts:
        print(("PASS " if ok else "MISS ") + text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
