"""A python model's worker process: one per slot, started by engine/python/backend.py as
`python -m engine.python.worker <pipe fd>`.

It imports the model.py, runs `auto_complete_config` and `initialize`, then serves `execute` calls (engine/python/
messages.py's Execute: a run number, a lane, the requests) until told to stop (then `finalize`). Tensors arrive and
leave through the server's shared-memory segments, a request and a response segment per lane
(engine/python/transport.py); the pipe carries only control messages (the common Execute and its Done not even
those: they lie packed in the lane's control area, and the pipe carries a doorbell). A worker serves one lane, one
call at a time, unless its model overlaps its calls (below).

A decoupled model (`model_transaction_policy { decoupled: true }`) answers through its requests' response senders,
from `execute` or from threads of its own: each `send` lays its tensors into its lane's response segment, tells the
server (a Response message) and waits for its Reply (the server has copied them out), all under
the lane's lock, so sends of one lane go one after another (sends of other lanes only share the pipe). A run ends at
its last final flag (a decoupled model's) or when its answer is sent (another model's): its BLS calls are allowed
until then, and its single-use segments are dropped then.

`async def execute` runs on the worker's event loop, a thread of its own (`EventLoop`, as Triton's stub runs it).
A model that is not decoupled waits for the coroutine (no overlap: Triton runs it to completion). A decoupled
model's coroutine runs in the background and the main thread reads the next Execute at once, so one worker has
several calls in flight, each on a lane of its own (the server decides how many: docs/python-models.md); a
coroutine that raises fails the requests of its own run whose final flag was not sent, nothing else.

Custom metrics (`pb_utils.MetricFamily`, `Metric`) go to the server as MetricCall(tag, op) and wait for its Reply
(`metric`): the server's registry holds every value, so the model's workers share them and a worker that replaced
a dead one finds them (service/process/custom_metrics.py).

BLS calls (`pb_utils.InferenceRequest(...).exec()`, from `execute` or from any thread while its run is in flight)
go to the server as BlsCall(tag, run, CallRequest) with their inputs in a segment of their own
(engine/python/transport.py): the run is the calling request's (a context variable set for `execute` and the
coroutine it returns; a thread of the model's own, which has none, is taken for the latest run in flight). The
server runs each through the callee's admission on a thread of its own and answers BlsPart messages (a decoupled
callee's responses one by one, as they come), so several calls may be in flight at once;
`exec(decoupled=True)` returns once the first of them came, as Triton's does. No thread of its own reads the pipe:
the thread waiting for a message reads it (engine/python/pipe.py), filing replies and parts for the thread waiting
for their tag (`ask`, `bls`), Execute and Stop for the main thread. Every message is a record of
engine/python/messages.py. `async_exec` runs `exec` on the event loop's
thread pool, so calls awaited together overlap.

An exception in the model is reported to the server with its type and message; its traceback goes to stderr,
which is the server's log. A watchdog thread ends the worker when the server process is gone, so a worker never
outlives its server.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import functools
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
import types
from collections.abc import Callable, Coroutine, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any, cast

from . import rescheduling, transport
from . import triton_python_backend_utils as pb_utils
from .error_codes import TritonCode
from .messages import (
    BlsCall,
    CallReply,
    CallRequest,
    Done,
    ErrorResult,
    Execute,
    Failed,
    Grow,
    Init,
    LoadFailed,
    Message,
    MetricAnswer,
    MetricCall,
    MetricOp,
    Ready,
    ReplyPayload,
    Request,
    Response,
    Result,
    SegmentName,
    Tensors,
)
from .output import RecordFormatter
from .pipe import WorkerPipe, unlink_reply

_LOG = logging.getLogger("slotserve.python_model")
WATCHDOG_SECONDS = 0.5
LOOP_STOP_SECONDS = 1.0  # how long the end of a worker waits for its event loop to stop


class Worker:
    def __init__(self, connection: Connection) -> None:
        self.connection = connection
        self.model: Any = None  # the TritonPythonModel instance, once `initialize` ran
        self.name = ""
        self.cancel_board: transport.Segment | None = None
        self.board_words = 1  # words of the cancel board per lane: one per request of a call (settings)
        self.lanes: dict[int, _Lane] = {}  # by number; made as the server first names one
        self.decoupled = False
        # Read by the thread waiting for a message (engine/python/pipe.py); a packed Execute is read out of its lane.
        self.pipe = WorkerPipe(connection, self._packed_execute)
        self.tags = itertools.count(1)
        self._runs_lock = threading.Lock()  # guards: _runs, each run's `live`
        self._runs: dict[int, _Run] = {}  # the runs in flight (until their answer or last final flag)
        self.loop: EventLoop | None = None  # runs `async def execute`; made at the first coroutine, ended at stop
        # Notified when a response sender of a call that is not decoupled got a response or its final flag (any
        # thread): the main thread waits on it for the responses the model sends rather than returns.
        self.finals = threading.Condition()
        self.instance_name = ""  # Triton's instance name (<model>_0_<slot>), for Triton's words

    # ---- start -----------------------------------------------------------------------------------------------

    def start(self, settings: dict[str, Any]) -> None:
        """Import model.py, auto-complete the configuration, initialize. Replies Ready (the completed configuration,
        whether execute is a coroutine function) or LoadFailed (the exception, which is logged). Raises OSError when
        the server is gone."""
        self.name = settings["model_name"]
        self.instance_name = settings["model_instance_name"]
        pb_utils._instance_name = self.instance_name  # Triton's refusals of custom metrics name it
        try:
            board: SegmentName = settings["cancel_board"]
            self.cancel_board = transport.Segment.attach(board.path, board.size)
            self.board_words = int(settings.get("board_words", 1))
            # Mapped first: the server unlinks the files once this call replies.
            self._remap(self._lane(0), settings["segments"])
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
            self.send(LoadFailed(_describe(error)))
            return
        self.send(Ready(json.dumps(config), inspect.iscoroutinefunction(getattr(self.model, "execute", None))))

    # ---- serve -----------------------------------------------------------------------------------------------

    def serve(self) -> None:
        """Read the server's orders until Stop (then `finalize`) or until the server is gone. Blocks while it
        serves."""
        while True:
            order = self.pipe.next_order()
            if order is None:
                return  # the server is gone
            if isinstance(order, Execute):
                self.execute(order)
            else:  # Stop
                if self.loop is not None:
                    self.loop.stop(LOOP_STOP_SECONDS)  # as Triton: the loop stops, then finalize runs
                self.finalize()
                return

    def send(self, message: Message) -> None:
        """Write `message` to the server (blocks while the pipe is full). Raises OSError when the server is gone."""
        self.pipe.send(message)

    def answer(self, lane: _Lane, done: Done) -> None:
        """Send a call's Done: packed into the lane's control area (the head of its response segment, written
        after the tensors) with a doorbell on the pipe, or pickled on the pipe when it is not of the common kind
        (Done.pack_into). Raises OSError when the server is gone."""
        segment = lane.response_segment
        if segment is not None and done.pack_into(transport.control(segment)):
            self.pipe.ring(lane.number)
        else:
            self.send(done)

    def _packed_execute(self, lane: int) -> Execute:
        """The Execute the server packed into lane `lane`'s control area (the head of its request segment) before
        it rang (any thread: the one reading the pipe). Raises ValueError when the lane has none."""
        known = self.lanes.get(lane)
        if known is None or known.request_segment is None:
            raise ValueError(f"a doorbell for lane {lane}, which has no request segment")
        return Execute.unpack_from(transport.control(known.request_segment))

    def ask(self, question: Callable[[int], Grow | Response | MetricCall]) -> ReplyPayload:
        """Send the question `question(tag)` makes with a new tag and wait for the payload of the server's Reply to it
        (blocks, without a timeout: the server answers each at once). Raises EOFError or OSError when the server is
        gone."""
        tag = next(self.tags)
        self.send(question(tag))
        return self.pipe.answer(tag)

    def metric(self, op: MetricOp) -> MetricAnswer:
        """A custom-metrics operation of the model (pb_utils.MetricFamily, Metric; any thread, any time): sent to the
        server, whose registry answers it (a refusal in `error`). Blocks for the answer, which the server gives at
        once while it reads this worker's pipe: during initialize, a call in flight and finalize (an operation of a
        thread of the model's own while none runs waits for the next). Never raises: a server that is gone is an
        error answer."""
        try:
            payload = self.ask(lambda tag: MetricCall(tag, op))
        except (EOFError, OSError):
            return MetricAnswer(error="the server is gone: the metric operation was not applied")
        if not isinstance(payload, MetricAnswer):
            return MetricAnswer(error=f"the server answered a metric operation with {type(payload).__name__}")
        return payload

    def event_loop(self) -> EventLoop:
        """The worker's event loop (made, and its thread started, at the first use; only the main thread calls)."""
        if self.loop is None:
            self.loop = EventLoop()
        return self.loop

    def calling_run(self) -> _Run | None:
        """The run a BLS call belongs to: the calling request's (its context variable), else, for a thread of the
        model's own, the latest run in flight; None when there is none in flight (or the caller's has ended)."""
        run = _CURRENT_RUN.get()
        if run is not None:
            return run if run.live else None
        with self._runs_lock:
            return self._runs[max(self._runs)] if self._runs else None

    def bls(
        self, request: pb_utils.InferenceRequest, decoupled: bool
    ) -> list[pb_utils.InferenceResponse] | Iterator[pb_utils.InferenceResponse]:
        """Send a BLS call to the server. Returns the list of the callee's responses (one), or with `decoupled` an
        iterator of them, once the first has arrived (as Triton's exec), each of the others as it arrives. Raises
        TritonModelException outside execute, for an input no datatype fits, or when the server is gone (the
        iterator raises it too)."""
        run = self.calling_run()
        if run is None:
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
        call = CallRequest(
            model=request.model_name(),
            version="" if version is None or int(version) < 0 else str(int(version)),
            request=Request(
                inputs=descriptors,
                outputs=tuple(request.requested_output_names()),
                request_id=request.request_id(),
                correlation_id=request.correlation_id(),
                flags=request.flags(),
                parameters=json.loads(request.parameters()),
            ),
            segment=None if segment is None else segment.name,
            decoupled=decoupled,
            timeout_us=int(request.timeout() or 0),
        )
        tag = next(self.tags)
        self.pipe.open_call(tag)
        try:
            self.send(BlsCall(tag, run.number, call))
        except OSError:
            self._end_call(tag, segment)
            raise pb_utils.TritonModelException("the server is gone: the BLS call was not sent") from None
        responses = self._responses(tag, segment)
        if not decoupled:
            return list(responses)
        # The first response is awaited here, as Triton's exec does: an `await async_exec(decoupled=True)` then
        # returns with it, and iterating does not hold the event loop until the callee's first answer.
        first = next(responses, None)
        return itertools.chain(() if first is None else (first,), responses)

    def _responses(self, tag: int, segment: transport.Segment | None) -> Iterator[pb_utils.InferenceResponse]:
        """A BLS call's responses as its parts arrive (a decoupled callee's one by one), up to the final part (a final
        part without a response, the callee's final flag alone, is an empty response, as Triton's iterator ends).
        Closed early (the model let go of it), the parts still to come are dropped, their files unlinked."""
        try:
            while True:
                part = self.pipe.next_part(tag)
                if part is None:
                    raise pb_utils.TritonModelException("the server is gone: the BLS call was not answered")
                reply, final = part.reply, part.final
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

    def _end_call(self, tag: int, segment: transport.Segment | None) -> None:
        """BLS call `tag` is over: its unread parts' files and its inputs' segment go. Never blocks."""
        for part in self.pipe.close_call(tag):
            unlink_reply(part.reply)
        if segment is not None:
            segment.unlink()
            segment.close()

    def execute(self, message: Execute) -> None:
        """Run one call (its requests read from its lane's request segment). A decoupled model's answers go as
        its requests' senders send them; another model's as a Done (`execute_returning`). Blocks for the model's
        execute (a decoupled `async def` one is left running). Raises OSError when the server is gone."""
        lane = self._lane(message.lane)
        if message.segments:
            self._remap(lane, message.segments)
        run = _Run(message.run, lane)
        board = self.cancel_board
        built = [self._request(run, index, request, board) for index, request in enumerate(message.requests)]
        self.track(run)
        current = _CURRENT_RUN.set(run)  # what execute, the coroutine it returns and their BLS calls belong to
        try:
            if self.decoupled:
                self.execute_decoupled(run, built, message.requests)
            else:
                self.execute_returning(run, built, message.requests)
        finally:
            _CURRENT_RUN.reset(current)

    def execute_returning(self, run: _Run, built: list[pb_utils.InferenceRequest], requests: list[Request]) -> None:
        """A model that is not decoupled: `execute` (an `async def` one run to its end on the event loop, as
        Triton does: no overlap), its responses laid into the lane's response segment, a Done with a Result per
        request (its Tensors, an ErrorResult, or Released); Failed when there is nothing to answer (execute raised
        before any response was sent, or returned what does not fit the requests). Blocks for the model's execute
        and the responses of the senders it took. Raises OSError when the server is gone.

        A request's response may come back from execute or through its response sender, from execute or from a
        thread after execute returned None: the call is answered once every request whose sender was taken has
        its response (the event loop runs meanwhile, on its thread). A response sent before execute raised still
        reaches its client, as on Triton; the others get the exception."""
        lane = run.lane
        for request in built:
            request._sender = pb_utils.InferenceResponseSender(notify=self._senders_changed)
        failure: BaseException | None = None
        try:
            try:
                returned = None
                began = time.perf_counter_ns()
                try:
                    returned = self.model.execute(built)
                    if type(returned) is not list and inspect.iscoroutine(returned):
                        returned = self.event_loop().run(returned)
                except BaseException as error:  # the model's own code
                    _LOG.error("model '%s': execute raised:\n%s", self.name, traceback.format_exc())
                    failure = error
                model_ns = time.perf_counter_ns() - began
                results, layout = self._collect(built, requests, returned, failure)
            except BaseException as error:  # nothing fits the requests: every request fails
                if error is not failure:
                    _LOG.error("model '%s': %s", self.name, _describe(error))
                self.send(Failed(run.number, _describe(error)))
                return
            finally:
                del built
            try:
                if layout.size > lane.response_segment.size:  # type: ignore[union-attr]
                    self._grow(run, layout.size)
            except transport.NoRoom as refused:  # /dev/shm is full: the server fails the call (RESOURCE_EXHAUSTED)
                self.send(Failed(run.number, str(refused)))
                return
            layout.write(lane.response_segment)  # type: ignore[arg-type]
            self.answer(lane, Done(run.number, results, model_ns))
        finally:
            with lane.lock:
                self._end_run(run)

    def execute_decoupled(self, run: _Run, built: list[pb_utils.InferenceRequest], requests: list[Request]) -> None:
        """A decoupled model: its responses go to the server as they are sent (`send_response`); the run ends at
        its last final flag. An `async def execute` is left running in the background on the event loop (the main
        thread reads the next order at once); otherwise execute runs here. An exception (or a return value other
        than None, refused in Triton's words) closes the senders still open and is reported as Failed. Requests the
        model rescheduled are handed back once execute (or its coroutine) has ended. Blocks for a plain execute;
        never raises (the model's exceptions fail its run)."""
        senders = [
            _StreamSender(self, run, index, list(request.outputs), built[index])
            for index, request in enumerate(requests)
        ]
        run.open_senders = len(senders)
        run.senders = senders
        run.requests = built
        for request, sender in zip(built, senders, strict=True):
            request._sender = sender
        try:
            returned = self.model.execute(built)
            if inspect.iscoroutine(returned):
                self.event_loop().start(returned, lambda outcome: self._background_ended(run, outcome))
                return
            self._returned_nothing(returned)
            rescheduling.send_released(self, run.number, run.lane.lock, built, senders)  # no final flag this time
        except BaseException as error:  # the model's own code
            _LOG.error("model '%s': execute raised:\n%s", self.name, traceback.format_exc())
            self.fail_run(run, error)
        finally:
            del built

    def _background_ended(self, run: _Run, outcome: concurrent.futures.Future[Any]) -> None:
        """A decoupled model's coroutine ended (on the event loop's thread): an exception fails its own run; its
        rescheduled requests are handed back."""
        try:
            self._returned_nothing(outcome.result())
            rescheduling.send_released(self, run.number, run.lane.lock, run.requests, run.senders)
        except BaseException as error:  # the model's own code (or its coroutine was cancelled)
            _LOG.error(
                "model '%s': execute raised:\n%s",
                self.name,
                "".join(traceback.format_exception(type(error), error, error.__traceback__)),
            )
            self.fail_run(run, error)

    def _returned_nothing(self, returned: object) -> None:
        """Raises TritonModelException (Triton's words) when a decoupled execute returned something."""
        if returned is not None:
            raise pb_utils.TritonModelException(
                f"Python model '{self.instance_name}' is using the decoupled mode and the execute function must "
                "return None."
            )

    def fail_run(self, run: _Run, error: BaseException) -> None:
        """Close the run's senders still open and tell the server (Failed): the requests of the run
        whose final flag was not sent fail; nothing happens when every one of them was sent already."""
        with run.lane.lock:
            if all(sender.closed for sender in run.senders):
                return
            for sender in run.senders:
                sender.close()
            try:
                self.send(Failed(run.number, _describe(error)))
            except OSError:
                pass  # the server is gone

    def _senders_changed(self) -> None:
        """A response sender of a call that is not decoupled got a response or its final flag (any thread): wake
        the main thread waiting for them (`_wait`)."""
        with self.finals:
            self.finals.notify_all()

    def _wait(self, done: Callable[[], bool]) -> None:
        """Block until `done()` (which `_senders_changed` follows; the event loop runs on its own thread meanwhile,
        so asyncio tasks execute left behind may be the ones that send). Waits as long as the model takes, as on
        Triton: the server kills a worker still busy `cancel_kill_seconds` after its request was cancelled."""
        with self.finals:
            self.finals.wait_for(done)

    def send_response(
        self, run: _Run, index: int, requested: Sequence[str], response: pb_utils.InferenceResponse | None, final: bool
    ) -> None:
        """Hand one response of a decoupled call to the server and wait until it has taken the tensors (blocks,
        without a timeout: the server answers at once). Called with the lane's lock held, on the model's thread.
        Raises transport.NoRoom when the response segment could not grow, EOFError or OSError when the server is
        gone, TritonModelException for a response that is not an InferenceResponse."""
        lane = run.lane
        layout = transport.Layout(transport.CONTROL_BYTES)
        result = None if response is None else self._result(response, requested, layout)
        if layout.size > lane.response_segment.size:  # type: ignore[union-attr]
            self._grow(run, layout.size)  # or NoRoom
        layout.write(lane.response_segment)  # type: ignore[arg-type]
        # Answered once the server copied the tensors out.
        self.ask(lambda tag: Response(tag, run.number, index, result, final))

    def _grow(self, run: _Run, size: int) -> None:
        """Have the server replace the run's lane's response segment by one of `size` bytes at least, and map it.
        Raises transport.NoRoom when the server has no room for it."""
        segment = transport.granted(self.ask(lambda tag: Grow(tag, run.number, size)))
        self._remap(run.lane, {"response": segment})

    def sender_closed(self, run: _Run) -> None:
        """One request of the run got its final flag (the lane's lock is held): the last one ends the run."""
        run.open_senders -= 1
        if run.open_senders == 0:
            self._end_run(run)

    def _end_run(self, run: _Run) -> None:
        """The run is over (the lane's lock held): no BLS call of its own after this, and its lane's single-use
        segments are dropped, as the server drops its side when the call ends (the next call sends small ones)."""
        with self._runs_lock:
            run.live = False
            self._runs.pop(run.number, None)
        lane = run.lane
        lane.request_segment = transport.kept(lane.request_segment)
        lane.response_segment = transport.kept(lane.response_segment)

    def track(self, run: _Run) -> None:
        """Count `run` in flight (until `_end_run`): its BLS calls, and those of threads that have no run, go."""
        with self._runs_lock:
            self._runs[run.number] = run

    def _lane(self, number: int) -> _Lane:
        lane = self.lanes.get(number)
        if lane is None:
            lane = self.lanes[number] = _Lane(number)
        return lane

    def _request(
        self, run: _Run, index: int, request: Request, board: transport.Segment | None
    ) -> pb_utils.InferenceRequest:
        """The model's view of the `index`-th request of `run`: its inputs are read-only views of the lane's request
        segment, and `is_cancelled()` reads its word of the cancel board."""
        assert board is not None  # mapped by `start`, before any Execute
        segment = run.lane.request_segment
        served = pb_utils.Tensor._served
        inputs = [
            served(d.name, transport.read(segment, d, copy=False, bf16=_bfloat16() if d.datatype == "BF16" else None))  # type: ignore[arg-type]
            for d in request.inputs
        ]
        offset = 8 * (run.lane.number * self.board_words + index)
        return pb_utils.InferenceRequest._served(
            self.name,
            inputs,
            list(request.outputs),
            request.request_id,
            request.correlation_id,
            request.flags,
            _parameters_json(request.parameters),
            # A partial, not a closure (one per request): is_cancelled() is whether the board holds this run's number.
            functools.partial(_cancelled_on, board.view, offset, run.number),
        )

    def _collect(
        self,
        built: list[pb_utils.InferenceRequest],
        requests: list[Request],
        returned: object,
        failure: BaseException | None,
    ) -> tuple[list[Result], transport.Layout]:
        """The per-request results of a call, with the outputs laid out for the response segment: each request's
        response sent through its sender, else the one `execute` returned, else (execute raised) the exception; a
        request the model rescheduled is a `Released` record (engine/python/rescheduling.py). After execute
        returned None, waits for the responses of the senders the model took. Raises `failure` when no request
        has a response to give, TritonModelException when the return value does not fit the requests."""
        if failure is not None:
            if all(_sent(request) is None for request in built):
                raise failure
            responses: list[object] = [_sent(request) for request in built]  # None: the exception's error below
        elif returned is None:
            answering = [request for request in built if not rescheduling.rescheduled(request)]
            if any(not request._sender_taken for request in answering):
                raise pb_utils.TritonModelException(
                    "execute returned None but did not send a response for every request through its response sender"
                )
            self._wait(lambda: all(_sent(request) is not None for request in answering))
            responses = [_sent(request) for request in built]
        else:
            responses = list(cast(Iterable[object], returned))  # not iterable: TypeError, in Python's words
            if len(responses) != len(built):
                raise pb_utils.TritonModelException(
                    f"execute returned {len(responses)} responses for {len(built)} requests (one each is required)"
                )
            if _plainly_returned(built, responses):
                return self._returned_results(built, requests, responses)
            for index, request in enumerate(built):
                sender = _sender(request)
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
                self._wait(lambda: all(_sent(built[index]) is not None for index in pending))
                for index in pending:
                    responses[index] = _sent(built[index])
        layout = transport.Layout(transport.CONTROL_BYTES)
        results: list[Result] = []
        for index, (response, asked) in enumerate(zip(responses, requests, strict=True)):
            if failure is None:
                released = rescheduling.released_result(built[index], response, index)  # rescheduled: runs again
                if released is not None:
                    results.append(released)
                    continue
            if response is None and failure is not None:
                results.append(ErrorResult(TritonCode.INTERNAL, _describe(failure)))
            else:
                results.append(self._result(response, asked.outputs, layout))
        return results, layout

    def _returned_results(
        self, built: list[pb_utils.InferenceRequest], requests: list[Request], responses: list[object]
    ) -> tuple[list[Result], transport.Layout]:
        """`_collect` for the common call (`_plainly_returned`): each request is answered by the response execute
        returned for it, and its sender closes (a later send raises, as on Triton)."""
        layout = transport.Layout(transport.CONTROL_BYTES)
        results: list[Result] = []
        for request, asked, response in zip(built, requests, responses, strict=True):
            _sender(request).closed = True
            results.append(self._result(response, asked.outputs, layout))
        return results, layout

    def _result(self, response: object, requested: Sequence[str], layout: transport.Layout) -> Tensors | ErrorResult:
        """A response laid out for the response segment (its requested outputs), or the error it carries or earns.
        Raises TritonModelException when it is not an InferenceResponse."""
        if not isinstance(response, pb_utils.InferenceResponse):
            raise pb_utils.TritonModelException(
                f"execute must return pb_utils.InferenceResponse objects, got {type(response).__name__}"
            )
        if response.has_error():
            error = response.error()
            return ErrorResult(error.code(), error.message())  # type: ignore[union-attr]
        descriptors = []
        tensors = response._tensors  # read only (output_tensors() copies the list for a model)
        names = [tensor._name for tensor in tensors]
        if len(set(names)) != len(names):  # Triton 2.51 answers a malformed response then (a shape twice, one none)
            twice = sorted({name for name in names if names.count(name) > 1})
            return ErrorResult(TritonCode.INTERNAL, f"the response has more than one output named {twice}: each "
                               "output may appear once")  # fmt: skip
        for tensor in tensors:
            if requested and tensor._name not in requested:
                continue
            array = tensor._array
            datatype = transport.datatype_of(array)
            if datatype is None:
                return ErrorResult(TritonCode.INTERNAL, f"output '{tensor.name()}' has numpy dtype {array.dtype}, "
                                   "which has no Triton datatype")  # fmt: skip
            descriptors.append(layout.plan(tensor.name(), array, datatype))
        return Tensors(tuple(descriptors))

    def _remap(self, lane: _Lane, segments: Mapping[str, SegmentName]) -> None:
        """Map the segments the server made for `lane` ({"request"|"response": its name}), in place of the old."""
        if not segments:
            return
        with lane.lock:  # reentrant: a send that grows the response segment holds it already
            for key, name in segments.items():
                old = getattr(lane, f"{key}_segment")
                setattr(lane, f"{key}_segment", transport.Segment.attach(name.path, name.size))
                if old is not None:
                    old.close()

    def finalize(self) -> None:
        """Run the model's `finalize` (blocks for it); an exception is logged, never raised."""
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

    def __init__(
        self, worker: Worker, run: _Run, index: int, requested: Sequence[str], request: pb_utils.InferenceRequest
    ) -> None:
        super().__init__()
        self._worker, self._run, self._index, self._requested = worker, run, index, requested
        self._request_cancelled = request.is_cancelled

    def send(self, response: pb_utils.InferenceResponse | None = None, flags: int = 0) -> None:
        final = pb_utils._check_send(response, flags)
        worker = self._worker
        with self._run.lane.lock:
            if self.closed:  # a response with the final flag was sent, or execute failed
                raise pb_utils.TritonModelException(pb_utils.SENDER_CLOSED)
            try:
                worker.send_response(self._run, self._index, self._requested, response, final)
            except (EOFError, OSError):
                raise pb_utils.TritonModelException("the server is gone: the response was not delivered") from None
            if final:
                self.close()

    def close(self) -> None:
        """No response after this one (called with the lane's lock held)."""
        if not self.closed:
            self.closed = True
            self._worker.sender_closed(self._run)

    def is_cancelled(self) -> bool:
        return self._request_cancelled()


@dataclass(eq=False)
class _Lane:
    """One of the worker's calls in flight at once: the segments the server made for it, and the lock under which
    its responses are written and sent and its segments replaced (they share the response segment)."""

    number: int
    request_segment: transport.Segment | None = None
    response_segment: transport.Segment | None = None
    lock: threading.RLock = field(default_factory=threading.RLock)


class _Run:
    """One execute call in flight: its number (the server's), its lane and, for a decoupled model, its requests'
    senders (`open_senders` of them without their final flag yet; changed under the lane's lock)."""

    __slots__ = ("number", "lane", "live", "open_senders", "senders", "requests")

    def __init__(self, number: int, lane: _Lane) -> None:
        self.number = number
        self.lane = lane
        self.live = True  # until its answer (or last final flag) was sent: BLS calls are allowed while it is
        self.open_senders = 0
        self.senders: list[_StreamSender] = []
        self.requests: list[
            pb_utils.InferenceRequest
        ] = []  # a decoupled run's (its rescheduled ones are handed back when it ends)


# The run the code running now belongs to: set for `execute` and copied into the coroutine it returns (and into
# async_exec's thread by pb_utils), so a BLS call knows its request.
_CURRENT_RUN: contextvars.ContextVar[_Run | None] = contextvars.ContextVar("slotserve_python_run", default=None)


class EventLoop:
    """The worker's asyncio event loop, run by a thread of its own as Triton's stub runs it: `async def execute`
    runs there, and `async_exec` on its thread pool (owned here). Made by the worker at its first coroutine and
    stopped by it at its end (`stop`)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._executor = concurrent.futures.ThreadPoolExecutor(thread_name_prefix="python-model-async-exec")
        self.loop.set_default_executor(self._executor)
        self._background: set[concurrent.futures.Future[Any]] = set()  # coroutines running in the background
        self._thread = threading.Thread(target=self._run, name="python-model-event-loop", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def run(self, coroutine: Coroutine[Any, Any, Any]) -> Any:
        """Run `coroutine` on the loop and return its result (or raise its exception). Blocks until it ends: the
        server bounds a call that never does (its kill clock ends the worker)."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result()

    def start(
        self, coroutine: Coroutine[Any, Any, Any], ended: Callable[[concurrent.futures.Future[Any]], None]
    ) -> None:
        """Run `coroutine` on the loop in the background; `ended(future)` is called (on the loop's thread) when it
        ends. Returns at once."""
        future = asyncio.run_coroutine_threadsafe(coroutine, self.loop)
        self._background.add(future)
        future.add_done_callback(self._background.discard)
        future.add_done_callback(ended)

    def stop(self, timeout: float) -> None:
        """Stop the loop (coroutines still running are left as they are) and its thread pool, waiting at most
        `timeout` seconds for the loop's thread."""
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout)
        self._executor.shutdown(wait=False, cancel_futures=True)


_ARG_KEYS = (
    "model_instance_kind",
    "model_instance_name",
    "model_instance_device_id",
    "model_repository",
    "model_version",
    "model_name",
)


def _sender(request: pb_utils.InferenceRequest) -> pb_utils.InferenceResponseSender:
    """The response sender the worker gave `request` before execute."""
    sender = request._sender
    assert sender is not None  # every request of a call gets one before the model sees it
    return sender


def _plainly_returned(built: list[pb_utils.InferenceRequest], responses: list[object]) -> bool:
    """Whether execute answered every request by returning its response: no sender taken, nothing rescheduled, every
    response an InferenceResponse (what `_collect` then has only to lay out)."""
    for request, response in zip(built, responses, strict=True):
        if (
            request._sender_taken
            or request._release_flags != rescheduling.RELEASE_ALL
            or type(response) is not pb_utils.InferenceResponse
        ):
            return False
    return True


def _sent(request: pb_utils.InferenceRequest) -> pb_utils.InferenceResponse | None:
    """The response the model sent through `request`'s sender so far (None: none yet)."""
    return _sender(request).response


def _cancelled_on(board: memoryview, offset: int, run: int) -> bool:
    """Whether the server marked run `run`'s request at `offset` of the cancel board cancelled."""
    return bool(_BOARD_WORD.unpack_from(board, offset)[0] == run)


_BOARD_WORD = struct.Struct("<q")


def _parameters_json(parameters: Mapping[str, object] | None) -> str:
    # Most requests carry none: "{}" without the encoder saves a few microseconds of every small request.
    return json.dumps(parameters, separators=(",", ":")) if parameters else "{}"


def _response_of(result: dict[str, Any] | ErrorResult) -> pb_utils.InferenceResponse:
    if isinstance(result, ErrorResult):
        return pb_utils.InferenceResponse(error=pb_utils.TritonError(result.message, result.code))
    return pb_utils.InferenceResponse([pb_utils.Tensor(name, array) for name, array in result.items()])


def _bf16_type(reply: CallReply) -> Any:
    """The numpy type of bfloat16 when a tensor of `reply` is BF16, else None (ml_dtypes is imported only then)."""
    wanted = any(isinstance(r, Tensors) and any(d.datatype == "BF16" for d in r.descriptors) for r in reply.responses)
    return _bfloat16() if wanted else None


def _bfloat16() -> Any:
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


def _import_model(path: str) -> types.ModuleType:
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
    """The worker process: read Init, load the model, serve until Stop or the server is gone. Returns 2 for a first
    message that is not Init, 1 when the model did not load; otherwise the process exits from here."""
    logging.basicConfig(stream=sys.stderr, level=logging.INFO)
    logging.root.handlers[0].setFormatter(RecordFormatter())  # the server reads each record back (output.py)
    pb_utils._install()
    connection = Connection(int(argv[1]))
    parent = int(argv[2])
    threading.Thread(target=_watch_parent, args=(parent,), name="parent-watchdog", daemon=True).start()
    init = transport.receive(connection)
    if not isinstance(init, Init):
        return 2
    worker = Worker(connection)
    pb_utils._bls_caller = worker.bls
    pb_utils._metrics_caller = worker.metric
    worker.start(init.settings)
    if worker.model is None:
        return 1
    worker.serve()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # skip the interpreter's teardown: the server is waiting for this process to end


if __name__ == "__main__":
    sys.exit(main(sys.argv))
