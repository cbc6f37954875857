"""What ``torchelastic-otel report --follow`` costs on a long, large run: its CPU share and memory while a 128-node
job's telemetry is appended for an hour of the run's time, and how both change from the first quarter to the last.

**The run.** A real small job's OTLP JSON files (``make demo``'s: ``--src``, or the demo run once into ``--work``)
are cloned to ``--nodes`` x ``--ranks`` by ``bench/scale_gen.py`` (2 attempts: a rank fails in the first, the
second succeeds; 1 metric export in ``--metric-every`` kept). Its lines are then played back, in the order of their
time stamps, into what the Collector's ``file`` exporter writes for a whole job (``collector-config/otelcol-file.
yaml``): one file, a line per batch of one signal holding many processes' resource blocks (the lines of
``--batch`` seconds of the run's time, at most 64 processes' a line), rotated at ``--rotate-mb`` (renamed with a
time stamp before its extension, a new file begun, the oldest beyond ``--backups`` deleted). The time stamps are
rewritten as it goes:

- the clone's beginning (start-up, the failed attempt and its root cause, the restart) as it was, moved to now;
- then the successful attempt's training (from its first export that counted a step to its last) again and again
  until ``--hours`` of the run's time are written, stretched ``--stretch`` times (the demo's steps take 40 ms and
  its workers export every 250 ms; a large job's steps take about a second: 20 times slower). Its cumulative counters
  start over with each repetition: the view's figures are not the point here, its cost is;
- then the clone's end (the agents end their run), after which the follower prints the report and exits.

The writer runs ``--speed`` times faster than the run's time (an hour in 12 minutes at 5x), on the same machine
as the follower (``report --follow DIR --interval 2``, its output a file: a frame each time the view changes).

**What is measured**, from ``/proc`` every half second: the follower's CPU seconds and resident memory. Printed:
the phases (catching up with the clone's beginning, following the training, the report at the end); for the
training, its four quarters of wall time (CPU share of one core, mean and peak RSS) and the change from the first to
the last (flat is the target: what the follower keeps does not grow with the run); its CPU seconds per hour of the
run's time, split into rebuilding the view (the CPU its header says its builds took) and reading: at the run's real
rate, the reading's seconds over 3,600 are its share of a core (the rebuilds take at most a quarter of one whatever
the rate: a view is rebuilt at most every four times its build); the last frame of the view.

    .venv/bin/python bench/bench_follow.py --src /tmp/demo/telemetry
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

import bench_report_scale  # noqa: E402  (and through it scale_gen)

_TIME = re.compile(r'(?<=[tT]imeUnixNano":")(\d+)(?=")')
_STEPS = '"name":"torchelastic.worker.steps"'
_SIGNALS = ("resourceSpans", "resourceLogs", "resourceMetrics")
_BLOCKS_A_LINE = 64


@dataclass
class Line:
    """One line of the clone: its signal, its time (its latest time stamp), its resource blocks as text with the
    time stamps cut out (``texts[i]``, then ``times[i]``, ..., then the last text)."""

    time: int
    signal: str
    texts: list[str]
    times: list[int]

    def render(self, origin: int, base: int, scale: float) -> str:
        """The blocks, each time stamp ``t`` written as ``base + (t - origin) * scale``."""
        out = [self.texts[0]]
        for t, text in zip(self.times, self.texts[1:], strict=True):
            out.append(str(int(base + (t - origin) * scale)))
            out.append(text)
        return "".join(out)


def load(run: Path) -> list[Line]:
    """Every line of the clone, in the order of their time."""
    lines = []
    for path in sorted(run.glob("*.jsonl")):
        with open(path, encoding="utf-8") as fh:
            for raw in fh:
                signal = next((s for s in _SIGNALS if raw.startswith('{"' + s + '":[')), None)
                if signal is None or not raw.rstrip().endswith("]}"):
                    continue
                inner = raw.rstrip()[len(signal) + 5 : -2]
                pieces = _TIME.split(inner)
                times = [int(t) for t in pieces[1::2]]
                if times:
                    lines.append(Line(max(times), signal, pieces[0::2], times))
    lines.sort(key=lambda line: line.time)
    return lines


def training_window(lines: list[Line]) -> tuple[int, int]:
    """From the last attempt's first worker export that counted a step to its last one."""
    counted = [line.time for line in lines if line.signal == "resourceMetrics" and _STEPS in "".join(line.texts)
               and '"torchelastic.restart_count","value":{"intValue":"1"}' in line.texts[0]]  # fmt: skip
    if len(counted) < 2:
        raise SystemExit("the clone's last attempt has no steps counted: a demo-like source is needed")
    return min(counted), max(counted)


# ---- the writer: the Collector's file, rotated --------------------------------------------------------------------


@dataclass
class Writer:
    """One file at ``path``, rotated at ``rotate`` bytes, ``backups`` rotated files kept."""

    path: Path
    rotate: int
    backups: int
    written: int = 0
    lines: int = 0
    rotations: int = 0
    _size: int = 0
    _out: object = None
    _rotated: list[Path] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._out = open(self.path, "a", encoding="utf-8")

    def write(self, signal: str, blocks: list[str]) -> None:
        for i in range(0, len(blocks), _BLOCKS_A_LINE):
            text = '{"' + signal + '":[' + ",".join(blocks[i : i + _BLOCKS_A_LINE]) + "]}\n"
            self._out.write(text)  # type: ignore[attr-defined]
            self._size += len(text)
            self.written += len(text)
            self.lines += 1
        self._out.flush()  # type: ignore[attr-defined]
        if self._size >= self.rotate:
            self._rotate()

    def _rotate(self) -> None:
        """As the Collector's exporter rotates: renamed with a time stamp before the extension, a new file begun."""
        self._out.close()  # type: ignore[attr-defined]
        stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H-%M-%S.%f")[:-3]
        rotated = self.path.with_name(f"{self.path.stem}-{stamp}{self.path.suffix}")
        self.path.rename(rotated)
        self._rotated.append(rotated)
        while len(self._rotated) > self.backups:
            self._rotated.pop(0).unlink()
        self._out = open(self.path, "a", encoding="utf-8")
        self._size = 0
        self.rotations += 1

    def close(self) -> None:
        self._out.close()  # type: ignore[attr-defined]


# ---- the follower, measured ------------------------------------------------------------------------------------


@dataclass
class Sample:
    wall: float
    cpu: float  # seconds
    rss: float  # MB


class Watched:
    """The follower process, sampled every half second."""

    def __init__(self, cmd: list[str], out: Path) -> None:
        self.out = out
        with open(out, "wb") as sink:
            self.proc = subprocess.Popen(cmd, cwd=out.parent, stdout=sink, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL)  # fmt: skip
        self.samples: list[Sample] = []
        self.final_at: float | None = None  # when it began the report of the files
        self._tick = os.sysconf("SC_CLK_TCK")
        self._page = os.sysconf("SC_PAGE_SIZE")
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while self.proc.poll() is None:
            try:
                fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
                rss = int(Path(f"/proc/{self.proc.pid}/statm").read_text().split()[1]) * self._page / 2**20
            except (OSError, IndexError, ValueError):
                break
            cpu = (int(fields[11]) + int(fields[12])) / self._tick
            self.samples.append(Sample(time.monotonic(), cpu, rss))
            if self.final_at is None and b": the report of the files ====" in self._tail():
                self.final_at = time.monotonic()
            time.sleep(0.5)

    def _tail(self) -> bytes:
        try:
            with open(self.out, "rb") as fh:
                fh.seek(max(0, self.out.stat().st_size - 200_000))
                return fh.read()
        except OSError:
            return b""

    def wait(self, timeout: float) -> int:
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        self._thread.join(timeout=5)
        return code

    def between(self, start: float, end: float) -> list[Sample]:
        return [s for s in self.samples if start <= s.wall <= end]


def _share(samples: list[Sample]) -> float:
    """The CPU share of one core over the samples (0 without two)."""
    if len(samples) < 2 or samples[-1].wall <= samples[0].wall:
        return 0.0
    return (samples[-1].cpu - samples[0].cpu) / (samples[-1].wall - samples[0].wall)


def _last_frame(output: str) -> tuple[str, float, int, float]:
    """The last frame of the view in the follower's output, and what its header says of the view's builds: the last
    one's seconds, how many, their CPU seconds together."""
    frames = re.split(r"^==== \S+ UTC ====$", output.split(": the report of the files ====")[0], flags=re.MULTILINE)
    frame = frames[-1].strip("\n") if frames else ""
    found = re.search(r"view built in ([\d.]+) s \(([\d,]+) builds: ([\d.]+) s of CPU\)", frame)
    if found is None:
        return frame, 0.0, 0, 0.0
    return frame, float(found[1]), int(found[2].replace(",", "")), float(found[3])


# ---- the run -----------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    p.add_argument("--src", type=Path, help="a real job's OTLP JSON files (default: run examples/demo.py once)")
    p.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "torchelastic-follow-bench")
    p.add_argument("--nodes", type=int, default=128)
    p.add_argument("--ranks", type=int, default=8, help="local ranks per node")
    p.add_argument("--metric-every", type=int, default=4, help="1 metric export in N of the demo's kept")
    p.add_argument("--hours", type=float, default=1.0, help="of the run's time, written")
    p.add_argument("--stretch", type=float, default=20.0, help="the training's time stamps spread this many times")
    p.add_argument("--speed", type=float, default=5.0, help="the run's seconds written a second")
    p.add_argument("--batch", type=float, default=1.0, help="seconds of the run's time in one line of a signal")
    p.add_argument("--rotate-mb", type=float, default=64.0)
    p.add_argument("--backups", type=int, default=8)
    p.add_argument("--interval", type=float, default=2.0, help="the follower's --interval")
    args = p.parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    src = args.src or bench_report_scale.demo_source(args.work)
    clone, gen_s = bench_report_scale.generated(src, args.work, args.nodes, args.ranks, 2, args.metric_every)
    started = time.monotonic()
    lines = load(clone)
    w0, w1 = training_window(lines)
    prologue = [line for line in lines if line.time < w0]
    training = [line for line in lines if w0 <= line.time <= w1]
    epilogue = [line for line in lines if line.time > w1]
    loop_ns = (w1 - w0) * args.stretch + 0.5e9
    loops = max(1, math.ceil(args.hours * 3600e9 / loop_ns))
    first = lines[0].time
    print(f"source: {src}; {args.nodes} nodes x {args.ranks} ranks (generated in {gen_s:.0f} s, loaded in "
          f"{time.monotonic() - started:.0f} s); {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}")  # fmt: skip
    print(f"the run: its beginning ({(w0 - first) / 1e9:.0f} s of run time, {len(prologue):,} lines); the training "
          f"({(w1 - w0) / 1e9:.1f} s, {len(training):,} lines) stretched {args.stretch:g}x and written {loops} times "
          f"({loops * loop_ns / 3600e9:.2f} h of run time); its end ({len(epilogue):,} lines); written at "
          f"{args.speed:g}x into one file rotated at {args.rotate_mb:g} MB, {args.backups} kept")  # fmt: skip

    files = args.work / "otelcol"
    shutil.rmtree(files, ignore_errors=True)
    files.mkdir()
    writer = Writer(files / "otelcol.json", int(args.rotate_mb * 2**20), args.backups)
    follower = Watched([sys.executable, "-m", "torchelastic_otel.report", "--follow", "--interval", str(args.interval),
                        "--width", "120", "--html", str(args.work / "follow.html"), str(files)],
                       args.work / "follow.out")  # fmt: skip
    base = time.time_ns()
    wall0 = time.monotonic()
    lag = 0.0

    def play(part: list[Line], origin: int, at: int, scale: float) -> int:
        """Write ``part`` with its time ``t`` at ``at + (t - origin) * scale``, on the wall clock at ``speed``x;
        the run time where it ends."""
        nonlocal lag
        batch_ns = args.batch * 1e9
        i = 0
        while i < len(part):
            window = math.floor((at + (part[i].time - origin) * scale - base) / batch_ns)
            groups: dict[str, list[str]] = {}
            while i < len(part) and math.floor((at + (part[i].time - origin) * scale - base) / batch_ns) == window:
                groups.setdefault(part[i].signal, []).append(part[i].render(origin, at, scale))
                i += 1
            due = wall0 + (window + 1) * args.batch / args.speed
            delay = due - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            else:
                lag = max(lag, -delay)
            for signal, blocks in groups.items():
                writer.write(signal, blocks)
        return int(at + (part[-1].time - origin) * scale) if part else at

    try:
        end = play(prologue, first, base, 1.0)
        training_from = time.monotonic()
        at = max(end, base + (w0 - first))
        for _ in range(loops):
            play(training, w0, at, args.stretch)
            at += int(loop_ns)
        training_to = time.monotonic()
        play(epilogue, w1, at, 1.0)
        written_at = time.monotonic()
        code = follower.wait(timeout=1800)
    finally:
        writer.close()
        if follower.proc.poll() is None:
            follower.proc.kill()
    ended = time.monotonic()
    final_at = follower.final_at or ended
    print(f"wrote {writer.written / 2**30:.2f} GB in {writer.lines:,} lines ({writer.rotations} rotations) in "
          f"{written_at - wall0:.0f} s, at most {lag:.1f} s behind the schedule; the follower exited {code} "
          f"{ended - written_at:.0f} s after the run's end was written")  # fmt: skip

    catch_up = follower.between(wall0, training_from)
    steady = follower.between(training_from, min(training_to, final_at))
    final = follower.between(final_at, ended)
    print(f"\n{'phase':<34}{'wall s':>8}{'CPU s':>8}{'CPU %':>7}{'RSS MB':>8}{'peak MB':>9}")
    for name, samples in (("the run's beginning (catching up)", catch_up), ("the training", steady),
                          ("the report at the end", final)):  # fmt: skip
        if len(samples) < 2:
            continue
        wall, cpu = samples[-1].wall - samples[0].wall, samples[-1].cpu - samples[0].cpu
        mean = statistics.mean(s.rss for s in samples)
        print(f"{name:<34}{wall:>8.0f}{cpu:>8.1f}{_share(samples) * 100:>7.1f}{mean:>8.0f}"
              f"{max(s.rss for s in samples):>9.0f}")  # fmt: skip
    if len(steady) >= 8:
        span = (steady[-1].wall - steady[0].wall) / 4
        quarters = [follower.between(steady[0].wall + q * span, steady[0].wall + (q + 1) * span) for q in range(4)]
        print(f"\nthe training by quarter{'':<11}{'CPU %':>7}{'RSS MB':>8}{'peak MB':>9}")
        for q, samples in enumerate(quarters, 1):
            print(f"  quarter {q}{'':<24}{_share(samples) * 100:>7.1f}{statistics.mean(s.rss for s in samples):>8.0f}"
                  f"{max(s.rss for s in samples):>9.0f}")  # fmt: skip
        first_q, last_q = quarters[0], quarters[-1]
        cpu_change = _share(last_q) - _share(first_q)
        rss_change = statistics.mean(s.rss for s in last_q) / statistics.mean(s.rss for s in first_q) - 1
        print(f"  last quarter against the first: CPU {cpu_change * 100:+.1f} points, RSS {rss_change * 100:+.1f} %")
        hours = loops * loop_ns / 3600e9
        total = steady[-1].cpu - (catch_up[0].cpu if catch_up else steady[0].cpu)
        frame, last, count, building = _last_frame(follower.out.read_text(errors="replace"))
        reading = (total - building) / hours
        rebuild = min(100.0, last / max(args.interval, 4 * last) * 100)  # every max(interval, 4 x a build)
        print(f"  CPU: {total / hours:.0f} s per hour of the run's time, of which {building / hours:.0f} s rebuilding "
              f"the view ({count:,} builds, the last {last:.2f} s) and {reading:.0f} s reading: at the run's real "
              f"rate, reading takes {reading / 36:.1f} % of a core; rebuilding, at most 25 % "
              f"({rebuild:.0f} % here)")  # fmt: skip
        print(f"\nthe last frame of the view:\n{frame}")
    print(json.dumps({"follower_exit": code}))
    return 0 if code == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
