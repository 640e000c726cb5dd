"""tritonclient[grpc] against a server of tests/python_models/repository (slotserve, or real Triton), in its own
process.

    python python_models_cases.py HOST:PORT CASE [ARGS...]

Each case asserts what a correct answer must be and prints one JSON object as the last line of stdout, so the
interop tests (tests/interop/test_python_models.py) and the differential tests
(tests/differential/test_python_models.py) can check and compare what the server said.
"""

from __future__ import annotations

import json
import queue
import sys
import threading

import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

WAIT = 60.0
CODES = ("UNKNOWN", "INTERNAL", "NOT_FOUND", "INVALID_ARG", "UNAVAILABLE", "UNSUPPORTED", "ALREADY_EXISTS", "CANCELLED")


def probe_inputs(mode: str, arg: bytes) -> list:
    inputs = [grpcclient.InferInput("MODE", [1], "BYTES"), grpcclient.InferInput("ARG", [1], "BYTES")]
    inputs[0].set_data_from_numpy(np.array([mode.encode()], dtype=np.object_))
    inputs[1].set_data_from_numpy(np.array([arg], dtype=np.object_))
    return inputs


def failure(error: InferenceServerException) -> list:
    return [str(error.status()).replace("StatusCode.", ""), error.message()]


def probe(client, mode: str, arg: bytes, **kwargs):
    """(pid, text) of an answer, or [status, message] of a failure."""
    try:
        result = client.infer("probe", probe_inputs(mode, arg), **kwargs)
    except InferenceServerException as error:
        return failure(error)
    return {"pid": int(result.as_numpy("PID")[0]), "text": result.as_numpy("TEXT")[0].decode("utf-8", "replace")}


def case_unary(client) -> dict:
    rng = np.random.default_rng(22)
    a = rng.integers(-1000, 1000, size=16, dtype=np.int32)
    b = rng.integers(-1000, 1000, size=16, dtype=np.int32)
    inputs = [grpcclient.InferInput("INPUT0", [16], "INT32"), grpcclient.InferInput("INPUT1", [16], "INT32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    result = client.infer("add_sub", inputs)
    out0, out1 = result.as_numpy("OUTPUT0"), result.as_numpy("OUTPUT1")
    assert out0.dtype == np.int32 and out1.dtype == np.int32
    np.testing.assert_array_equal(out0, a + b)
    np.testing.assert_array_equal(out1, a - b)
    only = client.infer("add_sub", inputs, outputs=[grpcclient.InferRequestedOutput("OUTPUT1")])
    return {
        "INPUT0": a.tolist(),
        "INPUT1": b.tolist(),
        "OUTPUT0": out0.tolist(),
        "OUTPUT1": out1.tolist(),
        "only": sorted(o.name for o in only.get_response().outputs),
    }


def case_batched(client, count: str) -> dict:
    """`count` requests at once on `batched` (preferred batch size 3, a long queue delay)."""
    answers: queue.Queue = queue.Queue()
    rows = [np.full((1, 4), float(index + 1), dtype=np.float32) for index in range(int(count))]

    def callback(index, result, error):
        answers.put((index, result, error))

    for index, row in enumerate(rows):
        tensor = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
        tensor.set_data_from_numpy(row)
        client.async_infer("batched", [tensor], lambda result, error, index=index: callback(index, result, error))
    out = {}
    for _ in rows:
        index, result, error = answers.get(timeout=WAIT)
        assert error is None, error
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), rows[index] * 2)
        out[str(index)] = {
            "OUTPUT0": result.as_numpy("OUTPUT0").tolist(),
            "requests": int(result.as_numpy("REQUESTS")[0][0]),
        }
    return out


def case_errors(client) -> dict:
    """An exception in execute, and a TritonError of every code, each on its own request."""
    out = {"raise": probe(client, "raise", b"the value 42 is bad")}
    for code in CODES:
        out[code] = probe(client, "error", f"{code}:refused with {code}".encode())
    out["after"] = probe(client, "pid", b"")
    return out


def case_pids(client, count: str) -> dict:
    return {"answers": [probe(client, "pid", b"") for _ in range(int(count))]}


def case_exit(client, code: str) -> dict:
    return {"exit": probe(client, "exit", code.encode())}


def case_overlap(client, folder: str) -> dict:
    """Two requests at once on the two slots; each worker spins, holding the GIL, until it sees the other's file."""
    results: list = [None, None]

    def run(index: int) -> None:
        results[index] = probe(client, "overlap", folder.encode())

    threads = [threading.Thread(target=run, args=(index,)) for index in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT + 30)
    return {"answers": results}


def case_cancel(client, marker: str) -> dict:
    """A request whose client gives up (its deadline) while the model waits for is_cancelled()."""
    return {"answer": probe(client, "cancel", marker.encode(), client_timeout=2.0)}


def case_hang(client, marker: str) -> dict:
    return {"answer": probe(client, "hang", marker.encode(), client_timeout=WAIT)}


def case_autocomplete(client) -> dict:
    texts = np.array([b"ab", b"\x00\xffz", "grüße".encode()], dtype=np.object_)
    tensor = grpcclient.InferInput("TEXT", [3], "BYTES")
    tensor.set_data_from_numpy(texts)
    result = client.infer("autocomplete", [tensor])
    metadata = client.get_model_metadata("autocomplete", as_json=True)
    return {
        "lengths": result.as_numpy("LENGTHS").tolist(),
        "upper": [t.hex() for t in result.as_numpy("UPPER")],
        "inputs": [[t["name"], t["datatype"], [int(d) for d in t["shape"]]] for t in metadata["inputs"]],
        "outputs": sorted([t["name"], t["datatype"]] for t in metadata["outputs"]),
    }


def repeat_inputs(n: int) -> list:
    tensor = grpcclient.InferInput("IN", [1], "INT32")
    tensor.set_data_from_numpy(np.array([n], np.int32))
    return [tensor]


def case_decoupled(client) -> dict:
    """The decoupled `repeat` model on one stream: n = 3, 0 (no response), -1 (an error response), 1002 (sent
    from the model's thread), 1; and unary ModelInfer on it (refused)."""
    answers: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    counts = {"three": 3, "none": 0, "negative": -1, "threaded": 1002, "one": 1}
    try:
        for request_id, n in counts.items():
            client.async_stream_infer("repeat", repeat_inputs(n), request_id=request_id)
        streams: dict = {request_id: [] for request_id in counts}
        errors = []
        for _ in range(3 + 1 + 2 + 1):  # every response the model sends, the error one included
            result, error = answers.get(timeout=WAIT)
            if error is not None:
                errors.append(error.message())
            else:
                streams[result.get_response().id].append(int(result.as_numpy("OUT")[0]))
    finally:
        client.stop_stream()
    try:
        client.infer("repeat", repeat_inputs(2))
        unary = ["OK", ""]
    except InferenceServerException as error:
        unary = failure(error)
    return {"streams": streams, "errors": errors, "unary": unary}


def main(argv: list[str]) -> int:
    address, case, *args = argv[1:]
    with grpcclient.InferenceServerClient(address) as client:
        result = globals()[f"case_{case}"](client, *args)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
