"""A process that behaves like a torchrun worker under the bridge, for tests/jobs/test_signals.py.

It installs the bridge as a worker (``RANK``, ``TORCHELASTIC_RUN_ID`` set), exports log records to stdout (one
``LOG <event_name> <json attributes>`` line each, through the SDK's simple processor), prints ``BLOCKING`` and
blocks where its ``--block`` says:

- ``native``: in a C call that no signal interrupts and that never returns to the interpreter -- a second
  ``pthread_mutex_lock`` of a mutex it holds (through ctypes, which releases the GIL): what a rank blocked in a
  gloo/NCCL collective looks like to CPython. (Real collectives are in tests/jobs/test_worker_sigterm.py; this one
  needs no peer.)
- ``python``: in a Python loop, where CPython runs Python signal handlers at once.

``--user-handler before|after`` installs a SIGTERM handler of its own before or after the bridge (it prints
``USER_HANDLER`` and exits 7); ``--ignore`` sets SIGTERM to SIG_IGN before the bridge is installed.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import signal
import sys
import time

os.environ.update(RANK="0", LOCAL_RANK="0", TORCHELASTIC_RUN_ID="signal-test")

from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import LogRecordExporter, LogRecordExportResult, SimpleLogRecordProcessor
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.trace import TracerProvider

import torchelastic_otel


class PrintLogs(LogRecordExporter):
    def export(self, batch):  # type: ignore[no-untyped-def]
        for data in batch:
            record = data.log_record
            attributes = {k: v for k, v in (record.attributes or {}).items()}
            print("LOG", record.event_name, json.dumps(attributes, default=str), flush=True)
        return LogRecordExportResult.SUCCESS

    def shutdown(self) -> None:
        pass

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


def user_handler(signum, frame):  # type: ignore[no-untyped-def]
    print("USER_HANDLER", flush=True)
    sys.stdout.flush()
    os._exit(7)


def block_natively() -> None:
    libc = ctypes.CDLL(None)
    mutex = ctypes.create_string_buffer(64)  # zeroed: PTHREAD_MUTEX_INITIALIZER of a normal mutex
    libc.pthread_mutex_lock(mutex)
    print("BLOCKING", flush=True)
    libc.pthread_mutex_lock(mutex)  # BLOCKED-HERE: never returns, no signal interrupts it


def block_in_python() -> None:
    print("BLOCKING", flush=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        time.sleep(0.01)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--block", choices=["native", "python"], default="native")
    parser.add_argument("--user-handler", choices=["none", "before", "after"], default="none")
    parser.add_argument("--ignore", action="store_true")
    args = parser.parse_args()
    if args.ignore:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if args.user_handler == "before":
        signal.signal(signal.SIGTERM, user_handler)
    logger_provider = LoggerProvider()
    logger_provider.add_log_record_processor(SimpleLogRecordProcessor(PrintLogs()))
    torchelastic_otel.install(TracerProvider(), MeterProvider(), logger_provider, propagate_to_workers=False)
    if args.user_handler == "after":
        signal.signal(signal.SIGTERM, user_handler)
    from torchelastic_otel.events import Event, EventSource, record

    record(Event("before.block", EventSource.WORKER, metadata={"n": 1}), "otel")
    torchelastic_otel.flush()
    if args.block == "native":
        block_natively()
    else:
        block_in_python()
    print("UNBLOCKED", flush=True)


if __name__ == "__main__":
    main()
