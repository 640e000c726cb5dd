"""L0_backend_python/async_execute, rewritten without its sleeps: an `async def execute` of a decoupled model runs
on the stub's event loop, so several executes of one instance are in flight together (and BLS `async_exec` calls
made from them), a short request overtakes a long one, and an exception after the final flags is logged.

The QA's model sleeps WAIT_SECONDS per row and the test checks the answers came back sooner than one after another
would allow. Here a row's value says what the execute waits for instead, so nothing depends on timing:
  n >= 1  wait until n executes of this instance are in flight together (OVERLAP_SECONDS at most, else an error)
  0.5     "long": wait until a "short" one has answered (the same bound)
  0.25    "short": answer at once
  -1      send the final flag, then raise ValueError
"""

# ruff: noqa: E501  (the config.pbtxt and model.py texts embedded here keep their one-line entries)

from __future__ import annotations

import numpy as np

from .harness import Model, build_request, python_model

OVERLAP_SECONDS = 10.0

ASYNC_DECOUPLED = f"""
    import asyncio

    import numpy as np
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def initialize(self, args):
            self.waiting = []  # futures of executes waiting for their group
            self.short_done = None

        async def together(self, size):
            if len(self.waiting) + 1 >= size:
                for future in self.waiting[: size - 1]:
                    future.set_result(True)
                del self.waiting[: size - 1]
                return True
            future = asyncio.get_running_loop().create_future()
            self.waiting.append(future)
            try:
                return await asyncio.wait_for(future, {OVERLAP_SECONDS})
            except asyncio.TimeoutError:
                self.waiting.remove(future)
                return False

        async def wait_for_short(self):
            try:
                await asyncio.wait_for(self.short_done.wait(), {OVERLAP_SECONDS})
                return True
            except asyncio.TimeoutError:
                return False

        async def execute(self, requests):
            if self.short_done is None:
                self.short_done = asyncio.Event()  # on the loop execute runs on
            work, senders = [], []
            for request in requests:
                rows = pb_utils.get_input_tensor_by_name(request, "WAIT_SECONDS").as_numpy()
                for row in rows:
                    value = float(row[0])
                    if value < 0:
                        for each in requests:
                            each.get_response_sender().send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                        raise ValueError("wait_secs cannot be negative")
                    if value == 0.5:
                        work.append(asyncio.create_task(self.wait_for_short()))
                    elif value == 0.25:
                        self.short_done.set()
                    elif value >= 1:
                        work.append(asyncio.create_task(self.together(int(value))))
                senders.append((request.get_response_sender(), rows.shape[0]))
            results = await asyncio.gather(*work)
            for sender, rows in senders:
                if all(results):
                    response = pb_utils.InferenceResponse([pb_utils.Tensor("DUMMY_OUT", np.zeros([rows, 1], np.float32))])
                else:
                    response = pb_utils.InferenceResponse(error=pb_utils.TritonError("the executes did not overlap"))
                sender.send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            return None
"""

ASYNC_BLS = """
    import asyncio

    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        async def one(self, request):
            value = pb_utils.get_input_tensor_by_name(request, "WAIT_SECONDS").as_numpy()
            call = pb_utils.InferenceRequest(
                model_name="async_execute_decouple",
                inputs=[pb_utils.Tensor("WAIT_SECONDS", value)],
                requested_output_names=["DUMMY_OUT"],
            )
            sender = request.get_response_sender()
            for response in await call.async_exec(decoupled=True):
                if response.has_error():
                    sender.send(pb_utils.InferenceResponse(error=response.error()))
                elif response.output_tensors():
                    out = pb_utils.get_output_tensor_by_name(response, "DUMMY_OUT").as_numpy()
                    sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("DUMMY_OUT", out)]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

        async def execute(self, requests):
            await asyncio.gather(*(self.one(request) for request in requests))
            return None
"""

CONFIG = """
    max_batch_size: 8
    input [ { name: "WAIT_SECONDS" data_type: TYPE_FP32 dims: [ 1 ] } ]
    output [ { name: "DUMMY_OUT" data_type: TYPE_FP32 dims: [ 1 ] } ]
    instance_group [ { kind: KIND_CPU } ]
    model_transaction_policy { decoupled: true }
"""

MODELS: dict[str, Model] = {
    "async_execute_decouple": python_model(CONFIG, ASYNC_DECOUPLED),
    "async_execute_decouple_bls": python_model(CONFIG, ASYNC_BLS),
}


def _request(model: str, value: float, rows: int):
    return build_request(model, {"WAIT_SECONDS": np.full([rows, 1], value, np.float32)})


def _concurrent(server, model: str, rows: int, requests: int) -> None:
    """`requests` requests of `rows` rows on one stream; each row needs `requests` executes in flight together."""
    with server.stream() as stream:
        for _ in range(requests):
            stream.send(_request(model, requests, rows))
        for _ in range(requests):  # the first error ends the case (the stream is cancelled)
            item = stream.next()
            assert item is not None and not item.error, item
            assert item.outputs["DUMMY_OUT"].shape[0] == rows
        assert stream.rest() == []


def test_concurrent_execute_single_request(server):
    """One request of four rows: its rows' tasks run together inside one execute."""
    _concurrent(server, "async_execute_decouple", 4, 1)


def test_concurrent_execute_multi_request(server):
    """Four one-row requests: four executes of the one instance in flight together."""
    _concurrent(server, "async_execute_decouple", 1, 4)


def test_concurrent_execute_single_request_bls(server):
    _concurrent(server, "async_execute_decouple_bls", 4, 1)


def test_concurrent_execute_multi_request_bls(server):
    """Four requests to the BLS model, each an async_exec of the decoupled model: both overlap."""
    _concurrent(server, "async_execute_decouple_bls", 1, 4)


def test_concurrent_execute_different_duration(server):
    """A long request sent first is answered after a short one sent next."""
    with server.stream() as stream:
        stream.send(_request("async_execute_decouple", 0.5, 1))
        stream.send(_request("async_execute_decouple", 0.25, 2))
        first = stream.next()
        assert first is not None and not first.error and first.outputs["DUMMY_OUT"].shape[0] == 2, first
        second = stream.next()
        assert second is not None and not second.error and second.outputs["DUMMY_OUT"].shape[0] == 1, second


def test_model_raise_exception(launch, logged):
    """An execute that raises after sending its final flags: the exception is in the server's log."""
    server = launch(MODELS)
    server.stream_all([_request("async_execute_decouple", -1, 1)])
    logged(server, "ValueError: wait_secs cannot be negative")
