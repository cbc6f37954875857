"""``torchelastic-otel run ...`` / ``python -m torchelastic_otel.run ...``: torchrun with the bridge installed.

Takes exactly torchrun's arguments. The pipeline is configured from ``OTEL_*``; the agent and every worker are
bridged (workers install the bridge at start-up through ``PYTHONPATH``).
"""

from __future__ import annotations

import sys

__all__ = ["main"]


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] == "run":  # `torchelastic-otel run ...`
        args = args[1:]
    from torchelastic_otel._install import install

    install()
    from torch.distributed.run import main as torchrun_main

    torchrun_main(args)


if __name__ == "__main__":
    main()
