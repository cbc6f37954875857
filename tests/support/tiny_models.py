"""Tiny models the in-process framework tests train on CPU in a moment (import it after
``pytest.importorskip("torch")``)."""

from __future__ import annotations

from typing import Any

import torch


class Regression(torch.nn.Module):  # type: ignore[misc]
    """A linear regression of 4 features, shaped for Hugging Face's ``Trainer``: ``forward(x, labels)`` returns
    the loss with the logits."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 1)

    def forward(self, x: Any, labels: Any = None) -> dict[str, Any]:
        out = self.linear(x)
        return {"loss": torch.nn.functional.mse_loss(out, labels), "logits": out}


def regression_rows(n: int) -> list[dict[str, Any]]:
    """``n`` random ``{"x", "labels"}`` rows for ``Regression``, the same ones every time."""
    generator = torch.Generator().manual_seed(0)
    x, y = torch.randn(n, 4, generator=generator), torch.randn(n, 1, generator=generator)
    return [{"x": x[i], "labels": y[i]} for i in range(n)]
