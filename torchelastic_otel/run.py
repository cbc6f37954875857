"""``torchelastic-otel run ...`` / ``python -m torchelastic_otel.run ...``: torchrun with the bridge installed.

Takes exactly torchrun's arguments. The pipeline is configured from ``OTEL_*``; the agent and every worker are
bridged (workers install the bridge at start-up through ``PYTHONPATH``). The run id is settled before the bridge
starts, so the agent's resource carries ``torchelastic.run_id`` like the workers' do.
"""

from __future__ import annotations

import functools
import os
import sys
import uuid
from collections.abc import Callable
from typing import Any

from torchelastic_otel._run_id import RunIdKept, install_for_run, settle_run_id
from torchelastic_otel._torch import tracebacks

__all__ = ["main"]


def _early_run_id(argv: list[str]) -> tuple[str | None, str | None]:
    """The run id as the arguments alone tell it, before torch is imported (most of the start-up): ``--rdzv-id`` as
    given, or a fresh uuid for ``--standalone`` (which :func:`settle_run_id` then uses); ``(None, None)`` where only
    torch's parser can tell. Returns ``(run id, the standalone uuid)``."""
    standalone, run_id = None, None
    for i, arg in enumerate(argv):
        if arg in ("--", "-m", "--module", "--no-python", "--no_python") or arg.endswith(".py"):
            break  # the script and its own arguments follow
        if arg == "--standalone":
            standalone = str(uuid.uuid4())
        elif arg in ("--rdzv-id", "--rdzv_id") and i + 1 < len(argv):
            run_id = argv[i + 1]
        elif arg.startswith(("--rdzv-id=", "--rdzv_id=")):
            run_id = arg.split("=", 1)[1]
    return (standalone or run_id), standalone


#: How long the agent waits for its pipeline before it imports torch (a build takes a fraction of it; one still going
#: on after that goes on in its thread, and the records before it are kept for it).
EARLY_BUILD_WAIT_SECONDS = 2.0


def _build_early(run_id: str | None) -> None:
    """Build the agent's pipeline before torch is imported, where the run id its resource carries is known already
    (else ``install()`` builds it, once torch has parsed the arguments), so that the agent's first record, exit or
    signal finds it ready.

    Built in a thread of its own (a build that hangs holds the agent at most ``EARLY_BUILD_WAIT_SECONDS``) that the
    main thread waits for, not beside ``import torch``: both are CPU-bound Python under one GIL, and side by side
    they cost more than one after the other, and as much CPU again in lock hand-overs (docs/performance.md, "Costs
    that shape the code")."""
    if not run_id or run_id == "none" or os.environ.get("TORCHELASTIC_RUN_ID"):
        return
    os.environ["TORCHELASTIC_RUN_ID"] = run_id
    from torchelastic_otel import pipeline

    if pipeline.start_building():
        pipeline.wait_built(EARLY_BUILD_WAIT_SECONDS)


def main(argv: list[str] | None = None) -> None:
    """torchrun's ``main(argv)`` with the bridge installed once torch has parsed the arguments (torch's ``run``,
    which its ``main`` calls, is the bridge's meanwhile: :func:`_bridged`). What the launch raises is raised without
    this launcher's frames (``_torch.tracebacks``): a failed job's traceback is the one torchrun prints."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(USAGE)
        sys.exit(0 if argv else 2)
    if argv[0] in ("--version", "-V", "version"):
        print(version_text())
        sys.exit(0)
    if argv[0] == "run" and _asks_for_help(argv[1:]):
        from torch.distributed import run as torchrun

        torchrun.get_args_parser().print_help()
        print(RUN_HELP_NOTE)
        sys.exit(0)
    # The agent's resource reads the run id from the environment when the pipeline is built; a launcher called
    # in-process (in place of torch.distributed.run.main) then gets its environment back as it was.
    try:
        with RunIdKept():
            if argv and argv[0] == "report":  # `torchelastic-otel report PATH...`: render OTLP JSON Lines files
                from torchelastic_otel.report import main as report

                sys.exit(report(argv[1:]))
            if argv and argv[0] == "accelerate":  # `torchelastic-otel accelerate launch ...`: docs/accelerate.md
                from torchelastic_otel.accelerate import main as accelerate

                return accelerate(argv[1:])
            if argv and argv[0] == "run":  # `torchelastic-otel run ...`
                argv = argv[1:]
            early_id, standalone_id = _early_run_id(argv)
            _build_early(early_id)
            from torch.distributed import run as torchrun

            original = torchrun.run
            torchrun.run = _bridged(original, standalone_id)
            try:
                torchrun.main(argv)  # torch's own: `@record`, parse_args(argv), run(args)
            finally:
                torchrun.run = original
    except BaseException as exc:
        tracebacks.drop_own_frame(exc)
        raise


USAGE = """usage: torchelastic-otel <command> [arguments]

OpenTelemetry for PyTorch elastic (torchrun) jobs: a job's rendezvous rounds, worker starts, failures and restarts
as a trace, its metrics as OpenTelemetry instruments, every event and log line as a log record.

commands:
  run         torchrun with the bridge (takes torchrun's arguments: torchelastic-otel run --help)
  report      render a job's OTLP JSON Lines files: terminal, HTML, --json, --follow (torchelastic-otel report --help)
  accelerate  accelerate launch with the bridge (torchelastic-otel accelerate launch --help)

options:
  -h, --help  show this help
  --version   the versions of the bridge, torch and OpenTelemetry

torchelastic-otel [torchrun's arguments] is torchelastic-otel run [torchrun's arguments].
Configuration: OpenTelemetry's OTEL_* variables (OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_TRACES_EXPORTER, ...) or
OTEL_CONFIG_FILE, and the bridge's own TORCHELASTIC_OTEL_* (docs/configuration.md)."""

RUN_HELP_NOTE = """
torchelastic-otel run takes torchrun's arguments, above, and bridges the agent and every worker. Where the telemetry
goes is OpenTelemetry's configuration: OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_{TRACES,METRICS,LOGS}_EXPORTER
(otlp, console, prometheus, otlp_json_file), OTEL_CONFIG_FILE; the bridge's own settings are TORCHELASTIC_OTEL_*
(docs/configuration.md)."""

#: The distributions ``--version`` names (without importing any of them: torch takes seconds to import).
VERSIONED = ("torchelastic-otel", "torch", "opentelemetry-api", "opentelemetry-sdk", "opentelemetry-exporter-otlp")


def version_text() -> str:
    """``torchelastic-otel 0.1.0`` and, one a line, the versions of torch and OpenTelemetry installed beside it."""
    from importlib import metadata

    from torchelastic_otel.version import __version__

    lines = [f"torchelastic-otel {__version__}"]
    for name in VERSIONED[1:]:
        try:
            found = metadata.version(name)
        except metadata.PackageNotFoundError:
            found = "not installed"
        lines.append(f"  {name} {found}")
    lines.append(f"  python {sys.version.split()[0]}")
    return "\n".join(lines)


def _asks_for_help(argv: list[str]) -> bool:
    """``-h`` / ``--help`` among torchrun's own arguments (before the script, whose arguments are its own)."""
    for arg in argv:
        if arg in ("-h", "--help"):
            return True
        if arg in ("--", "-m", "--module", "--no-python", "--no_python") or arg.endswith(".py"):
            return False
    return False


def _bridged(original: Callable[[object], object], standalone_id: str | None) -> Callable[[object], object]:
    """torch's ``run(args)``, the run id settled and the bridge installed first (torch's arguments parsed: the run
    id is theirs)."""

    @functools.wraps(original)
    def run(args: Any) -> object:
        settle_run_id(args, standalone_id)
        install_for_run(args.rdzv_id, EARLY_BUILD_WAIT_SECONDS)
        try:
            return original(args)
        except BaseException as exc:
            tracebacks.drop_own_frame(exc)
            raise

    return run


if __name__ == "__main__":
    main()
