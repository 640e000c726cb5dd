"""A python model's worker process: one per slot, started by engine/python/backend.py as
`python -m engine.python.worker <pipe fd>`.

It imports the model.py, runs `auto_complete_config` and `initialize`, then serves `execute` calls one at a
time until told to stop (then `finalize`). Tensors arrive and leave through the server's shared-memory segments
(engine/python/transport.py); the pipe carries only control messages.

A decoupled model (`model_transaction_policy { decoupled: true }`) answers through its requests' response senders,
from `execute` or from threads of its own: each `send` lays its tensors into the response segment, tells the
server ("response", run, index, result, final) and waits for its "ack" (the server has copied them out), all under
the pipe's lock, so sends from several threads go one after another. The main thread waits until every request of
the call got its final flag before it reads the next control message: only then is the pipe its own again.

BLS calls (`pb_utils.InferenceRequest(...).exec()`, from `execute` or from any thread while it runs) go to the
server as ("bls", tag, CallRequest) with their inputs in a segment of their own (engine/python/transport.py); the
server runs each through the callee's admission on a thread of its own and answers ("part", tag, CallReply,
final) messages (a decoupled callee's responses one by one, as they come), so several calls may be in flight at
once. No thread of its own reads the pipe: the thread waiting for a message reads it (engine/python/pipe.py),
filing replies and parts for the thread waiting for their tag (`ask`, `bls`), "execute" and "stop" for the main
thread. `async def execute` runs to its end on the worker's event loop; `async_exec` runs `exec` on the loop's
thread pool, so calls awaited together overlap.

An exception in the model is reported to the server with its type and message; its traceback goes to stderr,
which is the server's log. A watchdog thread ends the worker when the server process is gone, so a worker never
outlives its server.
"""

from __future__ import annotations

import asyncio
import importlib.machinery
import importlib.util
import inspect
import itertools
import json
import logging
import os
import struct
import sys
import threading
import time
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from . import rescheduling, transport
from . import triton_python_backend_utils as pb_utils
from .output import RecordFormatter
from .pipe import GONE, WorkerPipe, unlink_reply

_LOG = logging.getLogger("slotserve.python_model")
WATCHDOG_SECONDS = 0.5


class Worker:
    def __init__(self, connection: Connection) -> None:
        self.connection = connection
        self.model: Any = None  # the TritonPythonModel instance, once `initialize` ran
        self.name = ""
        self.request_segment: transport.Segment | None = None
        self.response_segment: transport.Segment | None = None
        self.cancel_board: transport.Segment | None = None
        self.requested_cache: dict = {}
        self.decoupled = False
        self.pipe_lock = threading.Lock()  # guards: the pipe and the response segment while a decoupled call runs
        self.finals = threading.Condition()  # guards: open_senders
        self.open_senders = 0
        self.pipe = WorkerPipe(connection)  # read by the thread waiting for a message (engine/python/pipe.py)
        self.tags = itertools.count(1)
        # True while a call runs (a decoupled model's: until every final flag): BLS calls are allowed then only.
        self.executing = False
        self.loop: asyncio.AbstractEventLoop | None = None  # runs an `async def execute`
        self._wakeup: asyncio.Event | None = None  # set by a sender while `_wait` runs the loop
        self.instance_name = ""  # Triton's instance name (<model>_0_<slot>), for Triton's words

    # ---- start -----------------------------------------------------------------------------------------------

    def start(self, settings: dict) -> None:
        """Import model.py, auto-complete the configuration, initialize. Replies ("ready", config json) or
        ("error", message)."""
        self.name = settings["model_name"]
        self.instance_name = settings["model_instance_name"]
        try:
            self.cancel_board = transport.Segment.attach(*settings["cancel_board"])
            self._remap(settings["segments"])  # mapped first: the server unlinks the files once this call replies
            config = json.loads(settings["model_config"])
            module = _import_model(settings["model_file"])
            model_class = getattr(module, "TritonPythonModel", None)
            if model_class is None:
                raise pb_utils.TritonModelException(f"{settings['shown_file']} defines no class TritonPythonModel")
            auto_complete = getattr(model_class, "auto_complete_config", None)
            if auto_complete is not None and settings["auto_complete"]:
                completed = auto_complete(pb_utils.ModelConfig(config))
                if isinstance(completed, pb_utils.ModelConfig):
                    config = completed.as_dict()
            self.decoupled = pb_utils.using_decoupled_model_transaction_policy(config)
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
            message = self.pipe.next_order()
            kind = message[0]
            if message is GONE:
                return  # the server is gone
            if kind == "execute" and self.decoupled:
                self.execute_decoupled(*message[1:])
            elif kind == "execute":
                self.execute(*message[1:])
            if kind == "execute":  # single-use segments go when a call ends; the server sends small ones next
                self.request_segment = transport.kept(self.request_segment)
                self.response_segment = transport.kept(self.response_segment)
            if kind == "stop":
                self.finalize()
                return

    def send(self, message) -> None:
        self.pipe.send(message)

    def ask(self, kind: str, *fields):
        """Send (kind, tag, *fields) and wait for the server's reply to it. Raises EOFError when the server is gone."""
        tag = next(self.tags)
        self.send((kind, tag, *fields))
        return self.pipe.answer(tag)

    def run_model(self, built):
        """`execute(built)`, an `async def execute` run to its end on the worker's event loop."""
        returned = self.model.execute(built)
        if inspect.iscoroutine(returned):
            if self.loop is None:
                self.loop = asyncio.new_event_loop()
            returned = self.loop.run_until_complete(returned)
        return returned

    def bls(self, request: pb_utils.InferenceRequest, decoupled: bool):
        """Send a BLS call to the server. Returns the list of the callee's responses (one), or with `decoupled` an
        iterator of them, each as it arrives. Raises TritonModelException outside execute, for an input no
        datatype fits, or when the server is gone (the iterator raises it too)."""
        if not self.executing:
            raise pb_utils.TritonModelException(  # Triton's words first
                "BLS is only supported during the 'execute' function. (a BLS call can only be made while execute "
                "runs: this one came before it, from initialize or finalize, or after it returned)"
            )
        tensors = [(tensor.name(), tensor.as_numpy()) for tensor in request.inputs()]
        try:
            segment, descriptors = transport.write_call(tensors)
        except ValueError as error:
            raise pb_utils.TritonModelException(f"BLS call to model '{request.model_name()}': {error}") from None
        version = request.model_version()
        call = transport.CallRequest(
            model=request.model_name(),
            version="" if version is None or int(version) < 0 else str(int(version)),
            inputs=descriptors,
            outputs=tuple(request.requested_output_names()),
            segment=None if segment is None else (segment.path, segment.size),
            decoupled=decoupled,
            timeout_us=int(request.timeout() or 0),
            request_id=request.request_id(),
            correlation_id=request.correlation_id(),
            flags=request.flags(),
            parameters=json.loads(request.parameters()),
        )
        tag = next(self.tags)
        self.pipe.open_call(tag)
        try:
            self.send(("bls", tag, call))
        except OSError:
            self._end_call(tag, segment)
            raise pb_utils.TritonModelException("the server is gone: the BLS call was not sent") from None
        responses = self._responses(tag, segment)
        return responses if decoupled else list(responses)

    def _responses(self, tag: int, segment):
        """A BLS call's responses as its parts arrive (a decoupled callee's one by one), up to the final part (a final
        part without a response, the callee's final flag alone, is an empty response, as Triton's iterator ends).
        Closed early (the model let go of it), the parts still to come are dropped, their files unlinked."""
        try:
            while True:
                part = self.pipe.next_part(tag)
                if part is None:
                    raise pb_utils.TritonModelException("the server is gone: the BLS call was not answered")
                reply, final = part
                try:
                    results = transport.read_reply(reply, bf16=_bf16_type(reply))
                except OSError as error:
                    raise pb_utils.TritonModelException(f"the BLS reply could not be mapped: {error}") from None
                for result in results:
                    yield _response_of(result)
                if final:
                    if not results:  # the callee's final flag came alone: Triton's iterator ends with an empty response
                        yield pb_utils.InferenceResponse()
                    return
        finally:
            self._end_call(tag, segment)

    def _end_call(self, tag: int, segment) -> None:
        for reply, _final in self.pipe.close_call(tag):
            unlink_reply(reply)
        if segment is not None:
            segment.unlink()
            segment.close()

    def execute(self, run: int, requests: list[dict], segments: dict) -> None:
        """Run one call (a list of requests) and reply ("done", run, results), results per request
        ("ok", descriptors) or ("error", code, message); ("failed", run, message) when there is nothing to answer
        (execute raised before any response was sent, or returned what does not fit the requests).

        A request's response may come back from execute or through its response sender, from execute or from a
        thread after execute returned None: the call is answered once every request whose sender was taken has
        its response (an async model's event loop runs meanwhile). A response sent before execute raised still
        reaches its client, as on Triton; the others get the exception."""
        self._remap(segments)
        board = self.cancel_board
        built = [self._request(run, index, request, board) for index, request in enumerate(requests)]
        for request in built:
            request._sender = pb_utils.InferenceResponseSender(notify=self._senders_changed)
        self.executing = True
        try:
            failure: BaseException | None = None
            returned = None
            try:
                returned = self.run_model(built)
            except BaseException as error:  # the model's own code
                _LOG.error("model '%s': execute raised:\n%s", self.name, traceback.format_exc())
                failure = error
            results, layout = self._collect(built, requests, returned, failure)
        except BaseException as error:  # nothing fits the requests: every request fails
            if error is not failure:
                _LOG.error("model '%s': %s", self.name, _describe(error))
            self.send(("failed", run, _describe(error)))
            return
        finally:
            self.executing = False
            del built
        try:
            if layout.size > self.response_segment.size:  # type: ignore[union-attr]
                self._replace_response_segment(*transport.granted(self.ask("grow", run, layout.size)))
        except transport.NoRoom as refused:  # /dev/shm is full: the server fails the call (RESOURCE_EXHAUSTED)
            self.send(("failed", run, str(refused)))
            return
        layout.write(self.response_segment)  # type: ignore[arg-type]
        self.send(("done", run, results))

    def execute_decoupled(self, run: int, requests: list[dict], segments: dict) -> None:
        """Run one call of a decoupled model: its responses go to the server as they are sent (`send_response`);
        returns once every request got its final flag (an async model's event loop runs meanwhile, so the tasks
        its execute left behind can send). An exception in `execute` (or a return value other than None, refused
        in Triton's words) closes the senders still open and is reported as ("failed", run, message)."""
        self._remap(segments)
        board = self.cancel_board
        built = [self._request(run, index, request, board) for index, request in enumerate(requests)]
        senders = [
            _StreamSender(self, run, index, request["outputs"], built[index]) for index, request in enumerate(requests)
        ]
        with self.finals:
            self.open_senders = len(senders)
        for request, sender in zip(built, senders, strict=True):
            request._sender = sender
        self.executing = True  # until every final flag: the model's threads may make BLS calls for its requests
        try:
            returned = self.run_model(built)
            if returned is not None:
                raise pb_utils.TritonModelException(
                    f"Python model '{self.instance_name}' is using the decoupled mode and the execute function must "
                    "return None."
                )
            rescheduling.send_released(self, built, senders)  # rescheduled requests: no final flag this time
        except BaseException as error:  # the model's own code
            _LOG.error("model '%s': execute raised:\n%s", self.name, traceback.format_exc())
            with self.pipe_lock:
                if any(not sender.closed for sender in senders):
                    for sender in senders:
                        sender.close()
                    self.send(("failed", run, _describe(error)))
        finally:
            del built
        self._wait(lambda: self.open_senders == 0)
        self.executing = False

    def _senders_changed(self) -> None:
        """A response sender got a response or its final flag (any thread): wake the call waiting for them."""
        with self.finals:
            self.finals.notify_all()
        loop, wakeup = self.loop, self._wakeup
        if loop is not None and wakeup is not None and not loop.is_closed():
            loop.call_soon_threadsafe(wakeup.set)

    def _wait(self, done: Callable[[], bool]) -> None:
        """Block until `done()` (which `_senders_changed` follows). For an `async def execute` the event loop runs
        meanwhile: asyncio tasks its execute created may be the ones that send. Waits as long as the model takes,
        as on Triton: the server kills a worker still busy `cancel_kill_seconds` after its request was cancelled."""
        if self.loop is None:
            with self.finals:
                self.finals.wait_for(done)
            return

        async def until_done() -> None:
            self._wakeup = asyncio.Event()
            try:
                while True:
                    self._wakeup.clear()  # cleared before looking: a send in between sets it again
                    with self.finals:
                        if done():
                            return
                    await self._wakeup.wait()
            finally:
                self._wakeup = None

        self.loop.run_until_complete(until_done())

    def send_response(self, run: int, index: int, requested: list[str], response, final: bool) -> None:
        """Hand one response of a decoupled call to the server and wait until it has taken the tensors. Called
        with pipe_lock held, on the model's thread."""
        layout = transport.Layout()
        result = None if response is None else self._result(response, requested, layout)
        if layout.size > self.response_segment.size:  # type: ignore[union-attr]
            self._replace_response_segment(*transport.granted(self.ask("grow", run, layout.size)))  # or NoRoom
        layout.write(self.response_segment)  # type: ignore[arg-type]
        self.ask("response", run, index, result, final)  # answered once the server copied the tensors out

    def sender_closed(self) -> None:
        with self.finals:
            self.open_senders -= 1
        self._senders_changed()

    def _request(self, run: int, index: int, request: dict, board) -> pb_utils.InferenceRequest:
        segment = self.request_segment
        inputs = [
            pb_utils.Tensor(d.name, transport.read(segment, d, copy=False, bf16=_bf16(d)))  # type: ignore[arg-type]
            for d in transport.from_wire(request["inputs"])
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
            parameters=_parameters_json(request.get("parameters")),
            _cancelled=cancelled,
        )

    def _collect(self, built, requests, returned, failure: BaseException | None):
        """The per-request results of a call, with the outputs laid out for the response segment: each request's
        response sent through its sender, else the one `execute` returned, else (execute raised) the exception; a
        request the model rescheduled is a `Released` record (engine/python/rescheduling.py). After execute
        returned None, waits for the responses of the senders the model took. Raises `failure` when no request
        has a response to give, TritonModelException when the return value does not fit the requests."""
        if failure is not None:
            if all(request._sender.response is None for request in built):
                raise failure
            responses = [request._sender.response for request in built]  # None: the exception's error below
        elif returned is None:
            answering = [request for request in built if not rescheduling.rescheduled(request)]
            if any(not request._sender_taken for request in answering):
                raise pb_utils.TritonModelException(
                    "execute returned None but did not send a response for every request through its response sender"
                )
            self._wait(lambda: all(request._sender.response is not None for request in answering))
            responses = [request._sender.response for request in built]
        else:
            responses = list(returned)
            if len(responses) != len(built):
                raise pb_utils.TritonModelException(
                    f"execute returned {len(responses)} responses for {len(built)} requests (one each is required)"
                )
            for index, request in enumerate(built):
                sender = request._sender
                if sender.response is not None:  # sent already: what execute returned for it goes nowhere
                    responses[index] = sender.response
                elif responses[index] is not None:
                    sender.closed = True  # answered: a later send raises, as on Triton
            # None for a request whose sender the model took: its response comes through the sender (a batch may
            # mix returned responses and sent ones).
            pending = [
                index
                for index, request in enumerate(built)
                if responses[index] is None and request._sender_taken and not rescheduling.rescheduled(request)
            ]
            if pending:
                self._wait(lambda: all(built[index]._sender.response is not None for index in pending))
                for index in pending:
                    responses[index] = built[index]._sender.response
        layout = transport.Layout()
        results: list = []  # per request: ("ok", ...), ("error", ...) or a rescheduling.Released
        for index, (response, request) in enumerate(zip(responses, requests, strict=True)):
            if failure is None:
                released = rescheduling.released_result(built[index], response, index)  # rescheduled: runs again
                if released is not None:
                    results.append(released)
                    continue
            if response is None and failure is not None:
                results.append(("error", pb_utils.TritonError.INTERNAL, _describe(failure)))
            else:
                results.append(self._result(response, request["outputs"], layout))
        return results, layout
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
        names = [tensor.name() for tensor in response.output_tensors()]
        twice = sorted({name for name in names if names.count(name) > 1})
        if twice:  # Triton 2.51 answers a malformed response then (one output's shape twice, the other's none)
            return ("error", pb_utils.TritonError.INTERNAL, f"the response has more than one output named {twice}: "
                    "each output may appear once")  # fmt: skip
        for tensor in response.output_tensors():
            if requested and tensor.name() not in requested:
                continue
            array = tensor.as_numpy()
            datatype = transport.datatype_of(array)
            if datatype is None:
                return ("error", pb_utils.TritonError.INTERNAL, f"output '{tensor.name()}' has numpy dtype "
                        f"{array.dtype}, which has no Triton datatype")  # fmt: skip
            descriptors.append(layout.plan(tensor.name(), array, datatype))
        return ("ok", transport.to_wire(descriptors))

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


class _StreamSender(pb_utils.InferenceResponseSender):
    """A decoupled request's response sender: every `send` reaches the server (and its client) before it returns.
    Raises TritonModelException after the final flag, for a response that is not an InferenceResponse, and when
    the server is gone."""

    def __init__(self, worker: Worker, run: int, index: int, requested: list[str], request) -> None:
        super().__init__()
        self._worker, self._run, self._index, self._requested = worker, run, index, requested
        self._request_cancelled = request.is_cancelled

    def send(self, response: pb_utils.InferenceResponse | None = None, flags: int = 0) -> None:
        final = pb_utils._check_send(response, flags)
        worker = self._worker
        with worker.pipe_lock:
            if self.closed:  # a response with the final flag was sent, or execute failed
                raise pb_utils.TritonModelException(pb_utils.SENDER_CLOSED)
            try:
                worker.send_response(self._run, self._index, self._requested, response, final)
            except (EOFError, OSError):
                raise pb_utils.TritonModelException("the server is gone: the response was not delivered") from None
            if final:
                self.close()

    def close(self) -> None:
        """No response after this one (called with the pipe's lock held)."""
        if not self.closed:
            self.closed = True
            self._worker.sender_closed()

    def is_cancelled(self) -> bool:
        return self._request_cancelled()


_ARG_KEYS = (
    "model_instance_kind",
    "model_instance_name",
    "model_instance_device_id",
    "model_repository",
    "model_version",
    "model_name",
)


def _parameters_json(parameters: dict | None) -> str:
    # Most requests carry none: "{}" without the encoder saves a few microseconds of every small request.
    return json.dumps(parameters, separators=(",", ":")) if parameters else "{}"


def _response_of(result: tuple) -> pb_utils.InferenceResponse:
    if result[0] == "ok":
        return pb_utils.InferenceResponse([pb_utils.Tensor(name, array) for name, array in result[1].items()])
    return pb_utils.InferenceResponse(error=pb_utils.TritonError(result[2], result[1]))


def _bf16_type(reply: transport.CallReply):
    wanted = any(r[0] == "ok" and any(d.datatype == "BF16" for d in r[1]) for r in reply.responses)
    return _bf16(transport.Descriptor("", "BF16", (), 0, 0)) if wanted else None


def _bf16(descriptor):
    if descriptor.datatype != "BF16":
        return None
    from engine.datatypes import bfloat16

    return bfloat16()


def _describe(error: BaseException) -> str:
    """ "Type: message" of a model's exception. Never raises: an exception whose __str__ raises is described by
    its type (it must not end the worker, which then counts as a death toward the model's limit)."""
    try:
        text = str(error)
    except BaseException:  # noqa: BLE001 (the model's __str__: anything may come out of it)
        text = "<str() of the exception raised>"
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def _import_model(path: str):
    """Import the model's file as Triton's stub does (pb_stub.cc, ModelContext::StubSetup): its version folder and
    the model's folder are appended to sys.path, and the file is the module `<version>.<stem>` ("1.model"), a
    module of the version folder's package. So `import helper` finds helper.py beside model.py, `from . import
    helper` works too, and `unittest.main("model")` imports the file again by the name `model`, as on Triton.

    The package is made here rather than found on sys.path: a folder of the version's name in the worker's working
    directory (an earlier sys.path entry) must not take its place. Raises what the import raises."""
    path = os.path.abspath(path)
    version_folder = os.path.dirname(path)
    version = os.path.basename(version_folder)
    stem = os.path.splitext(os.path.basename(path))[0]
    for folder in (version_folder, os.path.dirname(version_folder)):
        if folder not in sys.path:
            sys.path.append(folder)
    package_spec = importlib.machinery.ModuleSpec(version, None, is_package=True)
    package_spec.submodule_search_locations = [version_folder]
    package = importlib.util.module_from_spec(package_spec)
    sys.modules[version] = package
    spec = importlib.util.spec_from_file_location(f"{version}.{stem}", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    setattr(package, stem, module)
    spec.loader.exec_module(module)
    return module


def _watch_parent(parent: int) -> None:
    """End this process once the server that started it is gone (it cannot be told any more)."""
    while True:
        time.sleep(WATCHDOG_SECONDS)
        if os.getppid() != parent:
            os._exit(3)


def main(argv: list[str]) -> int:
    logging.basicConfig(stream=sys.stderr, level=logging.INFO)
    logging.root.handlers[0].setFormatter(RecordFormatter())  # the server reads each record back (output.py)
    pb_utils._install()
    connection = Connection(int(argv[1]))
    parent = int(argv[2])
    threading.Thread(target=_watch_parent, args=(parent,), name="parent-watchdog", daemon=True).start()
    kind, settings = connection.recv()
    if kind != "init":
        return 2
    worker = Worker(connection)
    pb_utils._bls_caller = worker.bls
    worker.start(settings)
    if worker.model is None:
        return 1
    worker.serve()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # skip the interpreter's teardown: the server is waiting for this process to end


if __name__ == "__main__":
    sys.exit(main(sys.argv))
