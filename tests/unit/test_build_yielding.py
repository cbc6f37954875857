"""A background build hands the GIL back often while it runs, and leaves the process's switch interval as it was.

(The effect on a real worker -- ``init_process_group`` slowed by 0.4-0.7 s under CPython's 5 ms interval while the
build ran beside it -- is measured in ``bench/bench_failures.py``, not timed here.)
"""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest

from torchelastic_otel._export import state


@pytest.fixture(autouse=True)
def _interval() -> Iterator[None]:
    before = sys.getswitchinterval()
    yield
    sys.setswitchinterval(before)


def test_the_interval_is_short_during_the_build_and_restored_after() -> None:
    sys.setswitchinterval(0.005)
    with state._yielding():
        assert sys.getswitchinterval() == pytest.approx(state.BUILD_SWITCH_INTERVAL)
    assert sys.getswitchinterval() == pytest.approx(0.005)


def test_an_interval_changed_meanwhile_is_left_as_it_was_changed() -> None:
    sys.setswitchinterval(0.005)
    with state._yielding():
        sys.setswitchinterval(0.002)  # the application's own choice, made during the build
    assert sys.getswitchinterval() == pytest.approx(0.002)


def test_a_shorter_interval_is_not_lengthened() -> None:
    sys.setswitchinterval(0.0001)
    with state._yielding():
        assert sys.getswitchinterval() == pytest.approx(0.0001)
    assert sys.getswitchinterval() == pytest.approx(0.0001)
