"""Installs the torchelastic-otel bridge at interpreter start-up in processes started by a bridged agent.

The agent puts this directory on ``PYTHONPATH`` and sets ``TORCHELASTIC_OTEL_AUTO_INSTALL=1`` for its workers.
Only one ``sitecustomize`` module is ever imported, so after installing, this one runs the next ``sitecustomize``
found on ``sys.path`` (an application's or ``opentelemetry-instrument``'s). It never raises.
"""

import importlib.util
import os
import sys


def _install() -> None:
    if os.environ.get("TORCHELASTIC_OTEL_AUTO_INSTALL") != "1":
        return
    try:
        import torchelastic_otel

        torchelastic_otel.install()
    except Exception as exc:  # the worker must start regardless
        sys.stderr.write(f"torchelastic_otel: bridge not installed in this worker: {exc}\n")


def _chain() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    for entry in sys.path:
        if not entry or os.path.abspath(entry) == here:
            continue
        candidate = os.path.join(entry, "sitecustomize.py")
        if os.path.isfile(candidate):
            spec = importlib.util.spec_from_file_location("_torchelastic_otel_chained_sitecustomize", candidate)
            if spec is not None and spec.loader is not None:
                module = importlib.util.module_from_spec(spec)
                try:
                    spec.loader.exec_module(module)
                except Exception as exc:
                    sys.stderr.write(f"torchelastic_otel: chained sitecustomize {candidate} failed: {exc}\n")
            return


_install()
_chain()
