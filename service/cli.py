"""`python -m service` / `slotserve`: parse flags, configure logging, run the server until a signal."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from pathlib import Path

from .core.events import JsonFormatter, QuietStreamHandler, TextFormatter, log_event
from .model_control import DEFAULT_POLL_SECONDS, MODES
from .model_files import DEFAULT_MAX_LOAD_FILE_BYTES
from .options import MAX_MESSAGE_BYTES, MIN_MESSAGE_BYTES, ServerOptions
from .signals import Decision, SignalPipe, decide
from .triton_flags import add_triton_flags, log_level, refusal, triton_bool, triton_fields

# --log-format's values: ours, and Triton's two (both plain text lines here).
LOG_FORMATS = ("text", "json", "default", "ISO8601")


class _Parser(argparse.ArgumentParser):
    """argparse, except that a bad command line is one line on stderr (exit 2), like a value out of range, and a
    flag is known only by its full name: argparse's abbreviations would take `--repository DIR` for
    `--repository-poll-seconds DIR` (and any Triton flag that is the start of one of ours for it)."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


class _ServerParser(_Parser):
    """The server's parser: a tritonserver flag with no meaning here is refused naming the flag and the reason
    (service/triton_flags.py), before argparse would call it unrecognized."""

    def parse_known_args(self, args=None, namespace=None):  # type: ignore[override]  # argparse's own signature
        argv = sys.argv[1:] if args is None else list(args)
        refused = refusal(argv)
        if refused is not None:
            self.error(refused)
        return super().parse_known_args(argv, namespace)


class _Once(argparse.Action):
    """A flag that may be given once (Triton takes several --model-repository; slotserve serves one)."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        if getattr(namespace, f"_{self.dest}_given", False):
            parser.error(f"{option_string} given twice: slotserve serves one model repository")
        setattr(namespace, f"_{self.dest}_given", True)
        setattr(namespace, self.dest, values)


def build_parser() -> argparse.ArgumentParser:
    parser = _ServerParser(
        prog="slotserve",
        description="Serve a model repository over the KServe v2 gRPC protocol.",
        epilog="slotserve check PATH (python -m service check PATH) tells what a repository will do, without serving "
        "it: slotserve check --help, docs/migrating-from-triton.md",
    )
    add = parser.add_argument
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
    add_security_flags(parser)
    add_shared_memory_flags(parser)
    add(
        "--log-level",
        default="INFO",
        type=str.upper,
        choices=("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"),
        help="the lowest level logged, in any case; DEBUG also logs every rejected request (default: %(default)s)",
    )
    add_triton_flags(parser)
    return parser


def add_shared_memory_flags(parser: argparse.ArgumentParser) -> None:
    """System shared memory (service/shared_memory.py): off by default, because registering a region makes the
    server read and write host memory a client names."""
    from .shared_memory import DEFAULT_MAX_BYTES

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
    """Tokens (service/auth.py) and TLS (service/tls.py). A token file is preferred: a token given on the
    command line is visible to every local user in the process list."""
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


def security_options(args: argparse.Namespace) -> dict:
    """ServerOptions fields from the security flags. Raises ValueError for an unreadable or empty token file
    (the message names the file, never its content)."""
    from .auth import read_token_file

    options = {"tls_cert": args.tls_cert, "tls_key": args.tls_key, "tls_client_ca": args.tls_client_ca}
    for kind in ("management", "inference"):
        path = getattr(args, f"{kind}_token_file")
        options[f"{kind}_token"] = (
            read_token_file(path, f"--{kind}-token-file") if path is not None else getattr(args, f"{kind}_token")
        )
    return options


def security_lines(options: ServerOptions) -> list[str]:
    """What the startup banner says about who may call what and how the port is secured."""
    from . import auth, tls

    lines = auth.describe(
        options.allow_management, options.management_token, options.inference_token, tls.describe(options)
    )
    if options.shared_memory == "system":
        lines.append(
            f"shared memory: system, keys starting with {options.shared_memory_prefix!r}, at most "
            f"{options.shared_memory_max_bytes} bytes registered at once"
        )
    else:
        lines.append("shared memory: off (start with --shared-memory system to enable it)")
    roots = options.allowed_model_roots
    lines.append(
        "model files: inside the repository"
        + (f" and {', '.join(str(root) for root in roots)} (--allow-model-root)" if roots else " only")
    )
    return lines


def security_warnings(options: ServerOptions) -> list[str]:
    """The banner lines (of security_lines) logged at WARNING: management enabled with no token at all, so that
    anyone who reaches the port may register, load and unload models."""
    from . import auth

    if not auth.management_unprotected(options.allow_management, options.management_token, options.inference_token):
        return []
    return [line for line in security_lines(options) if line.startswith("management:")]


def configure_logging(log_format: str, level: str, log_file: Path | None = None) -> None:
    """Log to stderr, or appended to `log_file` (--log-file); a broken stream drops lines and never raises into
    the server (QuietStreamHandler). Raises OSError when `log_file` cannot be opened."""
    stream = sys.stderr if log_file is None else open(log_file, "a", encoding="utf-8")  # noqa: SIM115 - the process's
    handler = QuietStreamHandler(stream)
    # Both formats write one line per record whatever a client put in it (service/core/events.py).
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter())
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)


def scope_lines(options: ServerOptions) -> list[str]:
    """What the startup banner says about the runtime mode and its validated scope."""
    if options.parallel_jobs is None:
        return ["one slot per model (start with --parallel-jobs N for the parallel runtime)"]
    return [
        f"parallel runtime: {options.parallel_jobs} slot(s) per model by default (1..16 per model)",
        "backends admitting more than one slot: onnxruntime (up to 16, one shared session), tensorrt "
        "(contexts that fit in device memory, up to 16)"
        + (", fixture (its declared capacity)" if options.enable_test_backends else ""),
        "not validated: TensorRT on a GPU (checked here only through a test double)",
    ]


def option_fields(args: argparse.Namespace) -> dict:
    """The ServerOptions fields the parsed command line gives, Triton's flags included. Raises ValueError for
    unreadable token files and Triton flags that do not go together."""
    fields = dict(
        model_repository=args.model_repository,
        host=args.host,
        port=args.port,
        allowed_model_roots=tuple(args.allowed_model_roots or ()),
        parallel_jobs=args.parallel_jobs,
        allow_management=args.allow_management,
        admission_timeout=args.admission_timeout,
        max_queue=args.max_queue,
        max_concurrent_loads=args.max_concurrent_loads,
        load_at_startup=args.load_at_startup,
        model_control_mode=args.model_control_mode,
        load_models=tuple(args.load_models or ()),
        repository_poll_seconds=args.repository_poll_seconds,
        model_files_dir=args.model_files_dir,
        max_load_file_bytes=args.max_load_file_bytes,
        python_environments_dir=args.python_environments_dir,
        max_resident_models=args.max_resident_models,
        idle_unload=args.idle_unload,
        memory_budget=args.memory_budget,
        max_workers=args.max_workers,
        max_concurrent_rpcs=args.max_concurrent_rpcs,
        handler_runners=args.handler_runners,
        max_message_bytes=args.max_message_bytes,
        enable_test_backends=args.enable_test_backends,
        max_request_tensor_bytes=args.max_request_tensor_bytes,
        max_inflight_tensor_bytes=args.max_inflight_tensor_bytes,
        response_cache_bytes=args.response_cache_bytes,
        drain_seconds=args.drain_seconds,
        shutdown_grace=args.shutdown_grace,
        stream_write_timeout=args.stream_write_timeout,
        log_format="json" if args.log_format == "json" else "text",
        exit_on_error=args.exit_on_error,
        strict_readiness=args.strict_readiness,
        metrics_port=args.metrics_port,
        shared_memory=args.shared_memory,
        shared_memory_prefix=args.shared_memory_prefix,
        shared_memory_max_bytes=args.shared_memory_max_bytes,
        **security_options(args),
    )
    fields.update(triton_fields(args, fields))
    return fields


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["check"]:  # `slotserve check PATH`: read a repository without serving it (service/check.py)
        from .check import main as check

        return check(argv[1:])
    args = build_parser().parse_args(argv)
    try:
        configure_logging(args.log_format, log_level(args), args.log_file)
    except OSError as error:
        print(f"slotserve: --log-file {args.log_file}: cannot open it: {error.strerror or error}", file=sys.stderr)
        return 2
    try:
        options = ServerOptions(**option_fields(args))
    except ValueError as error:
        print(f"slotserve: {error}", file=sys.stderr)
        return 2
    if not options.model_repository.is_dir():
        print(f"slotserve: model repository {options.model_repository} is not a folder", file=sys.stderr)
        return 2
    from .server import Server

    log = logging.getLogger("slotserve")
    warnings = security_warnings(options)
    for line in scope_lines(options) + security_lines(options):
        log.log(logging.WARNING if line in warnings else logging.INFO, "%s", line)
    server = Server(options)
    signals = SignalPipe(log)
    signals.install()  # before start: a stop signal during the startup loads ends the process at once
    try:
        server.start()
    except RuntimeError as error:
        print(f"slotserve: {error}", file=sys.stderr)
        return 1
    signals.serving = True
    announce(f"slotserve listening on {server.address}", log)
    report = run_until_stopped(server, signals, log)
    if report is None:
        return 1  # the shutdown itself failed (its traceback is in the log)
    if report.abandoned_calls:
        # Hung handler threads would keep the interpreter alive: leave without joining them.
        logging.shutdown()
        os._exit(0)
    return 0


def announce(line: str, log: logging.Logger) -> None:
    """Print `line` on stdout for whoever started the server (scripts and tests read the address there). A stdout
    that cannot take it (its reader is gone: EPIPE; its terminal hung up: EIO; closed) must not stop a server that
    is already serving: the line is dropped with a warning in the log, and stdout is pointed at /dev/null so that
    neither a later write nor the interpreter's final flush fails."""
    try:
        print(line, flush=True)
    except (OSError, ValueError):
        _discard_stdout()
        log.warning("stdout is closed (its reader went away): %r not printed; serving on", line)


def _discard_stdout() -> None:
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())  # the bytes still buffered go to /dev/null at the final flush
    except (OSError, ValueError, AttributeError):
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - lives as long as the process
    finally:
        os.close(devnull)


def run_until_stopped(server, signals: SignalPipe, log: logging.Logger):
    """Serve until a stop signal, then shut down on a thread of its own while this (main) thread keeps reading
    signals, so a forced exit (SIGINT again, SIGQUIT) works during the drain and the grace. Returns the
    shutdown's report, or None if the shutdown raised. See service/signals.py for the rules."""
    shutdown: threading.Thread | None = None
    reports = []

    def shut_down() -> None:
        try:
            reports.append(server.shutdown())
        finally:
            signals.shutdown_done()

    while True:
        signum = signals.next()
        if signum is None:
            return reports[0] if reports else None
        name = signal.Signals(signum).name
        decision = decide(signum, shutting_down=shutdown is not None)
        if decision is Decision.EXIT_NOW:
            log_event(log, "shutdown_forced", signal=name)
            logging.shutdown()
            os._exit(128 + signum)
        if decision is Decision.IGNORE:
            log_event(log, "shutdown_signal_repeated", signal=name)
            continue
        log_event(log, "shutdown_signal", signal=name)
        shutdown = threading.Thread(target=shut_down, name="shutdown", daemon=True)
        shutdown.start()
