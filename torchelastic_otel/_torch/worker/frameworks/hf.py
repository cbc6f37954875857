"""Hugging Face ``transformers.Trainer``: its logged scalars as gauges, its train / evaluate / save as spans.

Once the script imports ``transformers.trainer`` (``transformers.Trainer`` does, lazily):

- ``Trainer.__init__`` is wrapped to append a ``TrainerCallback`` of the bridge's with ``Trainer.add_callback``
  (after the user's callbacks: their order is left alone). Its ``on_log`` hands every value of ``Trainer.log``'s
  dict (``loss``, ``learning_rate``, ``grad_norm``, ``epoch``, ``eval_*``, ``train_runtime``...) to ``instruments``
  with ``state.global_step``;
- ``Trainer.train`` and ``Trainer.evaluate`` (public) and ``Trainer._save_checkpoint`` (private: ``_compat``) are
  wrapped in the spans ``torchelastic.framework.train`` / ``.evaluate`` / ``.save``: a wrapper, not the callback
  events, so that a phase an exception ends gets its span too (status ERROR).

``uninstall()`` puts the methods back (``Patches``); a ``Trainer`` built meanwhile keeps its callback, which then
records nothing.
"""

from __future__ import annotations

from typing import Any

from torchelastic_otel import _compat
from torchelastic_otel import _names as names
from torchelastic_otel._torch import tracebacks
from torchelastic_otel._torch.patches import Patches
from torchelastic_otel._torch.worker.frameworks import instruments

__all__ = ["install", "MODULE", "FRAMEWORK"]

MODULE = "transformers.trainer"
FRAMEWORK = "hf"
#: Set while the integration is installed: a callback of a ``Trainer`` built before ``uninstall()`` stops.
_installed = [False]


def install(patches: Patches) -> None:
    from torchelastic_otel._torch import imports

    def hook(module: Any) -> None:
        _patch(patches, module)

    imports.when_imported(MODULE, hook)

    def undo() -> None:
        imports.cancel(MODULE, hook)
        _installed[0] = False

    patches.on_restore(undo)


def _patch(patches: Patches, module: Any) -> None:
    cls = getattr(module, "Trainer", None)
    callback_base = getattr(module, "TrainerCallback", None)
    if not isinstance(cls, type) or not isinstance(callback_base, type):
        _compat.fallback(f"{MODULE}.Trainer", "not defined")
        return
    init = cls.__dict__.get("__init__")
    if init is None or getattr(init, "__torchelastic_otel__", False):
        return
    _installed[0] = True
    patches.set(cls, "__init__", _wrap_init(init, _callback_class(callback_base)))
    for attribute, name in (("train", names.FRAMEWORK_TRAIN), ("evaluate", names.FRAMEWORK_EVALUATE)):
        original = cls.__dict__.get(attribute)
        if original is None:
            _compat.fallback(f"{MODULE}.Trainer.{attribute}", "not defined")
            continue
        patches.set(cls, attribute, instruments.phase_method(original, name, _attributes(attribute)))
    save = _compat.framework_method(cls, "_save_checkpoint")
    if save is not None:
        patches.set(cls, "_save_checkpoint", instruments.phase_method(save, names.FRAMEWORK_SAVE, _attributes("save")))


def _attributes(phase: str) -> Any:
    def attributes(trainer: Any, args: tuple, kwargs: dict) -> dict[str, Any]:
        found: dict[str, Any] = {names.FRAMEWORK: FRAMEWORK}
        step = getattr(getattr(trainer, "state", None), "global_step", None)
        if isinstance(step, int):
            found[names.FRAMEWORK_GLOBAL_STEP] = step
        if phase == "evaluate":
            prefix = kwargs.get("metric_key_prefix", args[2] if len(args) > 2 else "eval")
            found[names.FRAMEWORK_STAGE] = prefix if isinstance(prefix, str) else "eval"
        return found

    return attributes


def _wrap_init(original: Any, callback_class: type) -> Any:
    import functools

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        try:
            original(self, *args, **kwargs)
        except BaseException as exc:
            tracebacks.drop_own_frame(exc)
            raise
        try:
            self.add_callback(callback_class())
        except Exception as exc:
            instruments._dropped(exc)

    __init__.__torchelastic_otel__ = True  # type: ignore[attr-defined]
    return __init__


def _logged(state: Any, logs: Any) -> Any:
    """The log call's values: ``Trainer.log`` appends a copy of them to ``state.log_history`` before the callbacks
    run, and a callback before ours may have taken keys out of ``logs`` (``PrinterCallback`` pops ``total_flos``)."""
    history = getattr(state, "log_history", None)
    if history and isinstance(history[-1], dict) and history[-1].get("step") == getattr(state, "global_step", None):
        return {**logs, **history[-1]}
    return logs


def _callback_class(base: type) -> type:
    """The bridge's ``TrainerCallback`` (a subclass of the framework's, made once it is imported)."""

    class TorchelasticOtelCallback(base):
        """Every scalar ``Trainer.log`` produces becomes a ``torchelastic.framework.<key>`` gauge value."""

        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
            if _installed[0] and logs:
                instruments.record(FRAMEWORK, _logged(state, logs), getattr(state, "global_step", None))

    return TorchelasticOtelCallback
