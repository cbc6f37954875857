"""Installs the torchelastic-otel bridge at interpreter start-up in processes started by a bridged agent.

The agent puts this directory on ``PYTHONPATH`` and sets ``TORCHELASTIC_OTEL_AUTO_INSTALL=1`` for its workers.
Only one ``sitecustomize`` module is ever imported, so after installing, this one runs the next ``sitecustomize``
found on ``sys.path`` (an application's or ``opentelemetry-instrument``'s). Before all of that, a torchrun worker's
stdout and stderr start being captured (``torchelastic_otel._torch.output``): everything that prints at start-up,
torch's import included, is captured, and the process that carries the output is forked before any thread runs.
It never raises.
"""

import importlib.util
import os
import sys


def _capture_output() -> None:
    if os.environ.get("TORCHELASTIC_OTEL_AUTO_INSTALL") != "1":
        return
    try:
        from torchelastic_otel._torch import output

        output.start()
    except Exception as exc:  # the worker must start regardless, its output untouched
        sys.stderr.write(f"torchelastic_otel: worker output not captured: {exc}\n")


def _install() -> None:
    if os.environ.get("TORCHELASTIC_OTEL_AUTO_INSTALL") != "1":
        return
    try:
        import torchelastic_otel

        torchelastic_otel.install()
    except Exception as exc:  # the worker must start regardless
        sys.stderr.write(f"torchelastic_otel: bridge not installed in this worker: {exc}\n")


def _next_sitecustomize() -> "str | None":
    here = os.path.dirname(os.path.abspath(__file__))
    for entry in sys.path:
        if not entry or os.path.abspath(entry) == here:
            continue
        candidate = os.path.join(entry, "sitecustomize.py")
        if os.path.isfile(candidate):
            return candidate
    return None


def _chain(candidate: "str | None") -> None:
    if candidate is None:
        return
    spec = importlib.util.spec_from_file_location("_torchelastic_otel_chained_sitecustomize", candidate)
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        try:
            spec.loader.exec_module(module)
        except Exception as exc:
            sys.stderr.write(f"torchelastic_otel: chained sitecustomize {candidate} failed: {exc}\n")


_capture_output()
_install()
_chain(_next_sitecustomize())
