"""Every ``TORCHELASTIC_OTEL_*`` variable the bridge reads, in one place; everything else is configured by ``OTEL_*``.

Each variable is a :class:`Setting` in :data:`SETTINGS`, with its default and what it is for: the README's
settings table is :func:`markdown_table` (a test holds the two together). A value is read from the environment when
asked for (``SETTING.get()``), so a test or a launcher that sets it later is heard; a malformed value falls back to
the default, never raises into the job. Variables the bridge hands to the processes it starts (``internal``) are
listed too, so that nothing reads the environment behind this module's back.

Stdlib only, cheap to import: the start-up code of every process in a bridged environment reads it.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (not imported at every start-up)
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Generic as _Generic
    from typing import TypeVar

    _T = TypeVar("_T", covariant=True)  # a Setting[int] is a Setting[object] (``SETTINGS``)
    _V = TypeVar("_V")
else:

    class _Generic:
        """``typing.Generic`` as far as a class statement needs it: ``Setting[int]`` is ``Setting`` at run time."""

        __slots__ = ()

        def __class_getitem__(cls, item: object) -> type:
            return cls

    _T = _V = None

__all__ = [
    "logs_exporters",
    "AUTO_INSTALL",
    "COLLECTIVES_INTERVAL",
    "DOWN_WAIT_MILLIS",
    "DRAIN_INTERVAL",
    "EXIT_TIMEOUT",
    "EXIT_TIMEOUT_MILLIS",
    "EXPORT_STALL",
    "FAILURE_DIR",
    "FILE_DIR",
    "FORK_WAIT",
    "FRAMEWORKS",
    "METRICS_DRAIN_INTERVAL",
    "OUTPUT_READER",
    "PROMETHEUS_PORT_OFFSET",
    "SETTINGS",
    "STALL_SECONDS",
    "STEPS",
    "GOODPUT",
    "Setting",
    "WORKER",
    "WORKER_LOGGING",
    "WORKER_OUTPUT",
    "WORKER_OUTPUT_BURST",
    "WORKER_OUTPUT_MAX_LINE",
    "WORKER_OUTPUT_RATE",
    "markdown_table",
    "sdk_disabled",
]


class Setting(_Generic[_T]):
    """One ``TORCHELASTIC_OTEL_*`` variable: its name, default, how its text becomes a value, and what it does.
    (A plain class: importing ``dataclasses`` would cost every process of a bridged environment at start-up.)"""

    __slots__ = ("default", "doc", "internal", "name", "parse")

    def __init__(self, name: str, default: _T, parse: Callable[[str], _T], doc: str, internal: bool = False) -> None:
        self.name = name
        self.default = default
        self.parse = parse
        self.doc = doc
        self.internal = internal  # set by the bridge for the processes it starts, not by users

    def __repr__(self) -> str:
        return f"Setting({self.name!r}, default={self.default!r})"

    def raw(self) -> str | None:
        """The variable's text, ``None`` when unset or blank."""
        value = os.environ.get(self.name, "").strip()
        return value or None

    def get(self, on_invalid: Callable[[], object] | None = None) -> _T:
        """The value now: the parsed variable, or the default when it is unset, blank or malformed (then
        ``on_invalid`` is called: the caller counts it where a wrong value would otherwise go unnoticed)."""
        raw = self.raw()
        if raw is None:
            return self.default
        try:
            return self.parse(raw)
        except (TypeError, ValueError):
            if on_invalid is not None:
                on_invalid()
            return self.default


def _millis(text: str) -> int:
    return max(0, int(text))


def _flag(text: str) -> bool:
    """On unless ``0``, ``false``, ``off`` or ``no``."""
    return text.lower() not in ("0", "false", "off", "no")


def _at_least(low: float) -> Callable[[str], float]:
    return lambda text: max(low, float(text))


def _non_negative(text: str) -> float:
    """A number of at least 0 (NaN and negative numbers are malformed)."""
    value = float(text)
    if not value >= 0:
        raise ValueError(f"not a non-negative number: {text!r}")
    return value


SETTINGS: list[Setting[object]] = []


def _setting(name: str, default: _V, parse: Callable[[str], _V], doc: str, internal: bool = False) -> Setting[_V]:
    """A ``Setting``, listed in ``SETTINGS``."""
    setting = Setting(name, default, parse, doc, internal)
    SETTINGS.append(setting)
    return setting


EXIT_TIMEOUT = _setting(
    "TORCHELASTIC_OTEL_EXIT_TIMEOUT_MILLIS",
    1000,
    _millis,
    "How long an exit path (end of an agent run, a worker's SIGTERM or uncaught exception, interpreter exit) may "
    "spend delivering; what is left is counted as `exit_timeout`. Also the most your own `force_flush()` / "
    "`shutdown()` on the providers the bridge built waits once the collector is down.",
)
EXPORT_STALL = _setting(
    "TORCHELASTIC_OTEL_EXPORT_STALL_MILLIS",
    2000,
    _millis,
    "A flush gives up on an export in flight this long (or retrying), so a dead collector never holds the job up.",
)
SETUP_DELAY = _setting(
    "TORCHELASTIC_OTEL_SETUP_DELAY_MILLIS",
    2000,
    _millis,
    "How long a worker of a bridged agent waits before it builds its exporters (some 0.15 s of CPU, which would "
    "slow the script's own imports; once the delay is over, the build still waits while the worker's main thread "
    "is importing and 2 s after, at most 30 s in all). A span, a metric value or more than 256 buffered events and "
    "log records start the build at once; a worker that ends or is stopped sooner builds nothing: its agent sends its "
    "`torchelastic.worker.start` span, its final records and what it logged meanwhile. `0`: build at start-up.",
)
FORK_WAIT = _setting(
    "TORCHELASTIC_OTEL_FORK_WAIT_MILLIS",
    1000,
    _millis,
    "How long a `fork()` waits for the bridge's exports in flight (gRPC is not fork-safe mid-call).",
)
DRAIN_INTERVAL = _setting(
    "TORCHELASTIC_OTEL_DRAIN_INTERVAL",
    0.5,
    _at_least(0.01),
    "Seconds between moves of buffered metric values and events into the SDK (collections and flushes drain too).",
)
METRICS_DRAIN_INTERVAL = _setting(
    "TORCHELASTIC_OTEL_METRICS_DRAIN_INTERVAL",
    0.5,
    _at_least(0.01),
    "Former name of TORCHELASTIC_OTEL_DRAIN_INTERVAL, read when that is unset.",
)
FILE_DIR = _setting(
    "TORCHELASTIC_OTEL_FILE_DIR",
    None,
    str,
    "With `OTEL_*_EXPORTER=otlp_json_file`: the directory where each process writes its own OTLP JSON Lines file "
    "per signal (named by host, rank, restart and pid), which `torchelastic-otel report` reads; unset, the "
    "exporter writes to stdout.",
)
PROMETHEUS_PORT_OFFSET = _setting(
    "TORCHELASTIC_OTEL_PROMETHEUS_PORT_OFFSET",
    True,
    _flag,
    "With the Prometheus exporter the worker of local rank *k* serves on `OTEL_EXPORTER_PROMETHEUS_PORT` + 1 + *k* "
    "(the agent on the port itself); `0` turns the offset off (one worker per container).",
)
STEPS = _setting(
    "TORCHELASTIC_OTEL_STEPS",
    True,
    _flag,
    "`0`: no step marks, no stall watchdog, no Flight Recorder reads in workers.",
)
GOODPUT = _setting(
    "TORCHELASTIC_OTEL_GOODPUT",
    True,
    _flag,
    "`0`: no step phases, checkpoint spans, memory gauges or goodput counters in workers (steps, stragglers and "
    "stalls stay; `TORCHELASTIC_OTEL_STEPS=0` turns everything off).",
)
FRAMEWORKS = _setting(
    "TORCHELASTIC_OTEL_FRAMEWORKS",
    True,
    _flag,
    "`0`: no Hugging Face `Trainer` / Lightning integration in workers (their logged scalars as "
    "`torchelastic.framework.*` gauges, their train / evaluate / save spans); see docs/frameworks.md.",
)
STALL_SECONDS = _setting(
    "TORCHELASTIC_OTEL_STALL_SECONDS",
    None,
    _non_negative,
    "Seconds without a step or a completed collective before a worker exports `torchelastic.worker.stalled` (unset: "
    "the larger of 120 and 10 times the median step); `0`: never.",
)
COLLECTIVES_INTERVAL = _setting(
    "TORCHELASTIC_OTEL_COLLECTIVES_INTERVAL",
    None,
    _at_least(1.0),
    "Seconds (at least 1) between two reads of the Flight Recorder's entries (step arrival); unset: 10 or more, "
    "keeping the reads under 0.1 % of the time.",
)
WORKER_LOGGING = _setting(
    "TORCHELASTIC_OTEL_WORKER_LOGGING",
    True,
    _flag,
    "`0`: no records from Python `logging` in workers.",
)
WORKER_OUTPUT = _setting(
    "TORCHELASTIC_OTEL_WORKER_OUTPUT",
    True,
    _flag,
    "`0`: workers' stdout and stderr are left alone (no pipes, no processes); also off when `OTEL_LOGS_EXPORTER` is "
    "only `console` or `none`.",
)
WORKER_OUTPUT_MAX_LINE = _setting(
    "TORCHELASTIC_OTEL_WORKER_OUTPUT_MAX_LINE",
    8192,
    lambda text: max(16, int(_non_negative(text))),
    "Bytes of an output line (at least 16); longer lines are cut (on a character boundary) and counted.",
)
WORKER_OUTPUT_RATE = _setting(
    "TORCHELASTIC_OTEL_WORKER_OUTPUT_RATE",
    1000.0,
    _non_negative,
    "Output lines a second per worker (both streams) that become records; `0`: no limit. The console still gets "
    "every line.",
)
WORKER_OUTPUT_BURST = _setting(
    "TORCHELASTIC_OTEL_WORKER_OUTPUT_BURST",
    10000,
    lambda text: max(1, int(_non_negative(text))),
    "Output lines above the rate at once (a start-up dump, a traceback).",
)
AUTO_INSTALL = _setting(
    "TORCHELASTIC_OTEL_AUTO_INSTALL",
    False,
    lambda text: text == "1",
    "Set to 1 by a bridged agent for its workers: their start-up installs the bridge.",
    internal=True,
)
WORKER = _setting(
    "TORCHELASTIC_OTEL_WORKER",
    None,
    str,
    "The mark a worker leaves for its descendants (pid, rank, restart, run), which tells them they are not the worker.",
    internal=True,
)
DISTRO_FOUND = _setting(
    "TORCHELASTIC_OTEL_DISTRO_FOUND",
    None,
    str,
    "Set by a bridged agent for its workers: `1` if an OpenTelemetry distro or configurator is installed (the "
    "workers run it), `0` if none is (they do not look).",
    internal=True,
)
FAILURE_DIR = _setting(
    "TORCHELASTIC_OTEL_FAILURE_DIR",
    None,
    str,
    "The agent's directory where its workers leave their failures and final records for it.",
    internal=True,
)
OUTPUT_READER = _setting(
    "TORCHELASTIC_OTEL_WORKER_OUTPUT_READER",
    None,
    str,
    "Set in a worker's output reader process, so that it captures nothing of its own.",
    internal=True,
)


def sdk_disabled() -> bool:
    """``OTEL_SDK_DISABLED`` as the specification reads it (case-insensitive ``true``)."""
    return os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true"


def logs_exporters() -> set[str]:
    """The log exporters ``OTEL_LOGS_EXPORTER`` names (lower case; ``otlp`` when unset) -- what the worker's output
    capture and logging records ask before they start. With ``OTEL_CONFIG_FILE`` the file configures the exporters
    and ``OTEL_LOGS_EXPORTER`` is ignored (the specification): ``{"config_file"}``, without parsing the file at a
    worker's start-up (the agent checked it)."""
    if os.environ.get("OTEL_CONFIG_FILE", "").strip():
        return {"config_file"}
    return {name.strip().lower() for name in os.environ.get("OTEL_LOGS_EXPORTER", "otlp").split(",")} - {""}


#: :data:`EXIT_TIMEOUT` as this process started (the exit paths' bound is fixed for a process's life).
EXIT_TIMEOUT_MILLIS = EXIT_TIMEOUT.get()
#: How long a flush waits once the backend is known to be down.
DOWN_WAIT_MILLIS = 100


def markdown_table() -> str:
    """The README's table of the user settings (``internal`` ones left out)."""
    rows = ["| Variable | Default | What it does |", "|---|---|---|"]
    for setting in SETTINGS:
        if not setting.internal:
            rows.append(f"| `{setting.name}` | {_shown(setting.default)} | {setting.doc} |")
    return "\n".join(rows)


def _shown(default: object) -> str:
    if default is None:
        return "unset"
    if isinstance(default, bool):
        return "`1`" if default else "`0`"
    return f"`{default}`"
