"""Every Python and shell example in the README and the docs site runs, as a reader would run it.

The fenced blocks are collected here (no plug-in): a ```` ```python ```` block runs in a fresh interpreter of this
venv, a ```` ```bash ```` / ```` ```sh ```` / ```` ```shell ```` block with ``bash -e`` in a temporary directory
where the checkout's top-level folders (``examples/``, ``collector-config/``, ...) are linked, with this venv first
on ``PATH`` and no ``OTEL_*`` or torchrun variable of ours. Each block is bounded by a timeout, and whatever it
started (a job in the background) is killed with its process group afterwards. Output is shown in ```` ```text ````
blocks, which are not run.

More words after the language say how (``mkdocs.yml``'s hook drops them before rendering):

- ``skip``: never run, for what truly cannot run here (PyPI, docker, a remote collector); the sentence before the
  block says why, with the words "docs tests do not run" (checked below);
- ``requires=<program>``: skipped, saying so, where the program is not installed (``make test`` installs it).

A block whose code is the same as an earlier one's (the README's quickstart is the overview page's) runs once.
The cheap checks (every block's language and words known, every Python block compiles, every skip explained) run
in ``make test-fast``; running the blocks starts processes (torchrun jobs), so those tests are marked ``jobs``. The
site itself is built with ``mkdocs build --strict`` (broken links and anchors fail it) by the last test.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.env import clean_env

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
#: The language of a block that runs, and the interpreter it runs with.
RUNNERS = {"python": "python", "py": "python", "bash": "bash", "sh": "bash", "shell": "bash"}
#: Languages shown, never run (output, queries, configuration).
SHOWN = {"", *"text txt console output promql logql json jsonl yaml yml toml ini csv dockerfile diff html".split()}
#: Seconds a block may take: a Python snippet starts one interpreter, a shell block may run up to three torchrun jobs
#: (some 10 s each on an idle 2-core machine; a minute each under a load of 12, as in `make test` beside other jobs).
TIMEOUTS = {"python": 60.0, "bash": 420.0}
#: The words before a ``skip`` block that say why it does not run.
SKIP_REASON = "docs tests do not run"
#: The top-level entries of the checkout that are not linked into a block's directory.
NOT_LINKED = {"site", "build", "dist"}
_FENCE = re.compile(r"^(?P<fence>`{3,}|~{3,})[ \t]*(?P<info>[^\n`]*)$")


@dataclass(frozen=True)
class Block:
    """One fenced block of a page: where it is, its language and further words, its code."""

    page: Path
    index: int
    line: int
    lang: str
    words: tuple[str, ...]
    code: str
    preceding: str

    @property
    def name(self) -> str:
        return f"{self.page.relative_to(ROOT)}[{self.index}]"

    @property
    def runner(self) -> str | None:
        return RUNNERS.get(self.lang)

    @property
    def required(self) -> list[str]:
        return [word.split("=", 1)[1] for word in self.words if word.startswith("requires=")]


def pages() -> list[Path]:
    """The README and every page of the site (``_*.md`` fragments are no pages: ``exclude_docs``)."""
    return [ROOT / "README.md", *sorted(p for p in DOCS.glob("*.md") if not p.name.startswith("_"))]


def blocks(page: Path) -> Iterator[Block]:
    """The fenced blocks of ``page``, in order (a fence closes with a fence of its kind at least as long)."""
    lines = page.read_text().splitlines()
    index, i = 0, 0
    while i < len(lines):
        match = _FENCE.match(lines[i])
        if not match:
            i += 1
            continue
        fence, info = match["fence"], match["info"].split()
        end = next((j for j in range(i + 1, len(lines)) if _closes(lines[j], fence)), len(lines))
        lang = info[0].lower() if info else ""
        preceding = "\n".join(lines[max(0, i - 6) : i])
        yield Block(page, index, i + 1, lang, tuple(info[1:]), "\n".join(lines[i + 1 : end]) + "\n", preceding)
        index += 1
        i = end + 1


def _closes(line: str, fence: str) -> bool:
    stripped = line.strip()
    return stripped.startswith(fence) and set(stripped) == {fence[0]}


def all_blocks() -> list[Block]:
    return [block for page in pages() for block in blocks(page)]


def runnable() -> list[Block]:
    """The blocks to run: runnable languages, not ``skip``, each code once."""
    seen: set[str] = set()
    chosen = []
    for block in all_blocks():
        if block.runner is None or "skip" in block.words or block.code in seen:
            continue
        seen.add(block.code)
        chosen.append(block)
    return chosen


# --- the cheap checks (make test-fast) ---


def test_every_block_says_a_known_language_and_known_words() -> None:
    unknown = [
        f"{b.name} line {b.line}: {b.lang!r} {b.words}"
        for b in all_blocks()
        if (b.runner is None and b.lang not in SHOWN)
        or any(w != "skip" and not w.startswith("requires=") for w in b.words)
    ]
    assert unknown == [], "fence info strings: a language of RUNNERS or SHOWN, then `skip` or `requires=PROGRAM`"


def test_every_skipped_block_says_why() -> None:
    unexplained = [
        f"{b.name} line {b.line}" for b in all_blocks() if "skip" in b.words and SKIP_REASON not in b.preceding
    ]
    assert unexplained == [], f"a `skip` block follows a sentence saying why ('... {SKIP_REASON} ...')"


@pytest.mark.parametrize("block", [b for b in all_blocks() if b.runner == "python"], ids=lambda b: b.name)
def test_python_blocks_compile(block: Block) -> None:
    compile(block.code, f"{block.name} (line {block.line})", "exec")


def test_there_are_examples_to_run() -> None:
    """The collector finds the README's quickstart (a parser broken into finding nothing would pass everything)."""
    readme = [b for b in runnable() if b.page.name == "README.md"]
    assert {b.runner for b in readme} == {"python", "bash"}


def test_the_readme_links_resolve() -> None:
    """The README is no page of the site (mkdocs checks the pages' links): its relative links are checked here."""
    links = re.findall(r"\]\(([^)\s]+)\)", (ROOT / "README.md").read_text())
    local = [link.split("#", 1)[0] for link in links if "://" not in link and not link.startswith("#")]
    assert local, "the README links to the docs"
    assert [link for link in local if not (ROOT / link).exists()] == []


# --- running them (make test) ---


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    """A directory where a block's relative paths (``examples/train_ddp.py``) resolve and what it writes stays."""
    for entry in ROOT.iterdir():
        if not entry.name.startswith(".") and entry.name not in NOT_LINKED:
            (tmp_path / entry.name).symlink_to(entry)
    return tmp_path


@pytest.mark.jobs
@pytest.mark.parametrize("block", runnable(), ids=lambda b: b.name)
def test_example_runs(block: Block, workdir: Path) -> None:
    missing = [program for program in block.required if shutil.which(program) is None]
    if missing:
        pytest.skip(f"{block.name} needs {', '.join(missing)} (make test installs it)")
    assert block.runner is not None
    script = workdir / ("example.py" if block.runner == "python" else "example.sh")
    script.write_text(block.code)
    argv = [sys.executable, str(script)] if block.runner == "python" else ["bash", "-e", str(script)]
    env = clean_env()
    env.pop("TORCH_DISABLE_SHARE_RDZV_TCP_STORE")  # what a block needs of it, it says itself
    env["PATH"] = os.pathsep.join((str(Path(sys.executable).parent), env.get("PATH", "")))
    code, output, seconds = _run(argv, workdir, env, TIMEOUTS[block.runner])
    where = f"{block.name} (line {block.line}), {seconds:.1f} s"
    assert code == 0, f"{where} exited {code}:\n{block.code}\n--- output (end) ---\n{output[-6000:]}"
    if block.runner == "python":
        assert "Traceback" not in output, f"{where} printed a traceback:\n{output[-6000:]}"


def _run(argv: list[str], cwd: Path, env: dict[str, str], timeout: float) -> tuple[int | None, str, float]:
    """Run ``argv`` in a session of its own; whatever is left of the session afterwards (or at the timeout) is
    killed. Output goes to a file: a pipe nobody reads could block a job's workers."""
    log = cwd / "output.log"
    start = time.monotonic()
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            code: int | None = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            code = None
        finally:
            _kill_session(proc)
    seconds = time.monotonic() - start
    output = log.read_text(errors="replace")
    if code is None:
        output += f"\n--- timed out after {timeout:.0f} s ---"
    return code, output, seconds


def _kill_session(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=10)


@pytest.mark.jobs
def test_the_site_builds_strictly(tmp_path: Path) -> None:
    """``mkdocs build --strict``: a broken link or anchor, a page missing from the nav, a bad fence all fail."""
    mkdocs = Path(sys.executable).parent / "mkdocs"
    argv = [str(mkdocs), "build", "--strict", "--site-dir", str(tmp_path / "site")]
    result = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr[-6000:]
