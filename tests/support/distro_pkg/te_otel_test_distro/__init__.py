"""A test distro and configurator, like a platform team's: the distro sets the exporter defaults (as
``opentelemetry-distro`` does), the configurator builds the SDK's providers with one resource attribute of its own,
``test.distro=yes``, which every process of a job it configures carries."""

from __future__ import annotations

import os
from typing import Any

from opentelemetry.instrumentation.distro import BaseDistro  # type: ignore[attr-defined]
from opentelemetry.sdk._configuration import _OTelSDKConfigurator

#: The resource attribute this configurator adds.
ATTRIBUTE = ("test.distro", "yes")


class Distro(BaseDistro):  # type: ignore[misc]
    def _configure(self, **kwargs: Any) -> None:
        for signal in ("TRACES", "METRICS", "LOGS"):
            os.environ.setdefault(f"OTEL_{signal}_EXPORTER", "otlp")


class Configurator(_OTelSDKConfigurator):
    def _configure(self, **kwargs: Any) -> None:
        kwargs["resource_attributes"] = {**(kwargs.get("resource_attributes") or {}), ATTRIBUTE[0]: ATTRIBUTE[1]}
        super()._configure(**kwargs)
