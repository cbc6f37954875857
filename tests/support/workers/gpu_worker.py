"""A CUDA training job that times itself with CUDA events, for the GPU checks (``tests/gpu``, ``bench/bench_gpu.py``).

It never imports the bridge. Each rank writes ``<GPU_OUT>/rank<R>-restart<N>.json`` at its end: its own truth,
measured with CUDA events it records on the current stream at its phases' boundaries (read once the loop is over,
after one ``synchronize()`` of its own), and its wall time per step. ``GPU_MODE`` (environment) picks the loop:

- ``compute``: a bf16 MLP (``GPU_LAYERS`` x ``GPU_WIDTH``², batch ``GPU_BATCH``), ``loss.item()`` every
  ``GPU_SYNC_EVERY`` steps (1: the common loop; 50: a loop that rarely syncs);
- ``input``: the same model, smaller, fed by a ``DataLoader`` whose items cost ``GPU_INPUT_DELAY`` seconds each (a
  slow disk), ``loss.item()`` each step: the GPU idles while the host waits for its input;
- ``leak``: ``compute``, keeping ``GPU_LEAK_MIB`` MiB more CUDA memory each step (a list that is never cleared);
- ``launch``: a small fp32 MLP (4 x 1024², batch 512) synced each step: a launch-bound loop, for the cost;
- ``failonce``: gloo all-reduces on CUDA tensors between the ranks; rank 1 raises in the first attempt;
- ``oom``: allocates past the device's memory: ``torch.cuda.OutOfMemoryError`` ends the rank.
"""

from __future__ import annotations

import json
import os
import statistics
import time

import torch

RANK = int(os.environ.get("RANK", "0"))
WORLD = int(os.environ.get("WORLD_SIZE", "1"))
RESTART = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
OUT = os.environ.get("GPU_OUT", ".")
MODE = os.environ.get("GPU_MODE", "compute")
STEPS = int(os.environ.get("GPU_STEPS", "300"))
SYNC_EVERY = int(os.environ.get("GPU_SYNC_EVERY", "1"))
LAYERS = int(os.environ.get("GPU_LAYERS", "8"))
WIDTH = int(os.environ.get("GPU_WIDTH", "4096"))
BATCH = int(os.environ.get("GPU_BATCH", "8192"))
DELAY = float(os.environ.get("GPU_INPUT_DELAY", "0.002"))
LEAK_MIB = int(os.environ.get("GPU_LEAK_MIB", "32"))


def _mlp(layers: int, width: int, dtype: torch.dtype) -> torch.nn.Module:
    blocks: list[torch.nn.Module] = []
    for _ in range(layers):
        blocks += [torch.nn.Linear(width, width), torch.nn.GELU()]
    return torch.nn.Sequential(*blocks).to(device="cuda", dtype=dtype)


class _Slow(torch.utils.data.Dataset):  # type: ignore[misc]
    def __init__(self, width: int) -> None:
        self.width = width

    def __len__(self) -> int:
        return 1_000_000

    def __getitem__(self, i: int) -> torch.Tensor:
        time.sleep(DELAY)
        return torch.ones(self.width)


def _events(n: int) -> list[torch.cuda.Event]:
    return [torch.cuda.Event(enable_timing=True) for _ in range(n)]


def _write(truth: dict) -> None:
    os.makedirs(OUT, exist_ok=True)
    path = os.path.join(OUT, f"rank{RANK}-restart{RESTART}.json")
    with open(path + ".tmp", "w") as fh:
        json.dump(truth, fh)
    os.replace(path + ".tmp", path)


def train(mode: str) -> dict:
    """The loop of ``mode``, with its own CUDA events at each boundary: (input start, input end, backward start,
    backward end, optimizer end) a step."""
    torch.manual_seed(RANK)
    if mode == "launch":
        model = _mlp(4, 1024, torch.float32)
        batch = torch.randn(512, 1024, device="cuda")
    else:
        width = WIDTH if mode != "input" else 2048
        model = _mlp(LAYERS if mode != "input" else 4, width, torch.bfloat16)
        batch = torch.randn(BATCH if mode != "input" else 4096, width, device="cuda", dtype=torch.bfloat16)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-6)
    loader = None
    if mode == "input":
        loader = iter(torch.utils.data.DataLoader(_Slow(16), batch_size=4))
    marks = [_events(5) for _ in range(STEPS)]
    kept: list[torch.Tensor] = []
    walls: list[float] = []
    sync_every = 1 if mode in ("input", "launch") else SYNC_EVERY
    for step in range(STEPS):
        began = time.perf_counter()
        events = marks[step]
        events[0].record()
        if loader is not None:
            next(loader)
        events[1].record()
        loss = model(batch).float().pow(2).mean()
        events[2].record()
        loss.backward()
        events[3].record()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        events[4].record()
        if mode == "leak":
            kept.append(torch.empty(LEAK_MIB << 20, dtype=torch.uint8, device="cuda"))
        if (step + 1) % sync_every == 0:
            loss.item()
        walls.append(time.perf_counter() - began)
    torch.cuda.synchronize()
    warm = 10  # the first steps warm the allocator and cuBLAS up
    phases = {"input": [], "forward": [], "backward": [], "optimizer": [], "step": []}
    for step in range(warm, STEPS - 1):
        e, following = marks[step], marks[step + 1]
        phases["input"].append(e[0].elapsed_time(e[1]) / 1e3)
        phases["forward"].append(e[1].elapsed_time(e[2]) / 1e3)
        phases["backward"].append(e[2].elapsed_time(e[3]) / 1e3)
        phases["optimizer"].append(e[3].elapsed_time(e[4]) / 1e3)
        phases["step"].append(e[4].elapsed_time(following[4]) / 1e3)
    return {
        "mode": mode,
        "steps": STEPS,
        "median": {phase: statistics.median(values) for phase, values in phases.items()},
        "wall_step_median": statistics.median(walls[warm:]),
        "wall_seconds": sum(walls),
        "peak_allocated": torch.cuda.max_memory_allocated(),
        "allocated": torch.cuda.memory_allocated(),
    }


def failonce() -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo")
    x = torch.ones(1 << 16, device="cuda")
    for step in range(int(os.environ.get("GPU_STEPS", "60"))):
        dist.all_reduce(x)
        x.div_(WORLD)
        torch.cuda.synchronize()
        if RESTART == 0 and RANK == 1 and step == 20:
            raise RuntimeError("rank 1 fails once")
    dist.destroy_process_group()


def main() -> None:
    # ranks share the devices there are: two ranks on a one-GPU machine both use cuda:0
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
    started = time.time()
    if MODE == "failonce":
        failonce()
        _write({"mode": MODE, "seconds": time.time() - started})
        # gloo's teardown at interpreter exit aborts about one process in four ("terminate called without an active
        # exception"): end as the elastic tests' workers do, the process group destroyed and everything written
        os._exit(0)
    if MODE == "oom":
        total = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
        keep = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")  # something allocated when it fails
        torch.empty(2 * total, dtype=torch.uint8, device="cuda")
        del keep
        return
    truth = train(MODE)
    truth["seconds"] = time.time() - started
    _write(truth)


if __name__ == "__main__":
    main()
