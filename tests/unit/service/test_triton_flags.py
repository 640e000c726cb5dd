"""tritonserver's command lines on slotserve (issue 35, item 4).

`--grpc-port`, `--repository-poll-secs`, `--exit-on-error`, `--log-verbose`, ... used to be unknown flags, and
argparse's abbreviations let `--repository DIR` bind silently to `--repository-poll-seconds` ("invalid float
value"). Now every flag of `tritonserver --help` (2.51) is accepted under Triton's name, accepted as another name
of ours, or refused naming the flag and the reason (service/process/triton_flags.py, docs/migrating-from-triton.md), and
no parser of ours (server, `check`, the client) takes an abbreviation.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from client import cli as client_cli
from client._cli_inputs import UsageError
from service.process import check
from service.process.cli import build_parser, option_fields
from service.process.options import ServerOptions
from service.process.triton_flags import BY_NAME, TRITON_FLAGS, Kind, log_level
from tests.differential.reference import find_installation

ROOT = Path(__file__).resolve().parents[3]
MIGRATING = ROOT / "docs" / "migrating-from-triton.md"


def options_from(*argv: str) -> ServerOptions:
    return ServerOptions(**option_fields(build_parser().parse_args(list(argv))))


def refused_by_parser(*argv: str, parser=None) -> str:
    """The one line the server's parser prints for `argv` (it exits 2)."""
    parser = parser or build_parser()
    with pytest.raises(SystemExit) as exit_info:
        parser.parse_args(list(argv))
    assert exit_info.value.code == 2
    return str(exit_info.value)


# ---- abbreviations --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ["--repository", "/srv/models"],  # was taken for --repository-poll-seconds ("invalid float value")
        ["--model-repo", "/srv/models"],
        ["--allow-manag"],
        ["--metrics", "9000"],
    ],
)
def test_the_server_takes_no_abbreviation(argv, capsys):
    refused_by_parser(*argv)
    assert f"unrecognized arguments: {argv[0]}" in capsys.readouterr().err


def test_check_takes_no_abbreviation(capsys):
    with pytest.raises(SystemExit):
        check.build_parser().parse_args(["models", "--form", "json"])
    assert "unrecognized arguments: --form" in capsys.readouterr().err


def test_the_client_takes_no_abbreviation():
    with pytest.raises(UsageError, match="unrecognized arguments: --addr"):
        client_cli.build_parser().parse_args(["--addr=127.0.0.1:1", "health"])
    with pytest.raises(UsageError, match="unrecognized arguments: --output-d"):
        client_cli.build_parser().parse_args(["infer", "m", "--input", "X=[1]", "--output-d", "/tmp/out"])


# ---- aliases and accepted flags -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv, field, value",
    [
        (["--grpc-port", "9001"], "port", 9001),
        (["--grpc-port=9001"], "port", 9001),
        (["--grpc-address", "0.0.0.0"], "host", "0.0.0.0"),
        (["--model-store", "/srv/models"], "model_repository", Path("/srv/models")),
        (["--repository-poll-secs", "5", "--model-control-mode", "poll"], "repository_poll_seconds", 5.0),
        (["--exit-timeout-secs", "12"], "shutdown_grace", 12.0),
        (["--model-load-thread-count", "4"], "max_concurrent_loads", 4),
        (["--response-cache-byte-size", "1048576"], "response_cache_bytes", 1 << 20),
        (["--cache-config", "local,size=2048"], "response_cache_bytes", 2048),
        (["--exit-on-error=true"], "exit_on_error", True),
        (["--exit-on-error", "1"], "exit_on_error", True),
        (["--exit-on-error"], "exit_on_error", True),
        (["--exit-on-error=false"], "exit_on_error", False),
        ([], "exit_on_error", False),  # slotserve's default, documented (Triton's is true)
        (["--strict-readiness=true"], "strict_readiness", True),
        (["--strict-readiness"], "strict_readiness", True),
        (["--strict-readiness=false"], "strict_readiness", False),
        ([], "strict_readiness", False),  # slotserve's default, documented (Triton's is true)
        (["--allow-metrics=true"], "metrics_port", 8002),  # Triton's metrics port
        (["--allow-metrics=true", "--metrics-port=9100"], "metrics_port", 9100),
        (["--allow-metrics=false", "--metrics-port=9100"], "metrics_port", None),
        (["--metrics-address", "0.0.0.0", "--metrics-port=9100"], "metrics_host", "0.0.0.0"),
        (["--reuse-grpc-port=true"], "reuse_port", True),
        (["--grpc-keepalive-time=10000"], "grpc_arguments", (("grpc.keepalive_time_ms", 10000),)),
        (
            ["--grpc-http2-max-ping-strikes", "0", "--grpc-max-connection-age", "60000"],
            "grpc_arguments",
            (("grpc.http2.max_ping_strikes", 0), ("grpc.max_connection_age_ms", 60000)),
        ),
        (["--log-format", "default"], "log_format", "text"),
        (["--log-format=ISO8601"], "log_format", "text"),
        (
            [
                "--allow-http=false",
                "--allow-grpc=true",
                "--allow-sagemaker=0",
                "--allow-vertex-ai=off",
                "--allow-gpu-metrics=false",
                "--allow-cpu-metrics=false",
                "--strict-model-config=false",
                "--strict-readiness=false",
                "--model-namespacing=false",
                "--rate-limit=off",
                "--model-load-retry-count=0",
                "--grpc-infer-response-compression-level=none",
                "--model-control-mode=explicit",
                "--load-model=simple",
            ],
            "load_models",
            ("simple",),
        ),
    ],
)
def test_tritons_flags_with_a_meaning_here_are_accepted(argv, field, value):
    assert getattr(options_from(*argv), field) == value


def test_tritons_tls_flags_become_ours(tmp_path):
    cert, key, ca = (tmp_path / name for name in ("cert.pem", "key.pem", "ca.pem"))
    tls = options_from("--grpc-use-ssl=true", f"--grpc-server-cert={cert}", f"--grpc-server-key={key}")
    assert (tls.tls_cert, tls.tls_key, tls.tls_client_ca) == (cert, key, None)
    mutual = options_from(
        "--grpc-use-ssl-mutual=true", f"--grpc-server-cert={cert}", f"--grpc-server-key={key}", f"--grpc-root-cert={ca}"
    )
    assert (mutual.tls_cert, mutual.tls_key, mutual.tls_client_ca) == (cert, key, ca)


@pytest.mark.parametrize(
    "argv, says",
    [
        (["--grpc-server-cert=c.pem", "--grpc-server-key=k.pem"], "need --grpc-use-ssl=true"),
        (["--grpc-use-ssl=true", "--grpc-server-cert=c.pem"], "--grpc-use-ssl=true needs --grpc-server-key"),
        (["--grpc-use-ssl-mutual=1", "--grpc-server-cert=c", "--grpc-server-key=k"], "needs --grpc-root-cert"),
        (
            ["--grpc-use-ssl=1", "--grpc-server-cert=c", "--grpc-server-key=k", "--grpc-root-cert=r"],
            "--grpc-root-cert needs --grpc-use-ssl-mutual=true",
        ),
        (
            ["--grpc-use-ssl=1", "--grpc-server-cert=c", "--grpc-server-key=k", "--tls-cert=c", "--tls-key=k"],
            "either with --tls-cert",
        ),
    ],
)
def test_tritons_tls_flags_that_do_not_go_together_are_refused(argv, says):
    with pytest.raises(ValueError, match=re.escape(says)):
        options_from(*argv)


@pytest.mark.parametrize(
    "argv, says",
    [
        (["--allow-http=true"], "argument --allow-http: true is not supported here: slotserve speaks only gRPC"),
        (["--allow-grpc", "false"], "argument --allow-grpc: false is not supported here: gRPC is the one protocol"),
        (["--strict-model-config=true"], "true is not supported here: an ONNX model's undeclared inputs"),
        (["--allow-gpu-metrics=true"], "slotserve exports no GPU metrics"),
        (["--rate-limit=sometimes"], "argument --rate-limit: expected execution_count or off, got 'sometimes'"),
        (["--rate-limit-resource=R1:many"], "'R1:many': the count and device must be integers"),
        (["--model-load-retry-count=2"], "only 0 is supported here"),
        (["--cache-config=redis,host=x"], "only local,size=BYTES is supported here"),
        (["--grpc-infer-response-compression-level=high"], "only none is supported here"),
        (["--exit-on-error=maybe"], "must be true or false"),
        (["--grpc-keepalive-time=-1"], "must be an integer 0..2147483647"),
        (["--model-repository=/a", "--model-repository=/b"], "given twice: slotserve serves one model repository"),
        (["--model-repository=/a", "--model-store=/b"], "given twice: slotserve serves one model repository"),
    ],
)
def test_a_triton_value_without_a_meaning_here_is_refused_naming_it(argv, says, capsys):
    refused_by_parser(*argv)
    error = capsys.readouterr().err
    assert says in error and error.count("\n") == 1, error


@pytest.mark.parametrize("flag", [flag.name for flag in TRITON_FLAGS if flag.kind is Kind.REFUSED])
@pytest.mark.parametrize("form", ["=", " "])
def test_every_refused_triton_flag_is_refused_by_name_with_its_reason(flag, form, capsys):
    argv = [f"{flag}=1"] if form == "=" else [flag, "1"]
    refused_by_parser("--port", "0", *argv)
    error = capsys.readouterr().err
    assert f"slotserve: {flag} is tritonserver's and has no meaning here: {BY_NAME[flag].says}" in error, error


@pytest.mark.parametrize(
    "argv, level",
    [
        ([], "INFO"),
        (["--log-level=DEBUG"], "DEBUG"),
        (["--log-level=DEBUG", "--log-info=true"], "DEBUG"),
        (["--log-level=DEBUG", "--log-info=false"], "WARNING"),
        (["--log-verbose", "1"], "DEBUG"),
        (["--log-verbose=0"], "INFO"),
        (["--log-verbose=0", "--log-level=WARNING"], "WARNING"),
        (["--log-info=false"], "WARNING"),
        (["--log-info=false", "--log-warning=false"], "ERROR"),
        (["--log-info=false", "--log-warning=false", "--log-error=false"], "CRITICAL"),
        (["--log-info=true", "--log-level=ERROR"], "ERROR"),  # Triton's switches only turn levels off
    ],
)
def test_tritons_log_flags_set_the_level(argv, level):
    assert log_level(build_parser().parse_args(argv)) == level


# ---- every tritonserver flag is classified and documented ------------------------------------------------------


def test_every_accepted_or_alias_flag_is_a_flag_of_the_server():
    known = {option for action in build_parser()._actions for option in action.option_strings}
    missing = [flag.name for flag in TRITON_FLAGS if flag.kind is not Kind.REFUSED and flag.name not in known]
    assert not missing


def test_aliases_are_second_names_of_the_flag_they_name():
    for flag in TRITON_FLAGS:
        if flag.kind is Kind.ALIAS:
            (action,) = [a for a in build_parser()._actions if flag.name in a.option_strings]
            assert action.option_strings[0] == flag.says, flag


def documented_rows() -> dict[str, str]:
    """Triton flag -> the first cell after it in the flags table of docs/migrating-from-triton.md."""
    rows = {}
    for line in MIGRATING.read_text().splitlines():
        match = re.match(r"^\| `(--[a-z0-9-]+)` \| (accepted|alias|refused)\b", line)
        if match:
            rows[match.group(1)] = match.group(2)
    return rows


def test_the_migration_page_lists_every_triton_flag_as_the_code_treats_it():
    documented = documented_rows()
    assert documented == {flag.name: flag.kind.value for flag in TRITON_FLAGS}


def test_every_flag_of_real_tritonserver_is_classified():
    """Asks real Triton 2.51 (bench/.venv-pytriton) for its flags: each must be in TRITON_FLAGS."""
    installation, reason = find_installation()
    if installation is None:
        pytest.skip(reason)
    environment = {**os.environ, "LD_LIBRARY_PATH": installation.library_path()}
    done = subprocess.run(
        [str(installation.binary), "--help"], capture_output=True, text=True, timeout=60, env=environment
    )
    flags = set(re.findall(r"^\s+(--[a-z0-9-]+)", done.stdout + done.stderr, flags=re.M)) - {"--help"}
    assert len(flags) > 80, done.stdout + done.stderr  # the help was read
    assert flags == set(BY_NAME), (sorted(flags - set(BY_NAME)), sorted(set(BY_NAME) - flags))


def test_a_refused_flag_stops_the_real_command_line_with_one_line(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "service", "--model-repository", str(tmp_path), "--http-port", "8000"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.splitlines() == [
        f"slotserve: --http-port is tritonserver's and has no meaning here: {BY_NAME['--http-port'].says} "
        "(docs/migrating-from-triton.md) (see slotserve --help)"
    ]
