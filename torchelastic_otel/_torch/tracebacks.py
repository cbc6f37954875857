"""Re-raising from a wrapper without the wrapper's frame: a failing job's traceback is the one plain torchrun prints.

The bridge wraps calls a user's code makes (``loss.backward()``, ``Trainer.train()``, ``torch.save``, torch's
``run``...). An exception leaving a Python function gets an entry for that function's frame in its traceback the
moment it first reaches the frame, so a wrapper would add a ``File ".../torchelastic_otel/...", in wrapper`` entry
(and its source line) to every traceback that passes it. Each wrapper re-raises this way instead::

    try:
        result = original(*args, **kwargs)
    except BaseException as exc:
        ...  # the wrapper's own work (end its span): never raises
        tracebacks.drop_own_frame(exc)
        raise  # bare: ``raise exc`` would add the wrapper's entry again

A bare ``raise`` -- and the implicit re-raise at the end of a ``finally`` block, or of a ``with`` block whose
``__exit__`` lets the exception go -- adds no entry of its own frame. On Python 3.11 and later it re-raises the
exception with its own ``__traceback__``: with the wrapper's entry taken off it, the caller's entry links straight
to the callee's. Python 3.10 re-raises with the traceback saved when the ``except`` block was entered instead (every
other way to raise adds the frame again): :func:`drop_own_frame` replaces that one too (``_compat``: CPython's
``PyErr_SetExcInfo``; where it cannot, counted, the wrapper's entry stays).

What ``traceback.format_exc()`` (torch's ``@record`` error file), ``sys.excepthook`` and
``traceback.format_exception`` print is then the unwrapped call's traceback; the exception itself, its
``__context__`` and ``__cause__`` (and their tracebacks) are untouched. The normal path costs nothing (an ``except``
block is free until an exception comes, on 3.11+); ``bench/bench_tracebacks.py`` times the exception path.
"""

from __future__ import annotations

import sys

from torchelastic_otel import _compat

__all__ = ["drop_own_frame"]

#: Python 3.10's bare ``raise`` re-raises the traceback saved when the ``except`` block was entered.
_SAVED_TRACEBACK = sys.version_info < (3, 11)


def drop_own_frame(exc: BaseException) -> None:
    """In a wrapper's ``except`` block, right before its bare ``raise``: take the wrapper's own entry (the first of
    ``exc.__traceback__``, where it is the calling frame's) off the traceback ``exc`` is re-raised with. Never
    raises."""
    try:
        tb = exc.__traceback__
        if tb is None or tb.tb_frame is not _compat.caller_frame(1):
            return
        exc.__traceback__ = tb.tb_next
        if _SAVED_TRACEBACK:
            _compat.reraised_traceback(exc, tb.tb_next)
    except Exception:  # never into the job: the wrapper's entry stays
        pass
