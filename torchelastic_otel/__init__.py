"""torchelastic-otel: the OpenTelemetry bridge for PyTorch elastic (``torchrun``) jobs.

- :mod:`torchelastic_otel.events` and :mod:`torchelastic_otel.metrics`: drop-ins for torch's modules, with the
  "otel" event destination and :class:`~torchelastic_otel.metrics.OtelMetricHandler`;
- :func:`install` / :func:`uninstall`: bridge torch's own agent, rendezvous, events and metrics in this process;
- :func:`setup`, :func:`flush`, :func:`shutdown`: the exporter pipeline (configured from ``OTEL_*`` by default).
- :func:`step`: mark the end of a training step (a worker's optimizer steps mark them without it).

The names are imported on first use (PEP 562): every Python process a bridged worker starts imports a submodule of
this package at start-up (``_torch.worker_env``), and must not pay for OpenTelemetry's import to do so
(docs/performance.md, "Costs that shape the code").
"""

from torchelastic_otel.version import __version__

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (this module is imported at every start-up)
if TYPE_CHECKING:  # the names __getattr__ imports on first use, for type checkers
    from torchelastic_otel._install import install, is_installed, uninstall
    from torchelastic_otel._torch.worker.steps import step
    from torchelastic_otel.pipeline import flush, get_pipeline, setup, shutdown

__all__ = ["__version__", "install", "uninstall", "is_installed", "setup", "flush", "shutdown", "get_pipeline", "step"]

_HOMES = {
    "install": "torchelastic_otel._install",
    "uninstall": "torchelastic_otel._install",
    "is_installed": "torchelastic_otel._install",
    "setup": "torchelastic_otel.pipeline",
    "flush": "torchelastic_otel.pipeline",
    "shutdown": "torchelastic_otel.pipeline",
    "get_pipeline": "torchelastic_otel.pipeline",
    "step": "torchelastic_otel._torch.worker.steps",
}


def __getattr__(name: str) -> object:
    import importlib

    home = _HOMES.get(name)
    if home is not None:
        value = getattr(importlib.import_module(home), name)
        globals()[name] = value
        return value
    try:
        return importlib.import_module(f"{__name__}.{name}")  # a submodule not imported yet
    except ModuleNotFoundError as exc:
        if exc.name != f"{__name__}.{name}":
            raise
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
