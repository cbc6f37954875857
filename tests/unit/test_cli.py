"""``torchelastic-otel``'s own help and version, as a newcomer types them (in this process: ``run.main``)."""

from __future__ import annotations

from importlib import metadata

import pytest

from torchelastic_otel import run
from torchelastic_otel.version import __version__


def _main(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    with pytest.raises(SystemExit) as exited:
        run.main(list(argv))
    return int(exited.value.code or 0), capsys.readouterr().out


@pytest.mark.parametrize("argv", [("--help",), ("-h",), ("help",)])
def test_help_lists_the_commands(capsys: pytest.CaptureFixture[str], argv: tuple[str, ...]) -> None:
    code, out = _main(capsys, *argv)
    assert code == 0
    assert out.startswith("usage: torchelastic-otel <command>")
    for command in ("run", "report", "accelerate"):
        assert f"\n  {command} " in out, command
    assert "OTEL_" in out and "TORCHELASTIC_OTEL_" in out


def test_no_arguments_is_the_usage_not_torchrun_s_error(capsys: pytest.CaptureFixture[str]) -> None:
    code, out = _main(capsys)
    assert code == 2 and out.startswith("usage: torchelastic-otel <command>")


def test_version_names_the_bridge_torch_and_opentelemetry(capsys: pytest.CaptureFixture[str]) -> None:
    code, out = _main(capsys, "--version")
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == f"torchelastic-otel {__version__}"
    assert f"  torch {metadata.version('torch')}" in lines
    assert f"  opentelemetry-sdk {metadata.version('opentelemetry-sdk')}" in lines


def test_run_help_is_torchrun_s_with_a_pointer_to_the_settings(capsys: pytest.CaptureFixture[str]) -> None:
    code, out = _main(capsys, "run", "--help")
    assert code == 0
    assert "--nproc-per-node" in out and "--rdzv-endpoint" in out  # torchrun's own help
    assert out.rstrip().endswith("(docs/configuration.md).")
    assert "OTEL_EXPORTER_OTLP_ENDPOINT" in out


def test_help_among_torchrun_s_arguments_is_torchrun_s(capsys: pytest.CaptureFixture[str]) -> None:
    code, out = _main(capsys, "run", "--nproc-per-node", "2", "--help")
    assert code == 0 and "--nproc-per-node" in out


def test_a_script_s_own_help_flag_is_the_script_s() -> None:
    assert not run._asks_for_help(["train.py", "--help"])
    assert not run._asks_for_help(["-m", "pkg.train", "-h"])
    assert not run._asks_for_help(["--no-python", "echo", "--help"])
