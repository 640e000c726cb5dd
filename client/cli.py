"""The ops command line: `python -m client [--address HOST:PORT] [--timeout S] [--token T] [--inference-token T]
[--tls-ca FILE [--tls-cert FILE --tls-key FILE] [--tls-server-name NAME]] COMMAND ...`.

    health                                   live, ready and gRPC health (exit 1 unless all are good)
    models                                   repository index joined with management status
    metadata MODEL | config MODEL            model metadata, model configuration (text format)
    stats [MODEL]                            inference statistics
    infer MODEL --input NAME=PATH.npy|NAME=JSON [--datatype NAME=TYPE] [--output-dir DIR]
    stream MODEL --input ... (as infer)      one request on ModelStreamInfer, every response as it arrives
                                             (a decoupled model's many; exit 1 if one is an error)
    load MODEL [--config JSON] [--slots N]   RepositoryModelLoad, or RegisterModel with --slots
    unload MODEL... | unload --all           UnloadModel for one id, UnloadModels for several
    register MODEL [--source DIR] [--backend B] [--slots N] [--option k=v]

`--json` (before or after the command) prints JSON instead of text. A failure prints one line on stderr,
`error: UNAVAILABLE (server_busy): ...`, and exits 1 (a refused connection names the address and how to give
another: --address or $SLOTSERVE_ADDRESS); a command line that cannot be carried out exits 2; output whose reader
went away (`... | head`) ends quietly with 141, as a tool killed by SIGPIPE. Every call waits for the server
without limit unless --timeout is given.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict
from typing import Any, NoReturn, Protocol

import numpy as np
from google.protobuf import text_format

from . import _render as render
from ._cli_inputs import UsageError, load_inputs, parse_datatypes, parse_options, parse_parameters
from ._security import INFERENCE_TOKEN_ENV
from .errors import ClientError
from .inference import InferenceClient, ModelMetadata, RepositoryModel
from .management import TOKEN_ENV, ManagementClient, ModelStatus

ADDRESS_ENV = "SLOTSERVE_ADDRESS"
DEFAULT_ADDRESS = "127.0.0.1:8001"


class _Parser(argparse.ArgumentParser):
    """argparse, except that a bad command line raises UsageError instead of printing usage and exiting, so
    main() reports it as one line like every other failure, and a flag is known only by its full name (no
    abbreviations: `--addr` is not `--address`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see {self.prog} --help)")


Handler = Callable[["_Session"], int]  # a command: its exit status


class Commands(Protocol):
    """What the commands are added to (the parser's subparsers)."""

    def add_parser(self, name: str, **settings: Any) -> argparse.ArgumentParser: ...


class _Session:
    """The clients of one command; the management client shares the inference client's channel and is
    created only when a command needs it."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        # One channel (TLS or not) serves both clients; each call carries the token its kind needs.
        self.inference = InferenceClient(
            args.address,
            timeout=args.timeout,
            token=args.inference_token,
            management_token=args.token,
            tls=args.tls,
            tls_ca=args.tls_ca,
            tls_cert=args.tls_cert,
            tls_key=args.tls_key,
            tls_server_name=args.tls_server_name,
        )
        self._management: ManagementClient | None = None

    @property
    def management(self) -> ManagementClient:
        if self._management is None:
            self._management = ManagementClient(
                channel=self.inference.channel,
                timeout=self.args.timeout,
                token=self.args.token,
                inference_token=self.args.inference_token,
            )
        return self._management

    def close(self) -> None:
        self.inference.close()


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; returns the exit status (0 ok, 1 failure, 2 usage, 130 interrupted). Never raises."""
    try:
        args = build_parser().parse_args(argv)
    except UsageError as error:
        return _fail(str(error), 2)
    except SystemExit as done:  # --help
        return done.code if isinstance(done.code, int) else 0
    try:
        session = _Session(args)
    except ValueError as error:
        return _fail(str(error), 2)
    except OSError as error:  # a TLS file that cannot be read
        return _fail(_os_error(error), 2)
    try:
        status: int = args.handler(session)
        sys.stdout.flush()  # a reader that went away shows here, not in the interpreter's final flush
        return status
    except BrokenPipeError:
        return _output_gone()
    except UsageError as error:
        return _fail(str(error), 2)
    except ClientError as error:
        return _fail(_with_hints(str(error), error, args), 1)
    except OSError as error:
        return _fail(_os_error(error), 1)
    except KeyboardInterrupt:
        return _fail("interrupted", 130)
    except Exception as error:  # noqa: BLE001 - the promise is one line, never a traceback
        return _fail(f"{type(error).__name__}: {error}", 1)
    finally:
        session.close()


# What grpc says when no connection could be made (refused, no route, unknown host), as opposed to an UNAVAILABLE
# that a server answered itself (shutting down, busy).
_NOT_CONNECTED = (
    "failed to connect",
    "connection refused",
    "dns resolution failed",
    "name resolution",
    "no route to host",
    "connect failed",
)


def _with_hints(message: str, error: ClientError, args: argparse.Namespace) -> str:
    """A failure to connect says why it is likely (a server that speaks TLS, or does not, or no server at all) and
    what to change; a streaming model called with `infer` points at `stream`."""
    if error.code == "UNIMPLEMENTED" and getattr(args, "command", None) == "infer" and "decoupled" in message:
        return f"{message} (call it with: python -m client stream {args.model} --input ...)"
    hint = _connection_hint(error, args.address, tls=bool(args.tls or args.tls_ca or args.tls_cert))
    return f"{message} ({hint})" if hint else message


def _connection_hint(error: ClientError, address: str, *, tls: bool) -> str | None:
    """What a connection failure most likely means, from grpc's words for it; None when it is not one."""
    if error.code != "UNAVAILABLE":
        return None
    text = error.message.lower()
    if not tls and "socket closed" in text:
        # A TLS server closes a plaintext connection at its first bytes; grpc then says only "Socket closed".
        return (
            f"a server at {address} closed the connection at once: it may speak TLS only; connect with --tls-ca "
            "FILE (its CA), or --tls to trust the system's CAs"
        )
    if tls and "wrong_version_number" in text:
        return f"the server at {address} does not speak TLS: connect without --tls, --tls-ca and --tls-cert"
    if tls and "certificate_verify_failed" in text:
        return f"the certificate of the server at {address} is not signed by a CA this client trusts: --tls-ca FILE"
    if tls and "hostname verification" in text:
        return (
            f"the certificate of the server at {address} does not name that host: --tls-server-name NAME checks "
            "another name"
        )
    if any(words in text for words in _NOT_CONNECTED):
        return f"no server answers at {address}; point the client at another with --address HOST:PORT or ${ADDRESS_ENV}"
    return None


def _output_gone() -> int:
    """stdout's reader went away (`python -m client models | head`): stop quietly, as a Unix tool killed by
    SIGPIPE does (exit 128 + 13), with stdout pointed at /dev/null so the interpreter's final flush of what is
    still buffered cannot fail either."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        pass
    finally:
        os.close(devnull)
    return 128 + signal.SIGPIPE


def _os_error(error: OSError) -> str:
    return f"{error.strerror or error}: {error.filename}" if error.filename else str(error)


def _fail(message: str, status: int) -> int:
    print(f"error: {' '.join(message.split())}", file=sys.stderr)
    return status


def _out(text: str) -> None:
    print(text, file=sys.stdout)


# ---- the parser ------------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    """The whole command line. Each subcommand sets `handler(session) -> exit status`."""
    parser = _Parser(prog="python -m client", description="Operate a slotserve (or any KServe v2 gRPC) server.")
    parser.add_argument(
        "--address",
        default=os.environ.get(ADDRESS_ENV, DEFAULT_ADDRESS),
        help=f"server HOST:PORT (default: ${ADDRESS_ENV} or {DEFAULT_ADDRESS})",
    )
    parser.add_argument(
        "--timeout",
        type=_deadline_seconds,
        default=None,
        metavar="S",
        help="deadline of each call in seconds, more than 0 (default: none)",
    )
    parser.add_argument(
        "--token", default=None, metavar="TOKEN", help=f"management bearer token (default: ${TOKEN_ENV})"
    )
    parser.add_argument(
        "--inference-token",
        default=None,
        metavar="TOKEN",
        help=f"inference bearer token, for servers started with --inference-token (default: ${INFERENCE_TOKEN_ENV})",
    )
    tls = parser.add_argument_group("TLS (any of these connects with TLS)")
    tls.add_argument("--tls", action="store_true", help="connect with TLS, trusting the system's root CAs")
    tls.add_argument("--tls-ca", metavar="FILE", help="PEM CA bundle that signed the server's certificate")
    tls.add_argument("--tls-cert", metavar="FILE", help="PEM client certificate (mutual TLS; with --tls-key)")
    tls.add_argument("--tls-key", metavar="FILE", help="PEM private key of --tls-cert")
    tls.add_argument(
        "--tls-server-name",
        metavar="NAME",
        help="check the server's certificate against NAME instead of the address's host",
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")
    # SUPPRESS keeps a subcommand's unset --json from overwriting a global --json.
    json_flag = _Parser(add_help=False)
    json_flag.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="print JSON instead of text")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in (
        _add_health,
        _add_models,
        _add_metadata,
        _add_config,
        _add_stats,
        _add_infer,
        _add_stream,
        _add_load,
        _add_unload,
        _add_register,
    ):
        add(commands, json_flag)
    return parser


def _deadline_seconds(text: str) -> float:
    """--timeout: a finite number of seconds above 0 (NaN, infinities, 0 and negatives would end every call at
    once with DEADLINE_EXCEEDED)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 < value < math.inf:
        raise argparse.ArgumentTypeError(f"must be a number of seconds more than 0, got {text}")
    return value


def _slot_count(text: str) -> int:
    """--slots: a positive count (the server says how many it allows)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value < 1 << 32:
        raise argparse.ArgumentTypeError(f"must be a slot count of at least 1, got {text}")
    return value


def _command(
    commands: Commands, name: str, json_flag: argparse.ArgumentParser, handler: Handler, help_text: str
) -> argparse.ArgumentParser:
    command = commands.add_parser(name, parents=[json_flag], help=help_text, description=help_text)
    command.set_defaults(handler=handler)
    return command


def _add_health(commands: Commands, json_flag: argparse.ArgumentParser) -> None:
    _command(commands, "health", json_flag, _health, "server liveness, readiness and gRPC health")


def _add_models(commands: Commands, json_flag: argparse.ArgumentParser) -> None:
    command = _command(commands, "models", json_flag, _models, "models in the repository and their status")
    command.add_argument("--ready", action="store_true", help="list only ready models")


def _add_metadata(commands: Commands, json_flag: argparse.ArgumentParser) -> None:
    command = _command(commands, "metadata", json_flag, _metadata, "a model's inputs and outputs")
    command.add_argument("model")
    command.add_argument("--version", default="")


def _add_config(commands: Commands, json_flag: argparse.ArgumentParser) -> None:
    command = _command(commands, "config", json_flag, _config, "a model's configuration")
    command.add_argument("model")
    command.add_argument("--version", default="")


def _add_stats(commands: Commands, json_flag: argparse.ArgumentParser) -> None:
    command = _command(commands, "stats", json_flag, _stats, "inference statistics (every model by default)")
    command.add_argument("model", nargs="?", default="")
    command.add_argument("--version", default="")


def _add_infer(commands: Commands, json_flag: argparse.ArgumentParser) -> None:
    command = _command(commands, "infer", json_flag, _infer, "run one inference")
    _add_request_arguments(command)
    command.add_argument("--id", default="", help="request id")


def _add_stream(commands: Commands, json_flag: argparse.ArgumentParser) -> None:
    command = _command(
        commands,
        "stream",
        json_flag,
        _stream,
        "send one request on ModelStreamInfer and print every response as it arrives: a decoupled model "
        "(model_transaction_policy { decoupled: true }) answers with any number of them; --json prints one JSON "
        "object per line, per response",
    )
    _add_request_arguments(command, output_dir="write each response's outputs to DIR/N/NAME.npy (N from 1)")


def _add_request_arguments(
    command: argparse.ArgumentParser, output_dir: str = "write each output to DIR/NAME.npy"
) -> None:
    """A request's model, inputs, outputs and parameters (infer and stream)."""
    command.add_argument("model")
    command.add_argument(
        "--input",
        action="append",
        required=True,
        metavar="NAME=PATH.npy|NAME=JSON",
        help="an input tensor: a .npy file, or JSON such as '[[1,2,3]]' (repeat per input)",
    )
    command.add_argument(
        "--datatype",
        action="append",
        default=[],
        metavar="NAME=TYPE",
        help="datatype of a JSON input (default: the model's, from its metadata), or a "
        ".npy input's conversion (default: the file's dtype)",
    )
    command.add_argument(
        "--output",
        action="append",
        default=[],
        metavar="NAME",
        help="request only this output (repeat; default: every output)",
    )
    command.add_argument("--output-dir", metavar="DIR", help=output_dir)
    command.add_argument(
        "--parameter",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a request parameter, e.g. timeout=500000 (microseconds)",
    )
    command.add_argument("--version", default="")


def _add_load(commands: Commands, json_flag: argparse.ArgumentParser) -> None:
    command = _command(
        commands, "load", json_flag, _load, "load a model (RepositoryModelLoad; with --slots, management RegisterModel)"
    )
    command.add_argument("model")
    command.add_argument("--config", metavar="JSON", help="a JSON ModelConfig replacing config.pbtxt")
    command.add_argument("--slots", type=_slot_count, metavar="N", help="slot count (needs management)")


def _add_unload(commands: Commands, json_flag: argparse.ArgumentParser) -> None:
    command = _command(commands, "unload", json_flag, _unload, "unload models (management)")
    command.add_argument("models", nargs="*", metavar="MODEL")
    command.add_argument("--all", action="store_true", help="unload every registered model")


def _add_register(commands: Commands, json_flag: argparse.ArgumentParser) -> None:
    command = _command(
        commands, "register", json_flag, _register, "register or reconfigure a model, then load it (management)"
    )
    command.add_argument("model")
    command.add_argument("--source", default="", metavar="DIR", help="model directory (default: the repository's)")
    command.add_argument("--backend", default="", help="onnxruntime, tensorrt or fixture (default: config.pbtxt's)")
    command.add_argument("--slots", type=_slot_count, metavar="N")
    command.add_argument("--option", action="append", default=[], metavar="KEY=VALUE", help="backend option")
    command.add_argument("--admission-timeout", type=float, metavar="S", help="seconds; 0 waits without limit")
    command.add_argument("--config", default="", metavar="JSON", help="a JSON ModelConfig replacing config.pbtxt")


# ---- the commands ----------------------------------------------------------------------------------------------


def _health(session: _Session) -> int:
    client = session.inference
    live, ready = client.live(), client.ready()
    try:
        health = client.health()
    except ClientError as error:
        # A server without the health service is still worth reporting on.
        health = error.code
    if session.args.json:
        _out(render.to_json({"live": live, "ready": ready, "health": health}))
    else:
        _out(render.key_values([("live", live), ("ready", ready), ("health", health)]))
    return 0 if live and ready and health == "SERVING" else 1


def _models(session: _Session) -> int:
    index = session.inference.repository_index(ready_only=session.args.ready)
    statuses = _management_statuses(session)
    rows = _model_rows(index, statuses, ready_only=session.args.ready)
    if session.args.json:
        _out(render.to_json(rows))
        return 0
    headers = ["NAME", "STATE", "SLOTS", "ACTIVE", "QUEUED", "MAX_PARALLEL_SLOTS", "MEMORY"]
    keys = ["name", "state", "slots", "active_slots", "queued_requests", "max_parallel_slots", "memory"]
    for row in rows:
        row["memory"] = _human_bytes(row.get("memory_bytes"))
    if any(row.get("reason") for row in rows):
        headers.append("REASON")
        keys.append("reason")
    _out(render.table(headers, [[row.get(key) for key in keys] for row in rows]))
    return 0


def _human_bytes(value: float | None) -> str | None:
    if value is None:
        return None
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return None


def _management_statuses(session: _Session) -> dict[str, ModelStatus] | None:
    """Management status by model id, or None when the server has no management service."""
    try:
        return {status.model_id: status for status in session.management.list()}
    except ClientError as error:
        if error.code == "UNIMPLEMENTED":
            return None
        raise


def _model_rows(
    index: list[RepositoryModel], statuses: dict[str, ModelStatus] | None, *, ready_only: bool
) -> list[dict[str, Any]]:
    """One row per model: the index entry, overlaid with the management status when there is one (its state
    is the finer one, e.g. RECONFIGURING). Registered models outside the index are added."""
    rows: dict[str, dict[str, Any]] = {}
    for entry in index:
        rows[entry.name] = {"name": entry.name, "version": entry.version, "state": entry.state, "reason": entry.reason}
    for model_id, status in (statuses or {}).items():
        if ready_only and status.state != "READY":
            continue
        row = rows.setdefault(model_id, {"name": model_id, "version": status.version, "reason": ""})
        row.update(render.status_data(status))
        row.pop("model_id")
        row["reason"] = row["reason"] or status.last_error
    return sorted(rows.values(), key=lambda row: row["name"])


def _metadata(session: _Session) -> int:
    metadata = session.inference.model_metadata(session.args.model, session.args.version)
    if session.args.json:
        _out(render.to_json(_metadata_data(metadata)))
        return 0
    _out(
        render.key_values(
            [
                ("model", metadata.name),
                ("platform", metadata.platform or None),
                ("versions", ", ".join(metadata.versions) or None),
            ]
        )
    )
    for title, tensors in (("inputs", metadata.inputs), ("outputs", metadata.outputs)):
        _out(f"{title}:")
        _out(
            _indent(render.table(["NAME", "DATATYPE", "SHAPE"], [[t.name, t.datatype, list(t.shape)] for t in tensors]))
        )
    return 0


def _metadata_data(metadata: ModelMetadata) -> dict[str, Any]:
    data = asdict(metadata)
    for key in ("inputs", "outputs"):
        data[key] = [{**tensor, "shape": list(tensor["shape"])} for tensor in data[key]]
    data["versions"] = list(data["versions"])
    return data


def _indent(text: str) -> str:
    return "\n".join(f"  {line}" for line in text.splitlines())


def _config(session: _Session) -> int:
    config = session.inference.model_config(session.args.model, session.args.version)
    if session.args.json:
        _out(render.to_json(render.message_data(config)))
    else:
        _out(text_format.MessageToString(config).rstrip())
    return 0


def _stats(session: _Session) -> int:
    stats = session.inference.statistics(session.args.model, session.args.version)
    if session.args.json:
        _out(render.to_json([render.message_data(item) for item in stats]))
    else:
        _out(render.table(render.STATS_HEADERS, [render.stats_row(item) for item in stats]))
    return 0


def _infer(session: _Session) -> int:
    args = session.args
    inputs = load_inputs(args.input, parse_datatypes(args.datatype), lambda: _input_datatypes(session))
    outputs = session.inference.infer(
        args.model,
        inputs,
        args.output or None,
        version=args.version,
        request_id=args.id,
        parameters=parse_parameters(args.parameter),
    )
    saved = _save_outputs(outputs, args.output_dir) if args.output_dir else {}
    if args.json:
        data = {name: render.tensor_data(array) for name, array in outputs.items()}
        for name, path in saved.items():
            data[name] = {"datatype": data[name]["datatype"], "shape": data[name]["shape"], "path": path}
        _out(render.to_json(data))
        return 0
    for name, array in outputs.items():
        _out(render.tensor_heading(name, array))
        _out(f"saved to {saved[name]}" if name in saved else render.tensor_text(array))
    return 0


def _stream(session: _Session) -> int:
    """One request on ModelStreamInfer; each response printed as it arrives (text: `response N:` then its
    tensors; --json: one object per line). A response that is an error is printed on stderr and the stream goes
    on; the exit status is 1 if any was."""
    args = session.args
    inputs = load_inputs(args.input, parse_datatypes(args.datatype), lambda: _input_datatypes(session))
    count = errors = 0
    for item in session.inference.stream_infer(
        args.model, [inputs], args.output or None, version=args.version, parameters=parse_parameters(args.parameter)
    ):
        count += 1
        if isinstance(item, ClientError):
            errors += 1
            if args.json:
                _out(json.dumps({"response": count, "error": str(item)}))
            _fail(f"response {count}: {item}", 1)
            continue
        saved = _save_outputs(item, os.path.join(args.output_dir, str(count))) if args.output_dir else {}
        if args.json:
            data = {name: render.tensor_data(array) for name, array in item.items()}
            for name, path in saved.items():
                data[name] = {"datatype": data[name]["datatype"], "shape": data[name]["shape"], "path": path}
            _out(json.dumps({"response": count, "outputs": data}, default=_plain))
        else:
            _out(f"response {count}:")
            for name, array in item.items():
                _out(_indent(render.tensor_heading(name, array)))
                _out(_indent(f"saved to {saved[name]}" if name in saved else render.tensor_text(array)))
        sys.stdout.flush()  # as it arrives: a decoupled model's responses may be seconds apart
    if not args.json:
        _out(f"{count} response(s)" + (f", {errors} of them error(s)" if errors else ""))
    return 1 if errors else 0


def _plain(value: Any) -> Any:
    """numpy scalars in JSON as plain numbers."""
    return value.item() if isinstance(value, np.generic) else str(value)


def _input_datatypes(session: _Session) -> dict[str, str]:
    """The model's input datatypes by name (one ModelMetadata call); empty when the server cannot say.

    A metadata failure is not the command's failure: a registered model that is not loaded may have no
    metadata yet while the inference itself would load it. The inference reports any real problem.
    """
    try:
        metadata = session.inference.model_metadata(session.args.model, session.args.version)
    except ClientError:
        return {}
    return {tensor.name: tensor.datatype for tensor in metadata.inputs}


def _save_outputs(outputs: dict[str, np.ndarray], directory: str) -> dict[str, str]:
    """Write NAME.npy per output into `directory` (created if missing); the paths by output name."""
    os.makedirs(directory, exist_ok=True)
    paths = {}
    for name, array in outputs.items():
        # Tensor names may hold '/' (TensorFlow-style scopes); keep every file inside the directory.
        path = os.path.join(directory, name.replace("/", "_").replace(os.sep, "_") + ".npy")
        np.save(path, render.saveable(array))
        paths[name] = path
    return paths


def _load(session: _Session) -> int:
    args = session.args
    if args.slots is None:
        session.inference.load(args.model, _checked_json(args.config))
        _out(render.to_json({"model": args.model, "loaded": True}) if args.json else f"loaded {args.model}")
        return 0
    status = session.management.register(args.model, slots=args.slots, config_json=_checked_json(args.config) or "")
    _print_status(session, status)
    return 0


def _checked_json(text: str | None) -> str | None:
    """--config text, refused here when it is not JSON (the server would only say INVALID_ARGUMENT)."""
    if not text:
        return None
    try:
        json.loads(text)
    except ValueError as error:
        raise UsageError(f"--config is not JSON: {error}") from None
    return text


def _unload(session: _Session) -> int:
    args = session.args
    if args.all and args.models:
        raise UsageError("unload: give model ids or --all, not both")
    if not args.all and not args.models:
        raise UsageError("unload: give at least one model id, or --all")
    if len(args.models) == 1:
        _print_status(session, session.management.unload(args.models[0]))
        return 0
    unloaded, not_found = session.management.unload_many(args.models, all=args.all)
    if args.json:
        _out(render.to_json({"unloaded": unloaded, "not_found": not_found}))
    else:
        _out("\n".join(f"unloaded {model_id}" for model_id in unloaded) or "nothing to unload")
    if not_found:
        return _fail(f"NOT_FOUND: not registered: {', '.join(not_found)}", 1)
    return 0


def _register(session: _Session) -> int:
    args = session.args
    status = session.management.register(
        args.model,
        source=args.source,
        backend=args.backend,
        options=parse_options(args.option),
        slots=args.slots,
        admission_timeout=args.admission_timeout,
        config_json=_checked_json(args.config) or "",
    )
    _print_status(session, status)
    return 0


def _print_status(session: _Session, status: ModelStatus) -> None:
    _out(render.to_json(render.status_data(status)) if session.args.json else render.status_block(status))
