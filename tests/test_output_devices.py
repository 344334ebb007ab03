"""Output paths that are devices (issue 35 §8): /dev/null and the standard streams (/dev/stdout, /dev/stderr,
/dev/fd/1, /dev/fd/2) are accepted, others refused."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from typer.testing import CliRunner
from wbfe_cli.main import app

from wbfe.errors import OutputError
from wbfe.render.files import check_output, write_atomic, write_output

pytestmark = pytest.mark.skipif(not os.path.exists("/dev/null") or not os.path.exists("/dev/zero"),
                                reason="needs /dev/null and /dev/zero (POSIX)")


def test_dev_null_is_written_directly(tmp_path: Path) -> None:
    assert check_output("/dev/null") == Path("/dev/null")
    assert write_atomic("/dev/null", "discarded") == Path("/dev/null")
    assert os.path.exists("/dev/null") and not Path("/dev/null").is_file()  # still the device
    link = tmp_path / "sink"
    link.symlink_to("/dev/null")
    assert write_atomic(link, b"x") == Path("/dev/null") and link.is_symlink()


def test_dev_stdout_is_standard_output(capsys: pytest.CaptureFixture[str]) -> None:
    assert check_output("/dev/stdout") is None
    assert write_output("/dev/stdout", "hello\n") is None
    assert capsys.readouterr().out == "hello\n"


@pytest.mark.parametrize("device", ["/dev/zero", "/dev/full"])
def test_other_devices_stay_refused(device: str) -> None:
    if not os.path.exists(device):
        pytest.skip(f"{device} absent")
    with pytest.raises(OutputError, match="it is a character device, not a regular file"):
        check_output(device)


def test_cli_writes_to_dev_null_and_dev_stdout() -> None:
    runner = CliRunner()
    to_null = runner.invoke(app, ["score", "--metrics", "bfe", "--format", "csv", "-o", "/dev/null"])
    assert to_null.exit_code == 0, to_null.stderr
    assert to_null.stdout == "" and "wrote /dev/null" in to_null.stderr
    to_stdout = runner.invoke(app, ["score", "--metrics", "bfe", "--format", "csv", "-o", "/dev/stdout"])
    plain = runner.invoke(app, ["score", "--metrics", "bfe", "--format", "csv"])
    assert to_stdout.exit_code == 0 and to_stdout.stdout == plain.stdout
    assert to_stdout.stdout.startswith("name,role,")
    refused = runner.invoke(app, ["score", "--metrics", "bfe", "-o", "/dev/zero"])
    assert refused.exit_code == 2 and refused.stderr.startswith("wbfe: error: cannot write /dev/zero")


@pytest.mark.parametrize(("path", "stream"), [("/dev/stderr", "err"), ("/dev/fd/2", "err"), ("/dev/fd/1", "out")])
def test_standard_streams_by_device_name(path: str, stream: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert check_output(path) is None  # no file is created or replaced
    assert write_output(path, "hello\n") is None
    captured = capsys.readouterr()
    assert getattr(captured, stream) == "hello\n" and getattr(captured, "out" if stream == "err" else "err") == ""


def test_cli_writes_to_dev_stderr() -> None:
    runner = CliRunner()
    plain = runner.invoke(app, ["score", "--metrics", "bfe", "--format", "csv"])
    to_err = runner.invoke(app, ["score", "--metrics", "bfe", "--format", "csv", "-o", "/dev/stderr"])
    assert to_err.exit_code == 0, to_err.stderr
    assert to_err.stdout == "" and to_err.stderr.endswith(plain.stdout) and plain.stdout.startswith("name,role,")
