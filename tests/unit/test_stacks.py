"""Every thread's stack at a signal, and the user's line (``torchelastic_otel._process.stacks``)."""

from __future__ import annotations

import json
import sys
import threading

from torchelastic_otel._process import stacks as _stacks


def test_user_frame_skips_the_standard_library() -> None:
    """Called back from inside ``json`` (stdlib): the innermost frame outside it is this test's own line."""
    found = []
    json.loads('{"a": 1}', object_hook=lambda d: found.append(_stacks.user_frame(sys._getframe(1))) or d)
    (frame,) = found
    assert frame is not None and frame.path == __file__
    assert frame.function == "test_user_frame_skips_the_standard_library"


def test_user_frame_skips_torch() -> None:
    """A frame inside torch (here: a torch function that calls back) is not the user's line."""
    import torch.utils._pytree as pytree

    found = []
    pytree.tree_map(lambda x: found.append(_stacks.user_frame(sys._getframe(1))) or x, [1])
    assert found and found[0] is not None and found[0].path == __file__


def test_capture_lists_the_main_thread_first_and_is_bounded() -> None:
    started, stop = threading.Event(), threading.Event()

    def deep(n: int) -> None:
        if n:
            deep(n - 1)
        else:
            started.set()
            stop.wait(10)

    threads = [threading.Thread(target=deep, args=(200,), name=f"worker-{i}") for i in range(20)]
    for thread in threads:
        thread.start()
    try:
        assert started.wait(10)
        stacks = _stacks.capture()
    finally:
        stop.set()
        for thread in threads:
            thread.join(10)
    assert stacks.text.startswith(f'Thread {threading.main_thread().ident} "MainThread"')
    assert len(stacks.text) <= _stacks.MAX_CHARS
    assert stacks.text.endswith("(stacks truncated)\n")
    assert stacks.threads >= 21


def test_a_process_stopped_while_importing_is_on_its_import_line(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Stopped inside ``import torch`` (which was importing NumPy then), the user's line is the ``import``, not a
    line of the module being imported."""
    import importlib
    import sys

    from torchelastic_otel._process import stacks as _stacks

    (tmp_path / "_being_imported.py").write_text(
        "import sys\nfrom torchelastic_otel._process import stacks\nFOUND = stacks.user_frame(sys._getframe())\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("_being_imported", None)
    module = importlib.import_module("_being_imported")  # the import line of this test
    found = module.FOUND
    assert found is not None and found.path == __file__ and found.function.startswith("test_a_process_stopped"), found
    assert _stacks.user_frame(sys._getframe()).path == __file__
