"""SIGTERM in a process whose main thread may be blocked in native code (a gloo/NCCL collective,
``init_process_group``), which is where a real rank is when torch's agent stops it.

CPython runs a Python signal handler only once the main thread is back in the interpreter. A rank blocked in a
collective whose peer died never gets there: a handler of the usual kind would make the worker ignore SIGTERM until
the agent's 30 s grace ends and it is SIGKILLed -- every failure-restart 30 s longer, and its telemetry lost anyway.

So the signal is also received off the main thread: CPython's C-level handler writes the signal number to the
*wakeup fd* (``signal.set_wakeup_fd``) even while the main thread is blocked, and a watcher thread reads it. Whoever
sees the signal first -- the watcher, or the Python handler in the main thread -- runs the final words once
(``on_terminate``: the terminated record with every thread's stack, and a flush), bounded by ``bound_millis``.
Then:

- no other handler was installed (SIG_DFL): the process dies of SIGTERM's default action, so torch's agent sees
  the same exit status as without the bridge (-15). From the watcher thread that needs libc's ``signal()``
  (``_compat.default_disposition``): ``signal.signal`` works in the main thread only.
- a handler was installed before (the user's, torch's): it is chained, in the main thread, once CPython gets
  there -- as without the bridge. The telemetry was delivered already.
- a handler was installed after ours (it replaced ours): it is the application's to run; the watcher only
  delivered the telemetry.

One stretch is different: while the main thread holds the GIL in native code for long -- loading torch's C++ libraries
at ``import torch`` (docs/performance.md) -- neither the watcher nor the handler can run, and a SIGTERM would wait for
the load to end. For such a stretch (:func:`enter_native` / :func:`leave_native`, a worker's ``import torch``) the
signal is handled in C instead: ``faulthandler`` writes every thread's Python stack to a file and the process dies of
SIGTERM's default action at once, as without the bridge; the agent turns the file into the record.

The wakeup fd is chained too: bytes are forwarded to one that was set before. Forked children keep the handler
(main-thread path) but not the watcher (``after_fork_in_child``); processes started with exec are unaffected (the
pipe is close-on-exec, handlers reset on exec).
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

from torchelastic_otel import _compat
from torchelastic_otel._process import stacks as _stacks

__all__ = ["install", "uninstall", "installed", "enter_native", "leave_native"]

_logger = logging.getLogger("torchelastic_otel")

OnTerminate = Callable[[_stacks.Stacks], object]
#: A SIGTERM handler as ``signal.getsignal`` returns it.
Handler = Callable[[int, FrameType | None], object] | int | signal.Handlers | None


class _Watcher:
    """One SIGTERM handler and its watcher thread: installed once per process by :func:`install`."""

    def __init__(self, on_terminate: OnTerminate, bound_millis: int, previous: Handler) -> None:
        self.on_terminate = on_terminate
        self.bound = max(0, bound_millis) / 1000
        self.previous = previous
        self.claim = threading.Lock()  # held by whoever runs the final words: never released (once per process)
        self.done = threading.Event()
        self.read_fd = self.write_fd = -1
        self.forward_fd = -1
        self.thread: threading.Thread | None = None
        self.stopping = False
        self.native = False  # between enter_native() and leave_native()

    # -- the handler in the main thread ---------------------------------------------------------------------------

    def handler(self, signum: int, frame: FrameType | None) -> None:
        self.handle(signum, frame, in_main_thread=True)

    # -- the watcher thread ----------------------------------------------------------------------------------------

    def arm(self) -> bool:
        """Create the pipe, make it the wakeup fd (chaining one set before) and start the watcher thread."""
        read_fd, write_fd = os.pipe()  # close-on-exec (PEP 446)
        os.set_blocking(write_fd, False)  # CPython requires a non-blocking wakeup fd
        try:
            previous_fd = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
        except (ValueError, OSError) as exc:
            os.close(read_fd)
            os.close(write_fd)
            _logger.debug("torchelastic_otel: no wakeup fd (%s); SIGTERM handled in the main thread only", exc)
            return False
        self.read_fd, self.write_fd, self.forward_fd = read_fd, write_fd, previous_fd
        self.thread = threading.Thread(target=self.watch, name="torchelastic-otel-sigterm", daemon=True)
        self.thread.start()
        return True

    def watch(self) -> None:
        read_fd = self.read_fd
        while True:
            try:
                data = os.read(read_fd, 64)
            except InterruptedError:  # pragma: no cover - retried by os.read itself (PEP 475)
                continue
            except OSError:
                return  # closed by uninstall or after a fork
            if not data or self.stopping:
                return
            if self.forward_fd >= 0:
                try:
                    os.write(self.forward_fd, data)
                except OSError:
                    pass
            if signal.SIGTERM in data:
                self.handle(signal.SIGTERM, None, in_main_thread=False)

    def disarm(self, thread_alive: bool = True) -> None:
        """Stop the watcher, give the wakeup fd back (keeping one set after ours) and close the pipe.

        A thread blocked in ``read`` is not woken by closing the fd, so it is sent a byte first and joined (at most
        1 s) before the read end is closed: an fd number must not be reused while it still reads from it.
        """
        self.stopping = True
        try:
            current = signal.set_wakeup_fd(self.forward_fd, warn_on_full_buffer=False)
            if current != self.write_fd:
                signal.set_wakeup_fd(current, warn_on_full_buffer=False)  # not ours any more: leave it
        except (ValueError, OSError):
            pass
        thread = self.thread if thread_alive else None
        if thread is not None and self.write_fd >= 0:
            try:
                os.write(self.write_fd, b"\0")
            except OSError:
                pass
        _close(self.write_fd)
        self.write_fd = -1
        if thread is not None and thread is not threading.current_thread():
            thread.join(1.0)
            if thread.is_alive():
                return  # leave its fd open rather than let a new file reuse it under the reader
        _close(self.read_fd)
        self.read_fd = -1

    # -- both ------------------------------------------------------------------------------------------------------

    def handle(self, signum: int, frame: FrameType | None, in_main_thread: bool) -> None:
        """Run the final words once (whoever comes first), then chain the previous handler or die of the signal."""
        if self.claim.acquire(blocking=False):
            try:
                self._final_words(frame if in_main_thread else None)
            finally:
                self.done.set()
        elif not in_main_thread:
            return  # the main thread's handler (or an earlier signal) has it in hand
        else:
            self.done.wait(self.bound + 0.5)  # the watcher is delivering: let it finish first
        self._after(signum, frame, in_main_thread)

    def _final_words(self, main_frame: FrameType | None) -> None:
        """Stacks, the terminated record and a flush -- all within the bound, in a helper thread (the stacks too:
        whatever they need that the interrupted thread holds, the process's death is not held up past the bound)."""
        from torchelastic_otel._export.bounded import run_bounded

        def words() -> bool:
            try:
                stacks = _stacks.capture(main_frame)
            except Exception:  # never in the way of the process's death
                stacks = _stacks.Stacks("", 0, None)
            return _call_quietly(self.on_terminate, stacks)

        run_bounded(words, int(self.bound * 1000))

    def _after(self, signum: int, frame: FrameType | None, in_main_thread: bool) -> None:
        current = signal.getsignal(signal.SIGTERM)
        if current != self.handler:
            return  # the application replaced our handler: what happens now is its handler's business
        previous = self.previous
        if callable(previous):
            if in_main_thread:
                previous(signum, frame)
            return  # the watcher: CPython calls our handler in the main thread when it can, which chains
        _die(signal.SIGTERM, in_main_thread)


def _call_quietly(function: OnTerminate, stacks: _stacks.Stacks) -> bool:
    try:
        function(stacks)
        return True
    except Exception:
        _logger.debug("torchelastic_otel: SIGTERM telemetry failed", exc_info=True)
        return False


def _close(fd: int) -> None:
    if fd >= 0:
        try:
            os.close(fd)
        except OSError:
            pass


def _die(signum: int, in_main_thread: bool) -> None:
    """End the process by ``signum``'s default action, as it would have without the bridge."""
    if in_main_thread:
        signal.signal(signum, signal.SIG_DFL)
    elif not _compat.default_disposition(signum):
        _compat.exit_as_if_signalled(signum)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, [signum])
    os.kill(os.getpid(), signum)
    time.sleep(1.0)  # the default action ends the process; should anything have caught it, end it anyway
    _compat.exit_as_if_signalled(signum)


_lock = threading.Lock()
_watcher: _Watcher | None = None


def installed() -> bool:
    return _watcher is not None


def install(on_terminate: OnTerminate, bound_millis: int) -> bool:
    """Handle SIGTERM as described above; call in the main thread. ``False`` (nothing changed) in another thread,
    when SIGTERM is ignored (``SIG_IGN``: whoever started us wants it so) or when already installed."""
    global _watcher
    if threading.current_thread() is not threading.main_thread():
        return False
    with _lock:
        if _watcher is not None:
            return False
        previous = signal.getsignal(signal.SIGTERM)
        if previous is signal.SIG_IGN:
            return False
        watcher = _Watcher(on_terminate, bound_millis, previous)
        signal.signal(signal.SIGTERM, watcher.handler)
        watcher.arm()
        _watcher = watcher
        return True


def enter_native(dump: Any) -> bool:
    """From now on, until :func:`leave_native`, a SIGTERM makes ``faulthandler`` write every thread's Python stack to
    ``dump`` (an open file) from C and ends the process by SIGTERM's default action at once: no Python runs. Main
    thread only, and only where the bridge's handler stands in for the default action (an application's handler
    must still run); ``False`` where nothing changed. There is no handler between the two calls below: a SIGTERM
    landing there ends the process by the default action (without its stacks)."""
    watcher = _watcher
    if watcher is None or watcher.native or threading.current_thread() is not threading.main_thread():
        return False
    if watcher.previous not in (signal.SIG_DFL, None) or signal.getsignal(signal.SIGTERM) != watcher.handler:
        return False
    import faulthandler

    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        faulthandler.register(signal.SIGTERM, file=dump, all_threads=True, chain=True)
    except Exception:
        signal.signal(signal.SIGTERM, watcher.handler)
        return False
    watcher.native = True
    return True


def leave_native() -> None:
    """Back to the watcher and the handler after :func:`enter_native` (main thread only)."""
    watcher = _watcher
    if watcher is None or not watcher.native or threading.current_thread() is not threading.main_thread():
        return
    import faulthandler

    watcher.native = False
    try:
        faulthandler.unregister(signal.SIGTERM)
    except Exception:
        pass
    if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):  # nobody set another handler meanwhile
        signal.signal(signal.SIGTERM, watcher.handler)


def uninstall() -> None:
    """Undo :func:`install`: the previous handler and wakeup fd (main thread only; elsewhere nothing changes)."""
    global _watcher
    if threading.current_thread() is not threading.main_thread():
        return
    leave_native()
    with _lock:
        watcher, _watcher = _watcher, None
        if watcher is None:
            return
        if signal.getsignal(signal.SIGTERM) == watcher.handler:
            signal.signal(signal.SIGTERM, watcher.previous if watcher.previous is not None else signal.SIG_DFL)
        watcher.disarm()


def after_fork_in_child() -> None:
    """A forked child keeps the handler (main-thread path), not the watcher: its thread did not survive the fork,
    and its pipe is the parent's (the parent would read the child's signals)."""
    global _lock
    _lock = threading.Lock()
    watcher = _watcher
    if watcher is None:
        return
    watcher.claim = threading.Lock()
    watcher.done = threading.Event()
    if watcher.native:  # the parent's dump file is not the child's: the child keeps the handler
        try:
            import faulthandler

            faulthandler.unregister(signal.SIGTERM)
            signal.signal(signal.SIGTERM, watcher.handler)
        except Exception:
            pass
        watcher.native = False
    if watcher.read_fd >= 0:
        watcher.disarm(thread_alive=False)
