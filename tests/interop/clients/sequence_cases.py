"""tritonclient[grpc] against a server with the accumulate model of tests/sequence_builders.py, in its own
process, through tritonclient's own sequence API (`sequence_id=`, `sequence_start=`, `sequence_end=`).

    python sequence_cases.py HOST:PORT MODEL

Prints one JSON object as the last line of stdout: the running sums three interleaved sequences got over
ModelInfer (sync `infer`) and over ModelStreamInfer (`async_stream_infer`, answers in stream order; and the aio
client's `stream_infer`), string ids included, and the errors of a request without an id and of one for a
sequence never started.
"""

from __future__ import annotations

import json
import queue
import sys

import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

VALUES = {1001: [1, 2, 3, 4], 1002: [10, 20, 30, 40], "seq-a": [100, 200, 300, 400]}


def tensor(value: int) -> list:
    t = grpcclient.InferInput("INPUT", [1], "INT32")
    t.set_data_from_numpy(np.array([value], dtype=np.int32))
    return [t]


def unary(client, model: str) -> dict:
    sums: dict[str, list[int]] = {str(k): [] for k in VALUES}
    for index in range(4):  # round-robin: the sequences interleave on the server
        for sequence_id, values in VALUES.items():
            result = client.infer(
                model,
                tensor(values[index]),
                sequence_id=sequence_id,
                sequence_start=index == 0,
                sequence_end=index == 3,
            )
            sums[str(sequence_id)].append(int(result.as_numpy("OUTPUT")[0]))
    return sums


def stream(client, model: str) -> dict:
    answers: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    order = []
    for index in range(4):
        for sequence_id, values in VALUES.items():
            client.async_stream_infer(
                model,
                tensor(values[index]),
                request_id=f"{sequence_id}-{index}",
                sequence_id=sequence_id,
                sequence_start=index == 0,
                sequence_end=index == 3,
            )
            order.append(str(sequence_id))
    got = []
    for _ in order:
        result, error = answers.get(timeout=60)
        if error is not None:
            raise RuntimeError(f"stream error: {error}")
        response = result.get_response()
        got.append((response.id, int(result.as_numpy("OUTPUT")[0])))
    client.stop_stream()
    sums: dict[str, list[int]] = {str(k): [] for k in VALUES}
    for request_id, value in got:
        sums[request_id.rsplit("-", 1)[0]].append(value)
    return {"sums": sums, "ids": [request_id for request_id, _ in got]}


def aio_stream(address: str, model: str) -> dict:
    """The same sequences over tritonclient.grpc.aio's stream_infer (the aio sequence example's API)."""
    import asyncio

    import tritonclient.grpc.aio as aioclient

    async def run() -> dict:
        client = aioclient.InferenceServerClient(address)

        async def requests():
            for index in range(4):
                for sequence_id, values in VALUES.items():
                    t = aioclient.InferInput("INPUT", [1], "INT32")
                    t.set_data_from_numpy(np.array([values[index]], dtype=np.int32))
                    yield {
                        "model_name": model,
                        "inputs": [t],
                        "request_id": f"{sequence_id}-{index}",
                        "sequence_id": sequence_id,
                        "sequence_start": index == 0,
                        "sequence_end": index == 3,
                    }

        sums: dict[str, list[int]] = {str(k): [] for k in VALUES}
        async for result, error in client.stream_infer(requests()):
            if error is not None:
                raise RuntimeError(f"aio stream error: {error}")
            request_id = result.get_response().id
            sums[request_id.rsplit("-", 1)[0]].append(int(result.as_numpy("OUTPUT")[0]))
        await client.close()
        return sums

    return asyncio.run(run())


def error_of(call) -> list:
    try:
        call()
    except InferenceServerException as error:
        return [error.status(), error.message()]
    return ["answered", ""]


def main() -> None:
    address, model = sys.argv[1], sys.argv[2]
    client = grpcclient.InferenceServerClient(address)
    report = {
        "unary": unary(client, model),
        "stream": stream(client, model),
        "aio_stream": aio_stream(address, model),
        "no_id": error_of(lambda: client.infer(model, tensor(1))),
        "not_started": error_of(lambda: client.infer(model, tensor(1), sequence_id=555)),
    }
    print(json.dumps(report))


if __name__ == "__main__":
    main()
