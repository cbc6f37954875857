"""``torchelastic-otel accelerate launch ...``: Hugging Face ``accelerate launch`` with the bridge installed.

Takes exactly ``accelerate``'s arguments. ``accelerate launch`` runs torch's launcher in its own process where it
launches through torch (``--multi_gpu``, ``--use_fsdp``, Megatron-LM; on a CPU-only machine ``--multi_gpu`` with
``ACCELERATE_USE_CPU=1``): it builds torchrun's arguments and calls ``torch.distributed.run.run(args)``. This
route installs the bridge when that call comes, once torch's arguments are known, and gives the run an id first:

- ``--standalone`` (which accelerate picks itself when its port is taken) and torchrun's other defaults, as
  ``torchelastic-otel run`` does (:func:`torchelastic_otel._run_id.settle_run_id`);
- a single machine's static rendezvous (accelerate's default) a fresh uuid in place of torch's ``none``: its run id
  only prefixes the agent's own store, and ``none`` would be every such job's run id.

The agent's resource then carries ``torchelastic.run_id`` like the workers' do; the workers are bridged at
start-up through ``PYTHONPATH`` as under ``torchelastic-otel run``. Launches that never reach torch's launcher
(accelerate's simple launcher for one process, ``--cpu``, ``mpirun``; DeepSpeed's, TPU and SageMaker launchers) run
unbridged, as do accelerate's other commands. The launching process's ``os.environ`` is left as it was.
"""

from __future__ import annotations

import functools
import logging
import sys
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from torchelastic_otel._torch import tracebacks

__all__ = ["main"]

_logger = logging.getLogger("torchelastic_otel")

#: How long the launch waits for a pipeline still being built for another run id before it rebuilds it.
PIPELINE_WAIT_SECONDS = 2.0


def _single_machine(args: Any) -> bool:
    """Whether torch's arguments name one node at most (``--nnodes 1`` or ``1:1``)."""
    from torch.distributed.run import parse_min_max_nnodes

    try:
        return bool(parse_min_max_nnodes(str(args.nnodes))[1] == 1)
    except (TypeError, ValueError):
        return False


def settle_run_id(args: Any) -> str | None:
    """Give the run its id before torch starts it (see the module's docstring); the id, or ``None`` where torch
    leaves it ``none`` (a static rendezvous across machines: every node must name the same run)."""
    from torchelastic_otel._run_id import settle_run_id as settle_as_torchrun

    settle_as_torchrun(args)
    if args.rdzv_backend == "static" and args.rdzv_id in ("", "none") and _single_machine(args):
        args.rdzv_id = str(uuid.uuid4())
    return args.rdzv_id if args.rdzv_id and args.rdzv_id != "none" else None


def _bridge(args: object) -> None:
    """Settle the run id and install the bridge, before torch starts the run."""
    from torchelastic_otel._run_id import install_for_run

    install_for_run(settle_run_id(args), PIPELINE_WAIT_SECONDS)


def _bridged(original: Callable[[object], object]) -> Callable[[object], object]:
    """torch's ``run(args)`` as accelerate calls it, bridged first; where bridging fails (logged), the job runs
    unbridged, never failed by it."""

    @functools.wraps(original)
    def run(args: object) -> object:
        try:
            _bridge(args)
        except Exception as exc:
            _logger.warning("torchelastic_otel: accelerate launch runs unbridged: %s", exc, exc_info=True)
        try:
            return original(args)
        except BaseException as exc:
            tracebacks.drop_own_frame(exc)
            raise

    return run


@contextmanager
def _torch_run_bridged() -> Iterator[None]:
    """``torch.distributed.run.run`` bridged while accelerate runs (it looks the function up on the module at the
    call), then torch's own again; ``TORCHELASTIC_RUN_ID`` back as it was."""
    from torch.distributed import run as torchrun

    from torchelastic_otel._run_id import RunIdKept

    original = torchrun.run
    torchrun.run = _bridged(original)
    try:
        with RunIdKept():
            yield
    finally:
        torchrun.run = original


def main(argv: list[str]) -> None:
    """Run ``accelerate <argv>`` as the ``accelerate`` command would, ``launch`` bridged; its exit is accelerate's
    (an exception, ``SystemExit``, or returning), and a traceback accelerate's (without this module's frames:
    ``_torch.tracebacks``)."""
    try:
        from accelerate.commands.accelerate_cli import main as accelerate_main
    except ImportError as exc:
        sys.exit(f"torchelastic-otel accelerate: accelerate is not installed ({exc})")
    saved_argv = sys.argv
    sys.argv = ["accelerate", *argv]  # accelerate's CLI parses sys.argv
    try:
        if argv and argv[0] == "launch":
            with _torch_run_bridged():
                accelerate_main()
        else:
            accelerate_main()
    except BaseException as exc:
        tracebacks.drop_own_frame(exc)
        raise
    finally:
        sys.argv = saved_argv
