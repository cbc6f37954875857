"""The training frameworks of a worker, with no code change: Hugging Face ``Trainer`` (``hf``) and Lightning's
``Trainer`` (``lightning``). What they log becomes ``torchelastic.framework.<key>`` gauges, their phases spans in
the attempt's trace (``instruments``; docs/frameworks.md). Each adapter waits for its framework's import
(``imports.when_imported``): installing imports neither. ``TORCHELASTIC_OTEL_FRAMEWORKS=0`` turns them off;
``uninstall()`` restores the frameworks' methods (``Patches``).
"""

from __future__ import annotations

from torchelastic_otel import _settings
from torchelastic_otel._torch.patches import Patches

__all__ = ["install", "enabled"]


def enabled() -> bool:
    return bool(_settings.FRAMEWORKS.get())


def install(patches: Patches) -> None:
    """Wait for the frameworks' imports (see the module's docstring)."""
    if not enabled():
        return
    from torchelastic_otel._torch.worker.frameworks import hf, lightning

    hf.install(patches)
    lightning.install(patches)
