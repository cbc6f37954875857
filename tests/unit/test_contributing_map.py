"""The architecture map of ``docs/contributing.md`` is the package's: what it names exists, it names every room, and
the imports run down its table.

The map is read as a reader reads it: the table under "## Architecture" (a row per room; the first cell names the
room's paths, the second what it owns) and the list under "How data flows". A word in backticks is

- a **package path** when it has a slash or ends in ``.py`` (``_torch/worker/steps.py``, ``report/``), relative to
  ``torchelastic_otel/``: the file or folder must exist;
- a **package member** when it is a Python name (``passthrough``, ``anatomy.Ledger``): a module (or sub-package)
  of that name in a folder its row or list item names -- anywhere in the package where it names none -- and, after
  a dot, a name that module defines. The few outside names the map mentions (torch's) are listed in ``OUTSIDE``;
  calls (``install()``), commands, decorators and upper-case names (variables, constants) are not checked.

So a module renamed or removed fails here, not in a reader's hands; and, the other way, a top-level room the
table leaves out (a new ``.py`` file or folder at the package's top) fails too. The table's order is the layering
the page states: a top-level room's row is the first that names it, and no module imports a room of an earlier row
(within a row or a room any direction goes; ``make lint`` checks for cycles). Only source text is read (``ast``,
through ``.ci/import_cycles.py``'s import graph): nothing is imported, torch least of all.
"""

from __future__ import annotations

import ast
import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "torchelastic_otel"
MAP = ROOT / "docs" / "contributing.md"
#: Names in the map's backticks that are torch's, not the package's.
OUTSIDE = {"DataLoader", "__next__", "autograd.backward"}
_TICKED = re.compile(r"`([^`\n]+)`")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*")


@dataclass(frozen=True)
class Entry:
    """A row of the table or an item of the list: the package paths it names (the room, for a row) and every word
    in backticks."""

    where: str
    paths: tuple[str, ...]
    words: tuple[str, ...]


def _is_path(word: str) -> bool:
    return ("/" in word or word.endswith(".py")) and " " not in word and not word.startswith(".")


def architecture(text: str) -> tuple[list[Entry], list[Entry]]:
    """(the table's rows, in order; the data-flow list's items) of the map's "## Architecture" section."""
    section = text.split("\n## Architecture", 1)[1].split("\n## ", 1)[0]
    table, _, flow = section.partition("How data flows")
    rows = []
    for line in table.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")] if line.startswith("|") else []
        if len(cells) < 2 or set(cells[0]) <= {"-", ":", " "} or cells[0] == "room":
            continue
        room = tuple(w for w in _TICKED.findall(cells[0]) if _is_path(w))
        rows.append(Entry(f"row {cells[0]!r}", room, tuple(_TICKED.findall(line))))
    items: list[list[str]] = []
    for line in flow.splitlines():
        if line.startswith("- "):
            items.append([line])
        elif items and line.startswith("  ") and line.strip():
            items[-1].append(line)
    entries = []
    for item in items:
        words = tuple(_TICKED.findall(" ".join(item)))
        entries.append(Entry(f"item {item[0][:50]!r}", tuple(w for w in words if _is_path(w)), words))
    return rows, entries


def _modules_in(folder: Path) -> dict[str, Path]:
    """The modules and sub-packages directly in ``folder``, by name: ``name`` -> its ``.py`` file (a package's
    ``__init__.py``; a folder of modules without one, the folder)."""
    found: dict[str, Path] = {}
    for child in sorted(folder.iterdir()):
        if child.suffix == ".py":
            found[child.stem] = child
        elif child.is_dir() and any(child.rglob("*.py")):
            found[child.name] = child / "__init__.py" if (child / "__init__.py").exists() else child
    return found


def _defines(module: Path, name: str) -> bool:
    """Whether the module's top level defines ``name`` (a class, function, assignment or import)."""
    if not module.is_file():
        return False
    for node in ast.parse(module.read_text()).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) and node.name == name:
            return True
        if isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                return True
        if isinstance(node, ast.Import | ast.ImportFrom):
            if any((alias.asname or alias.name.split(".")[0]) == name for alias in node.names):
                return True
    return False


def _is_member(word: str) -> bool:
    """Whether a word in backticks names a member of the package: a Python name, not a path, a call, a command, an
    upper-case variable or constant, or one of torch's names."""
    if _is_path(word) or word in OUTSIDE or word.startswith("torch.") or word.isupper():
        return False
    return _NAME.fullmatch(word) is not None


def _every_folder(package: Path) -> list[Path]:
    return [package, *sorted(d for d in package.rglob("*") if d.is_dir() and d.name != "__pycache__")]


def _folder(path: str, package: Path) -> Path:
    """The folder a package path stands for: itself for a folder, its parent for a file."""
    target = package / path.rstrip("/")
    return target if path.endswith("/") or target.is_dir() else target.parent


def missing(entries: list[Entry], package: Path = PACKAGE) -> list[str]:
    """What the entries name that the package does not have."""
    out = []
    for entry in entries:
        for path in entry.paths:
            target = package / path.rstrip("/")
            if not (target.is_file() if path.endswith(".py") else target.is_dir() and any(target.rglob("*.py"))):
                out.append(f"{entry.where}: `{path}` is not in {package.name}/")
        folders = sorted({_folder(p, package) for p in entry.paths}) or _every_folder(package)
        for word in entry.words:
            if not _is_member(word):
                continue
            name, _, member = word.partition(".")
            modules = [m[name] for m in map(_modules_in, filter(Path.is_dir, folders)) if name in m]
            if not modules:
                where = ", ".join(f"{f.relative_to(package.parent)}/" for f in folders[:4])
                out.append(f"{entry.where}: `{word}` names no module in {where}")
            elif member and not any(_defines(m, member) for m in modules):
                out.append(f"{entry.where}: `{word}`: {modules[0].relative_to(package.parent)} defines no {member}")
    return out


def _room(path: str) -> str:
    """The top-level room of a package path: its first part (``_torch/worker/steps.py`` -> ``_torch``)."""
    return path.rstrip("/").split("/")[0]


def rooms_left_out(rows: list[Entry], package: Path = PACKAGE) -> list[str]:
    """The package's top-level rooms (``.py`` files and folders of modules) that no row of the table names."""
    named = {_room(path) for row in rows for path in row.paths}
    tops = [c.name for c in sorted(package.iterdir()) if c.suffix == ".py" or c.is_dir() and any(c.rglob("*.py"))]
    return [name for name in tops if name not in named]


def _import_cycles() -> ModuleType:
    spec = importlib.util.spec_from_file_location("import_cycles", ROOT / ".ci" / "import_cycles.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def imports_up(rows: list[Entry], package: Path = PACKAGE) -> list[str]:
    """Imports from one top-level room into a room of an earlier row of the table (each room's row is the first
    that names it; within a row, and within a room, any direction: ``make lint`` checks for cycles)."""
    floor: dict[str, int] = {}
    for index, row in enumerate(rows):
        for path in row.paths:
            floor.setdefault(_room(path), index)
    graph = _import_cycles()
    known = graph.modules(package)

    def room(module: str) -> str:
        parts = module.split(".")[1:]
        if not parts:
            return "__init__.py"
        return parts[0] if (package / parts[0]).is_dir() else parts[0] + ".py"

    out = []
    for name, path in sorted(known.items()):
        for target in sorted(graph.edges(name, path, known)):
            here, there = room(name), room(target)
            if here != there and here in floor and there in floor and floor[there] < floor[here]:
                out.append(f"{name} imports {target}: `{there}` is above `{here}` in the table")
    return out


def test_every_room_and_module_the_map_names_exists() -> None:
    rows, flow = architecture(MAP.read_text())
    assert len(rows) >= 8 and len(flow) >= 4, "the map's table or its data-flow list was not found"
    assert missing(rows + flow) == []


def test_every_top_level_room_of_the_package_is_in_the_table() -> None:
    rows, _ = architecture(MAP.read_text())
    assert rooms_left_out(rows) == [], "add a row (or a path to a row) of docs/contributing.md's table"


def test_imports_run_down_the_table() -> None:
    rows, _ = architecture(MAP.read_text())
    assert imports_up(rows) == []


# --- the checks fail where they should ---


def test_a_name_the_package_lost_is_found() -> None:
    text = MAP.read_text()
    gone = text.replace("`_export/drainer.py`", "`_export/drainer_gone.py`", 1)
    gone = gone.replace("`passthrough`", "`passthrough_gone`", 1)
    rows, flow = architecture(gone)
    problems = missing(rows + flow)
    assert any("drainer_gone.py" in p for p in problems)
    assert any("passthrough_gone" in p for p in problems)
    wrong_member = text.replace("`anatomy.Ledger`", "`anatomy.Ledgerless`", 1)
    rows, flow = architecture(wrong_member)
    assert any("defines no Ledgerless" in p for p in missing(rows + flow))
    elsewhere = text.replace("`_torch/output/`", "`_torch/agent/`", 1)
    assert any("`passthrough`" in p for p in missing(architecture(elsewhere)[0]))


def test_a_room_left_out_and_an_import_up_are_found() -> None:
    rows, _ = architecture(MAP.read_text())
    without_report = [row for row in rows if "report/" not in row.paths]
    assert rooms_left_out(without_report) == ["report"]
    export = next(i for i, row in enumerate(rows) if "_export/" in row.paths)
    reordered = [rows[export], *rows[:export], *rows[export + 1 :]]
    assert any("`_export` is above" in p for p in imports_up(reordered))
