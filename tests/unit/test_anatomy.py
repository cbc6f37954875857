"""The anatomy of a step and the goodput ledger (``_torch.worker.anatomy``), in this process.

The ledger is fed events at chosen times where a test needs exact seconds; the in-process loops use torch's real
``DataLoader``, ``autograd.backward`` and optimizers with the real SDK (in-memory exporters, ``conftest.otel``), and
measure their own ground truth with their own clock. The torchrun jobs are ``tests/jobs/test_goodput.py``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.otel import points_of
from torchelastic_otel._torch.patches import Patches
from torchelastic_otel._torch.worker import anatomy, steps

torch = pytest.importorskip("torch")

S = 1_000_000_000


def _ns(seconds: float) -> int:
    return int(round(seconds * S))


def _feed(book: anatomy.Ledger, events: list[tuple[float, int | str]]) -> list[anatomy.Step | None]:
    """Events as the drain gives them: a code, or "post" (an optimizer's post hook that marks a step)."""
    out = []
    for at, code in events:
        if code == "post":
            book.optimizer_exit(_ns(at))
            out.append(book.step(_ns(at)))
        else:
            assert isinstance(code, int)
            book.event(_ns(at), code)
    return out


def _close(actual: dict[str, float], expected: dict[str, float]) -> None:
    for key, value in expected.items():
        assert actual.get(key, 0.0) == pytest.approx(value, abs=1e-9), (key, actual)


def test_a_plain_loop_step_splits_into_its_phases() -> None:
    book = anatomy.Ledger(0)
    (first, second) = _feed(book, [
        (1.0, anatomy.INPUT_ENTER), (1.5, anatomy.INPUT_EXIT),  # input 0.5
        (2.0, anatomy.BACKWARD_ENTER), (3.0, anatomy.BACKWARD_EXIT),  # forward (unmarked) 0.5, backward 1.0
        (3.2, "post"),  # optimizer 0.2
        (3.3, anatomy.INPUT_ENTER), (3.4, anatomy.INPUT_EXIT),  # zero_grad etc. before it: other 0.1
        (3.6, anatomy.BACKWARD_ENTER), (3.9, anatomy.BACKWARD_EXIT), (4.0, "post"),
    ])  # fmt: skip
    assert first is not None and second is not None
    _close(first.phases, {"input": 0.5, "forward": 0.5, "backward": 1.0, "optimizer": 0.2, "other": 0.0})
    _close(second.phases, {"input": 0.1, "forward": 0.2, "backward": 0.3, "optimizer": 0.1, "other": 0.1})
    added = book.take_added()
    _close(added, {"startup": 1.0, "input_wait": 0.6, "productive": 2.4})
    assert sum(added.values()) == pytest.approx(4.0)  # the process's start + the seconds = its last step's end


def test_lightning_runs_forward_and_backward_inside_the_optimizer_step() -> None:
    """``optimizer.step(closure)``: the closure (training_step, backward), then the update, then the post hook."""
    book = anatomy.Ledger(0)
    (step,) = _feed(book, [
        (0.0, anatomy.INPUT_ENTER), (0.5, anatomy.INPUT_EXIT),  # then optimizer.step(closure): the forward
        (1.0, anatomy.BACKWARD_ENTER), (1.5, anatomy.BACKWARD_EXIT), (1.7, "post"),  # the update after the backward
    ])  # fmt: skip
    assert step is not None
    _close(step.phases, {"input": 0.5, "forward": 0.5, "backward": 0.5, "optimizer": 0.2, "other": 0.0})


def test_gradient_accumulation_counts_each_micro_batch_s_forward() -> None:
    book = anatomy.Ledger(0)
    (step,) = _feed(book, [
        (0.0, anatomy.INPUT_ENTER), (0.1, anatomy.INPUT_EXIT), (0.3, anatomy.BACKWARD_ENTER),
        (0.5, anatomy.BACKWARD_EXIT),  # micro-batch 1: forward 0.2, backward 0.2
        (0.6, anatomy.INPUT_ENTER), (0.7, anatomy.INPUT_EXIT), (0.9, anatomy.BACKWARD_ENTER),
        (1.1, anatomy.BACKWARD_EXIT), (1.2, "post"),  # between them: other 0.1; micro-batch 2, then the update
    ])  # fmt: skip
    assert step is not None
    _close(step.phases, {"input": 0.2, "forward": 0.4, "backward": 0.4, "optimizer": 0.1, "other": 0.1})


def test_a_loop_without_a_dataloader_has_its_forward_before_the_backward() -> None:
    book = anatomy.Ledger(0)
    _feed(book, [(0.0, anatomy.BACKWARD_ENTER), (0.1, anatomy.BACKWARD_EXIT), (0.2, "post")])  # the first step
    (step,) = _feed(book, [(0.5, anatomy.BACKWARD_ENTER), (0.6, anatomy.BACKWARD_EXIT), (0.7, "post")])
    assert step is not None
    _close(step.phases, {"input": 0.0, "forward": 0.3, "backward": 0.1, "optimizer": 0.1, "other": 0.0})


def test_checkpoints_inside_a_step_and_before_the_first_step_are_their_own_causes() -> None:
    book = anatomy.Ledger(0)
    _feed(book, [
        (0.5, anatomy.LOAD_ENTER), (1.5, anatomy.LOAD_EXIT),  # a restore before training: checkpoint_load 1.0
        (2.0, anatomy.INPUT_ENTER), (2.5, anatomy.INPUT_EXIT), (3.0, "post"),
        (3.0, anatomy.SAVE_ENTER), (3.8, anatomy.SAVE_EXIT), (3.8, anatomy.SAVE_COMMITTED),
        (4.0, anatomy.INPUT_ENTER), (4.1, anatomy.INPUT_EXIT), (4.5, "post"),
    ])  # fmt: skip
    added = book.take_added()
    _close(added, {"startup": 1.0, "checkpoint_load": 1.0, "checkpoint_save": 0.8, "input_wait": 0.6,
                   "productive": 0.5 + 0.6})  # fmt: skip
    assert sum(added.values()) == pytest.approx(4.5)
    # the save completed after the first step: only the second step's seconds after it are at risk
    _close(book.at_risk, {"productive": 0.2 + 0.4, "input_wait": 0.1, "stalled": 0.0})
    assert book.lost(_ns(5.0)) == pytest.approx(0.7 + 0.5)  # at risk, and the unfinished step since 4.5


def test_a_reported_stall_counts_its_seconds_as_stalled() -> None:
    book = anatomy.Ledger(0)
    _feed(book, [(0.0, anatomy.INPUT_ENTER), (0.1, anatomy.INPUT_EXIT), (1.0, "post")])
    book.stall(_ns(1.0))  # no progress since the first step's end
    _feed(book, [(1.0, anatomy.INPUT_ENTER), (1.1, anatomy.INPUT_EXIT), (200.0, "post")])
    added = book.take_added()
    _close(added, {"stalled": 198.9, "input_wait": 0.2, "productive": 0.9})


def test_the_wait_for_the_last_collective_is_carved_from_its_phase() -> None:
    book = anatomy.Ledger(0)
    (step,) = _feed(book, [
        (0.0, anatomy.INPUT_ENTER), (0.1, anatomy.INPUT_EXIT),
        (0.3, anatomy.BACKWARD_ENTER), (1.3, anatomy.BACKWARD_EXIT), (1.4, "post"),
    ])  # fmt: skip
    assert step is not None
    anatomy.carve_collective_wait(step, [_ns(0.5), _ns(0.9)])  # DDP's last bucket enqueued at 0.9: 0.4 s waited
    _close(step.phases, {"backward": 0.6, "collective_wait": 0.4, "forward": 0.2})
    assert sum(step.phases.values()) == pytest.approx(1.4)


# ---- the hooks on a real loop ---------------------------------------------------------------------------------


class _SlowDataset(torch.utils.data.Dataset):  # type: ignore[misc]
    """Each item costs ``delay`` seconds of the loop's time, as a slow disk would."""

    def __init__(self, n: int, delay: float) -> None:
        self.n, self.delay = n, delay

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        time.sleep(self.delay)
        return torch.randn(8), torch.randn(1)


@pytest.fixture
def installed(otel: Any, paused_drainer: Any) -> Iterator[Any]:
    """The phase hooks and torch's step post hook, on a fresh ledger; undone after."""
    from torch.optim.optimizer import register_optimizer_step_post_hook

    patches = Patches()
    steps.reset()
    anatomy.install(patches)
    handle = register_optimizer_step_post_hook(steps.optimizer_hook)
    try:
        yield otel
    finally:
        handle.remove()
        patches.restore()
        steps.reset()


def test_a_real_loop_s_input_wait_is_what_the_loop_measured(installed: Any) -> None:
    model = torch.nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = torch.utils.data.DataLoader(_SlowDataset(40, 0.01), batch_size=2)
    waited = 0.0
    iterator = iter(loader)
    for _ in range(20):
        began = time.perf_counter()
        x, y = next(iterator)
        waited += time.perf_counter() - began
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    steps.drain()
    anatomy.resolve(None)
    data = installed.reader.get_metrics_data()  # one collection: older SDKs report a gauge once after it was set
    (point,) = [p for attrs, p in points_of(data, "torchelastic.worker.step.phase.duration")
                if attrs["phase"] == "input"]  # fmt: skip
    assert point.count == 20
    assert point.sum == pytest.approx(waited, rel=0.1)  # 20 steps x 2 items x 10 ms, as the loop timed them
    goodput = {attrs["cause"]: p.value for attrs, p in points_of(data, "torchelastic.goodput.time")}
    assert goodput["input_wait"] == pytest.approx(waited, rel=0.1)
    assert goodput["productive"] > 0
    at_risk = {attrs["cause"]: p.value for attrs, p in points_of(data, "torchelastic.worker.progress.at_risk")}
    assert at_risk["input_wait"] == pytest.approx(goodput["input_wait"])  # no checkpoint: every step is at risk


def test_steps_before_a_group_destroyed_early_get_their_wait_from_its_kept_entries(
    otel: Any, paused_drainer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job that destroys its process group before its pipeline is ready (shorter than the deferred build) leaves
    the Flight Recorder's last entries kept: a drain meanwhile records nothing, and once the pipeline is ready the
    watchdog's tick carves each step's wait for its last collective out of them. The entries are made here, as a
    gloo group would record them: one created inside each step's backward (a gradient hook, where DDP enqueues its
    last bucket); this process has no group, so the recorder itself is the one part not real."""
    from torch.optim.optimizer import register_optimizer_step_post_hook

    from torchelastic_otel import pipeline
    from torchelastic_otel._torch.worker import collectives, stalls

    monkeypatch.setenv("TORCH_FR_BUFFER_SIZE", "2000")
    patches = Patches()
    steps.reset()
    anatomy.install(patches, collectives.awaiting_read)
    handle = register_optimizer_step_post_hook(steps.optimizer_hook)
    created: list[int] = []
    model = torch.nn.Linear(8, 1)

    def enqueued(grad: Any) -> None:
        created.append(time.time_ns())
        time.sleep(0.01)  # the wait for the all-reduce, still inside backward

    model.weight.register_hook(enqueued)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    try:
        for _ in range(6):
            torch.nn.functional.mse_loss(model(torch.randn(4, 8)), torch.randn(4, 1)).backward()
            optimizer.step()
            optimizer.zero_grad()
        monkeypatch.setattr(collectives._arrivals, "kept", [{"time_created_ns": t} for t in created])
        steps.drain()  # the drainer meanwhile: the steps wait for the kept entries
        data = otel.reader.get_metrics_data()
        assert not points_of(data, "torchelastic.worker.step.phase.duration")
        monkeypatch.setattr(pipeline, "ready", lambda: object())
        stalls.Watchdog().tick()  # the pipeline is ready: the kept entries are read
    finally:
        handle.remove()
        patches.restore()
        steps.reset()
    assert collectives._arrivals.kept == []
    data = otel.reader.get_metrics_data()
    waits = [p for attrs, p in points_of(data, "torchelastic.worker.step.phase.duration")
             if attrs["phase"] == "collective_wait"]  # fmt: skip
    assert len(waits) == 1 and waits[0].count >= 5, waits
    assert waits[0].sum >= 0.01 * waits[0].count, waits  # every step's wait, at least


def test_uninstall_gives_torch_its_functions_back(otel: Any) -> None:
    from torch.utils.data import dataloader

    before = (dataloader._BaseDataLoaderIter.__dict__["__next__"], torch.autograd.backward)
    patches = Patches()
    anatomy.install(patches)
    during = (dataloader._BaseDataLoaderIter.__dict__["__next__"], torch.autograd.backward)
    assert all(a is not b for a, b in zip(before, during, strict=True))
    patches.restore()
    after = (dataloader._BaseDataLoaderIter.__dict__["__next__"], torch.autograd.backward)
    assert all(a is b for a, b in zip(before, after, strict=True))


def _compile_counters(model: Any, x: Any) -> tuple[int, int]:
    import torch._dynamo
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(model, backend="eager")
    for _ in range(3):
        compiled(x).sum().backward()
    return sum(counters["graph_break"].values()), counters["stats"]["unique_graphs"]


@pytest.mark.jobs  # torch.compile may start its compile workers (torch 2.8 does, even for the eager backend)
def test_a_compiled_model_gets_no_graph_break_or_recompile(otel: Any, paused_drainer: Any) -> None:
    """torch's own dynamo counters, without and with the hooks: the same graphs, no break, no recompile."""
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    x = torch.randn(4, 8)
    plain = _compile_counters(model, x)
    patches = Patches()
    anatomy.install(patches)
    try:
        assert getattr(torch.autograd.backward, "__torchelastic_otel_original__", None) is not None
        hooked = _compile_counters(model, x)
    finally:
        patches.restore()
        steps.reset()
    assert hooked == plain
    assert hooked[0] == 0


@pytest.mark.jobs  # torch.compile may start its compile workers (torch 2.8 does, even for the eager backend)
def test_a_compiled_optimizer_step_gets_no_extra_graph_break(otel: Any, paused_drainer: Any) -> None:
    """``torch.compile(optimizer.step)`` (a documented recipe) traces torch's step hooks: with the bridge's pre and
    post hooks, no more graph breaks and graphs than without."""
    import warnings

    import torch._dynamo
    from torch._dynamo.utils import counters
    from torch.optim.optimizer import register_optimizer_step_post_hook

    def compiled_steps() -> tuple[int, int]:
        torch._dynamo.reset()
        counters.clear()
        model = torch.nn.Linear(4, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        model(torch.randn(2, 4)).sum().backward()
        step = torch.compile(optimizer.step, backend="eager")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # dynamo's note that it runs time.time_ns outside the graph
            for _ in range(3):
                step()
        return sum(counters["graph_break"].values()), counters["stats"]["unique_graphs"]

    plain = compiled_steps()
    patches = Patches()
    anatomy.install(patches)
    handle = register_optimizer_step_post_hook(steps.optimizer_hook)
    try:
        hooked = compiled_steps()
    finally:
        handle.remove()
        patches.restore()
        steps.reset()
    assert hooked[0] <= plain[0] and hooked[1] <= plain[1], (plain, hooked)
