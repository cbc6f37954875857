"""Where every thread of a process was: the evidence users ask for when a hung rank is stopped (pytorch#122694).

When torch's agent stops a rank, that rank is almost always blocked somewhere -- in a collective, in
``init_process_group``, in a data loader. Its Python stacks at that moment say where, and the innermost frame of
the main thread in the user's own code says which line of the training script it was (the line that called
``all_reduce``, not torch's ``work.wait()``).
"""

from __future__ import annotations

import os
import sys
import threading
import traceback
from collections.abc import Mapping
from dataclasses import dataclass
from types import FrameType
from typing import Any

from torchelastic_otel import _compat

#: Size bound of the text of all stacks (the attribute limit of the event mapping); the main thread comes first.
MAX_CHARS = 8192
#: Innermost frames kept per thread.
MAX_FRAMES = 48
#: The bridge's own threads (drainer, flush helpers, signal watcher): not where the job was.
_OWN_THREAD_PREFIX = "torchelastic-otel"


@dataclass(frozen=True)
class UserFrame:
    """The innermost frame of the main thread in the user's code."""

    path: str
    line: int
    function: str


@dataclass(frozen=True)
class Stacks:
    text: str
    threads: int
    user_frame: UserFrame | None


def capture(main_frame: FrameType | None = None) -> Stacks:
    """The stacks of every thread, main thread first. ``main_frame``: the main thread's frame when the caller runs
    in the main thread itself (a signal handler gets the interrupted frame; its own frame is not of interest)."""
    frames = _compat.thread_frames()
    main = threading.main_thread().ident
    if main_frame is not None and main is not None:
        frames[main] = main_frame
    names = {thread.ident: thread.name for thread in threading.enumerate()}
    me = threading.get_ident()
    shown: dict[int, list[traceback.FrameSummary]] = {
        ident: traceback.extract_stack(frame, limit=MAX_FRAMES)
        for ident, frame in frames.items()
        if not (ident == me and ident != main or names.get(ident, "?").startswith(_OWN_THREAD_PREFIX))
    }
    text, threads = _text(shown, main, names)
    frame = frames.get(main) if main is not None else None
    return Stacks(text=text, threads=threads, user_frame=user_frame(frame))


def _text(
    stacks: Mapping[int, list[traceback.FrameSummary]], main: int | None, names: Mapping[Any, str]
) -> tuple[str, int]:
    """The text of ``stacks`` (each outermost frame first), main thread first, then by name; bounded; and how many
    threads it shows."""
    order = sorted(stacks, key=lambda ident: (ident != main, names.get(ident, "~")))
    parts = [
        f'Thread {ident} "{names.get(ident, "?")}" (most recent call last):\n'
        + "".join(traceback.format_list(stacks[ident]))
        for ident in order
    ]
    text = "".join(parts)
    if len(text) > MAX_CHARS:
        text = text[: MAX_CHARS - 24] + "\n... (stacks truncated)\n"
    return text, len(parts)


def user_frame(frame: FrameType | None) -> UserFrame | None:
    """The innermost frame outside torch (and its torchgen, functorch), OpenTelemetry, gRPC, the bridge and the
    standard library: the line of the user's script (or of a training library it uses). A process stopped while
    importing is on the line of the outermost ``import`` (``import torch``), not in whatever module torch was
    importing then (NumPy's, say)."""
    entries = []
    while frame is not None:
        code = frame.f_code
        entries.append(traceback.FrameSummary(code.co_filename, frame.f_lineno, code.co_name, lookup_line=False))
        frame = frame.f_back
    return _user_entry(entries[::-1])


def _user_entry(entries: list[traceback.FrameSummary]) -> UserFrame | None:
    """:func:`user_frame` for the entries of a stack, outermost first."""
    packages, stdlib = _library_roots()
    start = len(entries) - 1
    for i, entry in enumerate(entries):
        if entry.filename.startswith("<frozen importlib"):
            start = i - 1  # the caller of the outermost import in progress
            break
    for entry in reversed(entries[: start + 1]):
        path = entry.filename
        if not path.startswith("<") and not _in_library(os.path.abspath(path), packages, stdlib):
            return UserFrame(path, entry.lineno or 0, entry.name)
    return None


def _in_library(path: str, packages: tuple[str, ...], stdlib: tuple[str, ...]) -> bool:
    if path.startswith(packages):
        return True
    # Installed packages live below the standard library's directory (``lib/python3.X/site-packages``): theirs is
    # the user's code (a training library), not the standard library.
    return (
        path.startswith(stdlib)
        and f"{os.sep}site-packages{os.sep}" not in path
        and (f"{os.sep}dist-packages{os.sep}" not in path)
    )


def _library_roots() -> tuple[tuple[str, ...], tuple[str, ...]]:
    packages = set()
    for name in ("torch", "torchgen", "functorch", "torchelastic_otel", "opentelemetry", "grpc"):
        module = sys.modules.get(name)
        for entry in getattr(module, "__path__", None) or ():
            packages.add(os.path.abspath(entry) + os.sep)
    return tuple(packages), _STDLIB


#: The standard library's directory, from a module of it that is always loaded. Not ``sysconfig.get_paths()``: it
#: imports ``_sysconfigdata_*`` on first use, and this runs on the SIGTERM path, where the interrupted main thread
#: may hold the import lock (a worker stopped while importing torch waited the whole exit bound for it).
_STDLIB = (os.path.dirname(os.path.abspath(os.__file__)) + os.sep,)


# ---- the stacks faulthandler wrote (a process stopped while it could not run Python) --------------------------


def from_faulthandler(dump: str, main: int | None, names: dict[int, str]) -> Stacks:
    """The :class:`Stacks` of ``faulthandler``'s text (``_process.signals.enter_native``): the same text as
    :func:`capture` makes, main thread first, each with its source lines read here (the process is gone; its files
    are on this machine). ``main``: the main thread's ident; ``names``: the threads' names where known (threads
    started later are named ``?``, and left out when they run the bridge's code)."""
    # faulthandler writes the innermost frame first
    threads = {ident: entries[:MAX_FRAMES][::-1] for ident, entries in _parse_faulthandler(dump).items()}
    own = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep  # the torchelastic_otel package
    named = dict(names)
    if main is not None:
        named.setdefault(main, "MainThread")
    shown = {
        ident: entries
        for ident, entries in threads.items()
        if ident == main
        or not (
            named.get(ident, "?").startswith(_OWN_THREAD_PREFIX)
            or (ident not in named and any(os.path.abspath(e.filename).startswith(own) for e in entries))
        )
    }
    text, shown_threads = _text(shown, main, named)
    return Stacks(
        text=text, threads=shown_threads, user_frame=_user_entry(threads.get(main, []) if main is not None else [])
    )


def has_faulthandler_stacks(dump: str) -> bool:
    """Whether ``dump`` holds what ``faulthandler`` writes for a thread (a signal landed)."""
    return bool(_parse_faulthandler(dump))


def _parse_faulthandler(dump: str) -> dict[int, list[traceback.FrameSummary]]:
    import re

    header = re.compile(r"^(?:Current thread|Thread) 0x([0-9a-fA-F]+)")
    frame = re.compile(r'^\s+File "(.*)", line (\d+|\?\?\?) in (.*)$')
    threads: dict[int, list[traceback.FrameSummary]] = {}
    current: list[traceback.FrameSummary] | None = None
    for line in dump.splitlines():
        found = header.match(line)
        if found:
            current = threads.setdefault(int(found.group(1), 16), [])
            continue
        found = frame.match(line)
        if found and current is not None:
            number = int(found.group(2)) if found.group(2).isdigit() else 0
            current.append(traceback.FrameSummary(found.group(1), number, found.group(3).strip()))
    return threads
