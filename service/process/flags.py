"""The server's command line: its parser and every flag, help and defaults included (docs/command-line.md is
generated from them). `service/process/cli.py` runs what it parses; `service/process/check.py` takes the flags its
verdict depends on from here (`add_server_flags(parser, only=...)`), so neither imports the other's parser."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any, NoReturn

from ..request_path.model_control import DEFAULT_POLL_SECONDS, MODES
from ..request_path.model_files import DEFAULT_MAX_LOAD_FILE_BYTES
from .options import MAX_MESSAGE_BYTES, MIN_MESSAGE_BYTES, ServerOptions
from .trace_flags import add_trace_flags
from .triton_flags import add_triton_flags, refusal, triton_bool

# --log-format's values: ours, and Triton's two (both plain text lines here).
LOG_FORMATS = ("text", "json", "default", "ISO8601")


class CommandLineParser(argparse.ArgumentParser):
    """argparse, except that a bad command line is one line on stderr (exit 2), like a value out of range, and a
    flag is known only by its full name: argparse's abbreviations would take `--repository DIR` for
    `--repository-poll-seconds DIR` (and any Triton flag that is the start of one of ours for it)."""

    def __init__(self, prog: str, description: str, epilog: str | None = None) -> None:
        super().__init__(prog=prog, description=description, epilog=epilog, allow_abbrev=False)

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


class _ServerParser(CommandLineParser):
    """The server's parser: a tritonserver flag with no meaning here is refused naming the flag and the reason
    (service/process/triton_flags.py), before argparse would call it unrecognized."""

    def parse_known_args(  # type: ignore[override]  # argparse's overloads, one signature here
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        argv = sys.argv[1:] if args is None else list(args)
        refused = refusal(argv)
        if refused is not None:
            self.error(refused)
        return super().parse_known_args(argv, namespace)


class _Once(argparse.Action):
    """A flag that may be given once (Triton takes several --model-repository; slotserve serves one)."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        if getattr(namespace, f"_{self.dest}_given", False):
            parser.error(f"{option_string} given twice: slotserve serves one model repository")
        setattr(namespace, f"_{self.dest}_given", True)
        setattr(namespace, self.dest, values)


def server_parser() -> argparse.ArgumentParser:
    """The server's command line (`slotserve`, `python -m service`): every flag, in --help's order."""
    parser = _ServerParser(
        prog="slotserve",
        description="Serve a model repository over the KServe v2 gRPC protocol.",
        epilog="slotserve check PATH (python -m service check PATH) tells what a repository will do, without serving "
        "it: slotserve check --help, docs/migrating-from-triton.md",
    )
    add_server_flags(parser)
    return parser


def add_server_flags(parser: argparse.ArgumentParser, only: Collection[str] | None = None) -> None:
    """The server's flags on `parser`, in --help's order; with `only`, just the ungrouped flags whose destinations
    (the attribute names they parse into) it lists, with the same names, help and defaults (how `slotserve check`
    takes the flags its verdict depends on)."""

    def add(*names: str, **settings: Any) -> None:
        if only is None or _destination(names, settings) in only:
            parser.add_argument(*names, **settings)

    add(
        "--model-repository",
        "--model-store",
        action=_Once,
        type=Path,
        default=Path("demo/model_repository"),
        help="folder of <model>/config.pbtxt + <model>/<version>/model.* (default: %(default)s)",
    )
    add(
        "--allow-model-root",
        dest="allowed_model_roots",
        action="append",
        type=Path,
        metavar="PATH",
        help="a folder outside the repository that model files may also be in (a management request's source, a "
        "default_model_filename, a symbolic link's target); repeatable. Without it every model file must "
        "resolve inside the repository",
    )
    add("--host", "--grpc-address", default="127.0.0.1", help="address to listen on (default: %(default)s)")
    add(
        "--port",
        "--grpc-port",
        type=int,
        default=8001,
        help="port to listen on, 0..65535; 0 picks a free one (default: %(default)s)",
    )
    add(
        "--parallel-jobs",
        type=int,
        metavar="N",
        help="select the parallel runtime: models get N slots by default (1..16) and management requests may "
        "set a slot count; without it every model has one slot",
    )
    add(
        "--allow-management",
        action="store_true",
        help="allow Management mutations and repository load/unload (status calls are always allowed)",
    )
    add(
        "--admission-timeout",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="server ceiling and default of every model's admission timeout, 0..31536000 (a year); 0 waits "
        "without limit",
    )
    add("--max-queue", type=int, default=0, metavar="N", help="queued requests per model, >= 0; 0 = no limit")
    add(
        "--refuse-predicted-wait",
        action="store_true",
        help="refuse at arrival (UNAVAILABLE, reason wait_exceeds_deadline) a request whose deadline comes before "
        "its model's predicted wait, from the model's recent service rate and queue (docs/errors.md); off by default",
    )
    add(
        "--max-concurrent-loads",
        "--model-load-thread-count",
        type=int,
        default=1,
        metavar="N",
        help="simultaneous cold loads, >= 1 (default 1)",
    )
    add(
        "--max-resident-models",
        type=int,
        default=0,
        metavar="N",
        help="models holding engines at once, >= 0; loading one more retires the least recently used idle model "
        "(0 = no limit)",
    )
    add(
        "--idle-unload",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="retire a model idle and queue-free for this long, 0..31536000 (0 = never)",
    )
    add(
        "--memory-budget",
        type=int,
        default=0,
        metavar="BYTES",
        help="memory all loaded pools may report together, >= 0; a load beyond it retires idle models or fails "
        "with memory_limit (0 = no budget)",
    )
    add(
        "--no-load-at-startup",
        dest="load_at_startup",
        action="store_false",
        help="register the repository's models without loading them; the first request loads each",
    )
    add(
        "--model-control-mode",
        choices=MODES,
        default="lazy",
        help="lazy (slotserve's own): load every model at startup, a request loads an unloaded model; none: load "
        "every model at startup, repository load/unload refused; explicit: load only --load-model at startup, "
        "only RepositoryModelLoad loads a model; poll: like none, and rescan the repository every "
        "--repository-poll-seconds (docs/model-control.md; default: lazy)",
    )
    add(
        "--load-model",
        dest="load_models",
        action="append",
        metavar="NAME",
        help="with --model-control-mode explicit: load this model at startup; repeatable; '*' loads every model",
    )
    add(
        "--repository-poll-seconds",
        "--repository-poll-secs",
        type=float,
        default=DEFAULT_POLL_SECONDS,
        metavar="SECONDS",
        help="with --model-control-mode poll: seconds between repository scans, more than 0 and at most "
        "31536000 (default: %(default)s)",
    )
    add(
        "--model-files-dir",
        type=Path,
        default=None,
        metavar="DIR",
        help="folder in which loads with files (RepositoryModelLoad's file: parameters) get their private folder, "
        "removed at shutdown; made on the first such load if missing, nothing is written before (default: the "
        "system temporary folder; on a read-only root filesystem, a mounted volume)",
    )
    add(
        "--python-environments-dir",
        type=Path,
        default=None,
        metavar="DIR",
        help="folder in which python models' packed execution environments (EXECUTION_ENV_PATH naming an archive) "
        "are extracted, one folder per archive content, kept for later loads and restarts; made on the first such "
        "load, nothing is written before (default: slotserve-python-environments in the system temporary folder; "
        "on a read-only root filesystem, a mounted volume)",
    )
    add(
        "--max-load-file-bytes",
        type=int,
        default=DEFAULT_MAX_LOAD_FILE_BYTES,
        metavar="BYTES",
        help="the most bytes the files of one load with files may hold together; more is refused with "
        "RESOURCE_EXHAUSTED before anything is written, >= 0 (default: 1 GiB)",
    )
    add(
        "--max-workers",
        type=int,
        default=64,
        metavar="N",
        help="gRPC handler threads, 9..4096; 8 of them are kept for health, status and management calls "
        "(default: %(default)s)",
    )
    add(
        "--max-concurrent-rpcs",
        type=int,
        default=ServerOptions.max_concurrent_rpcs,
        metavar="N",
        help="calls open at once, of every kind, those still sending their request included (each holds a handler "
        "thread); a call beyond it is refused at once with RESOURCE_EXHAUSTED; --max-workers..100000 "
        "(default: 1024, or --max-workers if larger)",
    )
    add(
        "--handler-runners",
        type=int,
        default=ServerOptions.handler_runners,
        metavar="N",
        help="handler threads that run calls at once, not counting those waiting on an engine, a stream or a "
        "model's queue; a call that waits 20 ms for one gets a thread of its own; 0 gives every call a thread at "
        "once, 0..4096 (default: %(default)s)",
    )
    add(
        "--frontends",
        type=int,
        default=ServerOptions.frontends,
        metavar="N",
        help="front-end processes sharing the gRPC port (SO_REUSEPORT), each doing HTTP/2, TLS, decoding and "
        "encoding; admission, models and management stay in this process; 1 serves the port from this process, "
        "1..64 (default: %(default)s)",
    )
    add(
        "--max-message-bytes",
        type=int,
        default=ServerOptions.max_message_bytes,
        metavar="BYTES",
        help=f"largest request or response message, {MIN_MESSAGE_BYTES}..{MAX_MESSAGE_BYTES}: 64 KiB up to "
        "grpc's limit, 2 GiB - 1 (default: 1 GiB)",
    )
    add(
        "--max-request-tensor-bytes",
        type=int,
        default=ServerOptions.max_request_tensor_bytes,
        metavar="BYTES",
        help="memory one request's decoded input tensors may take (estimated from the message before decoding; "
        "a BYTES element counts 4 x (56 bytes + its length): decoded and an engine's copies); a request above it is "
        "refused with "
        "RESOURCE_EXHAUSTED; 0 or more, 0 = no limit (default: 1 GiB)",
    )
    add(
        "--max-inflight-tensor-bytes",
        type=int,
        default=ServerOptions.max_inflight_tensor_bytes,
        metavar="BYTES",
        help="memory the decoded tensors of all requests in flight may take together; a request that would pass "
        "it is refused at once with RESOURCE_EXHAUSTED; 0 or more, 0 = no limit (default: 4 GiB)",
    )
    add(
        "--response-cache-bytes",
        "--response-cache-byte-size",
        type=int,
        default=ServerOptions.response_cache_bytes,
        metavar="BYTES",
        help="memory for the response cache: ModelInfer answers of models whose config says response_cache "
        "{ enable: true } are kept by request content and served again without a slot (least recently used "
        "evicted first); 0 or more, 0 = no cache (default: 0)",
    )
    add(
        "--drain-seconds",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="on SIGTERM, SIGINT or SIGHUP, keep serving this long after health turns NOT_SERVING, "
        "0..31536000 (default: 0)",
    )
    add(
        "--shutdown-grace",
        "--exit-timeout-secs",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="then, how long calls in progress (queued ones included) may finish before queued work is refused "
        "and running work cancelled, 0..31536000 (default: %(default)s)",
    )
    add(
        "--stream-write-timeout",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="end a stream whose client does not take a message within this time, more than 0 and at most "
        "31536000 (default: %(default)s)",
    )
    add(
        "--metrics-port",
        type=int,
        metavar="PORT",
        help="serve Prometheus metrics over HTTP on --host:PORT, 0..65535 (0 picks a free port; default: off)",
    )
    add(
        "--log-format",
        choices=LOG_FORMATS,
        default="text",
        help="text: human-readable lines; json: one JSON object per line with time, level, logger, event, "
        "model, message and the event's fields; Triton's default and ISO8601 mean text (default: %(default)s)",
    )
    add(
        "--log-file",
        type=Path,
        metavar="PATH",
        help="write log lines to PATH (appended; created if missing) instead of stderr (default: stderr)",
    )
    add(
        "--exit-on-error",
        type=triton_bool,
        nargs="?",
        const=True,
        default="false",  # a string, so that argparse reads it with triton_bool and --help shows Triton's word
        metavar="BOOL",
        help="true (or the flag alone): exit with status 1, serving nothing, when a model fails to load at "
        "startup, as Triton does by default; false: log it, list the model with its reason and serve the others "
        "(default: false)",
    )
    add(
        "--enable-test-backends",
        action="store_true",
        help='also serve models of the test doubles (backend "fixture", engine/testing/): for test suites '
        "that start the server as a process; never in production",
    )
    if only is None:
        add_security_flags(parser)
        add_shared_memory_flags(parser)
    add(
        "--log-level",
        default="INFO",
        type=str.upper,
        choices=("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"),
        help="the lowest level logged, in any case; DEBUG also logs every rejected request (default: %(default)s)",
    )
    if only is None:
        add_trace_flags(parser)
        add_triton_flags(parser)


def _destination(names: tuple[str, ...], settings: dict[str, Any]) -> str:
    """The attribute a flag parses into, as argparse names it: `dest`, else its first long name with '-' as '_'."""
    if "dest" in settings:
        return str(settings["dest"])
    long = next((name for name in names if name.startswith("--")), names[0])
    return long.lstrip("-").replace("-", "_")


def add_shared_memory_flags(parser: argparse.ArgumentParser) -> None:
    """System shared memory (service/transport/shared_memory.py): off by default, because registering a region makes the
    server read and write host memory a client names."""
    from ..transport.shared_memory import DEFAULT_MAX_BYTES

    group = parser.add_argument_group("shared memory")
    group.add_argument(
        "--shared-memory",
        choices=("none", "system"),
        default="none",
        help="system: clients on this host may register POSIX shared-memory regions and pass tensors in them "
        "instead of in messages (Triton's system shared memory extension). Off by default: registering makes "
        "the server read and write memory a client names, so enable it only where every client that can reach "
        "the port is trusted to share this host's memory (e.g. a sidecar sharing the pod's /dev/shm); with "
        "--inference-token, registering needs that token (default: %(default)s)",
    )
    group.add_argument(
        "--shared-memory-prefix",
        default="/",
        metavar="PREFIX",
        help="use only keys starting with PREFIX, e.g. /slotserve_ (keys are POSIX shared-memory "
        "names: a leading '/', no other '/'; default: any)",
    )
    group.add_argument(
        "--shared-memory-max-bytes",
        type=int,
        default=DEFAULT_MAX_BYTES,
        metavar="BYTES",
        help="bytes registered at once over all regions, counting unregistered regions that running "
        "requests still use, > 0; a register beyond it is refused (default: 1 GiB)",
    )


def add_security_flags(parser: argparse.ArgumentParser) -> None:
    """Tokens (service/transport/auth.py) and TLS (service/transport/tls.py). A token file is preferred: a token given
    on the command line is visible to every local user in the process list."""
    group = parser.add_argument_group("authentication and TLS")
    for kind, what in (
        ("management", "management and repository calls, status included (needs --allow-management)"),
        ("inference", "every other call except health probes (the management token works too)"),
    ):
        token = group.add_mutually_exclusive_group()
        token.add_argument(f"--{kind}-token", metavar="TOKEN", help=f"require 'authorization: Bearer TOKEN' on {what}")
        token.add_argument(
            f"--{kind}-token-file",
            type=Path,
            metavar="PATH",
            help=f"as --{kind}-token, read from a file (trailing newline ignored; preferred)",
        )
    group.add_argument("--tls-cert", type=Path, metavar="FILE", help="serve TLS with this PEM certificate chain")
    group.add_argument("--tls-key", type=Path, metavar="FILE", help="the PEM private key of --tls-cert")
    group.add_argument(
        "--tls-client-ca",
        type=Path,
        metavar="FILE",
        help="mutual TLS: require client certificates signed by this PEM CA",
    )
