"""The ``report`` command: read, build, print the terminal report, write the HTML file, say where it is.

Its last line is ``report: <path of the HTML file>``. With ``--json`` it prints a machine-readable summary instead
(``training.summary``: per run its outcome, attempts, root cause, restarts, stragglers, stalls and missing ranks)
and writes the HTML file only when ``--html`` names one. Bad input never ends in a traceback: a path that does not
exist or holds no OTLP is a one-line error (exit status 2); lines that cannot be read are skipped and counted in
the report itself.

With ``--follow`` it first shows the run live, redrawn every ``--interval`` seconds as its files grow (``follow``),
until the run ends or Ctrl-C; then it prints the report of the files as without it, with the same exit status.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import shutil
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

from torchelastic_otel.report import follow, html, model, terminal, training
from torchelastic_otel.report.otlpjson import ReportError, read
from torchelastic_otel.report.records import Telemetry

#: msgspec's JSON indenter (``_json_text``), when the ``report`` extra is installed
_indent: Callable[..., str] | None
try:
    from msgspec.json import format as _indent
except ImportError:
    _indent = None

DEFAULT_HTML = "torchelastic-report.html"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="torchelastic-otel report",
        description="Render OTLP JSON Lines files of a torchrun job (from the otlp_json_file exporter or a "
        "Collector's file exporter) in the terminal and as one self-contained HTML file.",
    )
    p.add_argument("paths", nargs="+", metavar="PATH", help="OTLP JSON Lines files, or directories holding them")
    p.add_argument(
        "--html",
        metavar="FILE",
        default=None,
        help=f"HTML file to write (default: {DEFAULT_HTML}; with --json only when given)",
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="print a machine-readable summary instead (run, attempts, root cause, restarts, stragglers, "
        "stalls, missing ranks) for CI pipelines and scripts",
    )
    p.add_argument("--width", type=int, default=0, help="columns of the terminal report (default: the terminal's)")
    p.add_argument("--quiet", action="store_true", help="print only the last line (where the HTML report is)")
    p.add_argument(
        "--follow",
        action="store_true",
        help="show the run live as its files grow (as tail -F reads them: new files, rotated and truncated ones), "
        "redrawn in place every --interval seconds, until the run ends or Ctrl-C; then the report as without it "
        "(with --json, the live view goes to stderr)",
    )
    p.add_argument(
        "--interval",
        type=_seconds,
        default=follow.DEFAULT_INTERVAL,
        metavar="SECONDS",
        help=f"with --follow: seconds between two reads and redraws (default: {follow.DEFAULT_INTERVAL:g})",
    )
    return p


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0.05 <= value <= 3600:
        raise argparse.ArgumentTypeError(f"{text!r}: seconds between 0.05 and 3600")
    return value


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(sys.argv[1:] if argv is None else argv)
    if args.follow:
        screen = sys.stderr if args.json else sys.stdout
        try:
            return follow.follow(args.paths, lambda: _report(args), args.interval, screen, args.width)
        except KeyboardInterrupt:  # a second Ctrl-C, while the report of the files is made
            print("torchelastic-otel report: interrupted", file=sys.stderr)
            return 130
    return _report(args)


def _report(args: argparse.Namespace) -> int:
    """The report of the files at ``args.paths``, as the command prints it."""
    try:
        tel = read(args.paths, summary=args.json and not args.html)  # --json alone: what the summary reads
    except ReportError as exc:
        print(f"torchelastic-otel report: {exc}", file=sys.stderr)
        return 2
    with _no_cyclic_gc():
        jobs = model.build(tel)
        if args.json:
            _print_text(_json_text(training.summary(jobs, dict(tel.problems.counts))))
            return _write_html(tel, jobs, Path(args.html), quiet=True) if args.html else 0
        if not args.quiet:
            width = args.width or shutil.get_terminal_size((110, 24)).columns
            print(terminal.render(tel, jobs, width=max(60, width), color=terminal.use_color(sys.stdout)))
        return _write_html(tel, jobs, Path(args.html or DEFAULT_HTML))


def _json_text(summary: dict[str, object]) -> str:
    """``json.dumps(summary, indent=2, default=str)``: with msgspec (the ``report`` extra), the standard library's
    compact text (its C encoder: the indenting one is written in Python, seconds and a hundred megabytes on a large
    run's summary) indented by msgspec, which keeps every number and string as written: the same text. A summary
    with a ``NaN`` or an infinity (which ``json`` writes and JSON has not) is written by ``json`` alone."""
    if _indent is not None:
        try:
            return _indent(json.dumps(summary, default=str), indent=2)
        except ValueError:  # msgspec.DecodeError: not JSON (NaN, Infinity)
            pass
    return json.dumps(summary, indent=2, default=str)


def _print_text(text: str, chunk: int = 1 << 20) -> None:
    """``print(text)``, a megabyte at a time: not a second copy of a large run's summary, encoded, at once."""
    for start in range(0, len(text), chunk):
        sys.stdout.write(text[start : start + chunk])
    sys.stdout.write("\n")


@contextlib.contextmanager
def _no_cyclic_gc() -> Iterator[None]:
    """No cyclic garbage collection while the report is built and rendered (as while it is read): the model and
    the views make millions of objects in no cycle (per-rank lists, runs, rows), and each collection would walk
    them all again: on a large run, most of the time the model and the summary take. The records are frozen first
    (they live as long as the command); what the views leave is freed by reference counting, and collecting resumes
    after."""
    collecting = gc.isenabled()
    gc.freeze()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()


def _write_html(tel: Telemetry, jobs: list[model.Job], out: Path, quiet: bool = False) -> int:
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(html.render(tel, jobs), encoding="utf-8")
    except OSError as exc:
        print(f"torchelastic-otel report: cannot write {out}: {exc}", file=sys.stderr)
        return 2
    print(f"report: {os.path.abspath(out)}", file=sys.stderr if quiet else sys.stdout)
    return 0
