"""A part of the bridge installed in this process on its own ``Patches``, as a worker installs it, and undone after
(the unit tests' fixtures)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

from torchelastic_otel._torch.patches import Patches


@contextlib.contextmanager
def installed(install: Callable[[Patches], object]) -> Iterator[Patches]:
    """``install(patches)`` on new ``Patches``; the patches restored on the way out."""
    patches = Patches()
    install(patches)
    try:
        yield patches
    finally:
        patches.restore()
