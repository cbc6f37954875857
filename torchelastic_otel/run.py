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

from torchelastic_otel._run_id import renew_if_stale, settle_run_id
from torchelastic_otel._torch import tracebacks

__all__ = ["main"]


def _early_run_id(argv: list[str]) -> tuple[str | None, str | None]:
    """The run id as the arguments alone tell it, before torch (1-2 s to import) is: ``--rdzv-id`` as given, or a
    fresh uuid for ``--standalone`` (which :func:`settle_run_id` then uses); ``(None, None)`` where only torch's
    parser can tell. Returns ``(run id, the standalone uuid)``."""
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


#: How long the agent waits for its pipeline before it imports torch (the build takes ~0.2 s; a build still going
#: on after that goes on in its thread, and the records before it are kept for it).
EARLY_BUILD_WAIT_SECONDS = 2.0


def _build_early(run_id: str | None) -> None:
    """Build the agent's pipeline before torch is imported, where the run id its resource carries is known already
    (else ``install()`` builds it, once torch has parsed the arguments), so that the agent's first record, exit or
    signal finds it ready.

    Built in a thread of its own (a build that hangs holds the agent at most ``EARLY_BUILD_WAIT_SECONDS``) that the
    main thread waits for, not beside ``import torch``: both are CPU-bound Python under one GIL, and side by side
    they cost more than one after the other -- 0.40 s more than plain torchrun's start-up, against 0.20 s (and as
    much CPU again in lock hand-overs; medians of 8, measured on a 2-core machine)."""
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
    # The agent's resource reads the run id from the environment when the pipeline is built; a launcher called
    # in-process (in place of torch.distributed.run.main) then gets its environment back as it was.
    previous = os.environ.get("TORCHELASTIC_RUN_ID")
    try:
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
    finally:
        if previous is None:
            os.environ.pop("TORCHELASTIC_RUN_ID", None)
        else:
            os.environ["TORCHELASTIC_RUN_ID"] = previous


def _renew_if_stale(run_id: str | None) -> None:
    """The pipeline rebuilt where built for another run id (:func:`torchelastic_otel._run_id.renew_if_stale`)."""
    renew_if_stale(run_id, EARLY_BUILD_WAIT_SECONDS)


def _bridged(original: Callable[[Any], Any], standalone_id: str | None) -> Callable[[Any], Any]:
    """torch's ``run(args)``, the run id settled and the bridge installed first (torch's arguments parsed: the run
    id is theirs)."""

    @functools.wraps(original)
    def run(args: Any) -> Any:
        settle_run_id(args, standalone_id)
        if args.rdzv_id and args.rdzv_id != "none":
            os.environ["TORCHELASTIC_RUN_ID"] = args.rdzv_id
        _renew_if_stale(os.environ.get("TORCHELASTIC_RUN_ID"))
        from torchelastic_otel._install import install

        install()
        try:
            return original(args)
        except BaseException as exc:
            tracebacks.drop_own_frame(exc)
            raise

    return run


if __name__ == "__main__":
    main()
