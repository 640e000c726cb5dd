"""One soak client process: mixed traffic against a slotserve server for a bounded time, every call logged.

Started by soak/run.py (`python soak/traffic.py --address HOST:PORT --role ROLE --seconds S --log FILE ...`); each
process has its own log, one JSON object per line:

    {"event": "sent", "id": "...", "kind": "infer"|"stream"|"mgmt", "model": "...", "op": "...", "t": ...}
    {"event": "done", "id": "...", "status": "OK"|<gRPC code>|"STREAM_ERROR", "reason": ..., "gave_up": bool,
     "handler_busy": bool, "abandoned_after": bool, "message": "...", "t": ...}

A "sent" line is written before a request leaves (for a stream: when gRPC takes the request from the iterator),
a "done" line when its final status is known, so soak/run.py can check that every request got exactly one.
`gave_up` marks requests the client abandoned (its deadline passed or it cancelled): the server may or may not
have counted those. `abandoned_after` marks a stream request answered in full whose stream the client then
cancelled (or whose deadline then passed). Roles:

    infer   unary ModelInfer on ONNX and fixture models; short deadlines on the gated model; explicit cancels;
            malformed requests, unknown models, a model whose load always fails, short `timeout` parameters
    stream  ModelStreamInfer with one to four requests per stream on the streaming fixture model and others;
            streams cancelled after their first answer, streams with short deadlines
    ops     management: RegisterModel with different slot counts, a fixture model's load fault switched on and
            off, UnloadModel, UnloadModels (some of them, sometimes all), RepositoryModelLoad, ListModels; and
            some inference

Every loop is bounded by --seconds and every call by a deadline; traffic only to the given 127.0.0.1 address.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import threading
import time
from pathlib import Path

import grpc
import numpy as np

from client.errors import ClientError
from generated import grpc_service_pb2 as pb
from generated import grpc_service_pb2_grpc as pb_grpc
from generated import management_pb2 as mpb
from generated import management_pb2_grpc as mpb_grpc

ONNX_MODELS = ("simple", "simple_identity", "identity_fp32")
FIXTURE_MODELS = ("fx_echo", "fx_stream", "fx_slow", "fx_flaky")
LOADABLE = ONNX_MODELS + FIXTURE_MODELS  # what management calls may load, reconfigure and unload
BROKEN = "fx_broken"  # its load always fails
STREAM_RESPONSES = {"fx_stream": 3}  # answers per request on a stream; 1 for every other model
GAVE_UP = ("DEADLINE_EXCEEDED", "CANCELLED")
CALL_DEADLINE = 10.0  # seconds: the deadline of an ordinary call
MANAGEMENT_DEADLINE = 20.0


class Log:
    """The process's log: JSON lines, written under a lock, flushed line by line."""

    def __init__(self, path: Path, name: str) -> None:
        self._file = path.open("w", buffering=1)
        self._lock = threading.Lock()
        self._name = name
        self._next = 0

    def new_id(self) -> str:
        with self._lock:
            self._next += 1
            return f"{self._name}-{self._next}"

    def write(self, **record) -> None:
        record["t"] = round(time.time(), 4)
        line = json.dumps(record, separators=(",", ":"))
        with self._lock:
            self._file.write(line + "\n")

    def sent(self, request_id: str, kind: str, model: str, op: str) -> None:
        self.write(event="sent", id=request_id, kind=kind, model=model, op=op)

    def done(
        self,
        request_id: str,
        status: str,
        *,
        reason: str | None = None,
        message: str = "",
        gave_up: bool = False,
        abandoned_after: bool = False,
    ) -> None:
        self.write(
            event="done",
            id=request_id,
            status=status,
            reason=reason,
            gave_up=gave_up,
            handler_busy="inference handler threads" in message,
            abandoned_after=abandoned_after,
            message=message[:200],
        )

    def failed(self, request_id: str, error: grpc.RpcError | ClientError) -> None:
        failure = error if isinstance(error, ClientError) else ClientError.from_rpc_error(error)
        self.done(
            request_id, failure.code, reason=failure.reason, message=failure.message, gave_up=failure.code in GAVE_UP
        )

    def close(self) -> None:
        with self._lock:
            self._file.close()


# ---- requests ---------------------------------------------------------------------------------------------------


def infer_request(model: str, rng: random.Random, request_id: str, *, large: bool = False) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name=model, id=request_id)
    batch = rng.randint(1, 4)
    if model == "simple":
        for name in ("INPUT0", "INPUT1"):
            request.inputs.add(name=name, datatype="INT32", shape=[batch, 16])
            request.raw_input_contents.append(np.full((batch, 16), rng.randint(-99, 99), "<i4").tobytes())
    elif model == "simple_identity":
        words = [f"w{rng.randint(0, 10**6)}".encode() for _ in range(batch * 3)]
        request.inputs.add(name="INPUT0", datatype="BYTES", shape=[batch, 3])
        request.raw_input_contents.append(b"".join(len(w).to_bytes(4, "little") + w for w in words))
    elif model == "identity_fp32":
        width = 25_000 if large else rng.randint(1, 64)  # large: 100 KB a row, over 64 KiB a message
        request.inputs.add(name="INPUT0", datatype="FP32", shape=[batch, width])
        request.raw_input_contents.append(np.full((batch, width), 0.5, "<f4").tobytes())
    else:  # fixture models: INPUT0 FP32 [-1], no batch dimension
        width = rng.randint(1, 32)
        request.inputs.add(name="INPUT0", datatype="FP32", shape=[width])
        request.raw_input_contents.append(np.arange(width, dtype="<f4").tobytes())
    return request


def malformed_request(rng: random.Random, request_id: str) -> tuple[str, pb.ModelInferRequest]:
    model = rng.choice(("simple", "identity_fp32", "fx_echo"))
    request = infer_request(model, rng, request_id)
    how = rng.randrange(3)
    if how == 0:
        request.raw_input_contents[0] = request.raw_input_contents[0][:-1]  # one byte short
    elif how == 1:
        request.inputs[0].datatype = "INT33"
    else:
        request.inputs[0].name = "NO_SUCH_INPUT"
    return model, request


# ---- the roles --------------------------------------------------------------------------------------------------


class Worker:
    def __init__(self, address: str, log: Log, seed: int, until: float) -> None:
        self.channel = grpc.insecure_channel(
            address, options=[("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)]
        )
        self.stub = pb_grpc.GRPCInferenceServiceStub(self.channel)
        self.management = mpb_grpc.ModelManagementStub(self.channel)
        self.log = log
        self.rng = random.Random(seed)
        self.until = until
        self.pause = threading.Event()  # never set: its wait() is a bounded pause between some calls

    def running(self) -> bool:
        return time.monotonic() < self.until

    # unary inference -------------------------------------------------------------------------------------------

    def unary(
        self,
        model: str,
        request: pb.ModelInferRequest,
        *,
        deadline: float = CALL_DEADLINE,
        op: str = "infer",
        cancel_after: float | None = None,
    ) -> None:
        request_id = request.id
        self.log.sent(request_id, "infer", model, op)
        future = self.stub.ModelInfer.future(request, timeout=deadline)
        if cancel_after is not None:
            self.pause.wait(cancel_after)
            future.cancel()
        try:
            response = future.result(timeout=deadline + 5)
        except grpc.FutureCancelledError:
            self.log.done(request_id, "CANCELLED", message="cancelled by the client", gave_up=True)
            return
        except grpc.FutureTimeoutError:  # the call outlived its own deadline by 5 s: record it, end it
            future.cancel()
            self.log.done(request_id, "CLIENT_TIMEOUT", message="no answer 5 s past the deadline", gave_up=True)
            return
        except grpc.RpcError as error:
            self.log.failed(request_id, error)
            return
        if len(response.raw_output_contents) != len(response.outputs) or response.id != request_id:
            self.log.done(request_id, "MALFORMED_RESPONSE", message=f"{len(response.outputs)} outputs")
            return
        self.log.done(request_id, "OK")

    def infer_step(self) -> None:
        rng, new_id = self.rng, self.log.new_id
        roll = rng.random()
        if roll < 0.45:
            model = rng.choice(ONNX_MODELS + ("fx_echo", "fx_flaky"))
            self.unary(model, infer_request(model, rng, new_id()))
        elif roll < 0.55:  # the gated model, with a deadline shorter than some of its gate's holds
            self.unary(
                "fx_slow",
                infer_request("fx_slow", rng, new_id()),
                deadline=rng.uniform(0.2, 1.5),
                op="infer_short_deadline",
            )
        elif roll < 0.65:  # explicit cancellation, early or late
            model = rng.choice(("fx_slow", "identity_fp32", "simple"))
            self.unary(
                model,
                infer_request(model, rng, new_id(), large=True),
                op="infer_cancel",
                cancel_after=rng.uniform(0.0, 0.05),
            )
        elif roll < 0.70:
            model, request = malformed_request(rng, new_id())
            self.unary(model, request, op="infer_malformed")
        elif roll < 0.74:
            request = infer_request("simple", rng, new_id())
            request.model_name = rng.choice(("no_such_model", "SIMPLE", "simple2"))
            self.unary(request.model_name, request, op="infer_unknown_model")
        elif roll < 0.78:
            self.unary(BROKEN, infer_request(BROKEN, rng, new_id()), op="infer_broken")
        elif roll < 0.84:  # a short `timeout` parameter: refused as server_busy when it has to wait
            model = rng.choice(("fx_slow", "fx_echo"))
            request = infer_request(model, rng, new_id())
            request.parameters["timeout"].int64_param = rng.randint(100, 20_000)
            self.unary(model, request, op="infer_timeout_parameter")
        elif roll < 0.88:  # a streaming model called unary: refused with UNIMPLEMENTED, as Triton does
            self.unary("fx_stream", infer_request("fx_stream", rng, new_id()), op="infer_streaming_model")
        else:
            self.unary("identity_fp32", infer_request("identity_fp32", rng, new_id(), large=True), op="infer_large")

    # streams ---------------------------------------------------------------------------------------------------

    def stream_step(self) -> None:
        rng = self.rng
        count = rng.randint(1, 4)
        model_pool = ("fx_stream", "fx_stream", "simple", "identity_fp32", "fx_echo", "fx_slow", "simple_identity")
        models = [rng.choice(model_pool) for _ in range(count)]
        requests = [(model, infer_request(model, rng, self.log.new_id())) for model in models]
        cancel_early = rng.random() < 0.25
        deadline = rng.uniform(0.3, 2.0) if rng.random() < 0.2 else CALL_DEADLINE
        expected = {request.id: STREAM_RESPONSES.get(model, 1) for model, request in requests}
        received = {request.id: 0 for _, request in requests}
        finished: set[str] = set()
        answered: list[str] = []  # fully answered requests, in order
        taken: list[str] = []  # ids gRPC took from the iterator, in order
        sending = threading.Lock()  # guards: taken, closed (gRPC's own thread consumes the iterator)
        closed: list[bool] = []

        def messages():
            for model, request in requests:
                with sending:
                    if closed:
                        return
                    self.log.sent(request.id, "stream", model, "stream")
                    taken.append(request.id)
                yield request

        call = self.stub.ModelStreamInfer(messages(), timeout=deadline)
        ended_with = None
        try:
            for answer in call:
                request_id = answer.infer_response.id
                if request_id not in received or request_id in finished:
                    self.log.write(event="unexpected_answer", id=request_id, error=answer.error_message[:200])
                    continue
                if answer.error_message:
                    finished.add(request_id)
                    self.log.done(request_id, "STREAM_ERROR", message=answer.error_message)
                else:
                    received[request_id] += 1
                    if received[request_id] == expected[request_id]:
                        finished.add(request_id)
                        answered.append(request_id)  # logged once the stream's own end is known
                if cancel_early:
                    call.cancel()  # gives up on whatever is still unanswered
                    break
        except grpc.RpcError as error:
            ended_with = ClientError.from_rpc_error(error)
        finally:
            call.cancel()
        with sending:
            closed.append(True)  # from here on the iterator sends nothing, so `taken` is final
            sent_ids = list(taken)
        # A request answered in full before the client cancelled the stream (or its deadline passed) is OK here;
        # the server may have counted it either way (see soak/run.py), so the line says so.
        abandoned = cancel_early or ended_with is not None
        for request_id in answered:
            self.log.done(request_id, "OK", abandoned_after=abandoned)
        for request_id in sent_ids:
            if request_id in finished:
                continue
            if ended_with is not None:
                self.log.done(
                    request_id,
                    ended_with.code,
                    reason=ended_with.reason,
                    message=ended_with.message,
                    gave_up=ended_with.code in GAVE_UP,
                )
            elif cancel_early:
                self.log.done(request_id, "CANCELLED", message="stream cancelled by the client", gave_up=True)
            else:
                self.log.done(request_id, "NO_ANSWER", message="the stream ended OK without answering it")

    # management ------------------------------------------------------------------------------------------------

    def management_call(self, op: str, model: str, method, request) -> None:
        request_id = self.log.new_id()
        self.log.sent(request_id, "mgmt", model, op)
        try:
            method(request, timeout=MANAGEMENT_DEADLINE)
        except grpc.RpcError as error:
            self.log.failed(request_id, error)
            return
        self.log.done(request_id, "OK")

    def ops_step(self) -> None:
        rng, m = self.rng, self.management
        roll = rng.random()
        model = rng.choice(LOADABLE)
        if roll < 0.30:
            request = mpb.RegisterModelRequest(model_id=model, slots=rng.randint(1, 4))
            self.management_call("register_slots", model, m.RegisterModel, request)
        elif roll < 0.40:  # the fault: fx_flaky's load fails while its fail_load option is set
            fault = rng.random() < 0.5
            request = mpb.RegisterModelRequest(
                model_id="fx_flaky", options={"fail_load": "soak" if fault else ""}, slots=rng.randint(1, 2)
            )
            self.management_call(
                "register_fault_on" if fault else "register_fault_off", "fx_flaky", m.RegisterModel, request
            )
        elif roll < 0.55:
            self.management_call("unload", model, m.UnloadModel, mpb.UnloadModelRequest(model_id=model))
        elif roll < 0.65:
            chosen = rng.sample(LOADABLE, rng.randint(2, 4)) + (["no_such_model"] if rng.random() < 0.3 else [])
            self.management_call(
                "unload_many", ",".join(chosen), m.UnloadModels, mpb.UnloadModelsRequest(model_ids=chosen)
            )
        elif roll < 0.68:
            self.management_call("unload_all", "*", m.UnloadModels, mpb.UnloadModelsRequest(all=True))
        elif roll < 0.78:
            self.management_call(
                "repository_load", model, self.stub.RepositoryModelLoad, pb.RepositoryModelLoadRequest(model_name=model)
            )
        elif roll < 0.83:
            self.management_call(
                "repository_unload",
                model,
                self.stub.RepositoryModelUnload,
                pb.RepositoryModelUnloadRequest(model_name=model),
            )
        elif roll < 0.90:
            self.management_call("list", "*", m.ListModels, mpb.ListModelsRequest())
        else:
            self.infer_step()
        self.pause.wait(rng.uniform(0.02, 0.3))  # pacing: management is a minority of the traffic

    def run(self, role: str) -> None:
        step = {"infer": self.infer_step, "stream": self.stream_step, "ops": self.ops_step}[role]
        try:
            while self.running():
                step()
        finally:
            self.channel.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--address", required=True)
    parser.add_argument("--role", choices=("infer", "stream", "ops"), required=True)
    parser.add_argument("--seconds", type=float, required=True)
    parser.add_argument("--threads", type=int, default=3)
    parser.add_argument("--log", type=Path, required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if not args.address.startswith("127.0.0.1:"):
        print("soak clients only talk to 127.0.0.1", file=sys.stderr)
        return 2
    log = Log(args.log, args.name)
    until = time.monotonic() + args.seconds
    errors: list[BaseException] = []

    def work(index: int) -> None:
        try:
            Worker(args.address, log, args.seed * 1000 + index, until).run(args.role)
        except BaseException as error:  # noqa: BLE001 - reported through the exit status and the log
            errors.append(error)
            log.write(event="client_error", error=repr(error))

    threads = [threading.Thread(target=work, args=(i,), name=f"{args.name}-{i}") for i in range(args.threads)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    log.close()
    if errors:
        print(f"{args.name}: {errors[0]!r}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
