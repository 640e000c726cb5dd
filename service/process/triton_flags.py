"""tritonserver's command line on slotserve: what Helm charts and scripts pass to Triton 2.51, accepted under
Triton's names where it means something here, refused by name with the reason where it does not.

Every flag of `tritonserver --help` (2.51) is in `TRITON_FLAGS`, as one of:

* `ALIAS`: another name of one of our flags (`--grpc-port` is `--port`); service/process/flags.py adds the Triton name
as a
  second option string of that flag, so `--help` shows both;
* `ACCEPTED`: a flag of Triton's own name with Triton's meaning here (`--exit-on-error`, `--log-verbose`,
  `--grpc-use-ssl`, ...), some of them only with the value that matches slotserve (`--allow-http=false`: any other
  value is refused naming the flag and why);
* `REFUSED`: a flag with no meaning here (HTTP, tracing, CUDA memory pools, ...): `slotserve: --http-port is
  tritonserver's and has no meaning here: <why>` and exit 2, never silently ignored.

docs/migrating-from-triton.md ("Flags") has the same table for people; tests/unit/test_triton_flags.py keeps the
three in step, and against a real `tritonserver --help` when bench/.venv-pytriton is there.

Values follow Triton's parser: a boolean is true/on/1 or false/off/0 in any case; `--flag=value` and
`--flag value` both work. The translation into ServerOptions fields (`triton_fields`) raises ValueError naming the
flag for a value or a combination that cannot work.
"""

from __future__ import annotations

import argparse
import enum
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from ..core.rate_limiter import RateLimitMode, ResourceFlag, parse_resource_flag


class Kind(enum.Enum):
    ALIAS = "alias"  # another name of one of our flags
    ACCEPTED = "accepted"  # Triton's name and meaning, handled here
    REFUSED = "refused"  # no meaning here: refused naming the reason


@dataclass(frozen=True)
class TritonFlag:
    name: str
    kind: Kind
    # ALIAS: our flag; ACCEPTED: what it does here (and which values are refused); REFUSED: why.
    says: str


_GRPC_ONLY = "slotserve speaks only gRPC (no HTTP/REST, SageMaker or Vertex AI endpoint)"
_NO_CUDA_POOLS = (
    "slotserve keeps no pinned or CUDA memory pools of its own (TensorRT allocates per context; "
    "--memory-budget bounds the models' memory)"
)
_BUILT_IN = "slotserve's backends (onnxruntime, tensorrt, python, ensembles) are built in"

TRITON_FLAGS: tuple[TritonFlag, ...] = (
    # -- Server --
    TritonFlag("--id", Kind.REFUSED, "ServerMetadata's name is always slotserve"),
    TritonFlag("--exit-timeout-secs", Kind.ALIAS, "--shutdown-grace"),
    # -- Logging --
    TritonFlag("--log-verbose", Kind.ACCEPTED, "0: as --log-level says; 1 or more: --log-level DEBUG"),
    TritonFlag("--log-info", Kind.ACCEPTED, "false: INFO lines off (the level becomes WARNING)"),
    TritonFlag("--log-warning", Kind.ACCEPTED, "false, with --log-info false: WARNING lines off too (level ERROR)"),
    TritonFlag("--log-error", Kind.ACCEPTED, "false, with the two above: ERROR lines off too (level CRITICAL)"),
    TritonFlag("--log-format", Kind.ACCEPTED, "Triton's values default and ISO8601 mean text; json is slotserve's"),
    TritonFlag("--log-file", Kind.ACCEPTED, "log lines go to this file (appended) instead of stderr"),
    # -- Model repository --
    TritonFlag("--model-store", Kind.ALIAS, "--model-repository"),
    TritonFlag(
        "--model-repository",
        Kind.ACCEPTED,
        "one repository: a second --model-repository (Triton serves several) is refused",
    ),
    TritonFlag(
        "--exit-on-error",
        Kind.ACCEPTED,
        "true: exit with status 1 when a model fails to load at startup; slotserve's default is false (the "
        "server starts, the model is listed with its reason), Triton's true",
    ),
    TritonFlag(
        "--disable-auto-complete-config",
        Kind.REFUSED,
        "slotserve always completes an ONNX model's undeclared inputs and outputs from its file, and checks the "
        "declared ones against it",
    ),
    TritonFlag(
        "--strict-readiness",
        Kind.ACCEPTED,
        "the same, slotserve's default false: ServerReady says whether the server serves (ask ModelReady per "
        "model); true makes it false while a model loads or has failed to load, as Triton's default",
    ),
    TritonFlag("--model-control-mode", Kind.ACCEPTED, "none, poll, explicit, and slotserve's lazy (its default)"),
    TritonFlag("--repository-poll-secs", Kind.ALIAS, "--repository-poll-seconds"),
    TritonFlag("--load-model", Kind.ACCEPTED, "the same: with --model-control-mode explicit, repeatable, '*' for all"),
    TritonFlag("--model-config-name", Kind.REFUSED, "slotserve reads config.pbtxt only (no configs/<name>.pbtxt)"),
    TritonFlag("--model-load-thread-count", Kind.ALIAS, "--max-concurrent-loads"),
    TritonFlag("--model-load-retry-count", Kind.ACCEPTED, "0 only: a failed load is not retried"),
    TritonFlag("--model-namespacing", Kind.ACCEPTED, "false only: model names are unique in the one repository"),
    TritonFlag("--enable-peer-access", Kind.REFUSED, "slotserve does not manage CUDA peer access between GPUs"),
    # -- HTTP --
    TritonFlag("--allow-http", Kind.ACCEPTED, "false only: " + _GRPC_ONLY),
    TritonFlag("--http-address", Kind.REFUSED, _GRPC_ONLY),
    TritonFlag("--http-port", Kind.REFUSED, _GRPC_ONLY),
    TritonFlag("--reuse-http-port", Kind.REFUSED, _GRPC_ONLY),
    TritonFlag("--http-header-forward-pattern", Kind.REFUSED, _GRPC_ONLY),
    TritonFlag("--http-thread-count", Kind.REFUSED, _GRPC_ONLY),
    TritonFlag("--http-restricted-api", Kind.REFUSED, _GRPC_ONLY),
    # -- gRPC --
    TritonFlag("--allow-grpc", Kind.ACCEPTED, "true only: gRPC is the one protocol slotserve serves"),
    TritonFlag("--grpc-address", Kind.ALIAS, "--host"),
    TritonFlag("--grpc-port", Kind.ALIAS, "--port"),
    TritonFlag("--reuse-grpc-port", Kind.ACCEPTED, "true: SO_REUSEPORT on the gRPC port (default false)"),
    TritonFlag(
        "--grpc-header-forward-pattern", Kind.REFUSED, "slotserve does not turn headers into request parameters"
    ),
    TritonFlag(
        "--grpc-infer-allocation-pool-size",
        Kind.REFUSED,
        "slotserve keeps no pool of request and response objects to size",
    ),
    TritonFlag("--grpc-use-ssl", Kind.ACCEPTED, "true: serve TLS with --grpc-server-cert and --grpc-server-key"),
    TritonFlag("--grpc-use-ssl-mutual", Kind.ACCEPTED, "true: mutual TLS, clients signed by --grpc-root-cert"),
    TritonFlag("--grpc-server-cert", Kind.ACCEPTED, "--tls-cert, with --grpc-use-ssl(-mutual)=true"),
    TritonFlag("--grpc-server-key", Kind.ACCEPTED, "--tls-key, with --grpc-use-ssl(-mutual)=true"),
    TritonFlag("--grpc-root-cert", Kind.ACCEPTED, "--tls-client-ca, with --grpc-use-ssl-mutual=true"),
    TritonFlag(
        "--grpc-infer-response-compression-level",
        Kind.ACCEPTED,
        "none only: slotserve does not compress responses",
    ),
    TritonFlag("--grpc-keepalive-time", Kind.ACCEPTED, "gRPC's keepalive time (ms)"),
    TritonFlag("--grpc-keepalive-timeout", Kind.ACCEPTED, "gRPC's keepalive timeout (ms)"),
    TritonFlag("--grpc-keepalive-permit-without-calls", Kind.ACCEPTED, "gRPC's keepalive without calls (0/1)"),
    TritonFlag("--grpc-http2-max-pings-without-data", Kind.ACCEPTED, "gRPC's HTTP/2 pings without data"),
    TritonFlag(
        "--grpc-http2-min-recv-ping-interval-without-data",
        Kind.ACCEPTED,
        "gRPC's minimum interval between pings without data (ms)",
    ),
    TritonFlag("--grpc-http2-max-ping-strikes", Kind.ACCEPTED, "gRPC's HTTP/2 ping strikes"),
    TritonFlag("--grpc-max-connection-age", Kind.ACCEPTED, "gRPC's maximum connection age (ms)"),
    TritonFlag("--grpc-max-connection-age-grace", Kind.ACCEPTED, "gRPC's grace after the maximum age (ms)"),
    TritonFlag(
        "--grpc-restricted-protocol",
        Kind.REFUSED,
        "use --allow-management, --management-token-file and --inference-token-file (docs/security.md)",
    ),
    # -- SageMaker, Vertex AI --
    TritonFlag("--allow-sagemaker", Kind.ACCEPTED, "false only: " + _GRPC_ONLY),
    TritonFlag("--sagemaker-port", Kind.REFUSED, _GRPC_ONLY),
    TritonFlag("--sagemaker-safe-port-range", Kind.REFUSED, _GRPC_ONLY),
    TritonFlag("--sagemaker-thread-count", Kind.REFUSED, _GRPC_ONLY),
    TritonFlag("--allow-vertex-ai", Kind.ACCEPTED, "false only: " + _GRPC_ONLY),
    TritonFlag("--vertex-ai-port", Kind.REFUSED, _GRPC_ONLY),
    TritonFlag("--vertex-ai-thread-count", Kind.REFUSED, _GRPC_ONLY),
    TritonFlag("--vertex-ai-default-model", Kind.REFUSED, _GRPC_ONLY),
    # -- Metrics --
    TritonFlag(
        "--allow-metrics",
        Kind.ACCEPTED,
        "false: no metrics, even with --metrics-port; true: metrics on --metrics-port, or on 8002 (Triton's "
        "port) when it is not given; slotserve serves none unless told",
    ),
    TritonFlag("--allow-gpu-metrics", Kind.ACCEPTED, "false only: slotserve exports no GPU metrics"),
    TritonFlag("--allow-cpu-metrics", Kind.ACCEPTED, "false only: slotserve exports no CPU metrics"),
    TritonFlag("--metrics-address", Kind.ACCEPTED, "the address metrics listen on (default: --host)"),
    TritonFlag("--metrics-port", Kind.ACCEPTED, "the same (slotserve: off unless given)"),
    TritonFlag(
        "--metrics-interval-ms",
        Kind.REFUSED,
        "slotserve's metrics are read from the live server at each scrape: there is no collection interval",
    ),
    TritonFlag("--metrics-config", Kind.REFUSED, "slotserve's metric families are fixed (docs/operations.md, Metrics)"),
    # -- Tracing --
    TritonFlag(
        "--trace-config",
        Kind.ACCEPTED,
        "the same settings (level, rate, count, mode; triton,file and log-frequency; opentelemetry,url, resource "
        "and bsp_*); an unknown setting, a bad value, or a level without a trace file in triton mode is refused",
    ),
    TritonFlag("--trace-file", Kind.ACCEPTED, "--trace-config triton,file=PATH"),
    TritonFlag("--trace-level", Kind.ACCEPTED, "--trace-config level=LEVEL (repeatable)"),
    TritonFlag("--trace-rate", Kind.ACCEPTED, "--trace-config rate=N"),
    TritonFlag("--trace-count", Kind.ACCEPTED, "--trace-config count=N"),
    TritonFlag("--trace-log-frequency", Kind.ACCEPTED, "--trace-config triton,log-frequency=N"),
    # -- Backends, repository agents, caches --
    TritonFlag("--backend-directory", Kind.REFUSED, _BUILT_IN),
    TritonFlag(
        "--backend-config",
        Kind.REFUSED,
        _BUILT_IN + "; per-model settings go in config.pbtxt's parameters (docs/model-repository.md)",
    ),
    TritonFlag("--repoagent-directory", Kind.REFUSED, "slotserve has no repository agents"),
    TritonFlag(
        "--cache-config",
        Kind.ACCEPTED,
        "local,size=BYTES only: --response-cache-bytes BYTES (the one cache slotserve has, in process)",
    ),
    TritonFlag("--cache-directory", Kind.REFUSED, "slotserve's response cache is built in (--response-cache-bytes)"),
    TritonFlag("--response-cache-byte-size", Kind.ALIAS, "--response-cache-bytes"),
    # -- Rate limiter --
    TritonFlag(
        "--rate-limit",
        Kind.ACCEPTED,
        "off (the default) or execution_count: a slot runs only when the resources its instance_group's "
        "rate_limiter names are free (docs/lifecycle.md)",
    ),
    TritonFlag(
        "--rate-limit-resource",
        Kind.ACCEPTED,
        "name:count[:device], repeatable: a resource's count (without any: the most any loaded model needs; with "
        "one, a resource no flag gives has none, as Triton's); every slot counts as device 0",
    ),
    # -- Memory and devices --
    TritonFlag("--pinned-memory-pool-byte-size", Kind.REFUSED, _NO_CUDA_POOLS),
    TritonFlag("--cuda-memory-pool-byte-size", Kind.REFUSED, _NO_CUDA_POOLS),
    TritonFlag("--cuda-virtual-address-size", Kind.REFUSED, _NO_CUDA_POOLS),
    TritonFlag("--min-supported-compute-capability", Kind.REFUSED, "slotserve does not select GPUs"),
    TritonFlag("--buffer-manager-thread-count", Kind.REFUSED, "slotserve copies tensors on the request's own thread"),
    TritonFlag("--host-policy", Kind.REFUSED, "slotserve has no NUMA or CPU-core host policies"),
    TritonFlag(
        "--model-load-gpu-limit", Kind.REFUSED, "use --memory-budget (host and device memory the models report)"
    ),
    # -- Deprecated in Triton --
    TritonFlag(
        "--strict-model-config",
        Kind.ACCEPTED,
        "false only (Triton's default): an ONNX model's undeclared inputs and outputs come from its file",
    ),
)

BY_NAME: dict[str, TritonFlag] = {flag.name: flag for flag in TRITON_FLAGS}
REFUSED: dict[str, str] = {flag.name: flag.says for flag in TRITON_FLAGS if flag.kind is Kind.REFUSED}
TRITON_METRICS_PORT = 8002  # where Triton serves metrics unless told otherwise

# Triton's gRPC flags passed on to grpcio as server arguments, with the argument each sets.
GRPC_ARGUMENTS = {
    "grpc_keepalive_time": "grpc.keepalive_time_ms",
    "grpc_keepalive_timeout": "grpc.keepalive_timeout_ms",
    "grpc_keepalive_permit_without_calls": "grpc.keepalive_permit_without_calls",
    "grpc_http2_max_pings_without_data": "grpc.http2.max_pings_without_data",
    "grpc_http2_min_recv_ping_interval_without_data": "grpc.http2.min_ping_interval_without_data_ms",
    "grpc_http2_max_ping_strikes": "grpc.http2.max_ping_strikes",
    "grpc_max_connection_age": "grpc.max_connection_age_ms",
    "grpc_max_connection_age_grace": "grpc.max_connection_age_grace_ms",
}
GRPC_INT_MAX = (1 << 31) - 1  # grpc takes its arguments as C ints


def refusal(argv: list[str]) -> str | None:
    """The error for the first refused Triton flag in `argv` (`--flag` or `--flag=value`), or None. Stops at `--`."""
    for argument in argv:
        if argument == "--":
            return None
        name = argument.split("=", 1)[0]
        reason = REFUSED.get(name)
        if reason is not None:
            return f"{name} is tritonserver's and has no meaning here: {reason} (docs/migrating-from-triton.md)"
    return None


def triton_bool(text: str) -> bool:
    """A boolean as Triton parses one: true/on/1 or false/off/0, in any case."""
    value = text.strip().lower()
    if value in ("true", "on", "1"):
        return True
    if value in ("false", "off", "0"):
        return False
    raise argparse.ArgumentTypeError(f"must be true or false (or on/off, 1/0), got {text!r}")


def only(expected: bool, why: str) -> Callable[[str], bool]:
    """A type for a Triton boolean flag whose one accepted value is `expected`; the other is refused with `why`."""

    def parse(text: str) -> bool:
        value = triton_bool(text)
        if value is not expected:
            raise argparse.ArgumentTypeError(f"{str(value).lower()} is not supported here: {why}")
        return value

    parse.__name__ = "true_only" if expected else "false_only"  # argparse names the type in some messages
    return parse


def _grpc_int(text: str) -> int:
    """A gRPC argument: an integer 0..2147483647 (grpc holds it in a C int)."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value <= GRPC_INT_MAX:
        raise argparse.ArgumentTypeError(f"must be an integer 0..{GRPC_INT_MAX}, got {text!r}")
    return value


def _verbosity(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be an integer >= 0, got {text!r}")
    return value


def _zero_only(text: str) -> int:
    if text.strip() != "0":
        raise argparse.ArgumentTypeError(f"only 0 is supported here: a failed load is not retried, got {text!r}")
    return 0


def _none_only(text: str) -> str:
    if text.strip().lower() != "none":
        raise argparse.ArgumentTypeError(
            f"only none is supported here: slotserve does not compress responses, got {text!r}"
        )
    return "none"


def _rate_limit(text: str) -> RateLimitMode:
    try:
        return RateLimitMode(text.strip().lower())  # any case, as tritonserver reads it
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected execution_count or off, got {text!r}") from None


def _rate_limit_resource(text: str) -> ResourceFlag:
    try:
        return parse_resource_flag(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _cache_config(text: str) -> int:
    """--cache-config local,size=BYTES: the response cache's bytes. Any other cache or setting is refused."""
    name, _, setting = text.partition(",")
    key, _, value = setting.partition("=")
    if name.strip() != "local" or key.strip() != "size":
        raise argparse.ArgumentTypeError(
            f"only local,size=BYTES is supported here (slotserve's in-process response cache), got {text!r}"
        )
    try:
        size = int(value)
    except ValueError:
        size = -1
    if size < 0:
        raise argparse.ArgumentTypeError(f"local,size= must be a byte count >= 0, got {text!r}")
    return size


def add_triton_flags(parser: argparse.ArgumentParser) -> None:
    """The ACCEPTED flags that are not our own flags already (the aliases are second names of ours, added in
    service/process/flags.py; --exit-on-error, --log-file, --log-format, --model-control-mode, --load-model,
    --metrics-port and --model-repository are ours too)."""
    group = parser.add_argument_group(
        "Triton's flags", "tritonserver's flags with a meaning here (docs/migrating-from-triton.md lists them all)"
    )
    add = group.add_argument
    add("--log-verbose", type=_verbosity, metavar="N", help="0: as --log-level says; 1 or more: DEBUG")
    for level in ("info", "warning", "error"):
        add(f"--log-{level}", type=triton_bool, metavar="BOOL", help=f"false: no {level.upper()} lines")
    add("--allow-grpc", type=only(True, "gRPC is the one protocol slotserve serves"), metavar="true", help="true only")
    for name in ("http", "sagemaker", "vertex-ai"):
        add(f"--allow-{name}", type=only(False, _GRPC_ONLY), metavar="false", help="false only: gRPC only")
    add(
        "--allow-metrics",
        type=triton_bool,
        metavar="BOOL",
        help=f"false: no metrics; true: metrics on --metrics-port, or {TRITON_METRICS_PORT} without it",
    )
    for name in ("gpu", "cpu"):
        add(
            f"--allow-{name}-metrics",
            type=only(False, f"slotserve exports no {name.upper()} metrics"),
            metavar="false",
            help="false only",
        )
    add("--metrics-address", metavar="HOST", help="address metrics listen on (default: --host)")
    add("--reuse-grpc-port", type=triton_bool, metavar="BOOL", help="true: SO_REUSEPORT on the gRPC port")
    add("--grpc-use-ssl", type=triton_bool, metavar="BOOL", help="true: TLS with --grpc-server-cert/-key")
    add("--grpc-use-ssl-mutual", type=triton_bool, metavar="BOOL", help="true: mutual TLS, CA --grpc-root-cert")
    add("--grpc-server-cert", type=Path, metavar="FILE", help="--tls-cert, with --grpc-use-ssl(-mutual)=true")
    add("--grpc-server-key", type=Path, metavar="FILE", help="--tls-key, with --grpc-use-ssl(-mutual)=true")
    add("--grpc-root-cert", type=Path, metavar="FILE", help="--tls-client-ca, with --grpc-use-ssl-mutual=true")
    add("--grpc-infer-response-compression-level", type=_none_only, metavar="none", help="none only")
    for dest, argument in GRPC_ARGUMENTS.items():
        add(f"--{dest.replace('_', '-')}", type=_grpc_int, metavar="N", help=f"gRPC's {argument}")
    add("--cache-config", type=_cache_config, metavar="local,size=BYTES", help="--response-cache-bytes BYTES")
    add(
        "--rate-limit",
        type=_rate_limit,
        metavar="MODE",
        help="execution_count: slots wait for their rate_limiter resources; off: those are ignored (default: off)",
    )
    add(
        "--rate-limit-resource",
        type=_rate_limit_resource,
        action="append",
        metavar="NAME:COUNT[:DEVICE]",
        help="a rate limiter resource's count, repeatable; once one is given, a resource no flag gives has none "
        "(default: each has the most any loaded model needs)",
    )
    add("--model-load-retry-count", type=_zero_only, metavar="0", help="0 only")
    add(
        "--model-namespacing",
        type=only(False, "model names are unique in the one repository"),
        metavar="false",
        help="false only",
    )
    add(
        "--strict-readiness",
        type=triton_bool,
        nargs="?",
        const=True,
        default="false",  # a string, so that argparse reads it with triton_bool and --help shows Triton's word
        metavar="BOOL",
        help="true (or the flag alone): ServerReady is false while a model is loading or has failed to load, as "
        "Triton's default; false: ServerReady says whether the server serves (default: false)",
    )
    add(
        "--strict-model-config",
        type=only(False, "an ONNX model's undeclared inputs and outputs come from its file"),
        metavar="false",
        help="false only",
    )


def log_level(args: argparse.Namespace) -> str:
    """--log-level, changed by Triton's log flags: --log-verbose 1 or more lowers it to DEBUG; otherwise a
    --log-<level> false raises it past that level (Triton's switches only turn levels off, so --log-info true
    changes nothing)."""
    if (args.log_verbose or 0) >= 1:
        return "DEBUG"
    chosen = str(args.log_level)  # --log-level, upper case
    if False not in (args.log_info, args.log_warning, args.log_error):
        return chosen  # no level turned off (--log-info true is Triton's default: it lowers nothing)
    lowest_on = "CRITICAL"  # every switch false: only CRITICAL lines are left
    for level, switch in (("ERROR", args.log_error), ("WARNING", args.log_warning), ("INFO", args.log_info)):
        if switch is not False:
            lowest_on = level
    if logging.getLevelName(lowest_on) > logging.getLevelName(chosen):
        return lowest_on
    return chosen


def triton_fields(args: argparse.Namespace, fields: Mapping[str, object]) -> dict[str, object]:
    """The ServerOptions fields Triton's flags change, given the `fields` our flags gave. Raises ValueError
    naming the flag for a combination that cannot work."""
    changed: dict[str, object] = {}
    changed.update(_tls_fields(args, fields))
    if args.allow_metrics is False:
        changed["metrics_port"] = None
    elif args.allow_metrics and fields.get("metrics_port") is None:
        changed["metrics_port"] = TRITON_METRICS_PORT
    if args.metrics_address is not None:
        changed["metrics_host"] = args.metrics_address
    if args.cache_config is not None:
        changed["response_cache_bytes"] = args.cache_config
    arguments = tuple(
        (argument, getattr(args, dest)) for dest, argument in GRPC_ARGUMENTS.items() if getattr(args, dest) is not None
    )
    if arguments:
        changed["grpc_arguments"] = arguments
    if args.reuse_grpc_port is not None:
        changed["reuse_port"] = args.reuse_grpc_port
    if args.rate_limit is not None:
        changed["rate_limit"] = args.rate_limit
    if args.rate_limit_resource:
        changed["rate_limit_resources"] = tuple(args.rate_limit_resource)
    if args.log_verbose:
        changed["log_verbose_level"] = args.log_verbose
    return changed


def _tls_fields(args: argparse.Namespace, fields: Mapping[str, object]) -> dict[str, object]:
    """Triton's TLS flags as --tls-cert, --tls-key and --tls-client-ca. Triton ignores its certificate flags
    without --grpc-use-ssl; here they are refused instead, so a port is never plaintext by mistake."""
    use_ssl, mutual = bool(args.grpc_use_ssl), bool(args.grpc_use_ssl_mutual)
    given = {
        flag: path
        for flag, path in (
            ("--grpc-server-cert", args.grpc_server_cert),
            ("--grpc-server-key", args.grpc_server_key),
            ("--grpc-root-cert", args.grpc_root_cert),
        )
        if path is not None
    }
    if not (use_ssl or mutual):
        if given:
            raise ValueError(
                f"{', '.join(given)} need --grpc-use-ssl=true or --grpc-use-ssl-mutual=true (Triton ignores them "
                "without; slotserve refuses, so that the port is never plaintext by mistake)"
            )
        return {}
    if any(fields.get(name) is not None for name in ("tls_cert", "tls_key", "tls_client_ca")):
        raise ValueError("give TLS either with --tls-cert/--tls-key/--tls-client-ca or with Triton's --grpc-* flags")
    missing = [flag for flag in ("--grpc-server-cert", "--grpc-server-key") if flag not in given]
    if missing:
        raise ValueError(f"--grpc-use-ssl{'-mutual' if mutual else ''}=true needs {' and '.join(missing)}")
    if mutual and "--grpc-root-cert" not in given:
        raise ValueError("--grpc-use-ssl-mutual=true needs --grpc-root-cert (the CA that signs client certificates)")
    if not mutual and "--grpc-root-cert" in given:
        raise ValueError("--grpc-root-cert needs --grpc-use-ssl-mutual=true (it is the CA of client certificates)")
    return {
        "tls_cert": args.grpc_server_cert,
        "tls_key": args.grpc_server_key,
        "tls_client_ca": args.grpc_root_cert if mutual else None,
    }
