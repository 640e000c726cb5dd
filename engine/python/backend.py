"""Python models (`backend: "python"`): Triton's python-backend `model.py`, each slot in a worker process.

    PythonBackend.load(spec)    starts the first worker: it imports model.py, runs `auto_complete_config` (its
                                result gives the served inputs and outputs) and `initialize`
    PythonModel.create_context  one worker per slot (an instance; the first one is the load's); a slot's worker runs
                                one call at a time, so slots run in parallel whatever the model does with the GIL,
                                except a decoupled model with `async def execute`, whose worker overlaps calls:
                                its context takes `requests_per_context` requests at once, each on a lane
    PythonContext.execute       one request -> `execute([request])`; a batch leader passes its member requests
                                (`batches_as_requests`), and the model gets them as one list, Triton's semantics
    PythonContext.execute_stream  a decoupled model (`streaming`): its responses as the model sends them; the
                                request's place is held until the final flag (the dataplane's streaming path)
    PythonContext.execute_streams  a decoupled model's batch: one call, each member's responses a stream of its own
    run_bls                     a BLS call of the model (`InferenceRequest(...).exec()`), on a thread of the model's
                                (`CallThreads`: made with the model, stopped by its close): through the server's
                                ModelCalls (`bind_model_calls`), so through the callee's admission, with the calling
                                request's deadline and a token its cancellation fires

Messages to and from a worker are engine/python/messages.py's records; Triton's error codes are
engine/python/error_codes.py's table.

Each request reaches the model with its id, parameters, correlation id and flags (the dataplane's RequestInfo on
its CancelToken).

A BLS call that can never be granted (a model calling itself while every one of its slots is held by a caller)
waits in the callee's queue until the caller's deadline, the call's own `timeout` or the callee's admission
timeout, then fails (UNAVAILABLE, server_busy); with none of them set it waits until the client gives up.

Faults stay in their slot: a worker that dies fails only its in-flight call (ModelError naming the model and how
the worker ended) and the slot starts a new worker on its next use; after WORKER_FAILURES deaths within
FAILURE_WINDOW seconds the model is taken out of service (DeviceFailedError: the server unloads it, with the
reason as its last error). A cancelled request shows `is_cancelled()` true to the model (a word in shared memory
the worker reads); a worker that has not answered CANCEL_KILL_SECONDS after its request was cancelled
(SHUTDOWN_KILL_SECONDS when the server cancelled it at shutdown) is killed and its slot starts a new one, so a
hung model.py can hold neither a slot nor the server past its bound; the kill clock runs per request from its
cancellation, whatever the worker sends meanwhile, and a kill fails the other requests in flight on that worker
(an overlapping model's), naming why. A death is counted once per worker, whichever of its calls saw it. Closing
a slot asks its worker to run `finalize` and returns; a thread kills the worker if it has not ended within the
model's finalize grace.

A worker's stdout and stderr are pipes a thread of its WorkerProcess reads (engine/python/output.py): what the
model prints or logs becomes the server's log records, naming the model and the slot, never a write on the
server's own streams. Tensors that do not fit in /dev/shm fail their request with OutOfSharedMemoryError
(RESOURCE_EXHAUSTED), nothing else (engine/python/transport.py). A model's memory (`memory_bytes`) is read from
/proc when asked: its workers' own resident memory plus their segments, once. PythonBackend, when it is made,
removes the segment files that servers of ours which are gone left in /dev/shm.

Parameters read from config.pbtxt (all optional):
    max_parallel_slots          cap on the advertised capacity (default 16)
    initialize_timeout_seconds  how long a worker may take to import model.py and initialize (default 600; 0: no
                                limit, as Triton); unloading the model, or the shutdown, stops a load sooner
    finalize_grace_seconds      how long closing the model waits for `finalize` before killing (default 2)
    cancel_kill_seconds         kill (and replace) a worker still running this long after its request was
                                cancelled by its client or deadline (default 2; 0: never, Triton's behaviour)
    async_requests_per_instance the requests one worker of a decoupled model with `async def execute` runs at once
                                (default 16; Triton sets no bound)
    EXECUTION_ENV_PATH          the model's own Python environment (a folder, or a packed one extracted once):
                                its workers run on that interpreter (engine/python/environments.py)
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import json
import logging
import math
import os
import queue
import select
import signal
import socket
import struct
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Protocol, overload

import numpy as np

from .. import datatypes
from ..config.files import shown_path
from ..config.specs import ModelSpec, TensorSpec
from ..errors import (
    DeviceFailedError,
    EngineError,
    ExecutionCancelled,
    ModelConfigError,
    ModelError,
    ModelErrorAlreadyExists,
    ModelErrorInvalidArgument,
    ModelErrorNotFound,
    ModelErrorUnavailable,
    ModelErrorUnknown,
    ModelErrorUnsupported,
    ModelLoadError,
    OutOfSharedMemoryError,
)
from ..interface import (
    Backend,
    CancelToken,
    Context,
    FinalOutputs,
    LoadedModel,
    ModelCalls,
    ModelMetadata,
    Outputs,
    RequestInfo,
)
from . import transport
from .environments import SERVER, Environments, Launcher, declared_environment
from .error_codes import TritonCode, for_status
from .messages import (
    BlsCall,
    BlsPart,
    CallReply,
    CallRequest,
    Descriptor,
    Done,
    ErrorResult,
    Execute,
    Failed,
    Grow,
    GrowRefused,
    Init,
    LoadFailed,
    Message,
    MetricAnswer,
    MetricCall,
    MetricOp,
    Ready,
    Released,
    Reply,
    ReplyPayload,
    Request,
    Response,
    SegmentName,
    Stop,
    Tensors,
)
from .output import WorkerOutput
from .rescheduling import released_outcome

_LOG = logging.getLogger(__name__)

MAX_SLOTS = 16
ASYNC_REQUESTS = 16  # an async decoupled model's requests in flight at once per instance (Triton sets no bound)
MAX_ASYNC_REQUESTS = 256
WORKER_FAILURES = 3
FAILURE_WINDOW = 60.0
SHUTDOWN_KILL_SECONDS = 1.0  # well inside the server's SHUTDOWN_MARGIN (2 s) for cancelled work to return
# A request its client gave up on before a shutdown was cancelled then, not by the shutdown (the first cancel
# names the reason): killing its worker within the margin too keeps a hung model.py inside the shutdown's bound.
CANCEL_KILL_SECONDS = 2.0
# How long a worker may take to import model.py and run initialize. Triton 2.51 sets no limit (its python backend's
# stub-timeout-seconds, 30 s, does not bound initialize: tests/differential/test_initialize_timeout.py); slotserve
# bounds it, generously enough for whatever loads there, and a hung load holds only its own model meanwhile.
INITIALIZE_TIMEOUT = 600.0
SHUTDOWN_REASON = "shutdown"  # service/core/errors.py SHUTDOWN_CANCEL_REASON: the engine does not import the service
POLL_SECONDS = 0.1  # how often a waiting call looks at its cancellation (the reply itself wakes it at once)
OUTPUT_STOP_SECONDS = 2.0  # how long closing a worker waits for its output reader to log the last lines

# The error a model's TritonError code becomes here (engine/python/error_codes.py names the codes).
_BY_TRITON_CODE: dict[int, type[EngineError]] = {
    TritonCode.UNKNOWN: ModelErrorUnknown,
    TritonCode.INTERNAL: ModelError,
    TritonCode.NOT_FOUND: ModelErrorNotFound,
    TritonCode.INVALID_ARG: ModelErrorInvalidArgument,
    TritonCode.UNAVAILABLE: ModelErrorUnavailable,
    TritonCode.UNSUPPORTED: ModelErrorUnsupported,
    TritonCode.ALREADY_EXISTS: ModelErrorAlreadyExists,
    TritonCode.CANCELLED: ExecutionCancelled,
}


class Member(Protocol):
    """One request of a call: a lone request (`_Single`) or a batch's member (service/core/batching.py hands its
    own records, `batches_as_requests`)."""

    @property
    def inputs(self) -> Mapping[str, np.ndarray]:
        """Its input tensors by name."""

    @property
    def outputs(self) -> Sequence[str]:
        """The outputs it asks for (empty: all of them)."""

    @property
    def cancel(self) -> CancelToken:
        """Its cancel token (its client gave up, its deadline passed), which carries its
        RequestInfo."""


# What a member of a call comes back as: its outputs (copied out of the response segment), the error its response
# carried, or Released (the model rescheduled it).
CallResult = Outputs | ErrorResult | Released
Inbound = Done | Failed | Response | Released  # what a call's waiter gets from the worker
_INBOUND = (Done, Failed, Response, Released)  # the same, for isinstance (a tuple: its fastest form)


class WorkersFailing(DeviceFailedError):
    """A python model's workers died too often: the model is taken out of service (UNAVAILABLE)."""


def _parameter(spec: ModelSpec, key: str, default: float, minimum: float, maximum: float) -> float:
    raw = spec.parameter(key)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ModelConfigError(f"model '{spec.name}': parameter {key} must be a number, got {raw!r}") from None
    if not minimum <= value <= maximum:
        raise ModelConfigError(f"model '{spec.name}': parameter {key} must be {minimum:g}..{maximum:g}, got {raw}")
    return value


def how_it_ended(returncode: int | None) -> str:
    """A worker's end in words: "exited with code 3", "was killed by signal 11 (SIGSEGV)"."""
    if returncode is None:
        return "stopped answering"
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = "unknown"
        return f"was killed by signal {-returncode} ({name})"
    return f"exited with code {returncode}"


class WorkerProcess:
    """One worker: its process, pipe and cancel board, and per lane (a call in flight at once: several only on a
    model that overlaps its calls) its shared-memory segments. The calls of different lanes run on their own threads
    at once: whichever of them waits for a message reads the pipe (`_next_message`) and files each message for the
    call it belongs to (its run), answering the worker's asks (a larger segment) and starting its BLS calls on the
    way, so no thread of its own reads the pipe and a lone call reads its own answer. The cancel callbacks it
    registers run on any thread and write only their word of the board."""

    def __init__(self, model: PythonModel, instance: int, bls_threads: CallThreads) -> None:
        self.model = model
        self.instance = instance
        self._bls_threads = bls_threads  # the model's: its BLS calls run there
        launch = model.launcher.launch()  # the interpreter: the model's environment's, or the server's
        self.board_words = max(1, model.metadata_batch) + 1  # board words per lane: one per request of a call
        self.board, requests, responses = self._first_segments(model, self.board_words)
        # Lane 0's segments are made now; the others' (an overlapping model's) by the first call on each.
        released = transport.Segment.released
        self.lanes = [
            _Lane(requests, responses),
            *(_Lane(released(), released()) for _ in range(model.lanes_wanted - 1)),
        ]
        self._send_lock = threading.Lock()  # guards: writing a message on the pipe (BLS replies come from threads)
        # guards: _calls, _reading, _waiting, `ended`, and each call's `live`, `reply_files`, `handed_over` and its
        # waiters' inboxes (taken as `with self._mail:`, a plain lock; `_changed` waits and notifies on it)
        self._mail = threading.Lock()
        self._changed = threading.Condition(self._mail)
        self._calls: dict[int, _Call] = {}  # the calls in flight, by run
        self._reading = False  # a thread waiting for a message reads the pipe (only one at a time)
        self._waiting = 0  # threads waiting on `_changed` for a message (a lone call's reader notifies nobody)
        self._runs = itertools.count(1)
        self.ended = False  # it died, or was killed: its calls fail; the context starts a new one
        self.kill_reason = ""  # why the server killed it (a cancelled request outlived the kill grace)
        # The context's bookkeeping (under its lock): the calls using this worker, whether its death was counted and
        # whether its resources were freed.
        self.users = 0
        self.death_counted = False
        self.retired = False
        ours, theirs = socket.socketpair()
        out_read, out_write = os.pipe()
        err_read, err_write = os.pipe()
        try:
            self.process = subprocess.Popen(
                [launch.executable, "-m", "engine.python.worker", str(theirs.fileno()), str(os.getpid())],
                pass_fds=(theirs.fileno(),),
                env=dict(launch.variables),
                stdin=subprocess.DEVNULL,
                stdout=out_write,  # never the server's own: a print must not fail when its reader is gone
                stderr=err_write,
            )
        except OSError as error:
            ours.close()
            for descriptor in (out_read, err_read):
                os.close(descriptor)
            self._free_segments()
            raise ModelLoadError(f"model '{model.name}': could not start a python worker: {error}") from None
        finally:
            theirs.close()
            os.close(out_write)
            os.close(err_write)
        transport.started_worker(self.process.pid)
        self.output = WorkerOutput(model.name, instance, out_read, err_read)
        self.output.start()
        model.worker_started(self)
        self.connection = Connection(ours.detach())
        # One poller for the worker's lifetime: Connection.poll builds a selector for every wait, which costs more
        # than the rest of a small request's wait for its answer.
        self._poller = select.poll()
        self._poller.register(self.connection.fileno(), select.POLLIN)

    @staticmethod
    def _first_segments(
        model: PythonModel, board_words: int
    ) -> tuple[transport.Segment, transport.Segment, transport.Segment]:
        """The cancel board (room for every lane the model may use) and lane 0's request and response segments.
        Raises ModelLoadError when the shared memory has no room for them (none is left behind)."""
        made: list[transport.Segment] = []
        try:
            for size in (8 * board_words * model.lanes_wanted, 0, 0):
                made.append(transport.Segment.create(size))
        except (OutOfSharedMemoryError, OSError) as error:
            for segment in made:
                segment.unlink()
                segment.close()
            raise ModelLoadError(f"model '{model.name}': could not start a python worker: {error}") from None
        board, requests, responses = made
        return board, requests, responses

    def start(self, settings: dict[str, Any], timeout: float | None, cancel: CancelToken | None = None) -> Ready:
        """Send the init message and wait for initialize. Returns the worker's Ready (the completed configuration,
        whether execute is a coroutine function). Raises ModelLoadError with the model's message, after `timeout`
        seconds (None: no limit), or as soon as `cancel` fires (an unload or the shutdown gave up on the load); the
        worker is killed in each case."""
        lane = self.lanes[0]
        settings = dict(
            settings,
            cancel_board=self.board.name,
            board_words=self.board_words,
            segments={
                "request": lane.requests.name,
                "response": lane.responses.name,
            },
        )
        if cancel is not None:
            cancel.add_callback(self._kill_now)  # ends the wait below: the pipe reports the end of the worker
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            transport.send(self.connection, Init(settings))
            while True:
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                if not self.connection.poll(left):
                    self.kill()
                    raise ModelLoadError(
                        f"model '{self.model.name}': initialize did not finish within {timeout:g} s "
                        "(its initialize_timeout_seconds)"
                    )
                answer = transport.receive(self.connection)
                if not isinstance(answer, MetricCall):
                    break
                # initialize made or updated a custom metric: answered here, the load's only reader of the pipe
                transport.send(self.connection, Reply(answer.tag, self.model.metric_answer(answer.op)))
        except (EOFError, OSError):
            self.kill()
            self._raise_if_cancelled(cancel)
            raise ModelLoadError(
                f"model '{self.model.name}': its python worker {how_it_ended(self.process.wait())} while loading"
            ) from None
        finally:
            if cancel is not None:
                cancel.remove_callback(self._kill_now)
            for segment in (self.board, lane.requests, lane.responses):
                segment.unlink()  # mapped by both sides now (or never to be): no file outlives the start
        self._raise_if_cancelled(cancel)  # cancelled as initialize ended: the callback may have killed it
        if not isinstance(answer, Ready):
            self.kill()
            why = answer.message if isinstance(answer, LoadFailed) else f"it answered {type(answer).__name__}"
            raise ModelLoadError(f"model '{self.model.name}': loading {self.model.shown_file} failed: {why}")
        return answer

    def _kill_now(self) -> None:
        """A CancelToken callback (never blocks; idempotent): end the worker; `kill` reaps it later."""
        with contextlib.suppress(OSError):
            if self.process.poll() is None:
                self.process.kill()

    def _raise_if_cancelled(self, cancel: CancelToken | None) -> None:
        if cancel is not None and cancel.cancelled:
            self.kill()
            raise ModelLoadError(
                f"model '{self.model.name}': its load was stopped ({cancel.reason or 'given up'}) while "
                f"{self.model.shown_file} was loading; its python worker was killed"
            )

    def resident_bytes(self) -> int:
        """The worker's resident memory now (bytes, shared segments included), read from /proc; 0 once it is gone.
        Never blocks."""
        try:
            with open(f"/proc/{self.process.pid}/statm") as handle:
                return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError, IndexError):
            return 0

    def memory_bytes(self) -> int:
        """This worker's memory now: its own resident pages (anonymous and file-backed, read from /proc; the
        shared segments left out) plus the segments the server made for it, counted here once though both
        processes map them. Never blocks; 0 for the process's part once it is gone."""
        segments = self.board.size + sum(lane.requests.size + lane.responses.size for lane in self.lanes)
        return _private_resident(self.process.pid) + segments

    # ---- calls -----------------------------------------------------------------------------------------------

    def call(self, lane: int, members: Sequence[Member], kill_cancel: CancelToken) -> list[CallResult]:
        """Run `members` (objects with .inputs, .outputs, .cancel) as one execute call on lane `lane`. Blocks until
        the worker answers, it dies, or the kill grace after `kill_cancel` fired ends. Returns per member its
        outputs, its ErrorResult or Released. Raises ModelError (execute raised; the worker
        died: `self.ended` is then set), ExecutionCancelled (`kill_cancel` fired and the worker outlived the kill
        grace: it was killed), OutOfSharedMemoryError (the shared memory has no room for the call's tensors:
        nothing else is lost)."""
        call = self._begin_call(lane, [kill_cancel], kill_cancel, _caller_deadline(members))
        sent = False
        try:
            requests = self._lay_out(call.lane, members)
            watchers = [self._cancel_watcher(call, index, member.cancel) for index, member in enumerate(members)]
            try:
                self._send_execute(
                    call, Execute(call.run, lane, requests, self._hand_over(call) if call.lane.new else {})
                )
                sent = True
                return self._results(call, members)
            finally:
                for member, watcher in zip(members, watchers, strict=True):
                    member.cancel.remove_callback(watcher)
        finally:
            self._end_call(call, sent)

    def streams(
        self, lane: int, members: Sequence[Member], failed: Callable[[BaseException], None], ended: Callable[[], None]
    ) -> list[ResponseStream]:
        """Start one execute call of a decoupled model with `members` on lane `lane` and return each member's
        responses as a ResponseStream, to be read on the member's own thread (its cancel token is its kill clock's).
        The call ends when every stream has ended (read to its final flag, closed, or raised); then `ended()` is
        called. `failed(error)` is told each ModelError or ExecutionCancelled a stream raises. Raises as `call`
        when the call cannot be sent (nothing is left in flight)."""
        tokens = [member.cancel for member in members]
        bls_cancel, detach = (tokens[0], None) if len(tokens) == 1 else _every_one_gave_up(tokens)
        call = self._begin_call(lane, tokens, bls_cancel, _caller_deadline(members), detach)
        try:
            requests = self._lay_out(call.lane, members)
            for index, member in enumerate(members):
                call.waiters[index].watcher = self._cancel_watcher(call, index, member.cancel)
            self._send_execute(call, Execute(call.run, lane, requests, self._hand_over(call)))
        except BaseException:
            self._end_call(call, sent=False)
            raise

        def member_ended() -> None:
            with self._mail:
                call.open_streams -= 1
                last = call.open_streams == 0
            if last:
                self._end_call(call, sent=True)
                ended()

        return [
            ResponseStream(self, call, index, member.outputs, failed, member_ended)
            for index, member in enumerate(members)
        ]

    def _begin_call(
        self,
        lane: int,
        tokens: Sequence[CancelToken],
        bls_cancel: CancelToken,
        deadline: float | None,
        detach: Callable[[], None] | None = None,
    ) -> _Call:
        """A new call on lane `lane`, with a waiter (its inbox, its kill clock) per token."""
        call = _Call(next(self._runs), lane, self.lanes[lane], [_Waiter(t) for t in tokens], bls_cancel, deadline)
        call.detach = detach
        with self._mail:
            self._calls[call.run] = call
        return call

    def _end_call(self, call: _Call, sent: bool) -> None:
        """The call ended (its execute message `sent` or not): the files of BLS replies the model did not read are
        removed (a part that arrives later is not delivered: `_start_bls`), and single-use segments are dropped, as
        the worker drops its mappings of them when the call ends (the next call on the lane makes small ones)."""
        with self._mail:
            self._calls.pop(call.run, None)
            call.live = False
            unread, call.reply_files = call.reply_files, set()
        if call.detach is not None:
            call.detach()
        for waiter in call.waiters:
            if waiter.watcher is not None:
                waiter.cancel.remove_callback(waiter.watcher)
        for path in unread:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        if call.handed_over:
            self._unlink_handed_over(call)
        if not self.ended:
            call.lane.release_single_use(sent)

    def _hand_over(self, call: _Call) -> dict[str, SegmentName]:
        """The lane's replaced segments, for the call's execute message: from now on the call unlinks them."""
        if not call.lane.new:
            return {}
        new, call.lane.new = call.lane.new, {}
        with self._mail:
            call.handed_over.extend(new.values())
        return {key: segment.name for key, segment in new.items()}

    def _unlink_handed_over(self, call: _Call) -> None:
        """The worker has mapped the segments handed over to `call` (it sent a message of the call after reading
        them), or the call is over: their files go."""
        with self._mail:
            segments, call.handed_over = call.handed_over, []
        for segment in segments:
            segment.unlink()

    def _results(self, call: _Call, members: Sequence[Member]) -> list[CallResult]:
        """The call's Done, its tensors copied out of the lane's response segment (blocks as `_next_message`); a
        traced member's trace is told how long the model's execute ran. Raises the call's refusal (a response
        segment that could not grow) or ModelError when the call failed."""
        message = self._next_message(call, call.waiters[0])
        if isinstance(message, Failed):
            if call.refused is not None:  # the worker failed the call for want of room
                raise call.refused
            raise self._execute_failed(message.message)
        if not isinstance(message, Done):
            raise self._confused(message)
        for member in members:
            if member.cancel.trace is not None:
                member.cancel.trace.model_ran(message.model_ns)
        return [call.lane.read_result(result) for result in message.results]

    def _confused(self, message: Message) -> ModelError:
        """The error of a message the protocol does not allow where it came (a worker that broke the protocol is
        killed: its state is unknown)."""
        self.kill_reason = f"it sent {type(message).__name__} out of turn"
        self.kill()
        return self._died()

    def _execute_failed(self, why: str) -> ModelError:
        """The error of an execute that raised, in the python backend's words (its clients and NVIDIA's QA tests
        read them): the instance is named as Triton names it, `<model>_0_<instance>`."""
        return ModelError(
            f"Failed to process the request(s) for model '{self.model.name}_0_{self.instance}', message: {why}"[:2000]
        )

    def next_response(self, stream: ResponseStream) -> Outputs | None:
        """The next response of a streamed request (its outputs; FinalOutputs when it came with the final flag), or
        None once its final flag came alone. A response carrying an error raises it; raises as `call`."""
        call, waiter = stream.call, stream.call.waiters[stream.index]
        while True:
            message = self._next_message(call, waiter)
            if isinstance(message, Released):  # rescheduled: no final flag this time (rescheduling.py)
                stream.finished = True
                raise call.refused or released_outcome(self.model.name, self.model.spec)
            if isinstance(message, Failed):
                stream.finished = True
                raise call.refused or self._execute_failed(message.message)
            if not isinstance(message, Response):
                raise self._confused(message)
            if call.refused is not None:  # a response did not fit in the shared memory: the request ends
                stream.finished = message.final
                self._send(Reply(message.tag, None))
                raise call.refused
            result = message.result
            outputs = None if result is None else call.lane.read_result(result)
            self._send(Reply(message.tag, None))  # the tensors are copied out: the worker may reuse the segment
            stream.finished = bool(message.final)
            if outputs is not None:
                outcome = self.model.outcome(outputs, stream.requested)
                if isinstance(outcome, BaseException):
                    raise outcome
                return FinalOutputs(outcome) if stream.finished else outcome
            if stream.finished:
                return None

    def drop_the_rest(self, stream: ResponseStream) -> None:
        """A streamed request ended early: show it cancelled to the model and take what it still sends until its
        final flag (or the kill grace ends the worker). Never raises: it runs when the stream is closed."""
        call, waiter = stream.call, stream.call.waiters[stream.index]
        struct.pack_into("<q", self.board.view, self._board_offset(call, stream.index), call.run)
        if not waiter.cancel.cancelled:
            waiter.cancel = CancelToken()
            waiter.cancel.cancel("the request ended before its final response")
        try:
            while not stream.finished:
                message = self._next_message(call, waiter)
                if not isinstance(message, Response):  # Released or Failed: nothing more comes for it
                    return
                self._send(Reply(message.tag, None))
                stream.finished = bool(message.final)
        except (ModelError, ExecutionCancelled) as error:
            _LOG.warning("%s", error)

    # ---- the pipe: messages filed by run ---------------------------------------------------------------------

    def _next_message(self, call: _Call, waiter: _Waiter) -> Inbound:
        """`waiter`'s next message: a Response or Released for its request, or the call's Done or Failed. Waits for it,
        reading the pipe meanwhile when no other thread does. Raises ModelError when the worker died (or was killed
        for another request), ExecutionCancelled when its own kill clock ran out (the worker is killed then)."""
        if self.model.requests_per_context == 1 and len(call.waiters) == 1:
            return self._next_message_alone(call, waiter)
        while True:
            with self._mail:
                if waiter.inbox:
                    return waiter.inbox.popleft()
                left = None if self.ended or not waiter.cancel.cancelled else self._kill_clock(waiter)
                alive = not self.ended and (left is None or left > 0)
                reading = alive and not self._reading
                if reading:
                    self._reading = True
                elif alive:
                    self._waiting += 1
                    self._changed.wait(POLL_SECONDS if left is None else min(POLL_SECONDS, left))
                    self._waiting -= 1
                    continue
            if self.ended:
                raise self._died()
            if not reading:
                self._kill_for(waiter)  # raises
            mine = None
            try:
                message = self._receive(POLL_SECONDS if left is None else min(POLL_SECONDS, left))
                if message is not None:
                    mine = self._route(message, call, waiter)
            finally:
                with self._mail:
                    self._reading = False
                    if self._waiting:
                        self._changed.notify_all()  # a thread still waiting takes the role over
            if mine is not None:
                return mine

    def _next_message_alone(self, call: _Call, waiter: _Waiter) -> Inbound:
        """`_next_message` for the only call a worker can have in flight, and its only request (a model that does
        not overlap its calls, one request on a stream or a call of requests that answer together): its thread is
        the pipe's only reader, every message of the pipe is its own, so it reads without taking the reader's role."""
        while True:
            left = self._kill_clock(waiter) if waiter.cancel.cancelled else None
            if left is not None and left <= 0:
                self._kill_for(waiter)  # raises
            message = self._receive(POLL_SECONDS if left is None else min(POLL_SECONDS, left))
            if type(message) is Done and message.run == call.run and not call.handed_over:
                return message  # the call's answer, as `_route` would return it (the common message, routed here)
            if message is not None:
                mine = self._route(message, call, waiter)
                if mine is not None:
                    return mine

    def _route(self, message: Message, reader_call: _Call, reader: _Waiter) -> Inbound | None:
        """Deal with a message the reading thread (`reader`'s, of `reader_call`) took off the pipe: answer a Grow,
        start a BlsCall, file the rest in the inbox of their call's waiter (a Response for a call that has ended
        is answered and dropped). Returns the message when it is `reader`'s own (not filed), else None. Raises
        ModelError (the worker is killed) for a message a worker never sends."""
        if not isinstance(message, _INBOUND):  # a question of the worker's, not an answer to a call
            if isinstance(message, BlsCall):
                self._start_bls(message)
            elif isinstance(message, MetricCall):
                self._send(Reply(message.tag, self.model.metric_answer(message.op)))
            elif isinstance(message, Grow):
                self._send(Reply(message.tag, self._grown(message.run, message.size)))
            else:
                raise self._confused(message)
            return None
        run = message.run
        if run == reader_call.run:  # the reader's own call: in flight, since it waits for this
            call: _Call | None = reader_call
            live = True
        else:
            with self._mail:
                call = self._calls.get(run)
                live = call is not None and call.live
        if call is None or not live:
            if isinstance(message, Response):  # its call has ended: dropped
                self._send(Reply(message.tag, None))
            return None
        if call.handed_over:
            self._unlink_handed_over(call)  # the worker has mapped them: it sent this after reading the call's message
        if isinstance(message, Done) and call.waiters[0] is reader:  # a lone call's answer: its own thread read it
            return message
        if isinstance(message, Response):
            addressees = [call.waiters[message.position]]
        elif isinstance(message, Released):  # a decoupled request the model rescheduled: its stream ends
            addressees = [call.waiters[message.position]]
        elif isinstance(message, Done):
            addressees = [call.waiters[0]]
        else:  # Failed: the call's every request
            addressees = call.waiters
        mine = message if reader in addressees else None
        others = [waiter for waiter in addressees if waiter is not reader]
        if others:
            with self._mail:
                for waiter in others:
                    waiter.inbox.append(message)
                if self._waiting:
                    self._changed.notify_all()
        return mine

    def _receive(self, seconds: float) -> Message | None:
        """The worker's next message, or None when none came within `seconds`. Raises ModelError when the worker
        died."""
        try:
            if self._poller.poll(max(1, math.ceil(seconds * 1000))):  # readable, or hung up (recv then raises)
                return transport.receive(self.connection, self._packed_done)
        except (EOFError, OSError):
            raise self._died() from None
        if self.process.poll() is not None:
            raise self._died()
        return None

    def _kill_clock(self, waiter: _Waiter) -> float | None:
        """Seconds left before the worker is killed for `waiter`'s request (called with `_mail` held, or by the only
        reader): None while it is not cancelled (or the model never kills). The clock runs from the first time the
        request was seen cancelled, whatever the worker sends meanwhile, so a model that keeps sending is killed on
        time as well as one that hangs."""
        cancel = waiter.cancel
        if not cancel.cancelled:
            return None
        grace = self.model.kill_grace(cancel.reason)
        if grace is None:
            return None
        now = time.monotonic()
        if waiter.cancel_seen is None:
            waiter.cancel_seen = now
        return waiter.cancel_seen + grace - now

    def _kill_for(self, waiter: _Waiter) -> None:
        """Kill the worker: `waiter`'s request was cancelled and is still running past the kill grace. Raises
        ExecutionCancelled; the worker's other calls fail (ModelError naming why it was killed)."""
        grace = self.model.kill_grace(waiter.cancel.reason)
        self.kill_reason = f"a request on it was cancelled and had not ended {grace:g} s later"
        self.kill()
        self.mark_ended()
        raise ExecutionCancelled(
            f"model '{self.model.name}': its worker did not return {grace:g} s after the request was "
            "cancelled and was killed (the slot starts a new one)"
        )

    def mark_ended(self) -> None:
        """The worker is gone (dead or killed): its calls' waiters are woken to fail. Never blocks."""
        with self._mail:
            self.ended = True
            self._changed.notify_all()

    def _died(self) -> ModelError:
        self.mark_ended()
        try:
            code = self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.kill()
            code = self.process.returncode
        why = f" (killed: {self.kill_reason})" if self.kill_reason else ""
        return ModelError(
            f"model '{self.model.name}': its python worker (instance {self.instance}) {how_it_ended(code)}{why} while "
            "running this request; the slot starts a new worker for the next one"
        )

    def _grown(self, run: int, size: int) -> ReplyPayload:
        """The reply to a Grow of call `run`: its lane's new response segment's name, or GrowRefused (noted
        in the call's `refused`, which fails it)."""
        with self._mail:
            call = self._calls.get(run)
        if call is None:
            return GrowRefused(f"model '{self.model.name}': the call had ended")
        try:
            segment = call.lane.replace("response", size)
        except OutOfSharedMemoryError as error:
            call.refused = OutOfSharedMemoryError(f"model '{self.model.name}': the response: {error}")
            return GrowRefused(str(call.refused))
        with self._mail:
            call.handed_over.append(segment)  # the worker maps it before it sends the call's next message
        return segment.name

    def _start_bls(self, message: BlsCall) -> None:
        """Run a BLS call of a request in flight on a thread of its own (the model may make several at once), with
        that request's deadline and cancellation; its reply goes to the worker when the callee answered. A part that
        comes after the calling request ended is not delivered (its file is removed): the worker gets one error part,
        final, in its place."""
        with self._mail:
            call = self._calls.get(message.run)
        tag = message.tag
        ended = False  # the error part for a call outlived by its request was sent

        def deliver(reply: CallReply, final: bool) -> None:
            nonlocal ended
            with self._mail:
                live = call is not None and call.live
                if call is not None and live and reply.segment is not None:
                    call.reply_files.add(reply.segment.path)
            if not live:
                _unlink_reply(reply)
                if ended:
                    return
                ended, final = True, True
                reply = CallReply((ErrorResult(TritonCode.CANCELLED, _OUTLIVED),), None)
            try:
                self._send(BlsPart(tag, reply, final))
            except ModelError:  # the worker is gone (its calls report that): nobody will map the reply
                _unlink_reply(reply)

        if call is None:  # its request has ended: the model gets the error part at once
            deliver(CallReply((), None), True)
            return
        cancel, deadline = call.bls_cancel, call.deadline
        if not self._bls_threads.submit(lambda: run_bls(self.model, message.call, cancel, deadline, deliver)):
            closing = ErrorResult(TritonCode.UNAVAILABLE, f"model '{self.model.name}' is closing: no BLS call runs")
            deliver(CallReply((closing,), None), True)

    def _lay_out(self, lane: _Lane, members: Sequence[Member]) -> list[Request]:
        """Copy the members' inputs into the lane's request segment (grown first when they do not fit); returns each
        member's Request for the Execute message. Raises OutOfSharedMemoryError when the segment cannot grow."""
        layout = transport.Layout(transport.CONTROL_BYTES)
        requests = []
        for member in members:
            descriptors = [
                layout.plan(name, array, datatypes.from_numpy(array.dtype)) for name, array in member.inputs.items()
            ]
            requests.append(_request(descriptors, member))
        try:
            if layout.size > lane.requests.size or lane.requests.is_released:
                lane.new["request"] = lane.replace("request", layout.size)
            if lane.responses.is_released:  # dropped after a large call: the worker needs one to answer into
                lane.new["response"] = lane.replace("response", 0)
        except OutOfSharedMemoryError as error:
            raise OutOfSharedMemoryError(f"model '{self.model.name}': the request: {error}") from None
        layout.write(lane.requests)
        return requests

    def _send(self, message: Message) -> None:
        """Send a control message; a worker that is gone raises ModelError (its end named)."""
        try:
            with self._send_lock:
                transport.send(self.connection, message)
        except OSError:
            raise self._died() from None

    def _send_execute(self, call: _Call, message: Execute) -> None:
        """Send a call's Execute: packed into its lane's control area (the head of the request segment, after the
        tensors were laid out) with a doorbell on the pipe, or pickled on the pipe when it is not of the common
        kind (Execute.pack_into: a segment handed over, request parameters). Raises as `_send`."""
        if not message.pack_into(transport.control(call.lane.requests)):
            self._send(message)
            return
        try:
            with self._send_lock:
                transport.ring(self.connection, call.lane_number)
        except OSError:
            raise self._died() from None

    def _packed_done(self, lane: int) -> Done:
        """The Done the worker packed into lane `lane`'s control area (the head of its response segment) before it
        rang. Raises ValueError when the lane has none."""
        if not 0 <= lane < len(self.lanes):
            raise ValueError(f"a doorbell for lane {lane}, which this worker does not have")
        return Done.unpack_from(transport.control(self.lanes[lane].responses))

    def _board_offset(self, call: _Call, index: int) -> int:
        return 8 * (call.lane_number * self.board_words + index)

    def _cancel_watcher(self, call: _Call, index: int, cancel: CancelToken) -> Callable[[], None]:
        """Have `cancel` firing mark the `index`-th request of `call` cancelled on the board (the model's
        `is_cancelled()` reads it); returns the callback, for the caller to remove when the call ends."""
        # Writes only this run's number: a late callback of an older run is harmless. A partial, not a closure: made
        # for every request, it costs less to make and to call.
        cancelled = functools.partial(_BOARD_WORD.pack_into, self.board.view, self._board_offset(call, index), call.run)
        cancel.add_callback(cancelled)
        return cancelled

    # ---- the end ---------------------------------------------------------------------------------------------

    def ask_to_stop(self) -> None:
        """Ask the worker to run finalize and exit (never blocks on a busy worker)."""
        try:
            transport.send(self.connection, Stop())
        except OSError:
            pass

    def stop(self, deadline: float) -> None:
        """Ask the worker to finalize and exit, and return at once: a thread waits for it until `deadline`, then
        kills it and frees its pipe and segments. So closing a model never waits on a slow finalize (a server's
        shutdown stays inside its bound), and a hung one is killed at the deadline."""
        self.ask_to_stop()
        for lane in self.lanes:
            lane.unlink_new()  # the thread below may not outlive the process; the files must not either
        with self._mail:
            calls = list(self._calls.values())
        for call in calls:
            self._unlink_handed_over(call)
        threading.Thread(
            target=self.wait_or_kill, args=(deadline,), name=f"python-worker-stop-{self.process.pid}", daemon=True
        ).start()

    def wait_or_kill(self, deadline: float) -> None:
        """Wait for the worker to exit until `deadline` (monotonic), kill it then, and free its resources. Meanwhile
        answers the custom-metrics operations its finalize makes (nobody else reads its pipe after Stop). Blocks
        until then; never raises."""
        self._answer_metrics_until_closed(deadline)
        try:
            self.process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _LOG.warning(
                "model '%s': worker %d did not finish finalize in time; killed", self.model.name, self.instance
            )
            self.kill()
        self.close_resources()

    def _answer_metrics_until_closed(self, deadline: float) -> None:
        """Read the stopping worker's pipe until it closes (the worker exited) or `deadline`: answer its MetricCalls
        (finalize's), drop the rest (a call's late message: no call is in flight when a worker is stopped). Never
        raises."""
        try:
            while True:
                left = deadline - time.monotonic()
                if left <= 0 or not self.connection.poll(left):
                    return
                message = transport.receive(self.connection, self._packed_done)
                if isinstance(message, MetricCall):
                    with self._send_lock:
                        transport.send(self.connection, Reply(message.tag, self.model.metric_answer(message.op)))
        except (EOFError, OSError, ValueError):
            return  # the worker exited (its end closed), or sent what no record is

    def kill(self) -> None:
        """Kill the worker (SIGKILL) if it still runs and reap it. Blocks only for the reaping; never raises."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()

    def close_resources(self) -> None:
        """Free the pipe, the segments and the files of an ended worker; log the last of its output."""
        self.connection.close()
        self._free_segments()
        # BLS segments the worker made (named by its pid) or had yet to map: a dead worker unlinks none of them.
        with self._mail:
            stale = {*transport.segments_of(self.process.pid)}
            calls = list(self._calls.values())
            for call in calls:
                stale.update(call.reply_files)
                call.reply_files = set()
                call.live = False
        for path in stale:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        for call in calls:
            self._unlink_handed_over(call)
        transport.ended_worker(self.process.pid)
        self.model.worker_closed(self)
        if not self.output.stop(OUTPUT_STOP_SECONDS):
            _LOG.warning(
                "model '%s': worker %d's output is still held open (by a process it started?); not read further",
                self.model.name,
                self.instance,
            )

    def _free_segments(self) -> None:
        self.board.unlink()
        self.board.close()
        for lane in getattr(self, "lanes", ()):
            lane.free()


class _Lane:
    """The server's side of one lane of a worker: its request and response segments (replaced by larger ones as
    calls need them) and the replacements the worker has yet to be told of (`new`, handed over with the lane's next
    execute message to its call). Used by the call on the lane, and by the reading thread for the call's Grow
    asks, which the protocol puts between the call's own steps."""

    def __init__(self, requests: transport.Segment, responses: transport.Segment) -> None:
        self.requests = requests
        self.responses = responses
        self.new: dict[str, transport.Segment] = {}

    def replace(self, key: str, size: int) -> transport.Segment:
        """A new segment for `key` ("request" or "response") in place of the old one (freed); the caller tells the
        worker. Raises OutOfSharedMemoryError (nothing changed) when there is no room for it."""
        segment = transport.Segment.create(size)
        old = self.requests if key == "request" else self.responses
        self._set(key, segment)
        old.unlink()
        old.close()
        return segment

    def _set(self, key: str, segment: transport.Segment) -> None:
        if key == "request":
            self.requests = segment
        else:
            self.responses = segment

    def unlink_new(self) -> None:
        """The worker is ending: the files of replacements it was never told of go."""
        new, self.new = self.new, {}
        for segment in new.values():
            segment.unlink()

    def release_single_use(self, sent: bool) -> None:
        """Drop a single-use request or response segment (the worker drops its mapping of it when the call
        ends, by the same rule: transport.single_use); one the worker never saw (the call was not sent) goes too.
        Its place holds a released segment until the next call makes a small one (`_lay_out`), so no file is
        named between calls."""
        if self.requests.size <= transport.KEEP_SEGMENT_BYTES >= self.responses.size:  # the common call: both kept
            return
        for key, segment in (("request", self.requests), ("response", self.responses)):
            if transport.single_use(segment) and (sent or key in self.new):
                self.new.pop(key, None)
                self._set(key, transport.Segment.released())
                segment.unlink()
                segment.close()

    def read_result(self, result: Tensors | ErrorResult | Released) -> CallResult:
        """A response's result with its tensors copied out of the response segment."""
        if isinstance(result, Tensors):
            responses = self.responses
            return {
                d.name: transport.read(
                    responses, d, copy=True, bf16=datatypes.bfloat16() if d.datatype == "BF16" else None
                )
                for d in result.descriptors
            }
        return result

    def free(self) -> None:
        for segment in (self.requests, self.responses, *self.new.values()):
            segment.unlink()
            segment.close()
        self.new = {}


class _Waiter:
    """One request of a call as its thread waits for the worker's messages: its inbox, and its kill clock (its cancel
    token, when it was first seen cancelled). Its fields are guarded by the worker's `_mail`."""

    __slots__ = ("cancel", "cancel_seen", "inbox", "watcher")

    def __init__(self, cancel: CancelToken) -> None:
        self.cancel = cancel
        self.cancel_seen: float | None = None
        self.inbox: deque[Inbound] = deque()
        self.watcher: Callable[[], None] | None = None  # its cancel board callback, removed when the call ends


class _Call:
    """One execute call in flight on a worker: its run number, lane and waiters, and what its BLS calls carry (the
    calling requests' cancellation and deadline). `live` and `reply_files` are guarded by the worker's `_mail`."""

    __slots__ = (
        "run",
        "lane_number",
        "lane",
        "waiters",
        "bls_cancel",
        "deadline",
        "detach",
        "live",
        "reply_files",
        "handed_over",
        "refused",
        "open_streams",
    )

    def __init__(
        self,
        run: int,
        lane_number: int,
        lane: _Lane,
        waiters: list[_Waiter],
        bls_cancel: CancelToken,
        deadline: float | None,
    ) -> None:
        self.run = run
        self.lane_number = lane_number
        self.lane = lane
        self.waiters = waiters
        self.bls_cancel = bls_cancel
        self.deadline = deadline
        self.detach: Callable[[], None] | None = None  # ends bls_cancel's watch of the requests' tokens
        self.live = True  # until the call ended: its BLS replies are delivered while it is
        self.reply_files: set[str] = set()  # its BLS reply segments the worker may not have mapped yet
        # Segments made for it that the worker maps before it sends the call's next message (then unlinked); guarded
        # by the worker's `_mail`.
        self.handed_over: list[transport.Segment] = []
        self.refused: OutOfSharedMemoryError | None = None  # a response segment could not grow: the call fails
        self.open_streams = len(waiters)  # its streams not ended yet (a decoupled call's), guarded by `_mail`


class ResponseStream(Iterator[Outputs]):
    """One request's responses from a decoupled model's call, read on the request's own thread: each `next` waits for
    the next response (FinalOutputs for one sent with the final flag) and ends after the final flag. A response
    carrying an error raises it. Ended (its last response read, closed, or raised), it ends its part of the call
    once, even when it was never read: closed early, it first marks the request cancelled for the model and takes
    what the model still sends until the final flag (the kill grace bounds it)."""

    def __init__(
        self,
        worker: WorkerProcess,
        call: _Call,
        index: int,
        requested: Sequence[str],
        failed: Callable[[BaseException], None],
        ended: Callable[[], None],
    ) -> None:
        self.worker, self.call, self.index, self.requested = worker, call, index, requested
        self.finished = False  # its final flag came (or the call failed)
        self._failed, self._ended_callback = failed, ended
        self._ended = False
        self._ended_lock = threading.Lock()  # guards: _ended (a stream may be closed from another thread)

    def __next__(self) -> Outputs:
        if self._ended:
            raise StopIteration
        try:
            outputs = self.worker.next_response(self)
        except (ModelError, ExecutionCancelled) as error:
            self._end()
            self._failed(error)
            raise
        except BaseException:
            self._end()
            raise
        if outputs is None or self.finished:
            self._end()
        if outputs is None:
            raise StopIteration
        return outputs

    def close(self) -> None:
        """End the request's part of the call now: what the model still sends for it is taken and dropped until its
        final flag (bounded by the kill grace). Idempotent; never raises a model's error."""
        self._end()

    def _end(self) -> None:
        with self._ended_lock:
            if self._ended:
                return
            self._ended = True
        try:
            if not self.finished and not self.worker.ended:
                self.worker.drop_the_rest(self)
        finally:
            self._ended_callback()


def _every_one_gave_up(tokens: Sequence[CancelToken]) -> tuple[CancelToken, Callable[[], None]]:
    """A token cancelled once every one of `tokens` is (what a batch's BLS calls are cancelled with), and the function
    that stops it watching them."""
    token = CancelToken()

    def look() -> None:
        if all(each.cancelled for each in tokens):
            token.cancel(tokens[-1].reason)

    for each in tokens:
        each.add_callback(look)

    def detach() -> None:
        for each in tokens:
            each.remove_callback(look)

    return token, detach


class PythonContext(Context):
    """One instance of the model (a slot of its pool): its worker, started again after a death on the next call, and
    its lanes, the calls it runs at once: `model.requests_per_context` of them, 1 unless the model overlaps its calls
    (an async decoupled model), so several threads may use it at once (never more than that: the pool lends it that
    many times). A death is counted once per worker, whichever of its calls saw it."""

    def __init__(self, model: PythonModel, instance: int, worker: WorkerProcess) -> None:
        self._model = model
        self._instance = instance
        self._lock = threading.Lock()  # guards: _worker, _free_lanes, each worker's users/death_counted/retired
        self._start_lock = threading.Lock()  # held by the thread starting a new worker: the others wait for it
        self._worker: WorkerProcess | None = worker
        self._free_lanes = list(range(model.requests_per_context - 1, -1, -1))  # lane 0 is taken first

    @overload
    def execute(self, inputs: Mapping[str, np.ndarray], outputs: Sequence[str], cancel: CancelToken) -> Outputs: ...

    @overload
    def execute(
        self, inputs: list[Member], outputs: Sequence[str], cancel: CancelToken
    ) -> list[Outputs | EngineError]: ...

    def execute(
        self, inputs: Mapping[str, np.ndarray] | list[Member], outputs: Sequence[str], cancel: CancelToken
    ) -> Outputs | list[Outputs | EngineError]:
        """One request, or (from a batch leader, `batches_as_requests`) a list of member requests: then a list
        of outcomes, each its Outputs or its EngineError. Blocks for the run: until the worker answers, or dies, or
        the kill grace after `cancel` fired ends (the worker is killed). Raises ExecutionCancelled (cancelled
        before the run, or killed after it), ModelError (execute raised, the worker died), WorkersFailing (the
        workers die too often), OutOfSharedMemoryError, or the EngineError of a lone request's response."""
        if isinstance(inputs, list):
            return self._call(inputs, cancel)
        if cancel.cancelled:
            raise ExecutionCancelled("the caller gave up before the run started")
        (outcome,) = self._call([_Single(inputs, outputs, cancel)], cancel)
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    def _call(self, members: Sequence[Member], cancel: CancelToken) -> list[Outputs | EngineError]:
        lane, worker = self._enter()
        try:
            results = worker.call(lane, members, cancel)
        except (ModelError, ExecutionCancelled) as error:
            self._failed(worker, error)
            raise
        finally:
            self._leave(lane, worker)
        return [self._model.outcome(result, member.outputs) for result, member in zip(results, members, strict=True)]

    def execute_stream(
        self, inputs: Mapping[str, np.ndarray], outputs: Sequence[str], cancel: CancelToken
    ) -> Iterator[Outputs]:
        """A decoupled model's responses to one request, as the model sends them (a ResponseStream, each `next`
        blocking for the next response). A model that is not decoupled yields its one response (blocks for it).
        Raises as `execute` when the call cannot start; the stream raises as `execute` too."""
        if not self._model.decoupled:
            return iter((self.execute(inputs, outputs, cancel),))
        if cancel.cancelled:
            raise ExecutionCancelled("the caller gave up before the run started")
        (stream,) = self.execute_streams([_Single(inputs, outputs, cancel)])
        return stream

    def execute_streams(self, members: Sequence[Member]) -> list[Iterator[Outputs]]:  # type: ignore[override]  # the interface types the core's records as object
        """A decoupled model's batch: one execute call of `members` (each with .inputs, .outputs, .cancel), each
        member's responses as a ResponseStream read on the member's own thread. The lane is held until every stream
        has ended. Raises as `execute` when the call cannot start."""
        lane, worker = self._enter()
        try:
            return list(
                worker.streams(
                    lane, members, lambda error: self._failed(worker, error), lambda: self._leave(lane, worker)
                )
            )
        except (ModelError, ExecutionCancelled) as error:
            self._leave(lane, worker)
            self._failed(worker, error)
            raise
        except BaseException:
            self._leave(lane, worker)
            raise

    def _enter(self) -> tuple[int, WorkerProcess]:
        """A free lane and the live worker (a new one if it has none or it died); the caller `_leave`s both."""
        with self._lock:
            lane = self._free_lanes.pop()
            worker = self._worker
            if worker is not None and not worker.ended and worker.process.poll() is None:
                worker.users += 1
                return lane, worker
        try:
            return lane, self._worker_for_call()
        except BaseException:
            with self._lock:
                self._free_lanes.append(lane)
            raise

    def _leave(self, lane: int, worker: WorkerProcess) -> None:
        """A call on `lane` of `worker` ended: the last one to leave a worker that ended frees its resources."""
        with self._lock:
            self._free_lanes.append(lane)
            worker.users -= 1
            retire = worker.ended and self._retire_locked(worker)
        if retire:
            worker.close_resources()

    def _retire_locked(self, worker: WorkerProcess) -> bool:
        """Whether the caller is to free `worker`'s resources now (it ended and nobody uses it; said once)."""
        if not worker.ended or worker.users > 0 or worker.retired:
            return False
        worker.retired = True
        if self._worker is worker:
            self._worker = None
        return True

    def _failed(self, worker: WorkerProcess, error: BaseException) -> None:
        """A call on `worker` raised `error`: a death (not a kill after a cancellation) is counted once. Raises
        WorkersFailing when the model's workers die too often."""
        if not worker.ended or worker.kill_reason:
            return
        with self._lock:
            counted, worker.death_counted = worker.death_counted, True
        if not counted:
            self._model.worker_died(str(error))

    def _worker_for_call(self) -> WorkerProcess:
        """The instance's worker, one more user counted; a new one if it has none or it died while idle (no request
        of its failed then: the death is counted here)."""
        with self._start_lock:
            with self._lock:
                worker = self._worker
                if worker is not None and not worker.ended and worker.process.poll() is None:
                    worker.users += 1
                    return worker
            if worker is not None:
                self._replace_ended(worker)
            started = self._model.start_worker(self._instance, error_type=ModelError)
            with self._lock:
                self._worker = started
                started.users += 1
            return started

    def _replace_ended(self, worker: WorkerProcess) -> None:
        """Let go of an ended worker (its resources freed now, or by the last call still on it); one that died while
        idle (no call of its saw it) has its death counted here. Raises WorkersFailing as `worker_died`."""
        idle_death = not worker.ended
        worker.mark_ended()
        with self._lock:
            if self._worker is worker:
                self._worker = None
            retire = self._retire_locked(worker)
            counted, worker.death_counted = worker.death_counted, True
        if retire:
            worker.close_resources()
        if idle_death and not counted and not worker.kill_reason:
            self._model.worker_died(
                f"model '{self._model.name}': its python worker (instance {self._instance}) "
                f"{how_it_ended(worker.process.returncode)} while idle; the slot starts a new one"
            )

    def close(self) -> None:
        """Ask the slot's worker to finalize and exit; returns at once (a thread kills it after the finalize grace)."""
        with self._lock:
            worker, self._worker = self._worker, None
        if worker is not None:
            worker.stop(self._model.close_deadline())


class CallThreads:
    """The threads a python model's BLS calls run on, owned by the model (PythonModel makes them with itself and
    stops them in its `close`) and handed to each of its workers. An idle thread takes the next call, else a new one
    starts, so calls are never queued behind each other (a call may wait long for the callee's slot). A thread
    idle IDLE_SECONDS ends; `stop` ends the idle ones at once and the busy ones when their call ends. Starting a
    thread costs more than a call's own overhead on a loaded machine; reusing one does not.

    Lock: `_lock` guards `_idle`, `_threads` and `_stopped`; it is held for list and set work only, never across a
    call, a put or a thread's start."""

    IDLE_SECONDS = 10.0

    def __init__(self, name: str) -> None:
        self.name = name  # every thread's name: a test (and a thread dump) finds the model's threads by it
        self._lock = threading.Lock()
        self._idle: list[queue.SimpleQueue[Callable[[], None] | None]] = []  # idle threads' inboxes, latest last
        self._threads: set[threading.Thread] = set()  # started and not ended
        self._stopped = False

    def submit(self, work: Callable[[], None]) -> bool:
        """Run `work` on an idle thread, or a new one. Never blocks. Returns False, running nothing, once `stop` was
        called (the model is closing). Raises RuntimeError when no thread can be started."""
        with self._lock:
            if self._stopped:
                return False
            inbox = self._idle.pop() if self._idle else None
            if inbox is None:
                thread = threading.Thread(target=self._serve, args=(work,), name=self.name, daemon=True)
                self._threads.add(thread)
        if inbox is not None:
            inbox.put(work)
            return True
        try:
            thread.start()
        except BaseException:
            with self._lock:
                self._threads.discard(thread)
            raise
        return True

    def stop(self) -> None:
        """Take no more calls: idle threads end now, busy ones as soon as their call returns (a BLS call is bounded
        by its calling request's deadline and cancellation, which the model's unload fires). Never blocks;
        idempotent."""
        with self._lock:
            self._stopped = True
            idle, self._idle = self._idle, []
        for inbox in idle:
            inbox.put(None)  # wakes its thread, which ends

    def alive(self) -> list[threading.Thread]:
        """The threads started and not ended yet (busy or idle). Never blocks."""
        with self._lock:
            return list(self._threads)

    def _serve(self, work: Callable[[], None] | None) -> None:
        inbox: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        try:
            while work is not None:
                work()
                with self._lock:
                    if self._stopped:
                        return
                    self._idle.append(inbox)
                try:
                    work = inbox.get(timeout=self.IDLE_SECONDS)
                except queue.Empty:
                    with self._lock:
                        if inbox in self._idle:  # nobody took it: end
                            self._idle.remove(inbox)
                            return
                    work = inbox.get()  # taken just now: its work (or stop's None) is on its way
        finally:
            with self._lock:
                self._threads.discard(threading.current_thread())


def _request(descriptors: list[Descriptor], member: Member) -> Request:
    """What the worker needs of one request: its tensors, requested outputs and what it says about itself."""
    info = member.cancel.request or _NO_INFO
    return Request(
        tuple(descriptors), tuple(member.outputs), info.id, info.correlation_id, info.flags, dict(info.parameters)
    )


_NO_INFO = RequestInfo()
_BOARD_WORD = struct.Struct("<q")  # a request's word of the cancel board: its run's number once it was cancelled


def _caller_deadline(members: Sequence[Member]) -> float | None:
    """The deadline a call's BLS calls carry: the latest of its requests' (None when one of them has none)."""
    if len(members) == 1:  # the common call
        return (members[0].cancel.request or _NO_INFO).deadline
    deadlines = [(member.cancel.request or _NO_INFO).deadline for member in members]
    if any(deadline is None for deadline in deadlines):
        return None
    return max(deadlines)  # type: ignore[type-var]  # none is None here


SELF_CALL_HINT = (
    " (a BLS call to the calling model itself needs another of its slots: while callers hold every slot it can "
    "only time out)"
)


def run_bls(
    model: PythonModel,
    call: CallRequest,
    cancel: CancelToken,
    deadline: float | None,
    deliver: Callable[[CallReply, bool], None],
) -> None:
    """Run one BLS call of `model` through the server, handing its reply to `deliver(reply, final)`: once (final)
    for an ordinary call; for `decoupled` each response of the callee as it comes, then a final part (empty, or
    the error that ended the responses), unless the callee sent its last response with the final flag (that part
    is final then, as on Triton). Blocks for the call: until the callee answered, `deadline` (the calling
    request's) or the call's own timeout passed, or `cancel` (the calling request's) fired, which cancels the call.
    Never raises: a failure is an error response, with the TritonError code of the status a client would get."""
    calls = model.calls
    if calls is None:
        no_server = ErrorResult(TritonCode.UNAVAILABLE, "BLS calls need a server (no ModelCalls was bound)")
        deliver(CallReply((no_server,), None), True)
        return
    if call.timeout_us > 0:
        own = time.monotonic() + call.timeout_us / 1e6
        deadline = own if deadline is None else min(deadline, own)
    request = call.request
    info = RequestInfo(request.request_id, request.parameters, deadline, request.correlation_id, request.flags)
    token = CancelToken()  # the call's own: the dataplane sets its RequestInfo on it
    token.trace = cancel.trace  # a traced caller's call is traced as its child (service/core/tracing.py)

    def forward() -> None:
        token.cancel(cancel.reason or "the calling request was cancelled")

    cancel.add_callback(forward)
    segment = None
    outcomes: list[Outputs | ErrorResult] = []
    ended = False  # the callee sent its last response with the final flag: no empty final part after it
    try:
        bf16 = datatypes.bfloat16() if any(d.datatype == "BF16" for d in request.inputs) else None
        segment, inputs = transport.read_call(call, bf16=bf16)
        if call.decoupled:
            responses = calls.infer_stream(
                call.model, inputs, version=call.version, outputs=request.outputs, cancel=token, request=info
            )
            try:
                for outputs in responses:
                    ended = isinstance(outputs, FinalOutputs)
                    deliver(_reply([outputs], call.model), ended)
            finally:
                close = getattr(responses, "close", None)
                if close is not None:
                    close()  # an error or a cancellation ends the callee's stream: its slot is released now
        else:
            outcomes.append(
                calls.infer(
                    call.model, inputs, version=call.version, outputs=request.outputs, cancel=token, request=info
                )
            )
    except BaseException as error:  # noqa: BLE001 (every failure is the caller's error response)
        status, message = calls.describe(error)
        if call.model == model.name and _waited_for_a_slot(error):
            message += SELF_CALL_HINT
        outcomes.append(ErrorResult(for_status(status), message))
    finally:
        cancel.remove_callback(forward)
    try:
        if not ended:  # after a final part the caller's iterator has ended: nothing more reaches it
            deliver(_reply(outcomes, call.model), True)
    finally:
        if segment is not None:
            segment.close()  # after the reply copied the outputs: an output may be a view of an input


def _waited_for_a_slot(error: BaseException) -> bool:
    """Whether a call failed for want of a slot of its model (admission's `server_busy`: a timeout, a full queue,
    every busy slot overdue), what a self-call meets while its callers hold every slot; not a shutdown, a
    cancellation or an unloaded model."""
    return getattr(type(error), "error_reason", None) == "server_busy"


def _reply(outcomes: Sequence[Outputs | ErrorResult], callee: str) -> CallReply:
    """The reply carrying `outcomes`; one error response when they cannot be laid out. Never raises."""
    try:
        return transport.write_reply(outcomes)
    except OutOfSharedMemoryError as error:
        failed = ErrorResult(for_status("RESOURCE_EXHAUSTED"), f"BLS call to model '{callee}': {error}")
    except (ValueError, OSError) as error:
        failed = ErrorResult(TritonCode.INTERNAL, f"BLS call to model '{callee}': {error}")
    return CallReply((failed,), None)


_OUTLIVED = "the calling request ended before this BLS response was read; it was dropped"


def _unlink_reply(reply: CallReply) -> None:
    """Remove a BLS reply's segment file (nobody will map it)."""
    if reply.segment is not None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(reply.segment.path)


def _private_resident(pid: int) -> int:
    """Process `pid`'s resident anonymous and file-backed pages (bytes), shared memory left out; 0 when it is
    gone. /proc/<pid>/status keeps these as counters: reading them costs microseconds, whatever the process."""
    total = 0
    try:
        with open(f"/proc/{pid}/status") as handle:
            for line in handle:
                if line.startswith(("RssAnon:", "RssFile:")):
                    total += int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return 0
    return total


class _Single:
    __slots__ = ("inputs", "outputs", "cancel")

    def __init__(self, inputs: Mapping[str, np.ndarray], outputs: Sequence[str], cancel: CancelToken) -> None:
        self.inputs, self.outputs, self.cancel = inputs, outputs, cancel


class CustomMetricsSink(Protocol):
    """Where a python model's custom-metrics operations go (pb_utils.MetricFamily, Metric): the server's registry
    (service/process/custom_metrics.py), bound by `PythonBackend.bind_custom_metrics`; the engine never imports it."""

    def apply(self, model: str, op: MetricOp) -> MetricAnswer:
        """Apply `op` of `model`'s and answer it: its refusal in `error`, a read's value in `value`. Never blocks
        (a short lock) and never raises: every refusal is an answer."""
        ...


class PythonModel(LoadedModel):
    """A model.py with its (auto-completed) configuration; workers are started per slot (an instance). A decoupled
    model whose `execute` is `async def` overlaps its calls: each of its contexts takes `requests_per_context`
    (async_requests_per_instance) requests at once, as Triton's stub runs such coroutines in the background."""

    batches_as_requests = True  # service/core/batching.py hands a batch's member requests, unstacked
    launcher: Launcher = SERVER  # what its workers run on: EXECUTION_ENV_PATH's environment (unstarted_model)

    def __init__(self, spec: ModelSpec) -> None:
        self.name = spec.name
        self.spec = spec
        self.shown_file = shown_path(spec.model_file, spec.roots) if spec.model_file is not None else "model.py"
        self.metadata_batch = spec.max_batch_size
        self.max_parallel_slots = int(_parameter(spec, "max_parallel_slots", MAX_SLOTS, 1, MAX_SLOTS))
        # The calls one worker takes at once when the model overlaps them (an async decoupled model); others take one.
        self.lanes_wanted = int(_parameter(spec, "async_requests_per_instance", ASYNC_REQUESTS, 1, MAX_ASYNC_REQUESTS))
        self.requests_per_context = 1  # set at load: lanes_wanted for an async decoupled model
        # 0: no limit (Triton 2.51 waits for initialize without one; see docs/python-models.md).
        self._initialize_timeout = _parameter(spec, "initialize_timeout_seconds", INITIALIZE_TIMEOUT, 0.0, 86400.0)
        self._finalize_grace = _parameter(spec, "finalize_grace_seconds", 2.0, 0.0, 600.0)
        self._cancel_kill = _parameter(spec, "cancel_kill_seconds", CANCEL_KILL_SECONDS, 0.0, 86400.0)
        self._lock = threading.Lock()  # guards: _spare, _instances, _deaths, _worker_bytes, _live
        self._live: set[WorkerProcess] = set()  # every worker started and not yet closed (memory_bytes)
        self._spare: WorkerProcess | None = None
        self._instances = 0
        self._deaths: deque[float] = deque()
        self._worker_bytes = 0
        self._config_json = json.dumps(triton_config(spec))
        self._auto_complete = True
        self._async_execute = False  # its execute is `async def` (the first worker says)
        self.decoupled = False  # set from the completed configuration at load
        self.calls: ModelCalls | None = None  # the server's, for BLS calls (PythonBackend.bind_model_calls)
        self.metrics: CustomMetricsSink | None = None  # the server's (PythonBackend.bind_custom_metrics)
        # The threads its workers' BLS calls run on: none until the first call, stopped by `close`.
        self.bls_threads = CallThreads(f"python-bls-{spec.name}")

    # ---- load --------------------------------------------------------------------------------------------------

    def load_first_worker(self, cancel: CancelToken | None = None) -> None:
        """Start the first worker (auto-complete + initialize) and read the served I/O from its configuration.
        Raises ModelLoadError (after the initialize timeout, or at once when `cancel` fires: see start_worker)."""
        worker = self.start_worker(0, error_type=ModelLoadError, cancel=cancel)
        self._auto_complete = False
        try:
            config = json.loads(self._config_json)
            self.metadata = metadata_from_config(config, self.spec)
            self.decoupled = self.streaming = is_decoupled(config)
            if self.decoupled and self._async_execute:  # Triton runs its coroutines in the background: they overlap
                self.requests_per_context = self.lanes_wanted
        except BaseException:
            worker.ask_to_stop()
            worker.wait_or_kill(time.monotonic() + self._finalize_grace)
            raise
        self._spare = worker
        self._instances = 1

    def start_worker(
        self, instance: int, error_type: type[EngineError], cancel: CancelToken | None = None
    ) -> WorkerProcess:
        """A new worker for slot `instance`, its model initialized. Blocks for the model's initialize, at most
        initialize_timeout_seconds (0: no limit); `cancel` firing kills the worker at once. Raises `error_type`
        naming what went wrong (the worker is ended and its resources freed)."""
        spec = self.spec
        worker = WorkerProcess(self, instance, self.bls_threads)
        settings = {
            "model_name": spec.name,
            "model_file": str(spec.model_file),
            "shown_file": self.shown_file,
            "model_config": self._config_json,
            "auto_complete": self._auto_complete,
            "model_instance_kind": "CPU",
            "model_instance_name": f"{spec.name}_0_{instance}",
            "model_instance_device_id": "0",
            "model_repository": str(spec.directory or ""),
            "model_version": spec.version,
        }
        try:
            ready = worker.start(settings, self._initialize_timeout or None, cancel)
        except ModelLoadError as error:
            worker.close_resources()
            raise error_type(str(error)) from None
        if self._auto_complete:
            self._config_json = ready.config
            self._async_execute = ready.async_execute
        with self._lock:
            self._worker_bytes = max(self._worker_bytes, worker.resident_bytes())
        return worker

    # ---- slots -------------------------------------------------------------------------------------------------

    def create_context(self) -> Context:
        """A slot (see `create_context_cancellable`); blocks for a new worker's initialize. Raises ModelLoadError."""
        return self.create_context_cancellable(None)

    def create_context_cancellable(self, cancel: CancelToken | None) -> Context:
        """A slot: the load's worker for the first, a new worker (its own initialize) for each other one, stopped
        when `cancel` fires."""
        with self._lock:
            worker, self._spare = self._spare, None
            instance = self._instances
            if worker is None:
                self._instances += 1
        if worker is not None:
            return PythonContext(self, 0, worker)
        return PythonContext(self, instance, self.start_worker(instance, error_type=ModelLoadError, cancel=cancel))

    def memory_bytes(self, slots: int) -> int:
        """The model's memory now: each live worker's own resident memory plus its segments (counted once,
        though the server maps them too: WorkerProcess.memory_bytes); a slot without a worker (it died, its
        next use starts one) counts what a worker weighed when it started. Every slot is a process of its own:
        the model's weights are loaded once per worker. Reads /proc; never blocks."""
        with self._lock:
            workers = list(self._live)
            started = self._worker_bytes
        return sum(worker.memory_bytes() for worker in workers) + max(0, slots - len(workers)) * started

    def worker_started(self, worker: WorkerProcess) -> None:
        """Count `worker` in the model's memory (`memory_bytes`). Never blocks."""
        with self._lock:
            self._live.add(worker)

    def worker_closed(self, worker: WorkerProcess) -> None:
        """Stop counting `worker` in the model's memory. Never blocks."""
        with self._lock:
            self._live.discard(worker)

    def outcome(self, result: CallResult, requested: Sequence[str]) -> Outputs | EngineError:
        """A member's Outputs, or the EngineError its response carried or its outputs earn. Never raises."""
        if isinstance(result, Released):  # the model rescheduled the request (rescheduling.py)
            return released_outcome(self.name, self.spec)
        if isinstance(result, ErrorResult):  # the model's words, as Triton passes them
            return _BY_TRITON_CODE.get(result.code, ModelError)(result.message[:2000])
        outputs = result
        kept = self.spec.sequence.state_outputs() if self.spec.sequence is not None else ()
        for name, array in outputs.items():
            declared = self.metadata.output(name)
            if declared is None and name in kept:  # a sequence's implicit state, kept by the server (sequences.py)
                continue
            if declared is None:
                return ModelError(f"model '{self.name}' returned output '{name}', which its configuration lacks")
            # A numeric output of another datatype than configured is accepted, as Triton accepts it (its docs
            # promise no check; NVIDIA's QA models and the bls_decoupled examples rely on it); the response carries
            # it converted to the configured datatype. Strings and numbers do not convert into each other.
            if (array.dtype.kind in "OSU") != (declared.datatype == "BYTES"):
                returned = "BYTES" if array.dtype.kind in "OSU" else datatypes.from_numpy(array.dtype)
                return ModelError(
                    f"model '{self.name}' returned output '{name}' as {returned}; its configuration says "
                    f"{declared.datatype}"
                )
        for name in requested:
            if name not in outputs:
                return ModelError(f"model '{self.name}' did not return the requested output '{name}'")
        return outputs

    def worker_died(self, description: str) -> None:
        """Count a death; raise WorkersFailing when the model's workers die too often."""
        now = time.monotonic()
        with self._lock:
            self._deaths.append(now)
            while self._deaths and now - self._deaths[0] > FAILURE_WINDOW:
                self._deaths.popleft()
            count = len(self._deaths)
        _LOG.error("%s", description)
        if count >= WORKER_FAILURES:
            raise WorkersFailing(
                f"model '{self.name}' is out of service: its python workers died {count} times within "
                f"{FAILURE_WINDOW:g} s (last: {description.split(': ', 1)[-1]})"
            )

    def kill_grace(self, reason: str) -> float | None:
        """Seconds a worker may run on after a request of its was cancelled for `reason` before it is killed; None:
        never killed (cancel_kill_seconds 0)."""
        if reason == SHUTDOWN_REASON:
            return SHUTDOWN_KILL_SECONDS
        return self._cancel_kill or None

    def metric_answer(self, op: MetricOp) -> MetricAnswer:
        """The server's answer to a custom-metrics operation of one of this model's workers. Never blocks, never
        raises."""
        if self.metrics is None:
            return MetricAnswer(error="custom metrics need a server's registry (none was bound to the python backend)")
        return self.metrics.apply(self.name, op)

    def close_deadline(self) -> float:
        """When a worker asked to stop now is killed if it has not ended (finalize's grace)."""
        return time.monotonic() + self._finalize_grace

    def close(self) -> None:
        """The model is unloaded (its contexts were closed first): stop its spare worker, if any, and its BLS
        threads. Never blocks: a worker's finalize and a BLS call still running end on their own threads."""
        with self._lock:
            spare, self._spare = self._spare, None
        if spare is not None:
            spare.stop(self.close_deadline())
        self.bls_threads.stop()


def triton_config(spec: ModelSpec) -> dict[str, Any]:
    """The model's configuration as Triton hands it to a python model (JSON-shaped; dims as integers)."""
    from google.protobuf import json_format

    config: dict[str, Any] = {}
    if spec.config is not None:
        config = json_format.MessageToDict(spec.config, preserving_proto_field_name=True)  # type: ignore[arg-type]  # the ModelConfig message (typed `object` in the interface)
    config.setdefault("name", spec.name)
    config.setdefault("backend", "python")
    config.setdefault("max_batch_size", spec.max_batch_size)
    for kind in ("input", "output"):
        config.setdefault(kind, [])
        for tensor in config[kind]:
            tensor["dims"] = [int(d) for d in tensor.get("dims", [])]
            tensor.setdefault("data_type", "TYPE_INVALID")
    return config


def is_decoupled(config: dict[str, Any]) -> bool:
    """Whether a (completed) configuration says `model_transaction_policy { decoupled: true }`."""
    return bool(config.get("model_transaction_policy", {}).get("decoupled", False))


def metadata_from_config(config: dict[str, Any], spec: ModelSpec) -> ModelMetadata:
    """The served metadata of a (completed) configuration. Raises ModelConfigError for a tensor it cannot
    serve, or for settings slotserve refuses."""
    origin = f"model '{spec.name}'"
    if is_decoupled(config) and config.get("response_cache", {}).get("enable"):
        raise ModelConfigError(  # Triton 2.51 refuses it too
            f"{origin}: the response cache does not support a model with the 'decoupled' transaction policy"
        )
    max_batch = int(config.get("max_batch_size", 0) or 0)
    # auto_complete_config may set it where the configuration left it 0 and the server batches nothing itself (no
    # dynamic or sequence batching to size): each request then runs alone with its rows (Triton's auto_complete).
    completed = spec.max_batch_size == 0 and spec.batching is None and spec.sequence is None
    if max_batch != spec.max_batch_size and not completed:
        raise ModelConfigError(
            f"{origin}: auto_complete_config set max_batch_size {max_batch}; set it in config.pbtxt "
            f"(it is {spec.max_batch_size} there), where the server's batching reads it"
        )

    def tensors(kind: str) -> tuple[TensorSpec, ...]:
        specs = []
        for entry in config.get(kind, []):
            name = entry.get("name", "")
            datatype = datatypes.BY_CONFIG_NAME.get(entry.get("data_type", ""))
            if datatype is None:
                raise ModelConfigError(f"{origin}: {kind} '{name}' has data_type {entry.get('data_type')!r}")
            dims = tuple(int(d) for d in entry.get("dims", []))
            specs.append(TensorSpec(name, datatype.name, dims, bool(entry.get("optional", False))))
        return tuple(specs)

    return ModelMetadata(
        inputs=tensors("input"), outputs=tensors("output"), max_batch_size=max_batch, platform=spec.platform or "python"
    )


def unstarted_model(spec: ModelSpec, environments: Environments | None = None) -> PythonModel:
    """The PythonModel `spec` describes, checked but not started: no worker, none of the model's code run
    (PythonBackend.load starts it; `python -m service check` stops here without --load). Its EXECUTION_ENV_PATH is
    checked without writing or running anything; `environments` prepares it at the first worker. Raises
    ModelConfigError for a missing model.py, an execution environment that is not there, or a parameter out of
    range."""
    origin = f"model '{spec.name}'"
    if spec.model_file is None or not spec.model_file.exists():
        raise ModelConfigError(f"{origin}: model.py not found")
    declared = declared_environment(spec)
    model = PythonModel(spec)
    if declared is not None:
        model.launcher = (environments or Environments()).launcher(declared)
    return model


class PythonBackend(Backend):
    name = "python"

    def __init__(self, environments_folder: Path | None = None) -> None:
        self._calls: ModelCalls | None = None
        self._metrics: CustomMetricsSink | None = None
        # Where packed execution environments are extracted (--python-environments-dir): nothing is written there
        # before a model with one loads.
        self._environments = Environments(environments_folder)
        # What servers of ours that are gone left in /dev/shm (a SIGKILL unlinks nothing); what this one leaves
        # named when it exits (a worker hung or killed mid-call, a BLS reply unread) goes at its exit.
        removed = transport.remove_leftovers()
        if removed:
            _LOG.info("removed %d python-model segment file(s) left by processes that are gone", len(removed))
        transport.remove_own_at_exit()

    def bind_model_calls(self, calls: ModelCalls) -> None:
        """The server's calls to its own models, which every python model loaded after this uses for BLS."""
        self._calls = calls

    def bind_custom_metrics(self, metrics: CustomMetricsSink) -> None:
        """The server's custom-metrics registry, where every python model loaded after this sends its
        pb_utils.MetricFamily and Metric operations."""
        self._metrics = metrics

    def load(self, spec: ModelSpec) -> LoadedModel:
        """`load_cancellable` without a token: blocks for the first worker's initialize; raises ModelLoadError or
        ModelConfigError."""
        return self.load_cancellable(spec, None)

    def load_cancellable(self, spec: ModelSpec, cancel: CancelToken | None) -> LoadedModel:
        """Start the model's first worker. Blocks for its initialize (bounded by initialize_timeout_seconds);
        `cancel` firing kills the worker and raises ModelLoadError at once."""
        model = unstarted_model(spec, self._environments)
        model.calls = self._calls
        model.metrics = self._metrics
        model.load_first_worker(cancel)
        return model
