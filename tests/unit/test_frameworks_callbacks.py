"""The framework integrations (``_torch.worker.frameworks``), in this process: a tiny Hugging Face ``Trainer`` and a
tiny Lightning ``Trainer`` (CPU, random data, a few steps) train for real with the integration installed on a
``Patches`` (undone after each test); the SDK is real (in-memory exporters, ``conftest.otel``). The expected values
are what the framework itself recorded (``state.log_history``) or what the user's own module logged, never the
bridge's. The 2-rank jobs with a restart are ``tests/jobs/test_framework_metrics.py``.
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from torchelastic_otel import _names as names
from torchelastic_otel import _selftelemetry as selftelemetry
from torchelastic_otel._torch.patches import Patches
from torchelastic_otel._torch.worker import frameworks
from torchelastic_otel._torch.worker.frameworks import instruments

torch = pytest.importorskip("torch")

from tests.support.lazy import lazy  # noqa: E402
from tests.support.tiny_models import Regression, regression_rows  # noqa: E402  (torch first, or skip)

transformers = lazy("transformers")
pl = lazy("lightning.pytorch")

STATUS_ERROR = "ERROR"


@pytest.fixture
def installed(otel: Any, frameworks_installed: Any) -> Any:
    """The in-memory pipeline, the frameworks' instrumentation installed."""
    return otel


def _gauges(otel: Any) -> dict[str, list[tuple[dict, float]]]:
    """Every ``torchelastic.framework.*`` gauge of one collection: name -> [(attributes, value)]."""
    instruments.drain()
    found: dict[str, list[tuple[dict, float]]] = {}
    data = otel.reader.get_metrics_data()
    for resource_metrics in data.resource_metrics:
        for scope_metrics in resource_metrics.scope_metrics:
            for metric in scope_metrics.metrics:
                if metric.name.startswith(names.FRAMEWORK_METRIC_PREFIX):
                    found[metric.name] = [(dict(p.attributes), p.value) for p in metric.data.data_points]
    return found


def _spans(otel: Any, name: str | None = None) -> list[Any]:
    instruments.drain()
    found = [s for s in otel.spans.get_finished_spans() if name is None or s.name == name]
    return sorted(found, key=lambda s: s.start_time)


# ---- Hugging Face ---------------------------------------------------------------------------------------------------


def _hf_trainer(tmp_path: Path, **overrides: Any) -> Any:
    torch.manual_seed(0)
    arguments: dict[str, Any] = dict(
        output_dir=str(tmp_path / "hf"), max_steps=6, per_device_train_batch_size=4, per_device_eval_batch_size=4,
        learning_rate=1e-2, logging_steps=2, save_steps=3, eval_strategy="steps", eval_steps=3, report_to=[],
        use_cpu=True, disable_tqdm=True, dataloader_num_workers=0,
    )  # fmt: skip
    arguments.update(overrides)
    args = transformers.TrainingArguments(**arguments)
    return transformers.Trainer(model=Regression(), args=args, train_dataset=regression_rows(64),
                                eval_dataset=regression_rows(8))  # fmt: skip


def _last_logged(log_history: list[dict[str, Any]]) -> dict[str, float]:
    """The last value the ``Trainer`` logged under each key (a gauge keeps the last value)."""
    last: dict[str, float] = {}
    for entry in log_history:
        for key, value in entry.items():
            if key != "step" and isinstance(value, (int, float)):
                last[key] = float(value)
    return last


def test_hf_every_logged_scalar_is_a_gauge_equal_to_the_trainers_log_history(installed: Any, tmp_path: Path) -> None:
    trainer = _hf_trainer(tmp_path)
    seen: list[dict[str, list[tuple[dict, float]]]] = []

    class Probe(transformers.TrainerCallback):  # type: ignore[misc]
        """Reads the gauges after each log call (added after the bridge's: its on_log ran first)."""

        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
            seen.append(_gauges(installed))

    trainer.add_callback(Probe())
    trainer.train()
    history = trainer.state.log_history
    assert len(seen) == len(history) >= 4, history  # 3 training logs, 2 evaluations, the summary
    # after each log call, each of its scalars is the gauge's value
    for entry, gauges in zip(history, seen, strict=True):
        for key, value in entry.items():
            if key == "step":
                continue
            points = gauges[instruments.metric_name(key)]  # type: ignore[index]
            (attrs,) = [a for a, v in points if v == pytest.approx(float(value), rel=1e-9)]
            assert attrs[names.FRAMEWORK] == "hf", attrs
            assert attrs[names.SPLIT] == ("eval" if key.startswith("eval_") else "train"), (key, attrs)
        (step,) = gauges[names.FRAMEWORK_STEP]
        assert step[1] == entry["step"], (entry, step)
    final = _gauges(installed)
    for key, value in _last_logged(history).items():
        assert [v for _, v in final[instruments.metric_name(key)]] == [pytest.approx(value)], key  # type: ignore[index]
    assert {"torchelastic.framework.loss", "torchelastic.framework.eval_loss",
            "torchelastic.framework.train_runtime", "torchelastic.framework.learning_rate"} <= set(final)  # fmt: skip


def test_hf_units_follow_the_keys(installed: Any, tmp_path: Path) -> None:
    _hf_trainer(tmp_path).train()
    instruments.drain()
    units = {}
    for resource_metrics in installed.reader.get_metrics_data().resource_metrics:
        for scope_metrics in resource_metrics.scope_metrics:
            units.update({m.name: m.unit for m in scope_metrics.metrics})
    assert units["torchelastic.framework.train_runtime"] == "s"
    assert units["torchelastic.framework.eval_runtime"] == "s"
    assert units["torchelastic.framework.epoch"] == "{epoch}"
    assert units["torchelastic.framework.loss"] == ""
    assert units[names.FRAMEWORK_STEP] == "{step}"


def test_hf_train_evaluate_and_save_are_spans_nested_in_train(installed: Any, tmp_path: Path) -> None:
    trainer = _hf_trainer(tmp_path)
    trainer.train()
    (train,) = _spans(installed, names.FRAMEWORK_TRAIN)
    evaluations = _spans(installed, names.FRAMEWORK_EVALUATE)
    saves = _spans(installed, names.FRAMEWORK_SAVE)
    assert [s.attributes[names.FRAMEWORK_GLOBAL_STEP] for s in evaluations] == [3, 6]
    assert [s.attributes[names.FRAMEWORK_GLOBAL_STEP] for s in saves] == [3, 6]
    assert sorted(p.name for p in (tmp_path / "hf").iterdir()) == ["checkpoint-3", "checkpoint-6"]
    for span in [*evaluations, *saves]:
        assert span.parent is not None and span.parent.span_id == train.context.span_id, span
        assert span.context.trace_id == train.context.trace_id
        assert train.start_time <= span.start_time <= span.end_time <= train.end_time
        assert span.attributes[names.FRAMEWORK] == "hf"
    assert all(s.attributes[names.FRAMEWORK_STAGE] == "eval" for s in evaluations)
    assert train.status.status_code.name != STATUS_ERROR


def test_hf_a_train_that_raises_ends_its_spans_with_error(installed: Any, tmp_path: Path) -> None:
    trainer = _hf_trainer(tmp_path, eval_strategy="no", save_strategy="no")

    class Boom(transformers.TrainerCallback):  # type: ignore[misc]
        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if state.global_step == 3:
                raise RuntimeError("boom at 3")

    trainer.add_callback(Boom())
    with pytest.raises(RuntimeError, match="boom at 3"):
        trainer.train()
    (train,) = _spans(installed, names.FRAMEWORK_TRAIN)
    assert train.status.status_code.name == STATUS_ERROR and "boom at 3" in train.status.description
    assert instruments.open_tokens() == []


def test_the_users_callbacks_keep_their_order_and_ours_comes_last(installed: Any, tmp_path: Path) -> None:
    class Mine(transformers.TrainerCallback):  # type: ignore[misc]
        pass

    torch.manual_seed(0)
    args = transformers.TrainingArguments(output_dir=str(tmp_path / "o"), report_to=[], use_cpu=True)
    trainer = transformers.Trainer(model=Regression(), args=args, callbacks=[Mine()])
    plain = [type(c).__name__ for c in trainer.callback_handler.callbacks]
    assert plain[-1] == "TorchelasticOtelCallback"
    assert plain.index("Mine") < plain.index("TorchelasticOtelCallback")


# ---- Lightning ------------------------------------------------------------------------------------------------------


@functools.cache
def _module_class() -> type:
    """The LightningModule the tests train (a class of Lightning's, so made at first use: the file imports nothing of
    Lightning at collection)."""

    class _Module(pl.LightningModule):  # type: ignore[misc]
        """Logs its training loss every step (Lightning hands it to the loggers every ``log_every_n_steps``) and its
        validation loss per epoch; keeps what it logged (the ground truth)."""

        def __init__(self) -> None:
            super().__init__()
            self.linear = torch.nn.Linear(4, 1)
            self.logged: list[tuple[int, float]] = []

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            loss = torch.nn.functional.mse_loss(self.linear(batch[0]), batch[1])
            self.log("train_loss", loss)
            self.logged.append((self.global_step, float(loss.item())))
            return loss

        def validation_step(self, batch: Any, batch_idx: int) -> None:
            self.log("val_loss", torch.nn.functional.mse_loss(self.linear(batch[0]), batch[1]))

        def test_step(self, batch: Any, batch_idx: int) -> None:
            self.log("test_loss", torch.nn.functional.mse_loss(self.linear(batch[0]), batch[1]))

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.1)

        def _loader(self) -> Any:
            generator = torch.Generator().manual_seed(0)
            data = torch.utils.data.TensorDataset(
                torch.randn(64, 4, generator=generator), torch.randn(64, 1, generator=generator)
            )
            return torch.utils.data.DataLoader(data, batch_size=4)

        def train_dataloader(self) -> Any:
            return self._loader()

        def val_dataloader(self) -> Any:
            return self._loader()

    return _Module


def _lightning(tmp_path: Path, **overrides: Any) -> Any:
    arguments: dict[str, Any] = dict(
        accelerator="cpu", devices=1, max_steps=6, log_every_n_steps=2, val_check_interval=3, limit_val_batches=2,
        num_sanity_val_steps=0, enable_progress_bar=False, enable_model_summary=False, logger=False,
        enable_checkpointing=False, default_root_dir=str(tmp_path),
    )  # fmt: skip
    arguments.update(overrides)
    return pl.Trainer(**arguments)


@pytest.fixture(autouse=True)
def _lightning_quietly() -> Iterator[None]:
    level = logging.getLogger("lightning.pytorch").level
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    yield
    logging.getLogger("lightning.pytorch").setLevel(level)


@pytest.mark.parametrize("logger", ["off", "csv"])
def test_lightning_logged_values_are_gauges_with_or_without_loggers(
    installed: Any, tmp_path: Path, logger: str
) -> None:
    """``logger=False``: the values still arrive; a CSV logger: it stays the trainer's first logger and gets the
    same values as the bridge."""
    overrides: dict[str, Any] = {}
    if logger == "csv":
        overrides["logger"] = pl.loggers.CSVLogger(str(tmp_path / "csv"))
    trainer = _lightning(tmp_path, **overrides)
    module = _module_class()()
    trainer.fit(module)
    final = _gauges(installed)
    # Lightning hands the loggers the loss of every second batch (log_every_n_steps=2): batches 1, 3, 5
    (point,) = final["torchelastic.framework.train_loss"]
    assert point[1] == pytest.approx(module.logged[5][1], rel=1e-6), (point, module.logged)
    assert point[0] == {names.FRAMEWORK: "lightning", names.SPLIT: "train"}
    (val,) = final["torchelastic.framework.val_loss"]
    assert val[0][names.SPLIT] == "validate"
    assert val[1] == pytest.approx(float(trainer.callback_metrics["val_loss"]), rel=1e-6)
    assert [v for _, v in final[names.FRAMEWORK_STEP]] == [6]
    if logger == "csv":
        assert type(trainer.logger).__name__ == "CSVLogger"
        assert [type(x).__name__ for x in trainer.loggers] == ["CSVLogger", "TorchelasticOtelLogger"]
        assert trainer.logged_metrics["train_loss"] == pytest.approx(point[1])
    else:
        assert trainer.logger is None and trainer.loggers == []


def test_lightning_fit_validation_and_saves_are_spans(installed: Any, tmp_path: Path) -> None:
    checkpoint = pl.callbacks.ModelCheckpoint(dirpath=str(tmp_path / "ckpt"), every_n_train_steps=3, save_top_k=-1)
    trainer = _lightning(tmp_path, enable_checkpointing=True, callbacks=[checkpoint], num_sanity_val_steps=1)
    trainer.fit(_module_class()())
    (fit,) = _spans(installed, names.FRAMEWORK_TRAIN)
    evaluations = _spans(installed, names.FRAMEWORK_EVALUATE)
    saves = _spans(installed, names.FRAMEWORK_SAVE)
    assert [s.attributes[names.FRAMEWORK_STAGE] for s in evaluations] == ["sanity_check", "validate", "validate"]
    assert len(saves) == len(list((tmp_path / "ckpt").iterdir())) >= 2
    for span in [*evaluations, *saves]:
        assert span.parent is not None and span.parent.span_id == fit.context.span_id, span
        assert fit.start_time <= span.start_time <= span.end_time <= fit.end_time
    trainer.test(_module_class()(), dataloaders=_module_class()()._loader(), verbose=False)
    (test,) = [s for s in _spans(installed, names.FRAMEWORK_EVALUATE) if s.attributes[names.FRAMEWORK_STAGE] == "test"]
    assert test.parent is None or test.parent.span_id != fit.context.span_id  # after fit: not inside it
    (tested,) = _gauges(installed)["torchelastic.framework.test_loss"]
    assert tested[0][names.SPLIT] == "test"


# ---- bad values, bounded keys, the setting, uninstall --------------------------------------------------------------


def test_non_scalar_and_non_finite_values_are_skipped_and_counted(installed: Any) -> None:
    before_nan = selftelemetry.total(selftelemetry.DROPPED, "metrics", "framework_non_finite")
    before_text = selftelemetry.total(selftelemetry.DROPPED, "metrics", "framework_non_scalar")
    instruments.record("hf", {"loss": 1.5, "bad": math.nan, "worse": math.inf, "text": "x", "many": [1, 2],
                              "flag": True, "t": torch.tensor(2.5), "v": torch.ones(3)}, 7)  # fmt: skip
    gauges = _gauges(installed)
    assert [v for _, v in gauges["torchelastic.framework.loss"]] == [1.5]
    assert [v for _, v in gauges["torchelastic.framework.t"]] == [2.5]
    for skipped in ("bad", "worse", "text", "many", "flag", "v"):
        assert f"torchelastic.framework.{skipped}" not in gauges
    assert selftelemetry.total(selftelemetry.DROPPED, "metrics", "framework_non_finite") - before_nan == 2
    assert selftelemetry.total(selftelemetry.DROPPED, "metrics", "framework_non_scalar") - before_text == 4


def test_keys_are_sanitized_and_their_number_is_bounded(installed: Any) -> None:
    assert instruments.metric_name("val/loss") == "torchelastic.framework.val_loss"
    assert instruments.metric_name("eval loss (%)") == "torchelastic.framework.eval_loss"
    assert instruments.metric_name("0acc") == "torchelastic.framework.k_0acc"
    assert instruments.metric_name("//") is None
    before = selftelemetry.total(selftelemetry.DROPPED, "metrics", "framework_key_limit")
    instruments.record("lightning", {f"key_{i}": float(i) for i in range(instruments.MAX_KEYS + 20)}, 1)
    gauges = _gauges(installed)
    assert len([n for n in gauges if n != names.FRAMEWORK_STEP]) == instruments.MAX_KEYS
    assert selftelemetry.total(selftelemetry.DROPPED, "metrics", "framework_key_limit") - before == 20


def test_the_setting_turns_it_off_and_uninstall_restores_the_frameworks(
    otel: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    originals = {
        (cls, name): cls.__dict__[name]
        for cls, attributes in ((transformers.Trainer, ("__init__", "train", "evaluate", "_save_checkpoint")),
                                (pl.Trainer, ("__init__", "fit", "save_checkpoint")))
        for name in attributes
    }  # fmt: skip
    monkeypatch.setenv("TORCHELASTIC_OTEL_FRAMEWORKS", "0")
    patches = Patches()
    frameworks.install(patches)
    assert len(patches) == 0
    assert all(cls.__dict__[name] is fn for (cls, name), fn in originals.items())
    monkeypatch.delenv("TORCHELASTIC_OTEL_FRAMEWORKS")
    frameworks.install(patches)
    assert all(cls.__dict__[name] is not fn for (cls, name), fn in originals.items())
    patches.restore()
    assert all(cls.__dict__[name] is fn for (cls, name), fn in originals.items())


def test_lightning_a_validation_that_raises_ends_its_spans_with_error(installed: Any, tmp_path: Path) -> None:
    class Failing(_module_class()):  # type: ignore[misc]
        def validation_step(self, batch: Any, batch_idx: int) -> None:
            raise ValueError("bad validation")

    trainer = _lightning(tmp_path)
    with pytest.raises(ValueError, match="bad validation"):
        trainer.fit(Failing())
    (fit,) = _spans(installed, names.FRAMEWORK_TRAIN)
    (evaluation,) = _spans(installed, names.FRAMEWORK_EVALUATE)
    for span in (fit, evaluation):
        assert span.status.status_code.name == STATUS_ERROR and "bad validation" in span.status.description, span
    assert evaluation.parent is not None and evaluation.parent.span_id == fit.context.span_id
    assert instruments.open_tokens() == []


def test_the_private_framework_methods_wrapped_are_there() -> None:
    """Pins the ``_compat.framework_method`` uses (a release that renames them fails here, the job counts it)."""
    from lightning.pytorch.trainer.connectors.logger_connector import logger_connector

    from torchelastic_otel import _compat

    before = selftelemetry.total(selftelemetry.FALLBACK)
    assert callable(_compat.framework_method(transformers.Trainer, "_save_checkpoint"))
    assert callable(_compat.framework_method(logger_connector._LoggerConnector, "log_metrics"))
    assert selftelemetry.total(selftelemetry.FALLBACK) == before
    assert _compat.framework_method(transformers.Trainer, "_no_such_method") is None
    assert selftelemetry.total(selftelemetry.FALLBACK) == before + 1
