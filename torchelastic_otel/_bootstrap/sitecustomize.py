"""Sets up the torchelastic-otel bridge at interpreter start-up in processes started by a bridged agent.

The agent puts this directory on ``PYTHONPATH`` and sets ``TORCHELASTIC_OTEL_AUTO_INSTALL=1`` for its workers.
Every Python process that inherits that environment runs this module: the worker torchrun started, and whatever
it starts (``subprocess`` of ``sys.executable``, spawned ``multiprocessing`` pools and DataLoader workers, ...).
``_torch.worker_env`` tells them apart (and documents how: the first bridged Python process marks itself):

- **the worker**: its stdout and stderr start being captured first (``_torch.output.capture``: everything that prints at
  start-up, torch's import included, is captured, and the processes that carry the output are forked before any
  thread runs); then the bridge is installed (``torchelastic_otel.install()``), which imports neither torch nor the
  OpenTelemetry SDK in this thread: torch's modules are bridged when the script imports them, the exporters are
  built beside the script's start-up.
- **any other process** (a descendant of the worker, or one that just inherited the environment): only two
  post-import hooks are registered (``worker_env.join_lazily``): a few milliseconds, no torch, no OpenTelemetry,
  no output capture (its fds are its worker's, captured already), no exit path. It joins its worker's trace and
  builds a pipeline only if it records through the bridge or imports torch's elastic events or metrics.

Only one ``sitecustomize`` module is ever imported, so this one then runs the next ``sitecustomize`` found on
``sys.path`` (an application's, or ``opentelemetry-instrument``'s). When that is OpenTelemetry's
auto-instrumentation (``opentelemetry-instrument torchrun``: its instrumentor keeps this directory in front of its
own, see ``torchelastic_otel.instrumentation``), a worker's output capture starts here, before OpenTelemetry's
configurator starts its exporter threads, and the bridge is installed by its instrumentor, with the providers
its distro configured (here only if that did not happen).

It never raises: whatever fails, the process starts as without the bridge.
"""

import os
import sys

#: ``_settings.AUTO_INSTALL``, spelled out: this file runs in every Python the workers start, also one where the
#: package cannot be imported, and must decide without it (tests/unit hold the two names together).
_AUTO_INSTALL_ENV = "TORCHELASTIC_OTEL_AUTO_INSTALL"
_AUTO_INSTRUMENTATION = os.path.join("opentelemetry", "instrumentation", "auto_instrumentation", "sitecustomize.py")


def _warn(what: str, exc: BaseException) -> None:
    try:
        sys.stderr.write(f"torchelastic_otel: {what}: {exc}\n")
    except Exception:
        pass


def _role() -> "str | None":
    """This process's role (``worker_env.claim``); ``None`` where the bridge is not asked for or unavailable."""
    if os.environ.get(_AUTO_INSTALL_ENV) != "1":
        return None
    try:
        from torchelastic_otel._torch import worker_env

        return worker_env.claim()
    except Exception as exc:
        _warn("bridge not set up in this process", exc)
        return None


def _capture_output() -> None:
    try:
        from torchelastic_otel._torch.output import capture as output

        output.start()
    except Exception as exc:  # the worker must start regardless, its output untouched
        _warn("worker output not captured", exc)


def _install(only_if_not_installed: bool = False) -> None:
    try:
        import torchelastic_otel

        if only_if_not_installed and torchelastic_otel.is_installed():
            return
        torchelastic_otel.install()
    except Exception as exc:  # the worker must start regardless
        _warn("bridge not installed in this worker", exc)


def _join_lazily() -> None:
    try:
        from torchelastic_otel._torch import worker_env

        worker_env.join_lazily()
    except Exception as exc:
        _warn("bridge hooks not set up in this process", exc)


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
    import importlib.util

    spec = importlib.util.spec_from_file_location("_torchelastic_otel_chained_sitecustomize", candidate)
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        try:
            spec.loader.exec_module(module)
        except Exception as exc:
            _warn(f"chained sitecustomize {candidate} failed", exc)


def _main() -> None:
    role = _role()
    following = _next_sitecustomize()
    if role == "worker":
        _capture_output()
        if following is not None and following.endswith(_AUTO_INSTRUMENTATION):
            _chain(following)  # OpenTelemetry's initialize() installs the bridge through its instrumentor
            _install(only_if_not_installed=True)
            return
        _install()
    elif role is not None:
        _join_lazily()
    _chain(following)


_main()
