"""The bridge's settings and names each have one home: ``_settings`` reads every ``TORCHELASTIC_OTEL_*`` variable,
``_names`` spells every emitted name; the docs' settings table (``docs/configuration.md``) is the one ``_settings``
makes."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

from torchelastic_otel import _names, _settings
from torchelastic_otel._bootstrap import sitecustomize

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "torchelastic_otel"


def _string_literals(path: Path) -> list[str]:
    tokens = tokenize.generate_tokens(io.StringIO(path.read_text()).readline)
    return [
        ast.literal_eval(t.string)
        for t in tokens
        if t.type == tokenize.STRING and not t.string.startswith(("f", "rf", "b"))
    ]


def test_the_docs_table_is_the_settings_module() -> None:
    readme = (ROOT / "docs" / "configuration.md").read_text()
    assert _settings.markdown_table() in readme, (
        "docs/configuration.md's settings table differs from _settings: paste the output of "
        "python -c 'import torchelastic_otel._settings as s; print(s.markdown_table())'"
    )
    documented = set(re.findall(r"`(TORCHELASTIC_OTEL_[A-Z_]+)`", readme))
    public = {s.name for s in _settings.SETTINGS if not s.internal}
    assert public <= documented


def test_no_module_but_settings_names_a_variable() -> None:
    """A ``TORCHELASTIC_OTEL_*`` literal anywhere else would be a variable read behind the settings module's back
    (the bootstrap spells out the one it must read without the package, checked below)."""
    offenders = {}
    for path in PACKAGE.rglob("*.py"):
        if path.name in ("_settings.py", "sitecustomize.py"):
            continue
        found = [s for s in _string_literals(path) if re.fullmatch(r"TORCHELASTIC_OTEL_[A-Z_]+", s)]
        if found:
            offenders[str(path.relative_to(ROOT))] = found
    assert offenders == {}
    assert sitecustomize._AUTO_INSTALL_ENV == _settings.AUTO_INSTALL.name


def test_no_module_spells_an_emitted_name() -> None:
    """Span, event, metric and attribute names are ``_names``' constants, in the bridge and in the report."""
    offenders = {}
    for path in PACKAGE.rglob("*.py"):
        if path.name == "_names.py":
            continue
        found = [s for s in _string_literals(path) if re.fullmatch(r"torchelastic\.[a-z0-9_.]+", s)]
        if found:
            offenders[str(path.relative_to(ROOT))] = found
    assert offenders == {}
    values = [v for k, v in vars(_names).items() if k.isupper()]
    assert len(values) == len(set(values)), "one constant a name"


@pytest.mark.parametrize(
    ("raw", "expected", "counted"),
    [(None, None, False), ("", None, False), ("0", 0.0, False), ("2.5", 2.5, False), ("soon", None, True),
     ("-1", None, True), ("nan", None, True)],
)  # fmt: skip
def test_a_malformed_value_is_the_default_and_counted(
    monkeypatch: pytest.MonkeyPatch, raw: str | None, expected: float | None, counted: bool
) -> None:
    if raw is None:
        monkeypatch.delenv(_settings.STALL_SECONDS.name, raising=False)
    else:
        monkeypatch.setenv(_settings.STALL_SECONDS.name, raw)
    calls: list[bool] = []
    assert _settings.STALL_SECONDS.get(on_invalid=lambda: calls.append(True)) == expected
    assert calls == ([True] if counted else [])


def test_flags_read_as_before(monkeypatch: pytest.MonkeyPatch) -> None:
    for raw, expected in (("1", True), ("0", False), ("false", False), ("OFF", False), ("no", False), ("yes", True)):
        monkeypatch.setenv(_settings.WORKER_OUTPUT.name, raw)
        assert _settings.WORKER_OUTPUT.get() is expected, raw
    monkeypatch.delenv(_settings.WORKER_OUTPUT.name)
    assert _settings.WORKER_OUTPUT.get() is True


def test_with_a_configuration_file_the_logs_exporter_variable_is_ignored(monkeypatch: pytest.MonkeyPatch) -> None:
    """Worker output capture and logging records ask ``logs_exporters()`` before they start: ``OTEL_LOGS_EXPORTER``
    without ``OTEL_CONFIG_FILE``, the file (never parsed at a worker's start-up) with it, as the specification says."""
    from torchelastic_otel import _settings

    monkeypatch.delenv("OTEL_CONFIG_FILE", raising=False)
    monkeypatch.delenv("OTEL_LOGS_EXPORTER", raising=False)
    assert _settings.logs_exporters() == {"otlp"}
    monkeypatch.setenv("OTEL_LOGS_EXPORTER", " Console, none ,")
    assert _settings.logs_exporters() == {"console", "none"}
    monkeypatch.setenv("OTEL_LOGS_EXPORTER", "none")
    assert _settings.logs_exporters() == {"none"}
    monkeypatch.setenv("OTEL_CONFIG_FILE", "/nonexistent/otel.yaml")
    assert _settings.logs_exporters() == {"config_file"}
