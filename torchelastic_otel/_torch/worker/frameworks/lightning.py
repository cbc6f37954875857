"""Lightning's ``Trainer`` (``lightning.pytorch`` and the standalone ``pytorch_lightning``): what ``self.log`` /
``log_dict`` hand to the loggers as gauges, fit / validation / test / checkpoint saves as spans.

Once the script imports the trainer module, ``Trainer.__init__`` is wrapped; after it ran:

- a ``Logger`` of the bridge's is appended to ``trainer.loggers`` (after the user's: ``trainer.logger``, the first,
  and the directory ``ModelCheckpoint`` derives from it stay the user's). It receives what Lightning hands its
  loggers (every ``log_every_n_steps`` training steps, at the end of each validation / test epoch), on every rank;
- with ``logger=False`` (no loggers) no logger is added: one would change where ``ModelCheckpoint`` writes and what
  ``trainer.logger`` is. The values still arrive: the logger connector's ``log_metrics`` (private: ``_compat``),
  which returns at once when there are no loggers, hands them to the bridge's logger first. Users who turned
  Lightning's loggers off expect files and dashboards of their own to stay off, not their values to vanish from a
  telemetry backend they configured for the job;
- a ``Callback`` of the bridge's is appended to ``trainer.callbacks``: the validation and test loops (inside
  ``fit`` too, and the sanity check) become ``torchelastic.framework.evaluate`` spans, ended by ``on_exception``
  when one raises;
- ``Trainer.fit`` and ``Trainer.save_checkpoint`` (public; ``ModelCheckpoint`` saves through it) are wrapped in the
  spans ``torchelastic.framework.train`` and ``torchelastic.framework.save``.

The ``split`` of a value is the trainer's stage when it was logged (``trainer.state.stage``: ``train``,
``validate``, ``test``, ``sanity_check``). ``uninstall()`` puts the methods back; a trainer built meanwhile keeps
its logger and callback, which then record nothing.
"""

from __future__ import annotations

import functools
import sys
from typing import Any

from torchelastic_otel import _compat
from torchelastic_otel import _names as names
from torchelastic_otel._torch import tracebacks
from torchelastic_otel._torch.patches import Patches
from torchelastic_otel._torch.worker.frameworks import instruments

__all__ = ["install", "MODULES", "FRAMEWORK"]

#: The trainer modules of both distributions, and the package each belongs to.
MODULES = {
    "lightning.pytorch.trainer.trainer": "lightning.pytorch",
    "pytorch_lightning.trainer.trainer": "pytorch_lightning",
}
CONNECTOR = ".trainer.connectors.logger_connector.logger_connector"
FRAMEWORK = "lightning"
#: The attribute of a trainer that holds the bridge's logger (also where Lightning's loggers are off).
LOGGER_ATTRIBUTE = "_torchelastic_otel_logger"


_state = instruments.Integration()


def install(patches: Patches) -> None:
    _state.install(
        patches, {name: functools.partial(_patch, patches, package=package) for name, package in MODULES.items()}
    )


def _patch(patches: Patches, module: object, package: str) -> None:
    import importlib

    cls: Any = getattr(module, "Trainer", None)
    logger_base: Any = getattr(importlib.import_module(package + ".loggers"), "Logger", None)
    callback_base: Any = getattr(importlib.import_module(package + ".callbacks"), "Callback", None)
    if not all(isinstance(found, type) for found in (cls, logger_base, callback_base)):
        _compat.fallback(f"{package} Trainer / Logger / Callback", "not defined")
        return
    attach = functools.partial(_attach, _logger_class(logger_base), _callback_class(callback_base))
    phases = (("fit", names.FRAMEWORK_TRAIN, _attributes), ("save_checkpoint", names.FRAMEWORK_SAVE, _attributes))
    if not _state.patch_trainer(patches, cls, f"{package}.Trainer", attach, phases):
        return
    _patch_connector(patches, package)


def _patch_connector(patches: Patches, package: str) -> None:
    """Where the trainer has no loggers, the connector's ``log_metrics`` returns before any logger sees a value:
    the bridge's logger hears them first."""
    connector_module = sys.modules.get(package + CONNECTOR)
    cls = getattr(connector_module, "_LoggerConnector", None)
    original = _compat.framework_method(cls, "log_metrics") if cls is not None else None
    if original is None:
        if cls is None:
            _compat.fallback(f"{package}{CONNECTOR}._LoggerConnector", "not defined")
        return
    if getattr(original, "__torchelastic_otel__", False):
        return

    @functools.wraps(original)
    def log_metrics(self: object, metrics: Any, step: object = None) -> object:
        try:
            trainer: Any = getattr(self, "trainer", None)
            own = getattr(trainer, LOGGER_ATTRIBUTE, None)
            if own is not None and metrics and not trainer.loggers:
                scalars = {key: instruments.scalar(value) for key, value in metrics.items()}  # tensors: here
                own.log_metrics(scalars, step)
        except Exception as exc:
            instruments.dropped(exc)
        try:
            return original(self, metrics, step)
        except BaseException as exc:
            tracebacks.drop_own_frame(exc)
            raise

    log_metrics.__torchelastic_otel__ = True  # type: ignore[attr-defined]
    patches.set(cls, "log_metrics", log_metrics)


def _stage(trainer: object) -> str | None:
    stage = getattr(getattr(trainer, "state", None), "stage", None)
    value = getattr(stage, "value", stage)
    return value if isinstance(value, str) else None


def _attributes(trainer: object, args: tuple = (), kwargs: dict | None = None) -> dict[str, object]:
    found: dict[str, object] = {names.FRAMEWORK: FRAMEWORK}
    step = getattr(trainer, "global_step", None)
    if isinstance(step, int):
        found[names.FRAMEWORK_GLOBAL_STEP] = step
    return found


def _attach(logger_class: type, callback_class: type, trainer: Any) -> None:
    """The bridge's logger (also where the trainer has none: ``LOGGER_ATTRIBUTE``) and callback on ``trainer``."""
    own = logger_class(trainer)
    setattr(trainer, LOGGER_ATTRIBUTE, own)
    if trainer.loggers:
        trainer.loggers = [*trainer.loggers, own]
    trainer.callbacks.append(callback_class())


def _logger_class(base: type) -> type:
    """The bridge's ``Logger`` (a subclass of the framework's, made once it is imported)."""

    class TorchelasticOtelLogger(base):
        """Every scalar the trainer logs becomes a ``torchelastic.framework.<key>`` gauge value (all ranks)."""

        def __init__(self, trainer: object) -> None:
            super().__init__()
            self._trainer = trainer

        @property
        def name(self) -> str:
            return "torchelastic_otel"

        @property
        def version(self) -> str:
            return "0"

        def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
            if _state.installed and metrics:
                # the trainer's global_step (optimizer steps), as HF's: Lightning hands its loggers the batches
                # that stepped before this one instead (one less at a training log)
                global_step = getattr(self._trainer, "global_step", None)
                instruments.record(
                    FRAMEWORK, metrics, global_step if isinstance(global_step, int) else step, _stage(self._trainer)
                )

        def log_hyperparams(self, *args: object, **kwargs: object) -> None:
            pass

    return TorchelasticOtelLogger


def _callback_class(base: type) -> type:
    """The bridge's ``Callback``: the validation and test loops as spans."""

    class TorchelasticOtelCallback(base):
        def __init__(self) -> None:
            super().__init__()
            self._tokens: list[int] = []

        def _begin(self, trainer: object) -> None:
            if _state.installed:
                attributes = _attributes(trainer)
                attributes[names.FRAMEWORK_STAGE] = _stage(trainer) or "validate"
                self._tokens.append(instruments.begin(names.FRAMEWORK_EVALUATE, attributes))

        def _end(self, error: BaseException | None = None) -> None:
            if self._tokens:
                instruments.end(self._tokens.pop(), error)

        def on_validation_start(self, trainer: object, pl_module: object) -> None:
            self._begin(trainer)

        def on_validation_end(self, trainer: object, pl_module: object) -> None:
            self._end()

        def on_test_start(self, trainer: object, pl_module: object) -> None:
            self._begin(trainer)

        def on_test_end(self, trainer: object, pl_module: object) -> None:
            self._end()

        def on_exception(self, trainer: object, pl_module: object, exception: BaseException) -> None:
            while self._tokens:
                self._end(exception)

    return TorchelasticOtelCallback
