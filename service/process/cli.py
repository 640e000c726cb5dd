"""`python -m service` / `slotserve`: parse flags, configure logging, run the server until a signal."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..core.events import JsonFormatter, QuietStreamHandler, TextFormatter, log_event
from . import check, flags
from .options import ServerOptions
from .signals import Decision, SignalPipe, decide
from .trace_flags import trace_settings
from .triton_flags import log_level, triton_fields

if TYPE_CHECKING:  # the server's modules load only when it runs (not for --help, nor for a check)
    from .server import Server, ShutdownReport


def build_parser() -> argparse.ArgumentParser:
    """The server's command line (service/process/flags.py has its flags)."""
    return flags.server_parser()


def security_options(args: argparse.Namespace) -> dict[str, Any]:
    """ServerOptions fields from the security flags. Raises ValueError for an unreadable or empty token file
    (the message names the file, never its content)."""
    from ..transport.auth import read_token_file

    options: dict[str, Any] = {"tls_cert": args.tls_cert, "tls_key": args.tls_key, "tls_client_ca": args.tls_client_ca}
    for kind in ("management", "inference"):
        path = getattr(args, f"{kind}_token_file")
        options[f"{kind}_token"] = (
            read_token_file(path, f"--{kind}-token-file") if path is not None else getattr(args, f"{kind}_token")
        )
    return options


def security_lines(options: ServerOptions) -> list[str]:
    """What the startup banner says about who may call what and how the port is secured."""
    from ..transport import auth, tls

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
    from ..transport import auth

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


def option_fields(args: argparse.Namespace) -> dict[str, Any]:
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
        refuse_predicted_wait=args.refuse_predicted_wait,
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
        frontends=args.frontends,
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
        trace_settings=trace_settings(args),
    )
    fields.update(triton_fields(args, fields))
    return fields


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["check"]:  # `slotserve check PATH`: read a repository without serving it (service/process/check.py)
        return check.main(argv[1:])
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


def run_until_stopped(server: Server, signals: SignalPipe, log: logging.Logger) -> ShutdownReport | None:
    """Serve until a stop signal, then shut down on a thread of its own while this (main) thread keeps reading
    signals, so a forced exit (SIGINT again, SIGQUIT) works during the drain and the grace. Returns the
    shutdown's report, or None if the shutdown raised. See service/process/signals.py for the rules."""
    shutdown: threading.Thread | None = None
    reports: list[ShutdownReport] = []

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
