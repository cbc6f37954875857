"""What a wrapper's re-raise without its own frame costs (``torchelastic_otel._torch.tracebacks``).

``.venv/bin/python bench/bench_tracebacks.py`` (a few seconds; a report, not a test: it always exits 0). ns per call,
N calls timed with ``time.perf_counter_ns``, REPEATS times in turns, median; the loop overhead is included.

- normal path: a call through a wrapper shaped as the bridge's (``try`` / ``except BaseException``:
  ``drop_own_frame`` and a bare ``raise``), against the same call with no wrapper, a wrapper with no ``try``, and
  the ``try`` / ``finally`` wrapper the bridge had before. Target: the idiom costs no more than ``try`` /
  ``finally`` (an ``except`` block is free until an exception comes, on 3.11+);
- exception path: a call that raises, caught by the caller, through the same wrappers (and one re-raising with its
  own frame left on, the same normal path as the idiom's). What the idiom adds is paid once an exception, never by
  the normal path.
"""

from __future__ import annotations

import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from torchelastic_otel._torch import tracebacks

REPEATS = 7
N_CALLS = 200_000
N_RAISES = 50_000


def work(fail: bool) -> int:
    if fail:
        raise ValueError("failed")
    return 1


def no_try(original: Callable[..., Any]) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return original(*args, **kwargs)

    return wrapper


def try_finally(original: Callable[..., Any]) -> Callable[..., Any]:
    marks: list[int] = []

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return original(*args, **kwargs)
        finally:
            marks.append(1)
            marks.clear()

    return wrapper


def reraise_with_frame(original: Callable[..., Any]) -> Callable[..., Any]:
    marks: list[int] = []

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            result = original(*args, **kwargs)
        except BaseException:
            marks.append(1)
            marks.clear()
            raise
        marks.append(1)
        marks.clear()
        return result

    return wrapper


def idiom(original: Callable[..., Any]) -> Callable[..., Any]:
    marks: list[int] = []

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            result = original(*args, **kwargs)
        except BaseException as exc:
            marks.append(1)
            marks.clear()
            tracebacks.drop_own_frame(exc)
            raise
        marks.append(1)
        marks.clear()
        return result

    return wrapper


def calls(function: Callable[[bool], int]) -> float:
    start = time.perf_counter_ns()
    for _ in range(N_CALLS):
        function(False)
    return (time.perf_counter_ns() - start) / N_CALLS


def raises(function: Callable[[bool], int]) -> float:
    start = time.perf_counter_ns()
    for _ in range(N_RAISES):
        try:
            function(True)
        except ValueError:
            pass
    return (time.perf_counter_ns() - start) / N_RAISES


def timed(measure: Callable[[Callable[[bool], int]], float], variants: dict[str, Callable[[bool], int]]) -> dict:
    runs: dict[str, list[float]] = {name: [] for name in variants}
    for function in variants.values():  # warm-up
        measure(function)
    for _ in range(REPEATS):
        for name, function in variants.items():
            runs[name].append(measure(function))
    return {name: statistics.median(values) for name, values in runs.items()}


def main() -> None:
    print(f"Python {platform.python_version()} ({sys.implementation.name}), {REPEATS} runs, median ns per call")
    variants = {
        "no wrapper": work,
        "wrapper, no try": no_try(work),
        "wrapper, try/finally": try_finally(work),
        "wrapper, re-raise with its frame": reraise_with_frame(work),
        "wrapper, drop_own_frame + raise": idiom(work),
    }
    normal = timed(calls, variants)
    failing = timed(raises, variants)
    print(f"{'':36} {'normal path':>12} {'exception path':>15}")
    for name in variants:
        print(f"{name:36} {normal[name]:12.0f} {failing[name]:15.0f}")
    added = failing["wrapper, drop_own_frame + raise"] - failing["wrapper, re-raise with its frame"]
    print(f"drop_own_frame adds {added:.0f} ns to an exception's way through a wrapper")
    verdict = normal["wrapper, drop_own_frame + raise"] <= normal["wrapper, try/finally"] * 1.10
    print(f"{'PASS' if verdict else 'FAIL'}  normal path: the idiom costs no more than try/finally (10% for noise)")


if __name__ == "__main__":
    main()
