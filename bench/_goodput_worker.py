"""The training job of ``bench/bench_goodput.py``: 2-rank DDP on CPU (gloo), bridge-unaware (torch's APIs only).

The model is an ``nn.Sequential`` of ``--layers`` blocks of ``Linear(--width, --width)`` and ``Tanh``: 2 x
``--layers`` + 1 module calls a forward (501 with the defaults, plus DDP's own). The batches come from a
``DataLoader`` over an in-memory dataset (one ``__getitem__`` a step: the whole batch, no auto-batching, no loader
processes). With ``--input-share F`` the dataset sleeps so that the loop waits for its input F of each step (input
bound): the first ``--warmup`` steps run without the sleep and time the step; the ranks agree on the largest median
(an ``all_reduce``) and sleep ``step x F / (1 - F)`` from then on; ``--sleep S`` sleeps S seconds a batch instead
(the same sleep for every run of a comparison).

With ``--traceml`` the same loop runs under TraceML's documented plain-PyTorch integration: ``traceml.init(mode=
"auto")`` first (TraceML times the DataLoader iterators made after it) and each step's body (``zero_grad`` ..
``optimizer.step()``) inside ``traceml.trace_step(model)``, the batch fetched outside it, as TraceML's README shows
(run it with ``traceml run``). Without the flag the loop has no wrapper at all.

Each rank prints ``goodput_worker rank <r> loop <s> cpu <s> steps <n> input <s> sleep <s> module_hooks <n>``: the wall
time of the training loop after the warm-up, the CPU time its process (every thread) spent meanwhile, the steps
timed, the seconds its own clock measured around ``next()`` on the loader, the sleep per batch and the number of
torch's global ``nn.Module`` hooks in the process; then it calls ``destroy_process_group`` and exits normally, as a
script does (a bridged worker's exit flush runs, and TraceML's).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=80)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--layers", type=int, default=250)
    parser.add_argument("--width", type=int, default=16)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--input-share", type=float, default=0.0)
    parser.add_argument("--sleep", type=float, default=None, help="seconds each batch sleeps (no calibration)")
    parser.add_argument("--traceml", action="store_true")
    args = parser.parse_args()

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    if args.traceml:  # before any DataLoader iterator is made: TraceML times the iterators made after it
        import traceml_ai as traceml

        traceml.init(mode="auto")
    torch.set_flush_denormal(True)
    dist.init_process_group("gloo")
    torch.manual_seed(dist.get_rank())
    blocks: list[torch.nn.Module] = []
    for _ in range(args.layers):
        blocks += [torch.nn.Linear(args.width, args.width), torch.nn.Tanh()]
    model = DDP(torch.nn.Sequential(*blocks))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.001)
    sleep = [0.0]
    batches = [(torch.randn(args.batch, args.width), torch.randn(args.batch, args.width)) for _ in range(16)]

    class Batches(torch.utils.data.Dataset):  # type: ignore[misc]
        def __len__(self) -> int:
            return 1 << 30

        def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
            if sleep[0]:
                time.sleep(sleep[0])
            return batches[i % len(batches)]

    loader = iter(torch.utils.data.DataLoader(Batches(), batch_size=None, shuffle=False))

    def train_step(x: torch.Tensor, y: torch.Tensor) -> None:
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()

    if args.traceml:

        def step(x: torch.Tensor, y: torch.Tensor) -> None:
            with traceml.trace_step(model):
                train_step(x, y)

    else:
        step = train_step

    warm = []
    for _ in range(args.warmup):
        began = time.perf_counter()
        step(*next(loader))
        warm.append(time.perf_counter() - began)
    if args.sleep is not None:
        sleep[0] = args.sleep
    elif args.input_share > 0:
        longest = torch.tensor([statistics.median(warm)])
        dist.all_reduce(longest, op=dist.ReduceOp.MAX)
        sleep[0] = float(longest) * args.input_share / (1.0 - args.input_share)
    dist.barrier()
    waited = 0.0
    started, cpu = time.perf_counter(), time.process_time()
    for _ in range(args.steps):
        began = time.perf_counter()
        x, y = next(loader)
        waited += time.perf_counter() - began
        step(x, y)
    loop, cpu = time.perf_counter() - started, time.process_time() - cpu
    sys.stdout.write(
        f"goodput_worker rank {dist.get_rank()} loop {loop:.4f} cpu {cpu:.4f} steps {args.steps} input {waited:.4f} "
        f"sleep {sleep[0]:.5f} module_hooks {_global_module_hooks()}\n"
    )
    sys.stdout.flush()
    dist.destroy_process_group()


def _global_module_hooks() -> int:
    """How many global ``nn.Module`` hooks are registered (torch's own registries): each one sends every module
    call of the process through torch's slow path."""
    from torch.nn.modules import module

    names = ("_global_forward_pre_hooks", "_global_forward_hooks", "_global_backward_pre_hooks",
             "_global_backward_hooks")  # fmt: skip
    return sum(len(getattr(module, name, {})) for name in names)


if __name__ == "__main__":
    main()
