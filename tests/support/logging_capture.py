"""The workers' logging capture (``torchelastic_otel._torch.worker.log_records``) installed in this process, as the
bridge installs it in a worker; the ``captured`` fixture of ``tests/unit/conftest.py`` pairs it with the in-memory
pipeline."""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Iterator
from typing import Any

from tests.support.installed import installed
from torchelastic_otel._torch.worker import log_records as worker_logging

#: The loggers the tests make up for libraries (``lib.x``): their handlers, level and propagation are reset after.
TEST_LOGGERS = "lib."


@contextlib.contextmanager
def logging_captured() -> Iterator[None]:
    """The capture installed on a root logger without handlers; the root logger and the tests' ``lib.*`` loggers
    as they were after."""
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    root.handlers.clear()
    try:
        with installed(lambda patches: worker_logging.install(patches, lambda: None)):
            yield
    finally:
        root.handlers[:], root.level = saved
        for name in list(logging.root.manager.loggerDict):
            if name.startswith(TEST_LOGGERS):
                logger = logging.getLogger(name)
                logger.handlers.clear()
                logger.propagate = True
                logger.setLevel(logging.NOTSET)


@contextlib.contextmanager
def otel_handler_on_root(logger_provider: Any) -> Iterator[None]:
    """OpenTelemetry's ``LoggingHandler`` (exporting to ``logger_provider``) on the root logger, where logging
    auto-instrumentation puts it; removed after."""
    from opentelemetry.sdk._logs import LoggingHandler

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        handler = LoggingHandler(logger_provider=logger_provider)
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        yield
    finally:
        root.removeHandler(handler)
