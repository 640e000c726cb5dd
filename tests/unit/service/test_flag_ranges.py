"""Every numeric flag of the server has a range, checked before anything loads (issue 19, item 8).

`--max-message-bytes 3000000000` used to load every model and then die with an OverflowError traceback (grpc
takes its message limits as C ints); `0` started a server on which every RPC failed; `--admission-timeout nan`
was accepted (`nan < 0` is false). Now each value outside its range is refused with one line on stderr naming
the flag and the range, exit 2, before any model is read. tests/fuzz/test_numbers_fuzz.py throws NaN,
infinities, negatives and huge numbers at every numeric flag.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from service import options as server_options
from service.cli import build_parser, option_fields
from service.options import ServerOptions
from tests.integration._support import ROOT


def numeric_flags() -> dict[str, type]:
    """Every flag of the server's parser that takes an int or a float: flag -> type."""
    return {
        action.option_strings[0]: action.type
        for action in build_parser()._actions
        if action.option_strings and action.type in (int, float)
    }


def options_from(*argv: str) -> ServerOptions:
    return ServerOptions(**option_fields(build_parser().parse_args(list(argv))))


def test_every_numeric_flag_has_a_range():
    """A new int or float flag must say its range in service/options.py RANGES (the fuzz test uses them)."""
    flags = {flag for flag, _low, _high, _kind in getattr(server_options, "RANGES", {}).values()}
    assert set(numeric_flags()) <= flags, set(numeric_flags()) - flags


@pytest.mark.parametrize(
    "argv, says",
    [
        (["--max-message-bytes", "3000000000"], "--max-message-bytes must be 65536..2147483647, got 3000000000"),
        (["--max-message-bytes", "0"], "--max-message-bytes must be 65536..2147483647, got 0"),
        (["--max-message-bytes", "-1"], "--max-message-bytes must be 65536..2147483647, got -1"),
        (["--admission-timeout", "nan"], "--admission-timeout must be 0..31536000 seconds (a year), got nan"),
        (["--admission-timeout", "inf"], "--admission-timeout must be 0..31536000 seconds (a year), got inf"),
        (["--idle-unload=-inf"], "--idle-unload must be 0..31536000 seconds (a year), got -inf"),
        (["--drain-seconds", "nan"], "--drain-seconds must be 0..31536000 seconds (a year), got nan"),
        (["--shutdown-grace", "1e400"], "--shutdown-grace must be 0..31536000 seconds (a year), got inf"),
        (["--stream-write-timeout", "0"], "--stream-write-timeout must be more than 0 and at most 31536000 seconds"),
        (["--stream-write-timeout", "nan"], "got nan"),
        (["--max-workers", "5"], "--max-workers must be 9..4096 (8 of them are kept for control calls), got 5"),
        (["--max-workers", "100000"], "--max-workers must be 9..4096"),
        (["--port", "70000"], "--port must be 0..65535, got 70000"),
        (["--memory-budget", "-1"], "--memory-budget must be >= 0, got -1"),
        (["--max-concurrent-loads", "0"], "--max-concurrent-loads must be > 0, got 0"),
        (["--host", ""], "--host must name an address (0.0.0.0 for every interface), got ''"),
    ],
)
def test_a_value_out_of_range_is_refused_naming_the_flag_and_its_range(argv, says):
    with pytest.raises(ValueError) as info:
        options_from(*argv)
    assert says in str(info.value)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    "argv",
    [
        ["--max-message-bytes", "65536"],
        ["--max-message-bytes", "2147483647"],
        ["--admission-timeout", "0"],
        ["--admission-timeout", "31536000"],
        ["--drain-seconds", "0.5"],
        ["--stream-write-timeout", "0.001"],
        ["--max-workers", "9"],
        ["--port", "0"],
        ["--metrics-port", "65535"],
    ],
)
def test_the_edges_of_each_range_are_accepted(argv):
    options_from(*argv)


def test_an_int_flag_given_something_else_is_one_line_naming_the_flag():
    completed = subprocess.run(
        [sys.executable, "-m", "service", "--max-queue", "nan"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert completed.returncode == 2
    assert completed.stderr.splitlines() == [
        "slotserve: argument --max-queue: invalid int value: 'nan' (see slotserve --help)"
    ]


@pytest.mark.parametrize("value", ["3000000000", "0"])
def test_max_message_bytes_out_of_range_is_refused_before_any_model_loads(tmp_path, value):
    """The reported runs: 3000000000 loaded every model and then died with an OverflowError traceback; 0 started
    a server on which every RPC failed. Now: one line, exit 2, and no model is read (the repository is not a
    folder, which would be the next complaint)."""
    repository = tmp_path / "repository"
    (repository / "m").mkdir(parents=True)
    (repository / "m" / "config.pbtxt").write_text('name: "m"\nbackend: "fixture"\n')
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "service",
            "--model-repository",
            str(repository),
            "--port",
            "0",
            "--max-message-bytes",
            value,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert completed.returncode == 2, completed.stderr
    assert completed.stderr.splitlines() == [
        f"slotserve: --max-message-bytes must be 65536..2147483647, got {value}"
    ], completed.stderr
    assert completed.stdout == ""
