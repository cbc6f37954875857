"""A torchrun worker that logs the way framework jobs do (2 ranks, CPU): ``tests/jobs/test_framework_logs.py``.

It never imports the bridge. In the order a training script does it:

- ``import lightning.pytorch`` first: the root logger has no handler yet, so Lightning gives its ``lightning.pytorch``
  logger a ``StreamHandler`` of its own and stops its propagation;
- ``import transformers``; ``transformers.utils.logging.get_logger`` configures the library's root logger the same
  way (its own ``StreamHandler``, format ``[transformers] %(message)s``, no propagation); verbosity INFO;
- ``logging.basicConfig``: the root logger prints to stderr;
- then, on every rank: a transformers INFO, WARNING and ERROR with an exception, a record of the script's own logger
  (the root's handler prints it), a Lightning ``Trainer`` built (rank 0's ``rank_zero_info`` lines: "GPU available:
  ...") and a line of Lightning's logger; and lines that are no logging: ``print``, a write on fd 2 as native code
  writes, a progress bar with carriage returns.

Every line of its own names the rank and what printed it (``logs_worker rank <r>: <what>``). Ends with exit code 0.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

import logging
import sys

import lightning.pytorch as pl  # before any root handler: Lightning's logger gets its own handler
import transformers

RANK = int(os.environ["RANK"])


def text(what: str) -> str:
    return f"logs_worker rank {RANK}: {what}"


def main() -> None:
    hf_logger = transformers.utils.logging.get_logger("transformers.logs_worker")
    transformers.utils.logging.set_verbosity_info()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    hf_logger.info(text("transformers info"))
    hf_logger.warning(text("transformers warning"))
    try:
        raise ValueError("bad shard")
    except ValueError:
        hf_logger.error(text("transformers error"), exc_info=True)
    logging.getLogger("logs_worker.script").info(text("root info"))
    devices = int(os.environ["LOCAL_WORLD_SIZE"])
    pl.Trainer(accelerator="cpu", strategy="ddp", devices=devices, num_nodes=1, logger=False,
               enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)  # fmt: skip
    logging.getLogger("lightning.pytorch.logs_worker").info(text("lightning info"))
    print(text("print"), flush=True)
    os.write(2, (text("native stderr") + "\n").encode())
    sys.stderr.write(text("progress 50%") + "\r" + text("progress 100%") + "\n")
    sys.stderr.flush()


if __name__ == "__main__":
    main()
