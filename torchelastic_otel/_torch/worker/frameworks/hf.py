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

import functools
from typing import Any

from torchelastic_otel import _compat
from torchelastic_otel import _names as names
from torchelastic_otel._torch.patches import Patches
from torchelastic_otel._torch.worker.frameworks import instruments

__all__ = ["install", "MODULE", "FRAMEWORK"]

MODULE = "transformers.trainer"
FRAMEWORK = "hf"


_state = instruments.Integration()


def install(patches: Patches) -> None:
    _state.install(patches, {MODULE: functools.partial(_patch, patches)})


def _patch(patches: Patches, module: object) -> None:
    cls = getattr(module, "Trainer", None)
    callback_base = getattr(module, "TrainerCallback", None)
    if not isinstance(cls, type) or not isinstance(callback_base, type):
        _compat.fallback(f"{MODULE}.Trainer", "not defined")
        return
    callback_class = _callback_class(callback_base)

    def attach(trainer: Any) -> None:
        trainer.add_callback(callback_class())

    phases = (
        ("train", names.FRAMEWORK_TRAIN, _attributes("train")),
        ("evaluate", names.FRAMEWORK_EVALUATE, _attributes("evaluate")),
    )
    if not _state.patch_trainer(patches, cls, f"{MODULE}.Trainer", attach, phases):
        return
    save = _compat.framework_method(cls, "_save_checkpoint")
    if save is not None:
        patches.set(cls, "_save_checkpoint", instruments.phase_method(save, names.FRAMEWORK_SAVE, _attributes("save")))


def _attributes(phase: str) -> instruments.Attributes:
    def attributes(trainer: object, args: tuple, kwargs: dict) -> dict[str, object]:
        found: dict[str, object] = {names.FRAMEWORK: FRAMEWORK}
        step = getattr(getattr(trainer, "state", None), "global_step", None)
        if isinstance(step, int):
            found[names.FRAMEWORK_GLOBAL_STEP] = step
        if phase == "evaluate":
            prefix = kwargs.get("metric_key_prefix", args[2] if len(args) > 2 else "eval")
            found[names.FRAMEWORK_STAGE] = prefix if isinstance(prefix, str) else "eval"
        return found

    return attributes


def _logged(state: object, logs: Any) -> Any:
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

        def on_log(self, args: object, state: object, control: object, logs: object = None, **kwargs: object) -> None:
            if _state.installed and logs:
                instruments.record(FRAMEWORK, _logged(state, logs), getattr(state, "global_step", None))

    return TorchelasticOtelCallback
