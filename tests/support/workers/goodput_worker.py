"""A DDP training job on gloo that measures its own time, for the goodput tests (it never imports the bridge).

Every rank writes ``<GOODPUT_OUT>/rank<R>-restart<N>.json`` as it goes (rewritten after every step, so a rank
that dies keeps what it measured): each step's start and end (``time.time_ns``), the seconds it waited in the
DataLoader iterator's ``__next__`` (its own ``perf_counter`` around the call), and its checkpoint saves (start, end,
step). Settings (environment):

- ``GOODPUT_STEPS``: steps of an attempt; ``GOODPUT_INPUT_DELAY``: seconds each batch costs the loader (a sleep,
  as a slow disk); ``GOODPUT_COMPUTE``: seconds of matrix products in each step's forward;
- ``GOODPUT_SAVE_EVERY``: a ``torch.distributed.checkpoint.save`` every k steps (0: none); a restarted attempt
  loads the last one and goes on from its step;
- ``GOODPUT_FAIL_AFTER_SAVE``: attempt 0 raises this many steps after its first save, on rank
  ``GOODPUT_FAIL_RANKS`` (default 1; ``all``: every rank, as a NaN check would).
"""

from __future__ import annotations

import json
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp  # imported up front: its first import (0.2 s) is in no step of the truth
from torch.nn.parallel import DistributedDataParallel

RANK = int(os.environ["RANK"])
RESTART = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
OUT = os.environ["GOODPUT_OUT"]
STEPS = int(os.environ.get("GOODPUT_STEPS", "40"))
DELAY = float(os.environ.get("GOODPUT_INPUT_DELAY", "0"))
COMPUTE = float(os.environ.get("GOODPUT_COMPUTE", "0.02"))
SAVE_EVERY = int(os.environ.get("GOODPUT_SAVE_EVERY", "0"))
FAIL_AFTER_SAVE = int(os.environ.get("GOODPUT_FAIL_AFTER_SAVE", "0"))
FAIL_RANKS = os.environ.get("GOODPUT_FAIL_RANKS", "1")  # "all", or one rank
CHECKPOINT = os.path.join(OUT, "checkpoint")


class Batches(torch.utils.data.Dataset):  # type: ignore[misc]
    def __len__(self) -> int:
        return 100_000

    def __getitem__(self, i: int) -> torch.Tensor:
        if DELAY:
            time.sleep(DELAY)
        return torch.randn(64)


class Model(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.Sequential(*(torch.nn.Linear(64, 64) for _ in range(4)))
        self.weight = torch.randn(256, 256)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        deadline = time.perf_counter() + COMPUTE  # the compute a real model's forward would do
        y = self.weight
        while time.perf_counter() < deadline:
            y = torch.tanh(y @ self.weight)
        return self.layers(x).sum() + y.mean() * 0


def main() -> None:
    dist.init_process_group("gloo")
    model = DistributedDataParallel(Model())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.001)
    record: dict = {"rank": RANK, "restart": RESTART, "steps": [], "saves": [], "loads": [], "start_step": 0}
    path = os.path.join(OUT, f"rank{RANK}-restart{RESTART}.json")

    def keep() -> None:
        tmp = f"{path}.tmp"
        with open(tmp, "w") as fh:
            json.dump(record, fh)
        os.replace(tmp, path)

    step = 0
    if SAVE_EVERY and os.path.exists(os.path.join(CHECKPOINT, ".metadata")):
        began = time.time_ns()
        state = {"model": model.state_dict(), "step": torch.tensor(0)}
        dcp.load(state, checkpoint_id=CHECKPOINT)
        model.load_state_dict(state["model"])
        step = int(state["step"])
        record["loads"].append([began, time.time_ns()])
        record["start_step"] = step
    loader = iter(torch.utils.data.DataLoader(Batches(), batch_size=1))
    first_save_step = None
    step_start = time.time_ns()
    while step < STEPS:
        began = time.perf_counter()
        x = next(loader)
        waited = time.perf_counter() - began
        loss = model(x)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        step += 1
        end = time.time_ns()
        record["steps"].append([step_start, end, waited])
        step_start = end
        if SAVE_EVERY and step % SAVE_EVERY == 0:
            began_ns = time.time_ns()
            dcp.save({"model": model.state_dict(), "step": torch.tensor(step)}, checkpoint_id=CHECKPOINT)
            record["saves"].append([began_ns, time.time_ns(), step])
            first_save_step = first_save_step or step
            step_start = time.time_ns()  # the save is not the next step's
        keep()
        failing = FAIL_RANKS == "all" or int(FAIL_RANKS) == RANK
        if FAIL_AFTER_SAVE and RESTART == 0 and failing and first_save_step is not None:
            if step == first_save_step + FAIL_AFTER_SAVE:
                raise RuntimeError(f"injected failure {FAIL_AFTER_SAVE} steps after the save at step {first_save_step}")
    keep()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # after gloo use the interpreter may abort at exit (../shared/TORCH_TELEMETRY.md): as real jobs do


if __name__ == "__main__":
    main()
