"""What the framework workers (``hf_trainer_worker.py``, ``lightning_worker.py``) share: the settings the tests give
them in the environment, the one failure they inject, and how they write their ground truth (a file replaced whole,
so a reader never sees half of it). Imported as a sibling (``from _framework import ...``); it never imports the
bridge, nor a framework.
"""

from __future__ import annotations

import json
import os

RANK = int(os.environ["RANK"])
OUT = os.environ["FRAMEWORK_OUT"]
STEPS = int(os.environ.get("FRAMEWORK_STEPS", "20"))
SAVE_EVERY = int(os.environ.get("FRAMEWORK_SAVE_EVERY", "10"))
ATTEMPT = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
EVALUATE = os.environ.get("FRAMEWORK_EVAL") == "1"
FAIL_ONCE = os.environ.get("FRAMEWORK_FAIL_ONCE")
FAIL_AT = int(os.environ.get("FRAMEWORK_FAIL_AT", "7"))


def fail_once(step: int) -> None:
    """With ``FRAMEWORK_FAIL_ONCE=<marker>``: rank 1 raises at step ``FRAMEWORK_FAIL_AT`` unless the marker exists,
    which it creates first (one failure in the job)."""
    if FAIL_ONCE and RANK == 1 and step == FAIL_AT and not os.path.exists(FAIL_ONCE):
        open(FAIL_ONCE, "w").close()
        raise RuntimeError(f"injected failure at step {FAIL_AT}")


def write(name: str, record: object) -> None:
    """``record`` as JSON to ``<FRAMEWORK_OUT>/<name>``, replaced whole."""
    path = os.path.join(OUT, name)
    with open(path + ".tmp", "w") as f:
        json.dump(record, f)
    os.replace(path + ".tmp", path)
