"""A python model's worker process: one per slot, started by engine/python/backend.py as
`python -m engine.python.worker <pipe fd>`.

It imports the model.py, runs `auto_complete_config` and `initialize`, then serves `execute` calls one at a
time until told to stop (then `finalize`). Tensors arrive and leave through the server's shared-memory segments
(engine/python/transport.py); the pipe carries only control messages. An exception in the model is reported to
the server with its type and message; its traceback goes to stderr, which is the server's log. A watchdog thread
ends the worker when the server process is gone, so a worker never outlives its server.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import struct
import sys
import threading
import time
import traceback
from multiprocessing.connection import Connection

from . import transport
from . import triton_python_backend_utils as pb_utils

_LOG = logging.getLogger("slotserve.python_model")
WATCHDOG_SECONDS = 0.5


class Worker:
    def __init__(self, connection: Connection) -> None:
        self.connection = connection
        self.model = None
        self.name = ""
        self.request_segment: transport.Segment | None = None
        self.response_segment: transport.Segment | None = None
        self.cancel_board: transport.Segment | None = None
        self.requested_cache: dict = {}

    # ---- start -----------------------------------------------------------------------------------------------

    def start(self, settings: dict) -> None:
        """Import model.py, auto-complete the configuration, initialize. Replies ("ready", config json) or
        ("error", message)."""
        self.name = settings["model_name"]
        try:
            self.cancel_board = transport.Segment.attach(*settings["cancel_board"])
            self._remap(settings["segments"])  # mapped first: the server unlinks the files once this call replies
            config = json.loads(settings["model_config"])
            module = _import_model(settings["model_file"], self.name)
            model_class = getattr(module, "TritonPythonModel", None)
            if model_class is None:
                raise pb_utils.TritonModelException(f"{settings['shown_file']} defines no class TritonPythonModel")
            auto_complete = getattr(model_class, "auto_complete_config", None)
            if auto_complete is not None and settings["auto_complete"]:
                completed = auto_complete(pb_utils.ModelConfig(config))
                if isinstance(completed, pb_utils.ModelConfig):
                    config = completed.as_dict()
            self.model = model_class()
            initialize = getattr(self.model, "initialize", None)
            if initialize is not None:
                args = {key: settings[key] for key in _ARG_KEYS}
                args["model_config"] = json.dumps(config)
                initialize(args)
        except BaseException as error:  # the model's own code: any exception is its load failure
            _LOG.error("model '%s': loading model.py failed:\n%s", self.name, traceback.format_exc())
            self.connection.send(("error", _describe(error)))
            return
        self.connection.send(("ready", json.dumps(config)))

    # ---- serve -----------------------------------------------------------------------------------------------

    def serve(self) -> None:
        while True:
            try:
                message = self.connection.recv()
            except (EOFError, OSError):
                return  # the server is gone
            kind = message[0]
            if kind == "execute":
                self.execute(*message[1:])
            elif kind == "stop":
                self.finalize()
                return

    def execute(self, run: int, requests: list[dict], segments: dict) -> None:
        """Run one call (a list of requests) and reply ("done", run, results), results per request
        ("ok", descriptors) or ("error", code, message); ("failed", run, message) if execute raised."""
        self._remap(segments)
        board = self.cancel_board
        built = [self._request(run, index, request, board) for index, request in enumerate(requests)]
        try:
            responses = self.model.execute(built)  # type: ignore[attr-defined]  # set by initialize, which ran first
            results, layout = self._collect(built, requests, responses)
        except BaseException as error:  # the model's own code
            _LOG.error("model '%s': execute raised:\n%s", self.name, traceback.format_exc())
            self.connection.send(("failed", run, _describe(error)))
            return
        finally:
            del built
        if layout.size > self.response_segment.size:  # type: ignore[union-attr]
            self.connection.send(("grow", run, layout.size))
            path, size = self.connection.recv()
            self._replace_response_segment(path, size)
        layout.write(self.response_segment)  # type: ignore[arg-type]
        self.connection.send(("done", run, results))

    def _request(self, run: int, index: int, request: dict, board) -> pb_utils.InferenceRequest:
        segment = self.request_segment
        inputs = [
            pb_utils.Tensor(d.name, transport.read(segment, d, copy=False, bf16=_bf16(d)))  # type: ignore[arg-type]
            for d in request["inputs"]
        ]
        offset = 8 * index

        def cancelled() -> bool:
            return struct.unpack_from("<q", board.view, offset)[0] == run

        return pb_utils.InferenceRequest(
            model_name=self.name,
            inputs=inputs,
            requested_output_names=request["outputs"],
            request_id=request.get("id", ""),
            correlation_id=request.get("correlation_id", 0),
            flags=request.get("flags", 0),
            parameters=request.get("parameters") or "{}",
            _cancelled=cancelled,
        )

    def _collect(self, built, requests, responses):
        """The per-request results of `execute`'s return value, with the outputs laid out for the response
        segment. Raises TritonModelException when the return value does not fit the requests."""
        if responses is None:
            responses = [request._sender.response if request._sender is not None else None for request in built]
            if any(response is None for response in responses):
                raise pb_utils.TritonModelException(
                    "execute returned None but did not send a response for every request through its response sender"
                )
        responses = list(responses)
        if len(responses) != len(built):
            raise pb_utils.TritonModelException(
                f"execute returned {len(responses)} responses for {len(built)} requests (one each is required)"
            )
        layout = transport.Layout()
        results = []
        for response, request in zip(responses, requests, strict=True):
            results.append(self._result(response, request["outputs"], layout))
        return results, layout

    def _result(self, response, requested: list[str], layout: transport.Layout):
        if not isinstance(response, pb_utils.InferenceResponse):
            raise pb_utils.TritonModelException(
                f"execute must return pb_utils.InferenceResponse objects, got {type(response).__name__}"
            )
        if response.has_error():
            error = response.error()
            return ("error", error.code(), error.message())  # type: ignore[union-attr]
        descriptors = []
        for tensor in response.output_tensors():
            if requested and tensor.name() not in requested:
                continue
            array = tensor.as_numpy()
            datatype = transport.datatype_of(array)
            if datatype is None:
                return ("error", pb_utils.TritonError.INTERNAL, f"output '{tensor.name()}' has numpy dtype "
                        f"{array.dtype}, which has no Triton datatype")  # fmt: skip
            descriptors.append(layout.plan(tensor.name(), array, datatype))
        return ("ok", descriptors)

    def _remap(self, segments: dict) -> None:
        for key, (path, size) in segments.items():
            old = getattr(self, f"{key}_segment")
            setattr(self, f"{key}_segment", transport.Segment.attach(path, size))
            if old is not None:
                old.close()

    def _replace_response_segment(self, path: str, size: int) -> None:
        self._remap({"response": (path, size)})

    def finalize(self) -> None:
        finalize = getattr(self.model, "finalize", None)
        if finalize is None:
            return
        try:
            finalize()
        except BaseException:  # the model's own code: logged, the worker ends anyway
            _LOG.error("model '%s': finalize raised:\n%s", self.name, traceback.format_exc())


_ARG_KEYS = (
    "model_instance_kind",
    "model_instance_name",
    "model_instance_device_id",
    "model_repository",
    "model_version",
    "model_name",
)


def _bf16(descriptor):
    if descriptor.datatype != "BF16":
        return None
    from engine.datatypes import bfloat16

    return bfloat16()


def _describe(error: BaseException) -> str:
    text = str(error)
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def _import_model(path: str, name: str):
    spec = importlib.util.spec_from_file_location(f"slotserve_python_model_{name.replace('.', '_')}", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _watch_parent(parent: int) -> None:
    """End this process once the server that started it is gone (it cannot be told any more)."""
    while True:
        time.sleep(WATCHDOG_SECONDS)
        if os.getppid() != parent:
            os._exit(3)


def main(argv: list[str]) -> int:
    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    pb_utils._install()
    connection = Connection(int(argv[1]))
    parent = int(argv[2])
    threading.Thread(target=_watch_parent, args=(parent,), name="parent-watchdog", daemon=True).start()
    kind, settings = connection.recv()
    if kind != "init":
        return 2
    worker = Worker(connection)
    worker.start(settings)
    if worker.model is None:
        return 1
    worker.serve()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # skip the interpreter's teardown: the server is waiting for this process to end


if __name__ == "__main__":
    sys.exit(main(sys.argv))
